"""ScaNN over block embeddings (tree + asymmetric hashing + int8 reordering by default).

The only module of realm_tf that imports ``scann`` (on first use: :func:`_scann`).
Settings by corpus size are ``realm_tf.scann_settings.ScannSettings``'s; the recall tuning is
``index.tuning``'s.

**Memory.** The searcher keeps no float32 copy of the embeddings: per 128-d block it holds the
int8 reordering row (128 bytes), 43 hash codes (43 bytes on disk, packed two per byte in
memory) and an int32 leaf id: ~176 bytes on disk at 10^6 blocks (~182 at 30,000, where the
tree's centres weigh more), against 512 for a float32 row (:func:`searcher_bytes` measures it;
``experiments/benchmarks/bench_index_scale.py`` prints it). The float32 embeddings are saved
beside it (``embeddings.npy``) for callers that need them (Open-QA gathers the rows of its
beam): a loaded index memory-maps that file (``ScannIndex.embeddings``), so only the rows read
are paged in, from the page cache. ``reordering_dtype="float32"`` restores exact float
reordering (512 more bytes per block).

**Exact final rescoring.** int8 rescoring misranks near-ties, and at millions of blocks the
neighbours are dense enough that this alone caps recall@10 below 0.95 however many leaves are
searched (0.944 at 4x10^6 clustered vectors with every leaf). So the best ``exact_rescoring``
(100) of the int8 order are scored once more exactly, from those float32 rows: 100 rows
(51 KB) read per query from the memory map. A ``k`` above ``exact_rescoring`` gets the int8
order; an index loaded without its ``embeddings.npy`` too. Scores are then exact inner products.

**Centring.** Before hashing, the mean embedding ``mu`` is subtracted from every block
(``center=True``): ``q . x = q . (x - mu) + q . mu`` and the last term is the same for every
block, so the ranking is unchanged, while the quantizers no longer spend their codes and int8
range on the component all blocks share (large for LayerNorm outputs). Scores are returned
with ``q . mu`` added back. Appended blocks are centred with the same ``mu``.

**Fallbacks.** Where even every leaf and the deepest reordering miss the recall target, the
tuning tells why (``candidate_recall``: the recall if those candidates were rescored exactly)
and the build is redone once: with finer codes (2 dimensions each) if the neighbours are not
among the candidates (near-random embeddings), with float32 reordering if they are but int8
misranks them (nearly collapsed embeddings of an untrained tower);
``settings.tuning.fallback_from`` records the first try.

**Updates.** :meth:`MipsIndex.append` and :meth:`MipsIndex.delete` go through ScaNN's own
``upsert`` and ``delete`` (of its pybind searcher), the points mapped to rows by an int64 array
(``row_ids``; None while the points are rows ``0..n-1``: no row was ever deleted). ScaNN's Python
wrapper is not used for this: it keeps a list and a dict of Python ints (~100 bytes a point,
1.3 GB at 13.3M blocks, against the array's 8 bytes) and saves them as a pickle.

**No pickle.** The row ids are saved as ``scann/row_ids.npy`` and the searcher is loaded from its
``scann_assets.pbtxt`` by the pybind class directly: nothing in an index directory is
unpickled (ScaNN's ``load_searcher`` unpickles ``scann_docids.pkl``, which would run the code of
whoever could write the directory). A directory that holds a ``scann_docids.pkl`` (an index
updated before this, or a planted file) is refused with an error naming it. The rule after
updates (:meth:`ScannIndex.maintenance`): **rebuild** (from the saved embeddings, nothing
re-embedded) when the live count crosses a size boundary of the settings (2,000 or 20,000
blocks by default), **rebalance** (ScaNN's ``rebalance``, then the tuning redone on the same
queries) when ``get_health_stats()``'s ``partition_weighted_avg_relative_imbalance`` has grown
by more than ``rebalance_imbalance`` (0.1) since the last (re)build or more than
``rebalance_changed_fraction`` (25%) of the points were added or deleted since; else nothing.
"""

