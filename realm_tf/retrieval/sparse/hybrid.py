"""One retriever choice for answering: the dense index, its BM25 part, or both fused.

``dense`` is the query tower's top blocks from the MIPS index; ``bm25`` the index's sparse part
(``sparse_index``, over the same rows); ``hybrid`` fuses their two top lists (each
``max(k, FUSION["depth"])`` deep) by a weighted sum of per-question min-max normalized scores::

    fused(b) = w * bm25'(b) + (1 - w) * dense'(b)      s'(b) = (s(b) - min s) / (max s - min s)

over each list's own scores (a block outside a list gets 0 from it; a list of one score gives
it 1). The rule and ``w`` were chosen on the real-text dev questions (experiments/NOTES.md,
section 31: recall@5 0.954 at w = 0.7, BM25 alone 0.941, ICT alone 0.738, reciprocal-rank
fusion 0.918); each index records the rule it was published with (its manifest's
``sparse.fusion``), and answering uses that record. Ties go to the better dense rank, then
the lower block id. Each beam block keeps its rank in each list (-1: not in it), so that the
evidence of an answer says which retriever found it. A ``bm25`` beam shorter than ``k`` (fewer
blocks share a word with the question) is filled with the dense beam's next blocks.

The reader adds a score per read block to its span scores (its block prior). ORQA's is the
query tower's logit, and ``dense`` beams keep it. The beams of the BM25 part follow the rule's
``FUSION["block_prior"]``: ``fusion`` adds each block's fused score (``bm25``: BM25's normalized
score), over lists of the rule's depth, mapped onto the range of the question's dense scores,
so that the blocks BM25 ranks high are not outweighed by the dense tower's (with the logit, a
weak tower's favourite won between the fused blocks: NOTES 32). Chosen on 800 real-text dev
questions (NOTES 33): hybrid EM 0.511 with ``fusion``, 0.484 with ``none`` (span scores alone),
0.424 with the logit; bm25 0.500, 0.466, 0.460.
"""

from typing import Callable, Dict, NamedTuple, Optional

import numpy as np

from realm_tf.retrieval import errors

RETRIEVERS = ("dense", "bm25", "hybrid")
DEFAULT = "dense"
FUSION = {"rule": "weighted sum of per-question min-max normalized scores", "bm25_weight": 0.7,
          "depth": 20, "block_prior": "fusion"}
# How the reader weighs a BM25 or fused beam's blocks (``inputs.OpenQaInputBuilder``'s
# block_prior).
BLOCK_PRIORS = ("retriever", "fusion", "none")


class Beam(NamedTuple):
  """Blocks retrieved for each question, best first, and each one's rank in each list;
  ``fused``: a BM25 or fused beam's own scores on the range of the dense scores (:func:`fuse`,
  :func:`retrieve`)."""
  ids: np.ndarray          # int64 [q, k]
  dense_rank: np.ndarray   # int32 [q, k]: 0-based rank in the dense list, -1 when not in it
  bm25_rank: np.ndarray    # int32 [q, k]: the same in BM25's list
  fused: Optional[np.ndarray] = None   # float32 [q, k]


def fusion_of(index) -> Dict:
  """The fusion rule ``index`` was published with (its manifest's ``sparse.fusion``), the keys
  it predates taken from :data:`FUSION`."""
  return dict(FUSION, **(((index.manifest or {}).get("sparse") or {}).get("fusion") or {}))


def check(retriever: str, index=None) -> str:
  """``retriever`` when it is one of :data:`RETRIEVERS` that ``index`` can serve (``bm25`` and
  ``hybrid`` need a sparse part); ``RetrievalError`` naming the choices otherwise."""
  if retriever not in RETRIEVERS:
    raise errors.RetrievalError(f"unknown retriever {retriever!r}: one of "
                                f"{', '.join(RETRIEVERS)}")
  if retriever != "dense" and index is not None and index.sparse is None:
    raise errors.RetrievalError(
        f"retriever {retriever!r} needs the index's BM25 part, and this index was published "
        "without one: rebuild it (realm-index build; IndexConfig.sparse)")
  return retriever


def _ranks(ids: np.ndarray, lists: np.ndarray) -> np.ndarray:
  """For each ``ids[i, j]``, its position in ``lists[i]`` (-1 when absent)."""
  out = np.full(ids.shape, -1, np.int32)
  for row, found, ranked in zip(out, ids, lists):
    rank = {b: r for r, b in reversed(list(enumerate(ranked.tolist()))) if b >= 0}
    row[:] = [rank.get(b, -1) for b in found.tolist()]
  return out


