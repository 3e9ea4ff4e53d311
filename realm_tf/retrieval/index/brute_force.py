"""Exact MIPS by a blocked matrix product: the ground truth, and the index of small corpora."""

import numpy as np

from realm_tf.retrieval.index import base as index_base


class BruteForceIndex(index_base.MipsIndex):
  """Exact MIPS over every live row.

  Args:
    embeddings: float32 ``[num_blocks, dim]`` (a memory map is read in place; a loaded
      index memory-maps its ``embeddings.npy``; an updated one is a ``RowTable``).
    rows_per_block: rows scored per matrix product, bounding memory at
      ``batch * rows_per_block`` floats.
    check: check shape and finiteness (off for trusted, already checked embeddings).
    deleted: rows never returned (sorted or not).
  """

  index_type = "brute_force"

  def __init__(self, embeddings: np.ndarray, rows_per_block: int = 262_144, check: bool = True,
               deleted=None):
    embeddings = index_base.check_embeddings(embeddings) if check else embeddings
    super().__init__(*embeddings.shape, deleted=deleted)
    self.embeddings = embeddings
    self.rows_per_block = rows_per_block
    self.build_seconds = 0.0

  def search(self, queries, k):
    queries = index_base.check_queries(queries, self.dim)
    k = index_base.check_k(k, self.num_live)
    best_ids = np.zeros([len(queries), 0], np.int64)
    best_scores = np.zeros([len(queries), 0], np.float32)
    for start in range(0, self.num_blocks, self.rows_per_block):
      stop = min(start + self.rows_per_block, self.num_blocks)
      scores = queries @ self.embeddings[start:stop].T
      lo, hi = np.searchsorted(self.deleted, [start, stop])
      scores[:, self.deleted[lo:hi] - start] = -np.inf
      kk = min(k, scores.shape[1])
      part = np.argpartition(-scores, kk - 1, axis=1)[:, :kk]
      best_ids = np.concatenate([best_ids, part + start], axis=1)
      best_scores = np.concatenate([best_scores, np.take_along_axis(scores, part, 1)], axis=1)
      if best_ids.shape[1] > k:
        keep = np.argpartition(-best_scores, k - 1, axis=1)[:, :k]
        best_ids = np.take_along_axis(best_ids, keep, 1)
        best_scores = np.take_along_axis(best_scores, keep, 1)
    order = np.argsort(-best_scores, axis=1, kind="stable")
    return (np.take_along_axis(best_ids, order, 1).astype(np.int64),
            np.take_along_axis(best_scores, order, 1).astype(np.float32))

  def settings(self):
    return {"mode": "exact", "rows_per_block": self.rows_per_block}

  def _append(self, rows, embeddings):
    self.embeddings = index_base.RowTable.extend(self.embeddings, embeddings)

  def _delete(self, rows):
    pass  # ``self.deleted`` masks them in ``search``.

  def _save_artifacts(self, directory):
    index_base.save_npy(f"{directory}/{index_base.EMBEDDINGS_NAME}", self.embeddings)
