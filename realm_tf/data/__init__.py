"""Data of realm_tf: the on-disk contracts (``contract``) and the readers built on them.

``realm_tf.data.contract`` is the one definition of the directories the corpus pipelines write
and the index, the trainers and the evaluation read: blocks, pre-training examples, ICT
examples, sentences, and their manifests.
"""
