"""Sentence spans of a text: the one sentence splitter of the blocks pipeline and of
``realm-index upsert`` (``realm_tf.data.articles``), ICT and salient-span annotation.

spaCy's rule-based ``sentencizer`` (no statistical model), imported on first use.
"""

import re
from typing import List, Sequence, Tuple

_sentencizer = None


def _get_sentencizer():
  """A rule-based spaCy sentence splitter (no statistical model), built once per process."""
  global _sentencizer
  if _sentencizer is None:
    import spacy  # inside: spaCy is slow to import; only splitting text needs it
    nlp = spacy.blank("en")
    nlp.add_pipe("sentencizer")
    _sentencizer = nlp
  return _sentencizer


_PARAGRAPH = re.compile(r"[^\n]+")


def sentence_spans(text: str) -> List[Tuple[int, int]]:
  """Character ``(start, end)`` of each sentence of ``text``, in order.

  Lines are split first (a heading or a list item never runs into the next paragraph), then
  each line is split into sentences by spaCy's rule-based ``sentencizer``. Spans exclude
  surrounding whitespace and only whitespace lies between two consecutive spans, so the
  sentences cover all the non-space text.

  Example: ``sentence_spans("Hi there. Bye.\\nNext")`` -> ``[(0, 9), (10, 14), (15, 19)]``.
  """
  return batch_sentence_spans([text])[0]


def batch_sentence_spans(texts: Sequence[str]) -> List[List[Tuple[int, int]]]:
  """:func:`sentence_spans` for many texts, with one batched spaCy call."""
  nlp = _get_sentencizer()
  lines, owners = [], []
  for i, text in enumerate(texts):
    for m in _PARAGRAPH.finditer(text):
      if m.group().strip():
        lines.append((m.start(), m.group()))
        owners.append(i)
  out: List[List[Tuple[int, int]]] = [[] for _ in texts]
  docs = nlp.pipe([line for _, line in lines], batch_size=256)
  for (offset, line), owner, doc in zip(lines, owners, docs):
    for sent in doc.sents:
      start, end = sent.start_char, sent.end_char
      chunk = line[start:end]
      stripped = chunk.strip()
      if not stripped:
        continue
      start += len(chunk) - len(chunk.lstrip())
      out[owner].append((offset + start, offset + start + len(stripped)))
  return out
