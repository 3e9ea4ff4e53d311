"""A ScaNN index built in shards, so that the build's memory does not grow with the corpus.

A corpus whose build would not fit ``ScannSettings.build_memory_gib`` (:func:`rows_per_shard`)
is split into **shards**: contiguous row ranges ``[start, stop)`` of nearly equal size, each a
``ScannIndex`` over its own rows (local rows ``0 .. stop - start - 1``). What stays resident is
every shard's searcher (~176 bytes per 128-d block, no float32 row); the float32 rows are read
one shard at a time, and then only memory-mapped for the exact rescoring, as in an unsharded
index.

**Build** (:meth:`ShardedIndex.build`). For each shard in turn: its rows are read from the
embeddings (a memory-mapped ``.npy`` with plain file reads, so the mapping is never touched
whole and the pages read are not held by the process), its searcher is built, the tuning
queries' exact top ``k + 1`` over those rows is kept, and the rows are dropped. The peak is
the searchers built so far plus one shard's build (its rows, their centred copy and ScaNN's
own copy, ~``_BUILD_BYTES_PER_FLOAT`` bytes per float).

**Tuning over the whole index.** The shards are built untuned; the merged exact top ``k`` of
the tuning queries is the reference, and ``index_tuning.tune`` chooses one number of leaves
(per shard) and one reordering depth for every shard by measuring the merged search, exactly
as for one index: the recall target holds for the whole index, not for each shard.

**Search**, as one index searches: every shard returns its best ``exact_rescoring`` (100) by
ScaNN's own int8-reordered scores (the centre's term added back, so that shards compare); the
best 100 of those over all shards are scored exactly from the float32 rows, and the top ``k``
returned, ordered by score, ties by the lower block id. Without exact rescoring (``k`` above
it, or shards scored exactly by ScaNN) the shards' top ``k`` are merged the same way.

**Updates.** Appended rows join the last shard; a deleted row is deleted in its shard. After
updates each shard follows ScaNN's rebalance or rebuild rule on its own
(``ScannIndex.maintained``) and keeps the whole index's tuned leaves and depth; the tuning is
not redone (the refresher measures the recall of what it publishes).

**Saved as** (``MipsIndex.save``)::

    manifest.json     index_type "scann_sharded"; settings.shards: [{start, num_blocks}]
    embeddings.npy    float32 [num_blocks, dim], every row (streamed, never held whole)
    deleted.npy       the deleted rows (block ids), when any
    shards/00000/     shard 0: a ScannIndex directory without embeddings.npy (its rows are
                      embeddings.npy[start:start + num_blocks]); its own manifest, local rows

Shards are also the unit a deployment would place on separate hosts (``experiments/NOTES.md``,
"The index in shards").
"""

import dataclasses
import math
import mmap
import os
import time
from typing import Any, Dict, List, Optional, Sequence

from absl import logging
import numpy as np

from realm_tf.retrieval import errors
from realm_tf.retrieval.index import base as index_base
from realm_tf.retrieval.index import brute_force
from realm_tf.retrieval.index import tuning as index_tuning
from realm_tf.retrieval.index.scann_index import ScannIndex
from realm_tf.scann_settings import ScannSettings

SHARDS_DIR = "shards"
INDEX_TYPE = "scann_sharded"
# Resident bytes per block of a built searcher (int8 row, packed codes, leaf id, ids), with
# headroom: 176 measured at 10^6 blocks (``scann_index``'s module doc).
_SEARCHER_BYTES_PER_BLOCK = 200
# Transient bytes per float32 of a shard while its searcher is built: the rows read, their
# centred copy, ScaNN's own copy of the dataset and its training buffers (measured: ~23 for a
# one-piece build of 160k x 64, tests/test_sharded_index.py; NOTES, "The index in shards").
_BUILD_BYTES_PER_FLOAT = 24
# The smallest shard a budget may ask for (tests lower it to shard tiny corpora).
MIN_ROWS_PER_SHARD = 100_000
_READ_ROWS = 1 << 16


