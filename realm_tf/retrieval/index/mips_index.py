"""Maximum inner product search over block embeddings: ScaNN, and exact brute force.

The public face of the indexes; the parts live in

* ``base``: the ``MipsIndex`` interface (``search``, ``append``, ``delete``, ``save``),
  the artifacts' names, ``read_manifest``, ``RowTable``;
* ``brute_force``: ``BruteForceIndex``, exact;
* ``realm_tf.scann_settings``: ``ScannSettings``, ScaNN's settings by corpus size;
* ``scann_index``: ``ScannIndex``, the only module that imports ``scann``;
* ``tuning``: recall against exact search and the build-time tuning;
* ``sharded_index``: ``ShardedIndex``, ScaNN in shards for corpora whose build would exceed
  ``ScannSettings.build_memory_gib``.

``search(queries, k)`` returns ``(block_ids int64 [b, k], scores float32 [b, k])`` sorted by
decreasing score, where a block id is the row of the embedding table (= ``block_id`` of the
corpus). ``save(dir)`` writes the artifacts, ``embeddings.npy`` and ``manifest.json`` (last);
``load_dense_index(dir, expected_dim=..., expected_fingerprint=...)`` reads the dense index
back and refuses an index that does not fit. A published directory may also hold a sparse
part: callers load it with ``realm_tf.retrieval.publication.index_io.load_index``, which
adds it.

**Build-time recall target.** How many leaves to search and how many candidates to rescore
(``R``) are not fixed fractions: after building, the index measures its recall@10 against
exact search on a sample of queries (``target_recall``, default 0.95, required of the
sample's mean less two standard errors, plus a ``tuning_margin`` of 0.005; ties count as
hits, as in ``measure_recall``). For each depth ``R`` in (100, 300, 1000) it finds the fewest
leaves reaching that (galloping, then bisection), times those pairs on the sample at batch 128
and keeps the fastest; then the smallest ``R`` on a finer ladder that still reaches it at those
leaves. The sample is the caller's queries (the refresher passes query-tower embeddings of
sample blocks) or, by default, ``tuning_queries`` rows of the embeddings, each leaving its own
row out of its neighbours. The chosen values and the recall they measured go into
``settings()`` and so into the manifest (``settings.num_leaves_to_search``,
``settings.reordering_num_neighbors``, ``settings.tuning``); a loaded index searches with them.
A value given explicitly (``num_leaves_to_search=...``, ``reordering_num_neighbors=...``) is
used as given.

**Updates.** Rows are block ids and never move: ``append`` adds blocks as the next rows,
``delete`` removes rows from the results for good (``num_blocks`` counts every row,
``num_live`` the searchable ones). Both index types support them; ScaNN through its own
``upsert``/``delete``, rebalanced or rebuilt when its health says so (``scann_index``).
"""

from typing import Optional, Sequence, Union

import numpy as np

from realm_tf.retrieval import errors
from realm_tf.retrieval.index import base as index_base
from realm_tf.retrieval.index import sharded_index
from realm_tf.retrieval.index import tuning as index_tuning
from realm_tf.retrieval.index.brute_force import BruteForceIndex
from realm_tf.retrieval.index.base import (DELETED_NAME, EMBEDDINGS_NAME, FORMAT,
                                          MANIFEST_NAME, MipsIndex, RowTable, read_manifest)
from realm_tf.retrieval.index.scann_index import SCANN_DIR, ScannIndex, searcher_bytes
from realm_tf.retrieval.index.sharded_index import ShardedIndex
from realm_tf.scann_settings import ScannSettings

__all__ = ["BruteForceIndex", "DELETED_NAME", "EMBEDDINGS_NAME", "FORMAT", "MANIFEST_NAME",
           "MipsIndex", "RowTable", "SCANN_DIR", "ScannIndex", "ScannSettings", "ShardedIndex",
           "build_index",
           "check_manifest", "load_dense_index", "measure_recall", "read_manifest", "recall_at_k",
           "searcher_bytes"]


def build_index(embeddings: np.ndarray, index_type: str = "scann",
                settings: Optional[ScannSettings] = None,
                tuning_queries: Optional[np.ndarray] = None,
                deleted: Optional[np.ndarray] = None) -> MipsIndex:
  """``index_type``: ``scann`` (default settings pick exact scoring for tiny corpora; a
  corpus whose build would exceed ``settings.build_memory_gib`` is built in shards, a
  ``ShardedIndex``) or ``brute_force``. ``tuning_queries``: the sample ScaNN tunes its recall
  on (see module doc). ``deleted``: rows never returned."""
  if index_type == "scann":
    settings = settings or ScannSettings()
    n, dim = np.shape(embeddings)[0], np.shape(embeddings)[1]
    max_rows = sharded_index.rows_per_shard(n, dim, settings.build_memory_gib)
    if max_rows < n:
      return ShardedIndex.build(embeddings, settings, max_rows, tuning_queries=tuning_queries,
                                deleted=deleted)
    return ScannIndex.build(embeddings, settings, tuning_queries=tuning_queries,
                            deleted=deleted)
  if index_type == "brute_force":
    return BruteForceIndex(embeddings, deleted=deleted)
  raise ValueError(f"unknown index_type {index_type!r}; use 'scann' or 'brute_force'")


