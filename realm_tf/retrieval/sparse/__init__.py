"""BM25 beside the dense index, and the fusion of the two.

* ``sparse_index``: ``SparseIndex``, BM25 over the blocks in segments, updatable, saved
  without pickles; an index's ``sparse`` companion part (``index.base.CompanionPart``);
* ``hybrid``: the retriever choice, ``dense``, ``bm25`` or their fusion (``FUSION``).
"""
