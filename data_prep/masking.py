"""Masking for the masked-LM pre-training queries: salient spans, random spans, uniform tokens.

Pure functions over Python lists of wordpiece ids, so each rule is testable on its own. A query is
``[CLS] sentence [SEP]`` with at most ``query_seq_length`` tokens and at most ``max_masks``
masked positions.

* salient / random span (:func:`mask_span`): the sentence is tokenized as three pieces, the text
  before the span, the span, the text after it, so the masked positions are exactly the span's
  wordpieces; every one becomes ``[MASK]``. A span of more than ``max_masks`` wordpieces is masked
  whole and only its first ``max_masks`` wordpieces are predicted (as Google's
  ``featurization.py``: ``mask_query`` masks the whole span, ``truncate_or_pad`` then keeps the
  first ``max_masks`` targets); a span longer than the query (``query_seq_length - 2``) is not
  used. A sentence longer than ``query_seq_length - 2`` is **cut around the span** (context kept
  on both sides, as evenly as the sentence allows), never skipped.
* random span (:func:`choose_random_span`), SpanBERT-style: a run of whole words whose length is
  drawn from Geometric(0.2) clipped to 10 words, shortened until it has at most ``max_masks``
  wordpieces, at a uniformly random start.
* uniform (:func:`mask_uniform`), BERT-style: 15% of the sentence's wordpieces (rounded, at least
  one, at most ``max_masks``), chosen uniformly; of those 80% become ``[MASK]``, 10% a random
  wordpiece, 10% stay. A sentence longer than the query is cut at the end.
"""

import dataclasses
import random
import re
from typing import List, Optional, Sequence, Tuple

_WORD = re.compile(r"\w+|[^\w\s]")


@dataclasses.dataclass
class MaskedQuery:
  """An unpadded masked query: ``query_ids`` = [CLS] ... [SEP]; ``mlm_ids`` the originals."""
  query_ids: List[int]
  mlm_positions: List[int]
  mlm_ids: List[int]
  answer: str


def mask_span(prefix_ids: Sequence[int], span_ids: Sequence[int], suffix_ids: Sequence[int],
              answer: str, cls_id: int, sep_id: int, mask_id: int,
              query_seq_length: int = 96, max_masks: int = 10) -> Optional[MaskedQuery]:
  """Masks every wordpiece of a span; cuts the context to fit. None if the span cannot be used.

  Example: prefix ``[7, 8]``, span ``[9, 10]``, suffix ``[11]``, cls 2, sep 3, mask 4 ->
  ``query_ids [2, 7, 8, 4, 4, 11, 3]``, ``mlm_positions [3, 4]``, ``mlm_ids [9, 10]``.

  A span of more than ``max_masks`` wordpieces is still masked whole; ``mlm_positions`` and
  ``mlm_ids`` are its first ``max_masks`` wordpieces. None for an empty span or one longer than
  ``query_seq_length - 2``.
  """
  n = len(span_ids)
  if n == 0 or n > query_seq_length - 2:
    return None
  room = query_seq_length - 2 - n
  left, right = len(prefix_ids), len(suffix_ids)
  if left + right > room:
    half = room // 2
    if left <= half:
      right = room - left
    elif right <= room - half:
      left = room - right
    else:
      left, right = half, room - half
  kept_prefix = list(prefix_ids[len(prefix_ids) - left:]) if left else []
  kept_suffix = list(suffix_ids[:right])
  query = [cls_id] + kept_prefix + [mask_id] * n + kept_suffix + [sep_id]
  predicted = min(n, max_masks)
  positions = list(range(1 + len(kept_prefix), 1 + len(kept_prefix) + predicted))
  return MaskedQuery(query, positions, list(span_ids[:predicted]), answer)


def word_spans(sentence: str) -> List[Tuple[int, int]]:
  """Character spans of BERT-style words: runs of word characters, or one punctuation mark."""
  return [(m.start(), m.end()) for m in _WORD.finditer(sentence)]


def choose_random_span(words: Sequence[Tuple[int, int]], word_piece_counts: Sequence[int],
                       rng: random.Random, max_masks: int = 10, geometric_p: float = 0.2,
                       max_words: int = 10) -> Optional[Tuple[int, int]]:
  """A random run of whole words (SpanBERT masking) -> its character ``(start, end)``.

  Returns None when no word fits in ``max_masks`` wordpieces.
  """
  fitting = [i for i, c in enumerate(word_piece_counts) if 0 < c <= max_masks]
  if not fitting:
    return None
  length = 1
  while length < max_words and rng.random() > geometric_p:
    length += 1
  start = rng.choice(fitting)
  end, pieces = start, 0
  while end < len(words) and end - start < length and pieces + word_piece_counts[end] <= max_masks:
    pieces += word_piece_counts[end]
    end += 1
  return words[start][0], words[end - 1][1]


def mask_uniform(token_ids: Sequence[int], rng: random.Random, cls_id: int, sep_id: int,
                 mask_id: int, random_ids: Sequence[int], query_seq_length: int = 96,
                 max_masks: int = 10, mask_rate: float = 0.15,
                 vocab_lookup=None) -> Optional[MaskedQuery]:
  """BERT's masking of a tokenized sentence: 15% of the tokens, 80/10/10.

  ``random_ids`` are the ids a "random token" replacement draws from (the vocabulary minus
  special tokens). ``answer`` is the original wordpieces, space-joined when ``vocab_lookup`` (an
  id -> string function) is given. None for an empty sentence.
  """
  tokens = list(token_ids[:query_seq_length - 2])
  if not tokens:
    return None
  n = min(max_masks, max(1, int(round(len(tokens) * mask_rate))))
  chosen = sorted(rng.sample(range(len(tokens)), n))
  query = [cls_id] + tokens + [sep_id]
  originals = []
  for i in chosen:
    originals.append(tokens[i])
    r = rng.random()
    if r < 0.8:
      query[1 + i] = mask_id
    elif r < 0.9:
      query[1 + i] = rng.choice(random_ids)
  answer = " ".join(vocab_lookup(t) for t in originals) if vocab_lookup else ""
  return MaskedQuery(query, [1 + i for i in chosen], originals, answer)


def pad_to(values: Sequence, length: int, pad=0) -> List:
  values = list(values)
  if len(values) > length:
    raise ValueError(f"{len(values)} values do not fit in {length}")
  return values + [pad] * (length - len(values))