import copy
import dataclasses
import os
import time
from typing import Any, Dict, Optional, Tuple

from absl import logging
import numpy as np

from realm_tf.retrieval import errors
from realm_tf.retrieval.index import base as index_base
from realm_tf.retrieval.index import tuning as index_tuning
from realm_tf.scann_settings import ScannSettings

SCANN_DIR = "scann"
ROW_IDS_NAME = "row_ids.npy"  # In SCANN_DIR: ScaNN's point -> row, int64.
ASSETS_NAME = "scann_assets.pbtxt"
LEGACY_DOCIDS_NAME = "scann_docids.pkl"  # ScaNN's Python wrapper's pickle: never loaded.
CENTER_NAME = "scann_center.npy"
TUNING_QUERIES_NAME = "tuning_queries.npy"
_UPSERT_BATCH = 256


def _scann():
  """``(scann_ops_pybind, scann_builder)``, imported on first use (loading ScaNN takes time).
  ``scann_ops_pybind.scann_pybind.ScannNumpy`` is the searcher itself (no Python wrapper)."""
  # inside: scann is slow to import; only building or loading a ScaNN index needs it.
  from scann.scann_ops.py import scann_builder  # pylint: disable=g-import-not-at-top
  from scann.scann_ops.py import scann_ops_pybind  # pylint: disable=g-import-not-at-top
  return scann_ops_pybind, scann_builder


def _live_rows(num_blocks: int, deleted: np.ndarray) -> Optional[np.ndarray]:
  """The rows not deleted, or None when none is (the searcher's points are then its rows)."""
  return np.setdiff1d(np.arange(num_blocks), deleted) if len(deleted) else None


def _fallback(tuning: Dict[str, Any], current: Dict[str, Any],
              settings: ScannSettings) -> Optional[Dict[str, Any]]:
  """What to change when the tuning missed its target (see the module doc), or None."""
  if (tuning.get("candidate_recall", 0.0) >= tuning["target_recall"] + tuning["margin"]
      and current["reordering_dtype"] == "int8" and settings.fallback_float32_reordering):
    # The candidates hold the neighbours; int8 rescoring misranks them (near-collapsed
    # embeddings): rescore in float32, the same codes.
    return dict(reordering_dtype="float32")
  if (settings.fallback_dimensions_per_block and
      (settings.fallback_dimensions_per_block < current["dimensions_per_block"] or
       current.get("soar_lambda") is not None)):
    # Finer codes: more of the neighbours in the candidates.
    return dict(dimensions_per_block=settings.fallback_dimensions_per_block, soar_lambda=None)
  return None


def _builder(data: np.ndarray, resolved: Dict[str, Any], num_threads: int):
  """ScaNN's builder for the resolved settings."""
  scann_ops_pybind, scann_builder = _scann()
  # The builder's k only sets a default for search(); we always pass k explicitly.
  builder = scann_ops_pybind.builder(data, 10, "dot_product")
  if resolved["mode"] == "brute_force":
    builder = builder.score_brute_force()
  else:
    if resolved["mode"] == "tree_ah":
      builder = builder.tree(num_leaves=resolved["num_leaves"],
                             num_leaves_to_search=resolved["num_leaves_to_search"],
                             training_sample_size=resolved["training_sample_size"],
                             soar_lambda=resolved["soar_lambda"])
    builder = builder.score_ah(
        resolved["dimensions_per_block"],
        anisotropic_quantization_threshold=resolved["anisotropic_quantization_threshold"],
        training_sample_size=resolved["training_sample_size"])
    quantize = (scann_builder.ReorderType.INT8 if resolved["reordering_dtype"] == "int8"
                else scann_builder.ReorderType.FLOAT32)
    builder = builder.reorder(resolved["reordering_num_neighbors"], quantize=quantize)
  if num_threads:
    builder.set_n_training_threads(num_threads)
  return builder


