"""Answer matching: the one rule for "this block holds the answer" (training inputs and
validation), and ORQA's exact match for scoring predicted answers.

A block holds an answer when the answer's words occur in the block's text as a run of whole
words, after lower-casing and keeping only ``[0-9a-z]`` word characters (so "Paris" is in
"...to Paris, in 1820..." but "Ann" is not in "Anne"). ORQA's ``has_answer`` likewise matches
whole tokens of normalized text.
"""

import re
import string
import unicodedata
from typing import Sequence

_WORD = re.compile(r"[0-9a-z]+")
_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def words(text) -> str:
  """``" w1 w2 ... "``: the text's words, lower-cased, padded with a space on each side."""
  if isinstance(text, bytes):
    text = text.decode("utf-8")
  return " " + " ".join(_WORD.findall(text.lower())) + " "


def holds_answer(text, answer) -> bool:
  """Whether ``answer`` occurs in ``text`` as whole words (an empty answer never does)."""
  answer = words(answer)
  return answer.strip() != "" and answer in words(text)


# ---- Exact match, as ORQA's utils/eval_utils.py scores Open-QA predictions ----------------

def normalize_answer(text: str) -> str:
  """ORQA's (and SQuAD's) normalization: NFD, lower-case, ASCII punctuation removed, the
  articles a/an/the removed, whitespace collapsed."""
  text = unicodedata.normalize("NFD", text).lower()
  text = "".join(ch for ch in text if ch not in _PUNCTUATION)
  text = _ARTICLES.sub(" ", text)
  return " ".join(text.split())


def exact_match(prediction: str, answer: str) -> bool:
  return normalize_answer(prediction) == normalize_answer(answer)


def regex_match(prediction: str, pattern: str) -> bool:
  """CuratedTrec: ``re.match`` (anchored at the start only), ignoring case; a pattern that
  does not compile never matches."""
  try:
    regex = re.compile(pattern, flags=re.IGNORECASE | re.UNICODE | re.MULTILINE)
  except re.error:
    return False
  return regex.match(prediction) is not None


def is_correct(prediction: str, answers: Sequence[str], is_regex: bool = False) -> bool:
  """Whether ``prediction`` matches any of ``answers`` (ORQA's ``is_correct``)."""
  match = regex_match if is_regex else exact_match
  return any(match(prediction, a) for a in answers)
