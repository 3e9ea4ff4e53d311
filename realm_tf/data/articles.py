"""Articles -> blocks: the per-article rules of the blocks pipeline (``python -m
data_prep.blocks``) and of ``realm-index upsert`` (``realm_tf/retrieval/publication/updates.py``),
one code for both.

They live in the library so that it never depends on the data-prep package (which imports
these; the reverse never happens). No Beam here. The text is split into sentences
(``realm_tf.data.sentences``), and whole sentences are packed greedily into blocks of at most
``block_seq_length`` wordpieces counting ``[CLS] title [SEP] body [SEP]``; a sentence longer
than a block is cut between words (between characters for a monstrous word), never dropped.
"""

import json
import re
from typing import Dict, List, Optional, Sequence, Tuple

from realm_tf.data import sentences as sentences_lib

_WORD = re.compile(r"\S+")
MIN_BODY_BUDGET = 16


def parse_jsonl_article(path: str, line_number: int, raw: bytes) -> Tuple[Optional[Dict], str]:
  """One raw line of a JSON-lines corpus -> ``(article, "")`` or ``(None, reason)``.

  The article is ``{"title", "text", "source"}``. Reasons (counted as ``skip:<reason>``):
  ``non_utf8``, ``malformed_json``, ``missing_field``; blank lines are ignored (``blank_line``).
  """
  where = f"{path}:{line_number}"
  try:
    line = raw.decode("utf-8")
  except UnicodeDecodeError as e:
    return None, f"non_utf8: {where}: {e}"
  if not line.strip():
    return None, "blank_line"
  try:
    record = json.loads(line)
  except json.JSONDecodeError as e:
    return None, f"malformed_json: {where}: {e}"
  if not isinstance(record, dict) or not isinstance(record.get("title"), str) or not isinstance(
      record.get("text"), str):
    return None, f"missing_field: {where}: expected an object with string 'title' and 'text'"
  return {"title": record["title"], "text": record["text"], "source": where}, ""


def pack_units(counts: Sequence[int], budget: int) -> List[Tuple[int, int]]:
  """Greedy packing: unit index ranges ``[i, j)`` whose counts sum to at most ``budget``.

  Every unit must fit on its own (``count <= budget``). Example: counts ``[3, 4, 2, 6]``,
  budget 7 -> ``[(0, 2), (2, 3), (3, 4)]``.
  """
  groups, start, total = [], 0, 0
  for i, n in enumerate(counts):
    if n > budget:
      raise ValueError(f"unit {i} has {n} wordpieces, more than the budget {budget}")
    if i > start and total + n > budget:
      groups.append((start, i))
      start, total = i, 0
    total += n
  if start < len(counts):
    groups.append((start, len(counts)))
  return groups


def cut_long_span(text: str, start: int, end: int, word_counts_fn, budget: int
                  ) -> List[Tuple[int, int, int]]:
  """Cuts ``text[start:end]`` (longer than ``budget`` wordpieces) into pieces that fit.

  Cuts between whitespace-separated words; a single word longer than the budget is cut between
  characters. Returns ``(start, end, wordpiece_count)`` character spans, in order, covering all
  non-space characters of the span.
  """
  words = [(start + m.start(), start + m.end()) for m in _WORD.finditer(text[start:end])]
  counts = word_counts_fn([text[s:e] for s, e in words])
  units: List[Tuple[int, int, int]] = []
  for (s, e), n in zip(words, counts):
    if n <= budget:
      units.append((s, e, n))
    else:  # One character gives at most one wordpiece.
      for cs in range(s, e, budget):
        ce = min(cs + budget, e)
        units.append((cs, ce, word_counts_fn([text[cs:ce]])[0]))
  pieces = []
  for i, j in pack_units([u[2] for u in units], budget):
    pieces.append((units[i][0], units[j - 1][1], sum(u[2] for u in units[i:j])))
  return pieces


def article_to_blocks(title: str, text: str, tokenizer, block_seq_length: int = 288,
                      sentences: Optional[List[Tuple[int, int]]] = None) -> List[Dict]:
  """Splits one article into blocks.

  Returns a list of ``{"body": str, "token_ids": [int], "char_start": int, "char_end": int}``
  in article order; ``body == text[char_start:char_end]`` and ``token_ids`` is
  ``[CLS] title [SEP] body [SEP]`` of length at most ``block_seq_length``.

  Raises ValueError if the title alone leaves fewer than 16 wordpieces for the body.
  """
  return articles_to_blocks([(title, text)], tokenizer, block_seq_length,
                            None if sentences is None else [sentences])[0]


def articles_to_blocks(articles: Sequence[Tuple[str, str]], tokenizer,
                       block_seq_length: int = 288,
                       sentences: Optional[Sequence[List[Tuple[int, int]]]] = None
                       ) -> List[List[Dict]]:
  """:func:`article_to_blocks` of each ``(title, text)``, with two tokenizer calls for the
  whole batch (titles and sentences, then the blocks' bodies) instead of two per article."""
  if sentences is None:
    sentences = [sentences_lib.sentence_spans(text) for _, text in articles]
  flat = [piece for (title, text), spans in zip(articles, sentences) if spans
          for piece in [title] + [text[s:e] for s, e in spans]]
  pieces = tokenizer.tokenize(flat) if flat else None
  ids = pieces.flat_values.numpy().tolist() if flat else []
  lengths = pieces.row_lengths().numpy().tolist() if flat else []
  plans, row, cursor = [], 0, 0
  for (title, text), spans in zip(articles, sentences):
    if not spans:
      plans.append((title, []))
      continue
    title_ids = ids[cursor:cursor + lengths[row]]
    counts = lengths[row + 1:row + 1 + len(spans)]
    cursor += sum(lengths[row:row + 1 + len(spans)])
    row += 1 + len(spans)
    budget = block_seq_length - 3 - len(title_ids)
    if budget < MIN_BODY_BUDGET:
      raise ValueError(f"title {title!r} has {len(title_ids)} wordpieces: no room for a body "
                       f"in {block_seq_length}")
    units: List[Tuple[int, int, int]] = []
    for (s, e), n in zip(spans, counts):
      if n <= budget:
        units.append((s, e, n))
      else:
        units.extend(cut_long_span(text, s, e, tokenizer.count_wordpieces, budget))
    groups = [(units[i][0], units[j - 1][1])
              for i, j in pack_units([u[2] for u in units], budget)]
    plans.append((title, [(s, e, text[s:e], title_ids, budget) for s, e in groups]))
  bodies = [body for _, groups in plans for _, _, body, _, _ in groups]
  body_ids = iter(tokenizer.tokenize(bodies).to_list() if bodies else [])
  out = []
  for title, groups in plans:
    blocks = []
    for (s, e, body, title_ids, budget), piece_ids in zip(groups, body_ids):
      if len(piece_ids) > budget:  # Wordpiece counts are additive over whitespace: a guard.
        raise AssertionError(f"block of {title!r} has {len(piece_ids)} > {budget} body "
                             "wordpieces")
      token_ids = ([tokenizer.cls_id] + title_ids + [tokenizer.sep_id] + piece_ids +
                   [tokenizer.sep_id])
      blocks.append({"body": body, "token_ids": token_ids, "char_start": s, "char_end": e})
    out.append(blocks)
  return out