class ScannIndex(index_base.MipsIndex):
  """ScaNN over the embeddings; see the module doc.

  Build with ``ScannIndex.build(embeddings, ScannSettings())``; the settings actually used,
  including the tuned leaves and reordering depth, are in ``settings()``.
  """

  index_type = "scann"

  def __init__(self, searcher, num_blocks: int, dim: int, resolved: Dict[str, Any],
               embeddings=None, center: Optional[np.ndarray] = None,
               embeddings_path: Optional[str] = None, deleted: Optional[np.ndarray] = None,
               tuning_queries: Optional[np.ndarray] = None,
               tuning_queries_path: Optional[str] = None,
               row_ids: Optional[np.ndarray] = None):
    super().__init__(num_blocks, dim, deleted)
    self.searcher = searcher  # ScaNN's pybind searcher (``ScannNumpy``).
    self.center = center
    self._settings = dict(resolved)
    self._embeddings = embeddings
    self._embeddings_path = embeddings_path
    self._tuning_queries = tuning_queries
    self._tuning_queries_path = tuning_queries_path
    # ScaNN's point -> row, int64 (None: the identity, points are rows 0..n-1).
    self._row_of: Optional[np.ndarray] = (None if row_ids is None
                                          else np.asarray(row_ids, np.int64))
    self.save_embeddings = True  # False for a shard: its index saves every row once.

  # ---- building ----
  @classmethod
  def build(cls, embeddings: np.ndarray, settings: Optional[ScannSettings] = None,
            num_threads: int = 0, tuning_queries: Optional[np.ndarray] = None,
            deleted: Optional[np.ndarray] = None) -> "ScannIndex":
    """Builds the searcher over the live rows, then tunes it to ``settings.target_recall``;
    where the target is out of reach, builds once more as the tuning's diagnosis says.

    Args:
      embeddings: float32 ``[num_blocks, dim]``; kept by reference (for ``save``), not copied
        into the searcher.
      settings: ``ScannSettings`` (defaults if None).
      num_threads: ScaNN training threads (0: all).
      tuning_queries: ``[m, dim]`` queries to tune on (default: ``settings.tuning_queries``
        sample rows of ``embeddings``).
      deleted: rows left out of the searcher (never returned).
    """
    settings = settings or ScannSettings()
    start = time.time()
    index = cls._build_once(embeddings, settings, num_threads, tuning_queries, deleted)
    tried = []
    while True:
      tuning = index._settings.get("tuning")
      if tuning is None or tuning["target_reached"]:
        break
      current = index._settings
      change = _fallback(tuning, current, settings)
      if change is None:
        break
      logging.info("ScaNN: recall@%d %.4f < %.3f; rebuilding with %s", tuning["k"],
                   tuning["recall"], tuning["target_recall"], change)
      tried.append({key: current.get(key) for key in (
          "dimensions_per_block", "soar_lambda", "reordering_dtype", "num_leaves_to_search",
          "reordering_num_neighbors")})
      tried[-1].update(recall=tuning["recall"], candidate_recall=tuning.get("candidate_recall"))
      settings = dataclasses.replace(settings, **change)
      if "dimensions_per_block" in change:
        settings = dataclasses.replace(settings, fallback_dimensions_per_block=None)
      retry = cls._build_once(embeddings, settings, num_threads, tuning_queries, deleted)
      if retry._settings["tuning"]["recall"] < tuning["recall"]:
        break  # Keep the better one.
      index = retry
    if tried:
      index._settings["tuning"]["fallback_from"] = tried
    index.build_seconds = time.time() - start
    return index

  @classmethod
  def _build_once(cls, embeddings, settings: ScannSettings, num_threads: int,
                  tuning_queries: Optional[np.ndarray],
                  deleted: Optional[np.ndarray]) -> "ScannIndex":
    """One build and tuning with exactly ``settings``."""
    if not isinstance(embeddings, index_base.RowTable):
      embeddings = index_base.check_embeddings(embeddings)
    n, dim = embeddings.shape
    deleted = np.unique(np.asarray([] if deleted is None else deleted, np.int64))
    live = _live_rows(n, deleted)
    points = embeddings[:] if live is None else embeddings[live]
    resolved = settings.resolve(len(points))
    tune_leaves = resolved.pop("tune_leaves", False)
    tune_reordering = resolved.pop("tune_reordering", False)
    resolved["requested"] = dataclasses.asdict(settings)  # For rebuilds after updates.
    start = time.time()
    center, data = None, points
    if resolved.get("center"):
      center = np.asarray(points).mean(axis=0, dtype=np.float64).astype(np.float32)
      data = points - center
    searcher = _builder(data, resolved, num_threads).build().searcher  # Point i: live[i].
    del data, points  # The centred copy; ScaNN keeps only its codes and int8 rows.
    index = cls(searcher, n, dim, resolved, embeddings, center, deleted=deleted, row_ids=live)
    index._reset_update_counts()
    if resolved["mode"] != "brute_force" and (tune_leaves or tune_reordering):
      if tuning_queries is None:
        pool = np.arange(n) if live is None else live
        rng = np.random.default_rng(0)
        rows = np.sort(rng.choice(pool, min(len(pool), settings.tuning_queries),
                                  replace=False))
        queries, source, exclude = np.asarray(embeddings[rows]), "embeddings", rows
      else:
        queries, source, exclude = tuning_queries, "given", None
        index._tuning_queries = index_base.check_queries(tuning_queries, dim)
      index.tune(embeddings, queries, settings.target_recall, k=settings.tuning_k,
                 margin=settings.tuning_margin, confidence=settings.tuning_confidence,
                 tune_leaves=tune_leaves, tune_reordering=tune_reordering,
                 max_reordering_num_neighbors=resolved["reordering_num_neighbors"],
                 source=source, exclude=exclude)
    index.build_seconds = time.time() - start
    return index

  # ---- tuning ----
  def tune(self, embeddings, queries: np.ndarray, target_recall: float, k: int = 10,
           tune_leaves: bool = True, tune_reordering: bool = True,
           max_reordering_num_neighbors: Optional[int] = None, source: str = "given",
           exclude: Optional[np.ndarray] = None, margin: float = 0.0,
           confidence: float = 0.0) -> Dict[str, Any]:
    """Sets the fewest leaves, then the fewest reordered candidates, reaching the target
    (``index_tuning.tune``); returns the ``tuning`` record (also in ``settings()``)."""
    return index_tuning.tune(self, embeddings, queries, target_recall, k, tune_leaves,
                             tune_reordering, max_reordering_num_neighbors, source, exclude,
                             margin, confidence)

  def set_search_settings(self, leaves: Optional[int], reorder: int) -> None:
    """Searches with ``leaves`` (a tree) and ``reorder`` candidates, no tuning record (a
    shard, tuned as part of its ``ShardedIndex``)."""
    index_tuning.store_tuning(self._settings, leaves, reorder)

  def apply_tuning(self, leaves: Optional[int], reorder: int, max_reorder: int,
                   record: Dict[str, Any]) -> None:
    """Searches with ``leaves`` (a tree) and ``reorder`` from now on; keeps the record."""
    index_tuning.store_tuning(self._settings, leaves, reorder, max_reorder, record)

  def _retune(self) -> None:
    """The build's tuning again, on the same queries (after a rebalance)."""
    old = self._settings.get("tuning")
    if old is None:
      return
    requested = self._requested()
    tree = self._settings["mode"] == "tree_ah"
    if old["query_source"] == "given":
      queries, exclude = self.tuning_queries(), None
    else:  # Sample live rows, each leaving itself out, as the build did.
      pool = _live_rows(self.num_blocks, self.deleted)
      pool = np.arange(self.num_blocks) if pool is None else pool
      exclude = np.sort(np.random.default_rng(0).choice(
          pool, min(len(pool), old["queries"]), replace=False))
      queries = np.asarray(self.embeddings[exclude])
    self.tune(self.embeddings, queries, old["target_recall"], k=old["k"],
              tune_leaves=tree and requested.num_leaves_to_search is None,
              tune_reordering=requested.reordering_num_neighbors is None,
              max_reordering_num_neighbors=self._settings["max_reordering_num_neighbors"],
              source=old["query_source"], exclude=exclude, margin=old["margin"],
              confidence=old["confidence"])

  def tuning_queries(self) -> np.ndarray:
    """The queries given to the tuning (``tuning_queries.npy`` of a saved index)."""
    if self._tuning_queries is None and self._tuning_queries_path is not None:
      self._tuning_queries = np.load(self._tuning_queries_path)
    if self._tuning_queries is None:
      raise errors.IndexFormatError("this ScannIndex has no saved tuning queries")
    return self._tuning_queries

  # ---- searching ----
  @property
  def embeddings(self):
    """The float32 embeddings: the build's array, ``embeddings.npy`` memory-mapped, or (with
    rows appended since) a ``RowTable`` over them."""
    if self._embeddings is None and self._embeddings_path is not None:
      if os.path.exists(self._embeddings_path):
        self._embeddings = np.load(self._embeddings_path, mmap_mode="r")
    if self._embeddings is None:
      raise ValueError("this ScannIndex was loaded without its embeddings")
    return self._embeddings

  def set_rows(self, table) -> None:
    """Serves ``embeddings`` (the exact rescoring's rows) from ``table``: a shard's view of
    its index's table, so that no shard holds its rows."""
    self._embeddings, self._embeddings_path = table, None

  def _point_rows(self) -> Optional[np.ndarray]:
    """ScaNN's point -> row (None: points are rows)."""
    return self._row_of

  def _raw_search(self, queries, k: int, pre: int, leaves: Optional[int]):
    """ScaNN's top ``k`` (rows, centred scores); the point -> row mapping is one NumPy
    gather."""
    parallel = len(queries) > 1
    ids, scores = self.searcher.search_batched(
        queries, k, pre, -1 if leaves is None else leaves, parallel, 256 if parallel else 0)
    ids = np.asarray(ids).astype(np.int64).reshape(len(queries), -1)
    rows = self._point_rows()
    if rows is not None:
      ids = np.where((ids >= 0) & (ids < len(rows)), rows[np.clip(ids, 0, len(rows) - 1)], -1)
    return ids, np.asarray(scores, np.float32).reshape(len(queries), -1)

  def _search_args(self, k: int, leaves_to_search: Optional[int],
                   reordering_num_neighbors: Optional[int]):
    """``(pre, leaves)``: candidates reordered and leaves searched (the settings' unless
    given)."""
    pre = max(k, reordering_num_neighbors or self._settings.get("reordering_num_neighbors", k))
    leaves = None
    if self._settings.get("mode") == "tree_ah":
      leaves = int(leaves_to_search or self._settings["num_leaves_to_search"])
    return pre, leaves

  def candidates(self, queries, depth: int, leaves_to_search: Optional[int] = None,
                 reordering_num_neighbors: Optional[int] = None):
    """The best ``depth`` rows by ScaNN's own (int8-reordered) scores, the centre's term added
    back: ``(rows [b, depth] (-1: none), approximate scores)``. ``queries``: checked."""
    pre, leaves = self._search_args(depth, leaves_to_search, reordering_num_neighbors)
    ids, scores = self._raw_search(queries, depth, pre, leaves)
    if self.center is not None:
      scores = scores + (queries @ self.center)[:, np.newaxis]
    return index_base.pad(ids, scores, depth)

  def search(self, queries, k, leaves_to_search: Optional[int] = None,
             reordering_num_neighbors: Optional[int] = None):
    """Top ``k``; ``leaves_to_search`` / ``reordering_num_neighbors`` override the settings."""
    queries = index_base.check_queries(queries, self.dim)
    k = index_base.check_k(k, self.num_live)
    pre, leaves = self._search_args(k, leaves_to_search, reordering_num_neighbors)
    rescore = int(self._settings.get("exact_rescoring") or 0)
    if k <= rescore and self._settings.get("mode") != "brute_force":
      table = self._rescoring_table()
      if table is not None:
        return self._search_rescored(queries, k, min(rescore, self.num_live), leaves,
                                     max(pre, rescore), table)
    return self.candidates(queries, k, leaves_to_search, reordering_num_neighbors)

  def _rescoring_table(self):
    try:
      return self.embeddings
    except ValueError:
      return None  # Loaded without its embeddings file: int8 order only.

  def _search_rescored(self, queries, k, depth, leaves, pre, table):
    """The best ``depth`` by int8 reordering, scored exactly from ``table``; the top ``k``."""
    ids, _ = self._raw_search(queries, depth, pre, leaves)
    valid = ids >= 0
    scores = np.einsum("bd,bkd->bk", queries, np.asarray(table[np.where(valid, ids, 0)]),
                       dtype=np.float32)
    scores[~valid] = -np.inf
    top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    ids, scores = np.take_along_axis(ids, top, 1), np.take_along_axis(scores, top, 1)
    ids[~np.isfinite(scores)] = -1
    return index_base.pad(ids, scores.astype(np.float32), k)

  def settings(self):
    return copy.deepcopy(self._settings)

  # ---- updates ----
  def _reset_update_counts(self) -> None:
    imbalance = self.health().get("partition_weighted_avg_relative_imbalance", 0.0)
    self._settings["updates"] = {"appended": 0, "deleted": 0, "points": self.num_live,
                                 "imbalance": float(imbalance)}

  def _append(self, rows, embeddings):
    data = embeddings if self.center is None else embeddings - self.center
    # New points (None: no point to replace) go after the searcher's last, in order.
    self.searcher.upsert([None] * len(rows), np.ascontiguousarray(data, np.float32),
                         _UPSERT_BATCH)
    if self._row_of is not None:  # Else the points stay rows 0..n-1: rows are num_blocks...
      self._row_of = np.concatenate([self._row_of, rows])
    self._embeddings = index_base.RowTable.extend(self.embeddings, embeddings)
    self._settings["updates"]["appended"] += len(rows)

  def _delete(self, rows):
    """ScaNN deletes point by point, moving its last point into each deleted one's place; the
    row ids follow the same moves."""
    size = self.searcher.size()
    row_of = (np.arange(size, dtype=np.int64) if self._row_of is None
              else self._row_of.copy())
    small = np.int32 if size < np.iinfo(np.int32).max else np.int64
    point_of = np.full(self.num_blocks, -1, small)  # Row -> point, while deleting only.
    point_of[row_of] = np.arange(size, dtype=small)
    points = []
    for row in rows.tolist():
      point = int(point_of[row])
      if point < 0:
        raise errors.IndexFormatError(f"row {row} is not in the ScaNN searcher")
      points.append(point)
      size -= 1
      moved = int(row_of[size])
      row_of[point], point_of[moved], point_of[row] = moved, point, -1
    self.searcher.delete(points)
    self._row_of = row_of[:size]  # A view: the buffer's tail is len(rows) ids.
    self._settings["updates"]["deleted"] += len(rows)

  def _requested(self) -> ScannSettings:
    """The settings the index was built from (defaults for an index saved before they were
    recorded)."""
    return ScannSettings(**self._settings.get("requested", {}))

  def health(self) -> Dict[str, float]:
    """ScaNN's ``get_health_stats()`` (partition balance; zeros without a tree)."""
    return dict(self.searcher.get_health_stats())

  def maintenance(self) -> Optional[str]:
    """What the updates since the last (re)build call for: ``"rebuild"``, ``"rebalance"`` or
    None (the rule is in the module doc)."""
    requested = self._requested()
    if requested.resolve(self.num_live)["mode"] != self._settings["mode"]:
      return "rebuild"
    counts = self._settings["updates"]
    changed = counts["appended"] + counts["deleted"]
    if changed > requested.rebalance_changed_fraction * counts["points"]:
      return "rebalance"
    if self._settings["mode"] == "tree_ah":
      imbalance = self.health()["partition_weighted_avg_relative_imbalance"]
      if imbalance - counts["imbalance"] > requested.rebalance_imbalance:
        return "rebalance"
    return None

  def maintained(self) -> Tuple["ScannIndex", Optional[str]]:
    """``(index, action)``: this index rebalanced or a rebuilt one, as :meth:`maintenance`
    says (``action`` None: this one, unchanged)."""
    action = self.maintenance()
    if action == "rebuild":
      old = self._settings.get("tuning")
      given = old is not None and old["query_source"] == "given"
      rebuilt = ScannIndex.build(self.embeddings, self._requested(),
                                 tuning_queries=self.tuning_queries() if given else None,
                                 deleted=self.deleted)
      # The rebuild is also the sparse part's merge (its deleted blocks' postings go).
      rebuilt.sparse = self.sparse.merged() if self.sparse is not None else None
      logging.info("ScaNN: rebuilt after updates (%d live blocks: mode %s -> %s)",
                   self.num_live, self._settings["mode"], rebuilt._settings["mode"])
      return rebuilt, action
    if action == "rebalance":
      start = time.time()
      before = self._settings["updates"]
      self.searcher.rebalance("")  # Retrains on its current points; they keep their places.
      self._reset_update_counts()
      self._retune()
      logging.info("ScaNN: rebalanced after %s (imbalance %.3f -> %.3f) in %.1f s", before,
                   before["imbalance"], self._settings["updates"]["imbalance"],
                   time.time() - start)
    return self, action

  # ---- saving and loading ----
  def _save_artifacts(self, directory):
    if self.save_embeddings and (self._embeddings is not None or
                                 self._embeddings_path is not None):
      path = os.path.join(directory, index_base.EMBEDDINGS_NAME)
      index_base.save_npy(path, self.embeddings)
      # From now on the saved file serves ``embeddings`` (memory-mapped, not resident), so
      # the index no longer pins the caller's array.
      self._embeddings = np.load(path, mmap_mode="r")
      self._embeddings_path = path
    if self._tuning_queries is not None or self._tuning_queries_path is not None:
      index_base.save_npy(os.path.join(directory, TUNING_QUERIES_NAME), self.tuning_queries())
    scann_dir = os.path.join(directory, SCANN_DIR)
    os.makedirs(scann_dir, exist_ok=True)
    if self.center is not None:
      np.save(os.path.join(directory, CENTER_NAME), self.center)
    # Relative paths, so the directory can be renamed into place after writing.
    self.searcher.serialize(scann_dir, True)
    if self._row_of is not None:
      index_base.save_npy(os.path.join(scann_dir, ROW_IDS_NAME), self._row_of)

  @classmethod
  def load(cls, directory: str, manifest: dict, load_embeddings: bool = False) -> "ScannIndex":
    """The index saved in ``directory`` (whose checked ``manifest`` is given)."""
    n, dim = int(manifest["num_blocks"]), int(manifest["dim"])
    scann_dir = os.path.join(directory, SCANN_DIR)
    searcher = _load_searcher(scann_dir)
    row_ids = _load_row_ids(scann_dir, n)
    embeddings_path = os.path.join(directory, index_base.EMBEDDINGS_NAME)
    embeddings = None
    if load_embeddings and os.path.exists(embeddings_path):
      embeddings = np.load(embeddings_path, mmap_mode="r")
    center = None
    if manifest["settings"].get("center"):
      center = np.load(os.path.join(directory, CENTER_NAME))
      if center.shape != (dim,):
        raise errors.IndexFormatError(f"{directory}/{CENTER_NAME} has shape {center.shape}")
    queries = os.path.join(directory, TUNING_QUERIES_NAME)
    index = cls(searcher, n, dim, manifest["settings"], embeddings, center,
                embeddings_path=embeddings_path,
                deleted=index_base.load_deleted(directory, manifest),
                tuning_queries_path=queries if os.path.exists(queries) else None,
                row_ids=row_ids)
    size = searcher.size()
    if size != index.num_live:
      raise errors.IndexFormatError(f"{scann_dir} holds {size} points, the manifest says "
                                    f"{index.num_live} live blocks")
    if row_ids is None and len(index.deleted):
      raise errors.IndexFormatError(f"{scann_dir} has no {ROW_IDS_NAME} but the manifest says "
                                    f"{len(index.deleted)} rows are deleted: rebuild the index "
                                    "(realm-index build)")
    if row_ids is not None and len(row_ids) != size:
      raise errors.IndexFormatError(f"{scann_dir}/{ROW_IDS_NAME} holds {len(row_ids)} ids for "
                                    f"{size} points: rebuild the index (realm-index build)")
    index._settings.setdefault("updates", {"appended": 0, "deleted": 0, "points": size,
                                           "imbalance": 0.0})
    return index


