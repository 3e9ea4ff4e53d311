"""Data of realm_tf: the on-disk contracts and the readers built on them.

``realm_tf.data.manifests`` is the one definition of the directories the corpus pipelines write
and the index, the trainers and the evaluation read (blocks, pre-training examples, ICT
examples, sentences: file names, manifests, shards); ``realm_tf.data.features`` defines the
records they hold (tf.Example features, writers, parsers). ``realm_tf.data.articles`` (documents
-> blocks) and ``realm_tf.data.sentences`` are the rules the blocks pipeline and ``realm-index
upsert`` share: ``data_prep`` uses them, and nothing in ``realm_tf`` depends on ``data_prep``.
"""
