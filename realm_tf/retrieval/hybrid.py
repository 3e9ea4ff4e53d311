"""One retriever choice for answering: the dense index, its BM25 part, or both fused.

``dense`` is the query tower's top blocks from the MIPS index; ``bm25`` the index's sparse part
(``sparse_index``, over the same rows); ``hybrid`` fuses their two top lists by reciprocal-rank
fusion (Cormack, Clarke and Buettcher, SIGIR 2009; pyserini's and Haystack's default fusion)::

    fused(b) = sum over the lists that hold b of 1 / (RRF_K + rank of b there)   (rank from 1)

Ties go to the better dense rank, then the lower block id. Each beam block keeps its rank in
each list (-1: not in it), so that the evidence of an answer says which retriever found it.
A ``bm25`` beam shorter than ``k`` (fewer blocks share a word with the question) is filled with
the dense beam's next blocks.
"""

from typing import NamedTuple, Optional

import numpy as np

from realm_tf.retrieval import errors

RETRIEVERS = ("dense", "bm25", "hybrid")
DEFAULT = "dense"
RRF_K = 60


class Beam(NamedTuple):
  """Blocks retrieved for each question, best first, and each one's rank in each list."""
  ids: np.ndarray          # int64 [q, k]
  dense_rank: np.ndarray   # int32 [q, k]: 0-based rank in the dense list, -1 when not in it
  bm25_rank: np.ndarray    # int32 [q, k]: the same in BM25's list


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


def fuse(dense_ids: np.ndarray, bm25_ids: np.ndarray, k: int, rrf_k: int = RRF_K) -> Beam:
  """Reciprocal-rank fusion of two top lists (``-1``: no block) into the top ``k``."""
  out = np.full([len(dense_ids), k], -1, np.int64)
  for i, (dense, sparse) in enumerate(zip(dense_ids, bm25_ids)):
    score = {}
    for ranked in (dense, sparse):
      for rank, block in enumerate(ranked[ranked >= 0].tolist()):
        score[block] = score.get(block, 0.0) + 1.0 / (rrf_k + rank + 1)
    dense_rank = {b: r for r, b in enumerate(dense.tolist())}
    best = sorted(score, key=lambda b: (-score[b], dense_rank.get(b, len(dense)), b))[:k]
    out[i, :len(best)] = best
  return Beam(out, _ranks(out, dense_ids), _ranks(out, bm25_ids))


def fill(bm25_ids: np.ndarray, dense_ids: np.ndarray) -> np.ndarray:
  """BM25's lists with their empty places (-1) filled by the dense lists' next blocks."""
  out = bm25_ids.copy()
  for row, dense in zip(out, dense_ids):
    missing = row < 0
    if missing.any():
      row[missing] = [b for b in dense.tolist() if b not in set(row.tolist())][:missing.sum()]
  return out


def retrieve(index, retriever: str, query_embeddings: np.ndarray, questions, k: int,
             dense_search: Optional[callable] = None) -> Beam:
  """The top ``k`` blocks of each question by ``retriever`` over ``index`` (a ``MipsIndex``
  whose ``sparse`` part serves ``bm25``; ``dense_search``: its search, or a handle's)."""
  check(retriever, index)
  if retriever != "dense" and index is None:
    raise errors.RetrievalError(f"retriever {retriever!r} needs an index with a BM25 part")
  dense_ids = np.asarray((dense_search or index.search)(query_embeddings, k)[0], np.int64)
  if retriever == "dense":
    bm25_ids = np.full_like(dense_ids, -1)
    return Beam(dense_ids, _ranks(dense_ids, dense_ids), _ranks(dense_ids, bm25_ids))
  bm25_ids, _ = index.sparse.search(list(questions), k)
  if retriever == "bm25":
    ids = fill(bm25_ids, dense_ids)
    return Beam(ids, _ranks(ids, dense_ids), _ranks(ids, bm25_ids))
  return fuse(dense_ids, bm25_ids, k)
