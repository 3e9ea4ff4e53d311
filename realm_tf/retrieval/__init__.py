"""The retrieval side of REALM: corpus embedding, MIPS indexes, publishing and refreshing.

* ``corpus_embedding``: embed a blocks directory with a block tower (``embed_corpus``), shard
  and merge.
* ``mips_index``: ``MipsIndex`` with ``ScannIndex`` and ``BruteForceIndex``; ``load_index``
  (the parts: ``index_base``, ``brute_force``, ``scann_settings``, ``scann_index``,
  ``index_tuning``).
* ``publish``: the ``index_dir/step-<N>`` + ``LATEST`` contract.
* ``handle``: ``IndexHandle``, the reader side for trainers and evaluation.
* ``refresher``: ``refresh_loop`` and ``build_index_for_checkpoint`` (``realm-refresh``).
* ``updates``: documents added to and deleted from a corpus and its index (``realm-index
  upsert|delete``, ``realm-serve``'s ``/documents``).
* ``search``: ``TextSearcher``, query text to top-k blocks (``realm-index search``).

The blocks directory itself is ``realm_tf.data.manifests``'. The names below are imported on
first use, so that importing one light module (``scann_settings``, for ``realm_tf.configs``)
does not import the others.
"""

import importlib

_EXPORTS = {
    "errors": ("CheckpointNotFoundError", "CorpusFormatError", "DimensionMismatchError",
               "EmptyCorpusError", "FingerprintMismatchError", "IndexFormatError",
               "IndexNotReadyError", "RetrievalError"),
    "handle": ("IndexHandle",),
    "mips_index": ("BruteForceIndex", "MipsIndex", "ScannIndex", "ScannSettings",
                   "build_index", "load_index", "measure_recall", "recall_at_k"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}


def __getattr__(name):
  if name in _WHERE:
    return getattr(importlib.import_module(f"realm_tf.retrieval.{_WHERE[name]}"), name)
  raise AttributeError(f"module 'realm_tf.retrieval' has no attribute {name!r}")


__all__ = sorted(_WHERE)
