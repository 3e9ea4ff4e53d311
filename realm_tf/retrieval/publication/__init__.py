"""Indexes made from checkpoints, published, read and updated.

* ``corpus_embedding``: embed a blocks directory with a block tower (``embed_corpus``), shard
  and merge;
* ``publish``: the ``index_dir/step-<N>`` + ``LATEST`` contract;
* ``index_io``: ``load_index``, a published index directory: the dense index and its sparse
  part;
* ``refresher``: ``refresh_loop`` and ``build_index_for_checkpoint`` (``realm-refresh``);
* ``handle``: ``IndexHandle``, the reader side for trainers and evaluation;
* ``search``: ``TextSearcher``, query text to top-k blocks (``realm-index search``);
* ``updates``: documents added to and deleted from a corpus and its index (``realm-index
  upsert|delete``, ``realm-serve``'s ``/documents``), published as new index directories;
* ``testing``: tiny model directories and corpora for the tests, benchmarks and demos.
"""