def check_manifest(manifest: dict, directory: str, expected_dim: Optional[int] = None,
                   expected_fingerprint: Union[None, str, Sequence[str]] = None) -> None:
  """Refuses an index whose dimension or corpus differs from the caller's.

  ``expected_fingerprint``: the caller's corpus fingerprint, or the fingerprints of every
  version of the caller's corpus (``data.corpus_updates.fingerprints``): an index over an
  older version of the same corpus fits too, its rows being rows of the newer one.
  """
  if expected_dim is not None and int(manifest["dim"]) != int(expected_dim):
    raise errors.DimensionMismatchError(
        f"index {directory} has dimension {manifest['dim']} but the model's embeddings have "
        f"dimension {expected_dim}: rebuild the index with this model (realm-index build)")
  if expected_fingerprint is None:
    return
  accepted = ([expected_fingerprint] if isinstance(expected_fingerprint, str)
              else list(expected_fingerprint))
  found = manifest.get("corpus_fingerprint")
  if found in accepted:
    return
  if accepted[-1] in manifest.get("corpus_fingerprints", ()):
    raise errors.FingerprintMismatchError(
        f"index {directory} covers a newer version of this corpus ({found}, updated by "
        f"realm-index upsert/delete) than this process read ({accepted[-1]}): reopen the "
        "corpus (restart) to use it")
  raise errors.FingerprintMismatchError(
      f"index {directory} was built over corpus {found} but this run uses corpus "
      f"{accepted[-1]}: its block ids would point at the wrong blocks; rebuild "
      "the index from this blocks directory (realm-index build / realm-refresh)")


def load_dense_index(directory: str, expected_dim: Optional[int] = None,
                     expected_fingerprint: Union[None, str, Sequence[str]] = None,
                     load_embeddings: bool = False) -> MipsIndex:
  """Loads the dense index written by ``MipsIndex.save``, without its companion part
  (``index.sparse`` is None: ``publication.index_io.load_index`` loads both); checks
  dimension and fingerprint first.

  Args:
    directory: the index directory (e.g. ``index_dir/step-1200``).
    expected_dim: the caller's embedding width; a different index is refused.
    expected_fingerprint: the caller's corpus fingerprint (or its versions' fingerprints,
      see ``check_manifest``); an index over another corpus is refused.
    load_embeddings: memory-map ``embeddings.npy`` into a ``ScannIndex`` now (the mapping
      then outlives a later removal of the directory); otherwise ``ScannIndex.embeddings``
      maps it on first use. A ``BruteForceIndex`` always maps it: it searches those rows.
      Either way nothing float is read into memory until rows are touched.
  """
  manifest = read_manifest(directory)
  check_manifest(manifest, directory, expected_dim, expected_fingerprint)
  if manifest["index_type"] == "brute_force":
    embeddings = index_base.map_embeddings(directory, manifest)
    index = BruteForceIndex(embeddings, manifest["settings"].get("rows_per_block", 262_144),
                            check=False, deleted=index_base.load_deleted(directory, manifest))
  elif manifest["index_type"] == "scann":
    index = ScannIndex.load(directory, manifest, load_embeddings)
  elif manifest["index_type"] == sharded_index.INDEX_TYPE:
    index = ShardedIndex.load(directory, manifest)
  else:
    raise errors.IndexFormatError(f"{directory}: unknown index_type "
                                  f"{manifest['index_type']!r}")
  index.manifest = manifest
  return index


def recall_at_k(approx_ids: np.ndarray, exact_ids: np.ndarray) -> float:
  """Mean fraction of the exact top-k ids found in the approximate top-k (ties not counted)."""
  k = exact_ids.shape[1]
  hits = [len(set(a[:k].tolist()) & set(e.tolist())) for a, e in zip(approx_ids, exact_ids)]
  return float(np.mean(hits) / k)


def measure_recall(index: MipsIndex, embeddings: np.ndarray, queries: np.ndarray,
                   k: int = 10, rtol: float = 1e-5) -> float:
  """Recall@k of ``index`` against exact search over its live rows, counting ties as hits.

  An approximate neighbour counts when its true inner product is at least the exact k-th
  best score (up to ``rtol``): near-identical embeddings (an untrained tower) have many
  neighbours whose scores differ only by float rounding, and any of them is a correct answer.
  """
  queries = index_base.check_queries(queries, index.dim)
  k = index_base.check_k(k, index.num_live)
  kth = index_tuning.exact_kth_scores(embeddings, queries, k, deleted=index.deleted)
  approx_ids, _ = index.search(queries, k)
  return index_tuning.tie_recall(embeddings, queries, approx_ids, kth, k, rtol)