def _load_searcher(scann_dir: str):
  """ScaNN's pybind searcher saved in ``scann_dir``, from its assets list; never unpickles
  (see the module doc), never writes into the directory."""
  legacy = os.path.join(scann_dir, LEGACY_DOCIDS_NAME)
  if os.path.lexists(legacy):
    raise errors.UnsafeIndexError(
        f"{legacy}: a pickle, which realm_tf never loads (unpickling a file runs the code of "
        "whoever could write it). ScaNN's wrapper saved the row ids so for indexes updated "
        f"before realm_tf stored them as {ROW_IDS_NAME}; rebuild the index (realm-index build, "
        "or the next realm-refresh build): the rebuild becomes LATEST and updates apply on top")
  assets = os.path.join(scann_dir, ASSETS_NAME)
  if not os.path.isfile(assets):
    raise errors.IndexFormatError(f"{scann_dir}: no ScaNN artifacts ({ASSETS_NAME}); rebuild "
                                  "the index (realm-index build)")
  scann_ops_pybind, _ = _scann()
  try:
    with open(assets) as f:
      return scann_ops_pybind.scann_pybind.ScannNumpy(scann_dir, f.read())
  except Exception as e:  # pylint: disable=broad-except
    raise errors.IndexFormatError(f"cannot load the ScaNN searcher in {scann_dir}: "
                                  f"{str(e).splitlines()[0] if str(e) else e!r}") from None