def _normalized(ids: np.ndarray, scores: np.ndarray) -> Dict[int, float]:
  valid = ids >= 0
  ids, scores = ids[valid], np.asarray(scores, np.float64)[valid]
  if not len(ids):
    return {}
  lo, hi = scores.min(), scores.max()
  return {int(b): (s - lo) / (hi - lo) if hi > lo else 1.0 for b, s in zip(ids, scores)}


def fuse(dense_ids: np.ndarray, dense_scores: np.ndarray, bm25_ids: np.ndarray,
         bm25_scores: np.ndarray, k: int, bm25_weight: float = FUSION["bm25_weight"]) -> Beam:
  """The top ``k`` of two top lists (``-1``: no block) by the weighted sum of their
  normalized scores (the module docstring). ``Beam.fused``: each block's fused score mapped
  onto the range of the question's dense scores, ``lo + fused * (hi - lo)`` (``lo`` where no
  block is), so that it can stand where a dense score would (``block_prior="fusion"``)."""
  out = np.full([len(dense_ids), k], -1, np.int64)
  scores = np.zeros([len(dense_ids), k], np.float32)
  for i in range(len(dense_ids)):
    dense = _normalized(dense_ids[i], dense_scores[i])
    sparse = _normalized(bm25_ids[i], bm25_scores[i])
    rank = {b: r for r, b in reversed(list(enumerate(dense_ids[i].tolist())))}
    fused = {b: bm25_weight * sparse.get(b, 0.0) + (1 - bm25_weight) * dense.get(b, 0.0)
             for b in set(dense) | set(sparse)}
    best = sorted(fused, key=lambda b: (-fused[b], rank.get(b, len(rank)), b))[:k]
    out[i, :len(best)] = best
    scores[i] = _on_dense_range(out[i], dense_ids[i], dense_scores[i], fused)
  return Beam(out, _ranks(out, dense_ids), _ranks(out, bm25_ids), scores)


def _on_dense_range(ids: np.ndarray, dense_ids: np.ndarray, dense_scores: np.ndarray,
                    normalized: Dict[int, float]) -> np.ndarray:
  """``lo + normalized[b] * (hi - lo)`` for each block ``b`` of ``ids`` (``lo`` for a block
  without one, and for -1), where ``lo`` and ``hi`` are the smallest and largest score of the
  dense list."""
  valid = np.asarray(dense_scores, np.float64)[np.asarray(dense_ids) >= 0]
  lo, hi = (valid.min(), valid.max()) if len(valid) else (0.0, 1.0)
  return np.array([lo + normalized.get(int(b), 0.0) * (hi - lo) for b in ids], np.float32)


def fill(bm25_ids: np.ndarray, dense_ids: np.ndarray) -> np.ndarray:
  """BM25's lists with their empty places (-1) filled by the dense lists' next blocks."""
  out = bm25_ids.copy()
  for row, dense in zip(out, dense_ids):
    missing = row < 0
    if missing.any():
      row[missing] = [b for b in dense.tolist() if b not in set(row.tolist())][:missing.sum()]
  return out


def retrieve(index, retriever: str, query_embeddings: np.ndarray, questions, k: int,
             dense_search: Optional[Callable] = None) -> Beam:
  """The top ``k`` blocks of each question by ``retriever`` over ``index`` (a ``MipsIndex``
  whose ``sparse`` part serves ``bm25``; ``dense_search``: its search, or a handle's)."""
  check(retriever, index)
  if retriever != "dense" and index is None:
    raise errors.RetrievalError(f"retriever {retriever!r} needs an index with a BM25 part")
  search = dense_search or index.search
  if retriever == "dense":
    ids = np.asarray(search(query_embeddings, k)[0], np.int64)
    return Beam(ids, _ranks(ids, ids), np.full(ids.shape, -1, np.int32))
  fusion = fusion_of(index)
  depth = min(max(k, int(fusion["depth"])), index.num_live)
  dense_ids, dense_scores = search(query_embeddings, depth)
  dense_ids = np.asarray(dense_ids, np.int64)
  bm25_ids, bm25_scores = index.sparse.search(list(questions), depth)
  if retriever == "hybrid":
    return fuse(dense_ids, dense_scores, bm25_ids, bm25_scores, k, fusion["bm25_weight"])
  # BM25's top k (each list's top k, as a k-deep search gives them), with BM25's normalized
  # score over its list of the rule's depth on the dense range as ``Beam.fused``.
  ids = fill(bm25_ids[:, :k], dense_ids[:, :k])
  scores = np.stack([_on_dense_range(row, d, ds, _normalized(b, bs)) for row, d, ds, b, bs in
                     zip(ids, dense_ids, dense_scores, bm25_ids, bm25_scores)])
  return Beam(ids, _ranks(ids, dense_ids[:, :k]), _ranks(ids, bm25_ids[:, :k]), scores)
