"""Data preparation for realm_tf, as Apache Beam pipelines writing TF Examples.

Modules (each pipeline has a command line, ``python -m data_prep.<module> --help``):

* ``blocks``: a corpus (MediaWiki XML dump, JSON lines, TFDS Wikipedia) -> retrieval blocks of at
  most 288 wordpieces, with a ``manifest.json``;
* ``salient_spans``: blocks -> sentences annotated with named entities and dates;
* ``pretrain_examples``: annotated sentences -> masked-LM queries (salient, random-span or
  uniform masking);
* ``ict_examples``: blocks -> Inverse Cloze Task examples (ORQA's warm start);
* ``open_qa``: NQ-open, WebQuestions, CuratedTrec -> ``<dataset>-<split>.jsonl``;
* ``synthetic_world``: the small invented encyclopedia that the demo and the tests use;
* ``pipeline``: :func:`data_prep.pipeline.prepare_all` runs the corpus steps in order;
* ``cli``: the command lines' shared flags and one-line errors.

The on-disk formats they write (file names, features, manifests, readers) are defined once, in
``realm_tf.data.manifests`` (directories) and ``realm_tf.data.features`` (records), which the
index, the trainers and the evaluation read through.
``data_prep`` imports ``realm_tf``, never the other way round.
"""
import realm_tf  # noqa: F401  # Sets TF_USE_LEGACY_KERAS before TensorFlow loads.
