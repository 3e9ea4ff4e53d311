"""The retrieval side of REALM: corpus embedding, MIPS indexes, publishing and refreshing.

* ``corpus_embedding``: embed a blocks directory with a block tower (``embed_corpus``), shard
  and merge.
* ``mips_index``: ``MipsIndex`` with ``ScannIndex`` and ``BruteForceIndex``; ``load_index``.
* ``publish``: the ``index_dir/step-<N>`` + ``LATEST`` contract.
* ``handle``: ``IndexHandle``, the reader side for trainers and evaluation.
* ``refresher``: ``refresh_loop`` and ``build_index_for_checkpoint`` (``realm-refresh``).
* ``search``: ``TextSearcher``, query text to top-k blocks (``realm-index search``).

The blocks directory itself is ``realm_tf.data.manifests``'.
"""

from realm_tf.retrieval.errors import (CheckpointNotFoundError, CorpusFormatError,
                                       DimensionMismatchError, EmptyCorpusError,
                                       FingerprintMismatchError, IndexFormatError,
                                       IndexNotReadyError, RetrievalError)
from realm_tf.retrieval.handle import IndexHandle
from realm_tf.retrieval.mips_index import (BruteForceIndex, MipsIndex, ScannIndex,
                                           ScannSettings, build_index, load_index,
                                           measure_recall, recall_at_k)
