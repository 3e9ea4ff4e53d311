"""Small text utilities shared by the pipelines: sentence spans, byte offsets, hashes.

The sentence splitter is the library's (``realm_tf.data.sentences``, which ``realm-index
upsert`` cuts documents with too), here under its old names. Block uids, fingerprints and file
hashes are the data contract's (``realm_tf.data.features``, ``realm_tf.data.manifests``).
"""

import hashlib
from typing import List, Tuple

from realm_tf.data.sentences import (  # pylint: disable=unused-import
    batch_sentence_spans, sentence_spans)


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
