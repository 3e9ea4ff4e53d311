"""An index directory as published: the dense index and, when its manifest names one, its BM25
part (``sparse/``), loaded together.

The dense index (``retrieval.index``) saves its companion part under the same commit point
(``manifest.json``, written last) but never imports the BM25 code; this module puts the two
back together. Callers load an index directory with :func:`load_index`.
"""

import os
from typing import Optional, Sequence, Union

import numpy as np

from realm_tf.retrieval import errors
from realm_tf.retrieval.index import base as index_base
from realm_tf.retrieval.index import mips_index
from realm_tf.retrieval.sparse import sparse_index


def load_sparse(directory: str, manifest: dict, deleted: np.ndarray
                ) -> Optional[sparse_index.SparseIndex]:
  """The sparse part of a saved index (``sparse/``, when its manifest names one), checked to
  cover the same rows and deletions as the dense part."""
  if not manifest.get("sparse"):
    return None
  path = os.path.join(directory, index_base.SPARSE_DIR)
  sparse = sparse_index.SparseIndex.load(path)
  live = np.ones(int(manifest["num_blocks"]), bool)
  live[deleted] = False
  if sparse.num_rows != len(live) or not np.array_equal(sparse.live, live):
    raise errors.IndexFormatError(
        f"{path}: its {sparse.num_rows} rows ({sparse.num_live} live) are not the dense "
        f"index's {len(live)} ({int(live.sum())} live): rebuild the index")
  return sparse


def load_index(directory: str, expected_dim: Optional[int] = None,
               expected_fingerprint: Union[None, str, Sequence[str]] = None,
               load_embeddings: bool = False) -> mips_index.MipsIndex:
  """Loads an index written by ``MipsIndex.save``, with its sparse part when it has one;
  checks dimension and fingerprint first (``mips_index.load_dense_index``, whose arguments
  these are)."""
  index = mips_index.load_dense_index(directory, expected_dim, expected_fingerprint,
                                      load_embeddings)
  index.sparse = load_sparse(directory, index.manifest, index.deleted)
  return index
