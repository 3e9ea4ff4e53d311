"""Small text utilities shared by the pipelines: sentence spans, byte offsets, hashes.

Block uids, fingerprints and file hashes are the data contract's (``realm_tf.data.features``,
``realm_tf.data.manifests``).
"""

import hashlib
import re
from typing import List, Sequence, Tuple

_sentencizer = None


def _get_sentencizer():
  """A rule-based spaCy sentence splitter (no statistical model), built once per process."""
  global _sentencizer
  if _sentencizer is None:
    import spacy
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


def char_to_byte_offsets(text: str) -> List[int]:
  """``offsets[i]`` = UTF-8 byte offset of character ``i`` (one extra entry for the end)."""
  offsets = [0] * (len(text) + 1)
  pos = 0
  for i, ch in enumerate(text):
    offsets[i] = pos
    pos += len(ch.encode("utf-8"))
  offsets[len(text)] = pos
  return offsets


def byte_span_to_chars(text: str, byte_start: int, byte_limit: int) -> Tuple[int, int]:
  """Byte offsets within ``text``'s UTF-8 encoding -> character offsets (must be on boundaries)."""
  raw = text.encode("utf-8")
  if not 0 <= byte_start <= byte_limit <= len(raw):
    raise ValueError(f"byte span [{byte_start}, {byte_limit}) outside a {len(raw)}-byte text")
  return (len(raw[:byte_start].decode("utf-8")), len(raw[:byte_limit].decode("utf-8")))


def sha1_hex(data) -> str:
  if isinstance(data, str):
    data = data.encode("utf-8")
  return hashlib.sha1(data).hexdigest()


def hash_fraction(key: str, salt: str = "") -> float:
  """A deterministic number in [0, 1) from a string (first 8 bytes of its SHA1)."""
  digest = hashlib.sha1((salt + key).encode("utf-8")).digest()
  return int.from_bytes(digest[:8], "big") / 2.0**64