def rows_per_shard(num_blocks: int, dim: int, budget_gib: Optional[float]) -> int:
  """The most rows a shard may hold so that the build fits ``budget_gib`` (``num_blocks``
  when one piece fits, or when there is no budget): the searchers of every shard stay
  resident, and one shard is built at a time."""
  if budget_gib is None:
    return num_blocks
  budget = float(budget_gib) * 2**30
  if num_blocks * (_SEARCHER_BYTES_PER_BLOCK + dim * _BUILD_BYTES_PER_FLOAT) <= budget:
    return num_blocks
  spare = budget - num_blocks * _SEARCHER_BYTES_PER_BLOCK
  rows = int(spare // (dim * _BUILD_BYTES_PER_FLOAT)) if spare > 0 else 0
  if rows < MIN_ROWS_PER_SHARD:
    logging.warning("build_memory_gib=%s leaves room for shards of %d rows only (the %d "
                    "blocks' searchers alone take %.1f GiB); using shards of %d rows",
                    budget_gib, rows, num_blocks,
                    num_blocks * _SEARCHER_BYTES_PER_BLOCK / 2**30, MIN_ROWS_PER_SHARD)
  return max(rows, MIN_ROWS_PER_SHARD, 1)


def shard_bounds(num_blocks: int, max_rows: int) -> List[int]:
  """Starts of nearly equal shards of at most ``max_rows`` rows, and ``num_blocks`` last."""
  count = max(1, math.ceil(num_blocks / max(1, max_rows)))
  return [num_blocks * i // count for i in range(count + 1)]


def read_rows(table, start: int, stop: int) -> np.ndarray:
  """Rows ``start .. stop - 1`` of ``table`` as a new float32 array. A whole memory-mapped
  ``.npy`` is read with plain file reads: its mapping is never touched, so the pages read
  are the page cache's, not this process's."""
  if isinstance(table, index_base.RowTable):
    n = len(table.base)
    base = read_rows(table.base, start, min(stop, n)) if start < n else None
    extra = table.extra[max(start - n, 0):max(stop - n, 0)]
    return extra.copy() if base is None else np.concatenate([base, extra])
  if (isinstance(table, np.memmap) and isinstance(table.base, mmap.mmap) and table.filename
      and table.dtype == np.float32 and table.flags.c_contiguous and table.ndim == 2):
    dim = table.shape[1]
    with open(table.filename, "rb") as f:
      f.seek(table.offset + start * dim * 4)
      out = np.fromfile(f, np.float32, (stop - start) * dim)
    if out.size != (stop - start) * dim:
      raise errors.IndexFormatError(f"{table.filename}: short read of rows {start}..{stop}")
    return out.reshape(stop - start, dim)
  return np.array(table[start:stop], np.float32)


def stream_npy(path: str, table) -> None:
  """Writes ``table`` (array, memory map or ``RowTable``) as a float32 ``.npy``, a chunk of
  rows at a time (nothing held whole, no mapping touched); through a temporary name."""
  tmp = f"{path}.tmp-{os.getpid()}.npy"
  with open(tmp, "wb") as f:
    np.lib.format.write_array_header_1_0(
        f, {"descr": "<f4", "fortran_order": False, "shape": tuple(table.shape)})
    for start in range(0, len(table), _READ_ROWS):
      stop = min(start + _READ_ROWS, len(table))
      f.write(np.ascontiguousarray(read_rows(table, start, stop), "<f4").tobytes())
  os.replace(tmp, path)


class ExactTop:
  """The exact top ``kk`` of fixed queries, merged shard by shard."""

  def __init__(self, queries: np.ndarray, kk: int):
    self.queries, self.kk = queries, kk
    self.ids = np.zeros([len(queries), 0], np.int64)
    self.scores = np.zeros([len(queries), 0], np.float32)

  def add(self, rows: np.ndarray, start: int, deleted: np.ndarray) -> None:
    exact = brute_force.BruteForceIndex(rows, check=False, deleted=deleted)
    kk = min(self.kk, exact.num_live)
    found = [exact.search(self.queries[i:i + 128], kk) for i in range(0, len(self.queries), 128)]
    ids = np.concatenate([f[0] for f in found]) + start
    scores = np.concatenate([f[1] for f in found])
    self.ids, self.scores = _merge([self.ids, ids], [self.scores, scores], self.kk)

  def kth(self, k: int, exclude: Optional[np.ndarray]) -> np.ndarray:
    if exclude is None:
      return self.scores[:, k - 1]
    return index_tuning.drop_excluded(self.ids, self.scores, exclude)[1][:, k - 1]


def _merge(ids: Sequence[np.ndarray], scores: Sequence[np.ndarray], k: int):
  """The top ``k`` of per-shard results (global ids; -1 with -inf: none): by score, ties by
  the lower id."""
  ids, scores = np.concatenate(ids, axis=1), np.concatenate(scores, axis=1)
  order = np.lexsort((ids, -scores), axis=-1)[:, :k]
  return np.take_along_axis(ids, order, 1), np.take_along_axis(scores, order, 1)


def _global(ids: np.ndarray, start: int) -> np.ndarray:
  """A shard's rows as block ids (-1 stays -1)."""
  return np.where(ids >= 0, ids + start, -1)


def _shard_view(table, start: int, stop: int):
  """The shard's rows of the whole table without a copy (a memory map stays one)."""
  if isinstance(table, index_base.RowTable):
    n = len(table.base)
    if stop <= n:
      return table.base[start:stop]
    return index_base.RowTable(table.base[start:n], table.extra)
  return table[start:stop]


class ShardedIndex(index_base.MipsIndex):
  """ScaNN shards searched as one index; see the module doc."""

  index_type = INDEX_TYPE

  def __init__(self, shards: List[ScannIndex], starts: Sequence[int], dim: int,
               resolved: Dict[str, Any], embeddings, deleted: Optional[np.ndarray] = None,
               embeddings_path: Optional[str] = None):
    num_blocks = int(starts[-1]) + shards[-1].num_blocks
    super().__init__(num_blocks, dim, deleted)
    self.shards, self.starts = list(shards), [int(s) for s in starts]
    self._settings = dict(resolved)
    self._embeddings = embeddings
    self._embeddings_path = embeddings_path
    for shard in self.shards:
      shard.save_embeddings = False

  # ---- building ----
  @classmethod
  def build(cls, embeddings, settings: Optional[ScannSettings] = None, max_rows: int = 0,
            tuning_queries: Optional[np.ndarray] = None, deleted: Optional[np.ndarray] = None,
            num_threads: int = 0) -> "ShardedIndex":
    """Builds the shards one at a time, then tunes the whole index (module doc).

    Args:
      embeddings: float32 ``[num_blocks, dim]``, best a memory-mapped ``.npy`` (read a shard
        at a time, kept by reference for saving and the exact rescoring).
      settings: ``ScannSettings`` (each shard is built with them, untuned).
      max_rows: rows per shard at most (0: from ``settings.build_memory_gib``).
      tuning_queries, deleted, num_threads: as for ``ScannIndex.build``.
    """
    settings = settings or ScannSettings()
    start_time = time.time()
    if not isinstance(embeddings, (index_base.RowTable, np.memmap)):
      embeddings = np.asarray(embeddings)  # A memory map stays one: read_rows reads it.
    if len(embeddings.shape) != 2 or not embeddings.shape[0]:
      index_base.check_embeddings(embeddings)  # Raises the usual error.
    n, dim = embeddings.shape
    max_rows = max_rows or rows_per_shard(n, dim, settings.build_memory_gib)
    bounds = shard_bounds(n, max_rows)
    deleted = np.unique(np.asarray([] if deleted is None else deleted, np.int64))
    untuned = dataclasses.replace(settings, target_recall=None)
    tuning = settings.target_recall is not None and n - len(deleted) > 1
    queries = exclude = None
    source = "given"
    if tuning:
      if tuning_queries is None:
        pool = np.setdiff1d(np.arange(n), deleted)
        exclude = np.sort(np.random.default_rng(0).choice(
            pool, min(len(pool), settings.tuning_queries), replace=False))
        queries, source = np.asarray(embeddings[exclude], np.float32), "embeddings"
      else:
        queries = index_base.check_queries(tuning_queries, dim)
      k = min(settings.tuning_k, n - len(deleted) - (exclude is not None))
      exact = ExactTop(queries, k + (exclude is not None))
    shards = []
    for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
      begin = time.time()
      rows = read_rows(embeddings, lo, hi)
      local = deleted[(deleted >= lo) & (deleted < hi)] - lo
      if len(local) == hi - lo:
        raise errors.EmptyCorpusError(f"every row of shard {i} (rows {lo}..{hi - 1}) is deleted")
      shard = ScannIndex.build(rows, untuned, num_threads=num_threads, deleted=local)
      if tuning:
        exact.add(rows, lo, local)
      del rows
      shard.set_rows(_shard_view(embeddings, lo, hi))
      shards.append(shard)
      logging.info("sharded index: shard %d/%d (rows %d..%d) built in %.1f s", i + 1,
                   len(bounds) - 1, lo, hi - 1, time.time() - begin)
    first = shards[0].settings()
    resolved = {key: first[key] for key in (
        "mode", "num_leaves_to_search", "reordering_num_neighbors", "exact_rescoring")
        if key in first}
    resolved.update(max_reordering_num_neighbors=first.get("reordering_num_neighbors"),
                    requested=dataclasses.asdict(settings), rows_per_shard=int(max_rows))
    if first["mode"] == "tree_ah":
      resolved["num_leaves"] = min(s.settings()["num_leaves"] for s in shards)
    index = cls(shards, bounds[:-1], dim, resolved, embeddings, deleted)
    if tuning and first["mode"] != "brute_force":
      index_tuning.tune(
          index, embeddings, queries, settings.target_recall, k=k,
          tune_leaves=settings.num_leaves_to_search is None,
          tune_reordering=settings.reordering_num_neighbors is None,
          max_reordering_num_neighbors=resolved["max_reordering_num_neighbors"], source=source,
          exclude=exclude, margin=settings.tuning_margin, confidence=settings.tuning_confidence,
          kth=exact.kth(k, exclude))
    index.build_seconds = time.time() - start_time
    logging.info("sharded index: %d shards of <= %d rows over %d blocks in %.1f s",
                 len(shards), max_rows, n, index.build_seconds)
    return index

  # ---- tuning (``index_tuning.tune``'s interface) ----
  def apply_tuning(self, leaves: Optional[int], reorder: int, max_reorder: int,
                   record: Dict[str, Any]) -> None:
    index_tuning.store_tuning(self._settings, leaves, reorder, max_reorder, record)
    self._share_tuning()

  def _share_tuning(self) -> None:
    """Every shard searches with the whole index's leaves and depth."""
    for shard in self.shards:
      if shard.settings()["mode"] == "tree_ah" and "num_leaves_to_search" in self._settings:
        shard.set_search_settings(self._settings["num_leaves_to_search"],
                                  self._settings["reordering_num_neighbors"])
      elif shard.settings()["mode"] != "brute_force":
        shard.set_search_settings(None, self._settings["reordering_num_neighbors"])

  # ---- searching ----
  @property
  def embeddings(self):
    """Every row, float32: the build's table, or ``embeddings.npy`` memory-mapped."""
    if self._embeddings is None and self._embeddings_path is not None:
      self._embeddings = np.load(self._embeddings_path, mmap_mode="r")
    if self._embeddings is None:
      raise ValueError("this ShardedIndex has no embeddings")
    return self._embeddings

  def search(self, queries, k, leaves_to_search: Optional[int] = None,
             reordering_num_neighbors: Optional[int] = None):
    """The top ``k`` of the merged shards (module doc); ties: the lower block id."""
    queries = index_base.check_queries(queries, self.dim)
    k = index_base.check_k(k, self.num_live)
    live = [(start, shard) for start, shard in zip(self.starts, self.shards) if shard.num_live]
    rescore = int(self._settings.get("exact_rescoring") or 0)
    if self._settings.get("mode") != "brute_force" and k <= rescore:
      # As one index: the best ``rescore`` by ScaNN's scores over every shard, then those
      # scored exactly.
      depth = min(rescore, self.num_live)
      found = [shard.candidates(queries, min(depth, shard.num_live), leaves_to_search,
                                reordering_num_neighbors) for _, shard in live]
      ids, _ = _merge([_global(f[0], start) for f, (start, _) in zip(found, live)],
                      [f[1] for f in found], depth)
      valid = ids >= 0
      scores = np.einsum("bd,bkd->bk", queries,
                         np.asarray(self.embeddings[np.where(valid, ids, 0)]), dtype=np.float32)
      scores[~valid] = -np.inf
      ids, scores = _merge([ids], [scores], k)
    else:
      found = [shard.search(queries, min(k, shard.num_live), leaves_to_search,
                            reordering_num_neighbors) for _, shard in live]
      ids, scores = _merge([_global(f[0], start) for f, (start, _) in zip(found, live)],
                           [f[1] for f in found], k)
    return index_base.pad(ids, scores, k)

  def settings(self):
    out = dict(self._settings)
    out["shards"] = [{"start": s, "num_blocks": shard.num_blocks}
                     for s, shard in zip(self.starts, self.shards)]
    return out

  # ---- updates ----
  def _append(self, rows, embeddings):
    self.shards[-1].append(embeddings)
    self._embeddings = index_base.RowTable.extend(self.embeddings, embeddings)

  def _delete(self, rows):
    which = np.searchsorted(self.starts, rows, side="right") - 1
    for i in np.unique(which):
      self.shards[i].delete(rows[which == i] - self.starts[i])

  def maintained(self):
    """``(self, action)``: each shard rebalanced or rebuilt as its rule says
    (``ScannIndex.maintained``), keeping the whole index's tuning; ``action``: the strongest
    one taken (None, "rebalance", "rebuild")."""
    actions = []
    for i, shard in enumerate(self.shards):
      new, action = shard.maintained()
      if action == "rebuild":
        new.set_rows(_shard_view(self.embeddings, self.starts[i],
                                 self.starts[i] + new.num_blocks))
        new.save_embeddings = False
      self.shards[i] = new
      actions.append(action)
    self._share_tuning()
    for action in ("rebuild", "rebalance"):
      if action in actions:
        return self, action
    return self, None

  # ---- saving and loading ----
  def _save_artifacts(self, directory):
    path = os.path.join(directory, index_base.EMBEDDINGS_NAME)
    stream_npy(path, self.embeddings)
    self._embeddings, self._embeddings_path = np.load(path, mmap_mode="r"), path
    for i, (start, shard) in enumerate(zip(self.starts, self.shards)):
      shard.save(os.path.join(directory, SHARDS_DIR, f"{i:05d}"))
      shard.set_rows(_shard_view(self._embeddings, start, start + shard.num_blocks))

  @classmethod
  def load(cls, directory: str, manifest: dict) -> "ShardedIndex":
    """The sharded index saved in ``directory`` (whose checked ``manifest`` is given)."""
    n, dim = int(manifest["num_blocks"]), int(manifest["dim"])
    path = os.path.join(directory, index_base.EMBEDDINGS_NAME)
    table = index_base.map_embeddings(directory, manifest)
    entries = manifest["settings"].get("shards") or []
    shards, starts, expected = [], [], 0
    for i, entry in enumerate(entries):
      shard_dir = os.path.join(directory, SHARDS_DIR, f"{i:05d}")
      shard_manifest = index_base.read_manifest(shard_dir)
      start, rows = int(entry["start"]), int(entry["num_blocks"])
      if start != expected or int(shard_manifest["num_blocks"]) != rows:
        raise errors.IndexFormatError(
            f"{shard_dir}: {shard_manifest['num_blocks']} rows from {start}, the manifest of "
            f"{directory} says {rows} rows from {expected}: the shards do not tile the index")
      shard = ScannIndex.load(shard_dir, shard_manifest)
      shard.set_rows(table[start:start + rows])
      shards.append(shard)
      starts.append(start)
      expected = start + rows
    if expected != n or not shards:
      raise errors.IndexFormatError(f"{directory}: the shards hold {expected} rows, the "
                                    f"manifest says {n}")
    settings = {k: v for k, v in manifest["settings"].items() if k != "shards"}
    index = cls(shards, starts, dim, settings, table,
                deleted=index_base.load_deleted(directory, manifest), embeddings_path=path)
    local = np.concatenate([s.deleted + start for s, start in zip(shards, starts)])
    if not np.array_equal(np.sort(local), index.deleted):
      raise errors.IndexFormatError(f"{directory}: the shards' deleted rows differ from "
                                    f"{index_base.DELETED_NAME}")
    index._share_tuning()
    return index
