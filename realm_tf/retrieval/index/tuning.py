"""Recall against exact search, and the build-time tuning of an approximate index to a target.

The tuning (:func:`tune`) sets the fewest leaves, then the fewest reordered candidates, that
reach a recall target (see ``mips_index``'s module doc for the rule). Its pieces:

* :class:`RecallProbe`: recall@k of one (leaves, depth) setting on a sample of queries,
  against the exact k-th score, ties counting as hits; cached per setting, with the sample's
  lower bound (:func:`recall_lower_bound`) and the setting's speed (:meth:`RecallProbe.qps`);
* :func:`smallest`: the smallest value of a ladder reaching the aim (galloping, bisection);
* :func:`_choose_leaves` and :func:`_choose_depth`: the two searches;
* :func:`candidate_recall`: where the target is out of reach, which stage loses the recall.

The index only needs ``search(queries, k, leaves_to_search=, reordering_num_neighbors=)``,
``settings()`` and ``apply_tuning(...)``.
"""

import math
import time
from typing import Any, Dict, List, Optional, Tuple

from absl import logging
import numpy as np

from realm_tf.retrieval.index import base as index_base
from realm_tf.retrieval.index import brute_force

# Candidate reordering depths the tuning tries (those within [k, max]; the max always).
DEPTH_CANDIDATES = (100, 300, 1000)  # Depths whose fewest leaves are timed against each other.
REORDER_LADDER = (10, 15, 20, 30, 40, 50, 75, 100, 150, 200, 300, 400, 600, 800, 1000)


def store_tuning(settings: Dict[str, Any], leaves: Optional[int], reorder: int,
                 max_reorder: Optional[int] = None,
                 record: Optional[Dict[str, Any]] = None) -> None:
  """Writes a tuning's choice into an index's ``settings``: ``leaves`` (None: no tree) and
  ``reorder``; ``max_reorder`` and the ``record`` when given."""
  if leaves is not None:
    settings["num_leaves_to_search"] = int(leaves)
  settings["reordering_num_neighbors"] = int(reorder)
  if max_reorder is not None:
    settings["max_reordering_num_neighbors"] = int(max_reorder)
  if record is not None:
    settings["tuning"] = record


def tie_recalls(embeddings, queries: np.ndarray, approx_ids: np.ndarray,
                kth_scores: np.ndarray, k: int, rtol: float = 1e-5) -> np.ndarray:
  """Each query's recall@k, an approximate id counting when its true score reaches the
  exact k-th (``embeddings``: an array, memory map or ``RowTable`` of every row)."""
  valid = approx_ids[:, :k] >= 0
  rows = embeddings[np.where(valid, approx_ids[:, :k], 0)]
  true_scores = np.einsum("bd,bkd->bk", queries, rows)
  kth = np.asarray(kth_scores, np.float32).reshape(-1, 1)
  hits = (true_scores >= kth - rtol * np.maximum(1.0, np.abs(kth))) & valid
  return np.minimum(hits.sum(axis=1), k) / k


def tie_recall(embeddings, queries: np.ndarray, approx_ids: np.ndarray,
               kth_scores: np.ndarray, k: int, rtol: float = 1e-5) -> float:
  """Mean recall@k over the queries (:func:`tie_recalls`)."""
  return float(tie_recalls(embeddings, queries, approx_ids, kth_scores, k, rtol).mean())


def recall_lower_bound(per_query: np.ndarray, z: float) -> float:
  """The mean of per-query recalls less ``z`` standard errors (0 queries or 1: the mean)."""
  per_query = np.asarray(per_query, np.float64)
  if len(per_query) < 2:
    return float(per_query.mean())
  return float(per_query.mean() - z * per_query.std(ddof=1) / math.sqrt(len(per_query)))


