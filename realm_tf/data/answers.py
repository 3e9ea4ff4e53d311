"""The one rule for "this block holds the answer", used by training inputs and evaluation.

A block holds an answer when the answer's words occur in the block's text as a run of whole
words, after lower-casing and keeping only ``[0-9a-z]`` word characters (so "Paris" is in
"...to Paris, in 1820..." but "Ann" is not in "Anne"). ORQA's ``has_answer`` likewise matches
whole tokens of normalized text.
"""

import re
from typing import Sequence

_WORD = re.compile(r"[0-9a-z]+")


def words(text) -> str:
  """``" w1 w2 ... "``: the text's words, lower-cased, padded with a space on each side."""
  if isinstance(text, bytes):
    text = text.decode("utf-8")
  return " " + " ".join(_WORD.findall(text.lower())) + " "


def holds_answer(text, answer) -> bool:
  """Whether ``answer`` occurs in ``text`` as whole words (an empty answer never does)."""
  answer = words(answer)
  return answer.strip() != "" and answer in words(text)


def holds_any(text, answers: Sequence) -> bool:
  return any(holds_answer(text, a) for a in answers)
