"""The dense MIPS index: block embeddings searched by inner product (ScaNN or exact).

* ``mips_index``: the entry points, ``build_index``, ``load_dense_index`` (without the sparse
  part), ``check_manifest``, ``measure_recall``, and the index types;
* ``base``: the ``MipsIndex`` interface (``search``, ``append``, ``delete``, ``save``), the
  artifacts' names, ``read_manifest``, ``RowTable``, and the ``CompanionPart`` protocol of a
  part saved beside the dense rows (the BM25 part, ``retrieval.sparse``, is one; nothing here
  imports it);
* ``brute_force``: ``BruteForceIndex``, exact;
* ``scann_index``: ``ScannIndex``, the only module that imports ``scann``;
* ``tuning``: recall against exact search and the build-time tuning;
* ``sharded_index``: ``ShardedIndex``, ScaNN in shards.

ScaNN's settings are ``realm_tf.scann_settings``' (``realm_tf.configs`` imports them without
importing this package). An index directory as published, with its sparse part, is loaded by
``retrieval.publication.index_io.load_index``.
"""