def drop_excluded(ids: np.ndarray, scores: np.ndarray,
                  exclude: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
  """Of ``k + 1`` results per row, the ``k`` left after removing the excluded id (else the
  last)."""
  hit = ids == np.asarray(exclude).reshape(-1, 1)
  drop = np.where(hit.any(axis=1), hit.argmax(axis=1), ids.shape[1] - 1)
  keep = np.ones(ids.shape, bool)
  keep[np.arange(len(ids)), drop] = False
  shape = (ids.shape[0], ids.shape[1] - 1)
  return ids[keep].reshape(shape), scores[keep].reshape(shape)


def exact_kth_scores(embeddings, queries: np.ndarray, k: int,
                     exclude: Optional[np.ndarray] = None, batch: int = 128,
                     deleted: Optional[np.ndarray] = None) -> np.ndarray:
  """The exact k-th best inner product of each query over the live rows (blocked; queries
  in batches). ``exclude``: one row id per query that does not count (a query that is that
  row)."""
  exact = brute_force.BruteForceIndex(embeddings, check=False, deleted=deleted)
  kk = k if exclude is None else k + 1
  ids, scores = zip(*[exact.search(queries[i:i + batch], kk)
                      for i in range(0, len(queries), batch)])
  ids, scores = np.concatenate(ids), np.concatenate(scores)
  if exclude is None:
    return scores[:, -1]
  return drop_excluded(ids, scores, exclude)[1][:, -1]


class RecallProbe:
  """Recall@k of an index's settings on a sample of queries, against exact search.

  Args:
    index: the index (its ``search`` takes ``leaves_to_search`` and
      ``reordering_num_neighbors``).
    embeddings: the float32 rows it was built over (every row; ``index.deleted`` skipped).
    queries: float32 ``[m, dim]``.
    k: the k of recall@k.
    exclude: for queries that are rows of ``embeddings``, their rows: each query's own row is
      left out of both the exact and the approximate top k.
    confidence: standard errors subtracted from the sample's mean (:meth:`bound`).
    kth: each query's exact k-th best score, when the caller has it (a sharded build merges
      it shard by shard); else computed here by brute force over ``embeddings``.
  """

  def __init__(self, index, embeddings, queries: np.ndarray, k: int,
               exclude: Optional[np.ndarray], confidence: float,
               kth: Optional[np.ndarray] = None):
    self.index, self.embeddings, self.queries = index, embeddings, queries
    self.k, self.exclude, self.confidence = k, exclude, confidence
    self.kth = (exact_kth_scores(embeddings, queries, k, exclude, deleted=index.deleted)
                if kth is None else np.asarray(kth, np.float32))
    self._measured: Dict[Tuple[Optional[int], int], np.ndarray] = {}

  @property
  def evaluations(self) -> int:
    return len(self._measured)

  def recalls(self, leaves: Optional[int], depth: int) -> np.ndarray:
    """Per-query recall@k with ``leaves`` leaves searched and ``depth`` candidates reordered."""
    key = (leaves, depth)
    if key not in self._measured:
      ids, scores = self.index.search(self.queries, self.k + (self.exclude is not None),
                                      leaves_to_search=leaves, reordering_num_neighbors=depth)
      if self.exclude is not None:
        ids, _ = drop_excluded(ids, scores, self.exclude)
      self._measured[key] = tie_recalls(self.embeddings, self.queries, ids, self.kth, self.k)
    return self._measured[key]

  def bound(self, leaves: Optional[int], depth: int) -> float:
    """The sample's recall less ``confidence`` standard errors: what fresh queries get."""
    return recall_lower_bound(self.recalls(leaves, depth), self.confidence)

  def qps(self, leaves: Optional[int], depth: int) -> float:
    """Queries per second of this setting at batch 128 (best of three passes over 512)."""
    timed = self.queries[:512]
    search = lambda q: self.index.search(q, self.k, leaves_to_search=leaves,
                                         reordering_num_neighbors=depth)
    search(self.queries[:128])
    best = float("inf")
    for _ in range(3):
      begin = time.perf_counter()
      for i in range(0, len(timed), 128):
        search(timed[i:i + 128])
      best = min(best, time.perf_counter() - begin)
    return len(timed) / max(best, 1e-9)


def smallest(values: List[int], reaches) -> Tuple[int, bool]:
  """The smallest of the ascending ``values`` with ``reaches(value)`` (assumed monotone):
  galloping, then bisection. ``(values[-1], False)`` when even the last does not reach."""
  if not reaches(values[-1]):
    return values[-1], False
  lo, hi, step = -1, 0, 1  # values[lo] does not reach (lo -1: none tried); values[hi]: next.
  while hi < len(values) - 1 and not reaches(values[hi]):
    lo, hi, step = hi, min(len(values) - 1, hi + step), step * 2
  while hi - lo > 1:
    mid = (lo + hi) // 2
    if reaches(values[mid]):
      hi = mid
    else:
      lo = mid
  return values[hi], True


def _choose_leaves(probe: RecallProbe, aim: float, num_leaves: int, depths: List[int]):
  """For each candidate depth (ascending), the fewest leaves reaching ``aim`` (a deeper
  reordering never needs more); then the fastest of those pairs. Returns ``(leaves, depth,
  timed, reached)``, ``timed`` the ``[leaves, depth, qps]`` measured."""
  first = max(1, int(math.ceil(0.01 * num_leaves)))
  top, timed = num_leaves, []
  for depth in depths:
    found, ok = smallest(list(range(first, top + 1)),
                         lambda v, d=depth: probe.bound(v, d) >= aim)
    if ok:
      timed.append((found, depth, probe.qps(found, depth)))
      top = found
  if not timed:
    return num_leaves, depths[-1], timed, False
  leaves, depth, _ = max(timed, key=lambda t: t[2])
  return leaves, depth, timed, True


def _choose_depth(probe: RecallProbe, aim: float, leaves: Optional[int], floor: int,
                  depth: int) -> int:
  """The fewest candidates on a finer ladder that keep ``aim`` at ``leaves``."""
  ladder = sorted({r for r in REORDER_LADDER if floor <= r < depth} | {depth})
  return smallest(ladder, lambda v: probe.bound(leaves, v) >= aim)[0]


def candidate_recall(index, embeddings, queries, kth, k, leaves, depth, exclude) -> float:
  """Recall@k if the ``depth`` candidates of the hashing were rescored in float32."""
  depth = min(depth, index.num_live)
  best = []
  for i in range(0, len(queries), 32):
    q = queries[i:i + 32]
    cand, _ = index.search(q, depth, leaves_to_search=leaves, reordering_num_neighbors=depth)
    valid = cand >= 0
    scores = np.einsum("bd,bkd->bk", q, embeddings[np.where(valid, cand, 0)])
    scores[~valid] = -np.inf
    if exclude is not None:
      scores[cand == np.asarray(exclude[i:i + 32]).reshape(-1, 1)] = -np.inf
    top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    best.append(np.where(np.take_along_axis(valid, top, 1), np.take_along_axis(cand, top, 1),
                         -1))
  return tie_recall(embeddings, queries, np.concatenate(best), kth, k)


def tune(index, embeddings, queries: np.ndarray, target_recall: float, k: int = 10,
         tune_leaves: bool = True, tune_reordering: bool = True,
         max_reordering_num_neighbors: Optional[int] = None, source: str = "given",
         exclude: Optional[np.ndarray] = None, margin: float = 0.0,
         confidence: float = 0.0, kth: Optional[np.ndarray] = None) -> Dict[str, Any]:
  """Sets ``index``'s fewest leaves, then fewest reordered candidates, reaching the target.

  A setting reaches the target when the sample's mean recall@k less ``confidence`` standard
  errors is at least ``target_recall + margin`` (:class:`RecallProbe`; ``kth``: the exact
  k-th scores when the caller has them). Returns the ``tuning`` record, which
  ``index.apply_tuning`` also stores in its settings.
  """
  queries = index_base.check_queries(queries, index.dim)
  if len(queries) == 0:
    raise ValueError("tuning needs at least one query")
  if exclude is not None and index.num_live < 2:
    exclude = None
  k = index_base.check_k(min(k, index.num_live - (exclude is not None)), index.num_live)
  start = time.time()
  if kth is not None and len(kth) != len(queries):
    raise ValueError(f"{len(kth)} exact k-th scores for {len(queries)} queries")
  probe = RecallProbe(index, embeddings, queries, k, exclude, confidence, kth)
  settings = index.settings()
  tree = settings["mode"] == "tree_ah"
  # The exact rescoring reads its candidates from the int8 reordering: never fewer.
  floor = max(k, int(settings.get("exact_rescoring") or 0))
  max_reorder = max(floor, int(max_reordering_num_neighbors or
                               settings["reordering_num_neighbors"]))
  aim = min(1.0, target_recall + margin)
  leaves = settings.get("num_leaves_to_search") if tree else None
  reorder = max_reorder if tune_reordering else max(floor,
                                                    int(settings["reordering_num_neighbors"]))
  reached, timed = True, []
  if tree and tune_leaves:
    depths = ([reorder] if not tune_reordering else
              sorted({r for r in DEPTH_CANDIDATES if floor <= r < max_reorder} | {max_reorder}))
    leaves, reorder, timed, reached = _choose_leaves(probe, aim, int(settings["num_leaves"]),
                                                     depths)
  if tune_reordering and reached:
    reorder = _choose_depth(probe, aim, leaves, floor, reorder)
  final = float(probe.recalls(leaves, reorder).mean())
  record = {
      "target_recall": float(target_recall), "margin": float(margin),
      "confidence": float(confidence), "k": int(k), "recall": round(final, 4),
      "recall_lower_bound": round(probe.bound(leaves, reorder), 4),
      "target_reached": bool(final >= target_recall), "queries": int(len(queries)),
      "query_source": source, "evaluations": probe.evaluations,
      "timed": [[int(a), int(b), round(c)] for a, b, c in timed],
      "seconds": round(time.time() - start, 3),
  }
  if not record["target_reached"]:
    record["candidate_recall"] = round(candidate_recall(
        index, embeddings, queries, probe.kth, k, leaves, max_reorder, exclude), 4)
    logging.warning("index tuning: recall@%d %.4f < target %.3f even with %s leaves and %d "
                    "candidates (%.4f if those were rescored exactly)", k, final,
                    target_recall, leaves, reorder, record["candidate_recall"])
  index.apply_tuning(leaves if tree else None, reorder, max_reorder, record)
  return record