def _load_row_ids(scann_dir: str, num_blocks: int) -> Optional[np.ndarray]:
  """``row_ids.npy`` of a saved searcher (None when absent: points are rows), checked."""
  path = os.path.join(scann_dir, ROW_IDS_NAME)
  if not os.path.exists(path):
    return None
  try:
    ids = np.load(path, allow_pickle=False)
  except (OSError, ValueError) as e:
    raise errors.IndexFormatError(f"cannot read {path}: {e}") from None
  if ids.ndim != 1 or ids.dtype.kind not in "iu":
    raise errors.IndexFormatError(f"{path}: expected int64 row ids, got {ids.dtype} "
                                  f"{ids.shape}")
  if ids.size and (ids.min() < 0 or ids.max() >= num_blocks):
    raise errors.IndexFormatError(f"{path}: row ids outside [0, {num_blocks})")
  return ids.astype(np.int64, copy=False)


def searcher_bytes(directory: str) -> int:
  """Bytes of a saved ScaNN searcher: its ``scann/`` assets and the centre, not embeddings.

  This is what ``load_dense_index`` reads into memory (the asymmetric-hashing codes are packed
  two per byte once loaded, so the resident size is a little smaller).
  """
  shards = os.path.join(directory, "shards")  # A ShardedIndex: the sum of its shards'.
  if os.path.isdir(shards):
    return sum(searcher_bytes(os.path.join(shards, d)) for d in sorted(os.listdir(shards)))
  total = 0
  for root, _, files in os.walk(os.path.join(directory, SCANN_DIR)):
    total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
  center = os.path.join(directory, CENTER_NAME)
  return total + (os.path.getsize(center) if os.path.exists(center) else 0)
