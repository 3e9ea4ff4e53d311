"""The retrieval side of REALM: MIPS indexes, BM25, publishing and refreshing.

* ``index/``: the dense MIPS index: ``MipsIndex`` with ``ScannIndex``, ``BruteForceIndex`` and
  ``ShardedIndex``, ``build_index`` (``index.mips_index``; the parts: ``index.base``,
  ``index.brute_force``, ``index.scann_index``, ``index.tuning``, ``index.sharded_index``).
  It knows nothing of BM25: a sparse part is a companion part behind ``index.base``'s
  protocol.
* ``sparse/``: BM25 (``sparse.sparse_index``) and its fusion with the dense index
  (``sparse.hybrid``).
* ``publication/``: corpus embedding (``publication.corpus_embedding``), the
  ``index_dir/step-<N>`` + ``LATEST`` contract (``publication.publish``), ``load_index`` of a
  published directory, dense and sparse parts (``publication.index_io``), the refresher
  (``publication.refresher``, ``realm-refresh``), ``IndexHandle`` (``publication.handle``),
  ``TextSearcher`` (``publication.search``), document updates (``publication.updates``,
  ``realm-index upsert|delete``, ``realm-serve``'s ``/documents``) and the tests' tiny models
  (``publication.testing``).
* ``errors``: the retrieval errors.

Elsewhere: ScaNN's settings are ``realm_tf.scann_settings`` (imported by ``realm_tf.configs``,
which imports nothing of this package); the candidates REALM's training reads are
``realm_tf.tasks.candidates`` (host) and ``realm_tf.tasks.device_retrieval`` (replicas). The
blocks directory itself is ``realm_tf.data.manifests``'. The names below are imported on first
use, so that importing this package imports none of its modules.
"""

import importlib

_EXPORTS = {
    "errors": ("CheckpointNotFoundError", "CorpusFormatError", "DimensionMismatchError",
               "EmptyCorpusError", "FingerprintMismatchError", "IndexFormatError",
               "IndexNotReadyError", "RetrievalError"),
    "publication.handle": ("IndexHandle",),
    "publication.index_io": ("load_index",),
    "index.mips_index": ("BruteForceIndex", "MipsIndex", "ScannIndex", "ScannSettings",
                         "build_index", "measure_recall", "recall_at_k"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}


def __getattr__(name):
  if name in _WHERE:
    return getattr(importlib.import_module(f"realm_tf.retrieval.{_WHERE[name]}"), name)
  raise AttributeError(f"module 'realm_tf.retrieval' has no attribute {name!r}")


__all__ = sorted(_WHERE)
