"""The on-disk contracts of data_prep: file names, tf.Example features, manifests, readers.

Other parts of realm_tf (the index refresher, the trainer, the demo) read data_prep's outputs
only through this module.

Blocks directory::

  blocks-00000-of-0000N.tfrecord   tf.Example, one per block (shards in any order; read_blocks
                                   sorts by block_id)
  manifest.json                    {"num_blocks", "vocab_file", "vocab_sha1", "lower_case",
                                    "block_seq_length", "fingerprint", "num_shards", "source", ...}

  block_id    int64   dense 0..num_blocks-1, ordered by (title, source text hash, position of
                      the block within its article): the same on every run and every runner
  uid         bytes   hex SHA1(title + " <sep> " + body), REALM's document uid
  title       bytes   article title (UTF-8)
  doc_title   bytes   same as title
  body        bytes   block text: whole sentences of the article, original spacing
  token_ids   int64[] [CLS] title [SEP] body [SEP], unpadded, at most block_seq_length (288)

``fingerprint`` = hex SHA1 over the uids in block_id order, joined with "\\n".

Pre-training examples directory: ``train-*.tfrecord``, ``eval-*.tfrecord``, ``manifest.json``;
features in :data:`PRETRAIN_FEATURES` (fixed length; :func:`parse_pretrain_example` casts the
int64s to int32) and host-only strings in :data:`PRETRAIN_HOST_FEATURES`.

ICT examples directory: ``train-*.tfrecord``, ``eval-*.tfrecord``, ``manifest.json``; features
in :data:`ICT_FEATURES`.

Sentences directory (intermediate): ``sentences-*.jsonl``, one JSON object per sentence (see
:data:`SENTENCE_FIELDS`), and ``manifest.json``.
"""

import json
import os
from typing import Dict, Iterator, List

import tensorflow as tf

MANIFEST = "manifest.json"
BLOCKS_PREFIX = "blocks"
TFRECORD_SUFFIX = ".tfrecord"
SENTENCES_PREFIX = "sentences"
JSONL_SUFFIX = ".jsonl"
SHARD_TEMPLATE = "-SSSSS-of-NNNNN"
TRAIN_SPLIT = "train"
EVAL_SPLIT = "eval"

BLOCK_SEQ_LENGTH = 288
QUERY_SEQ_LENGTH = 96
MAX_MASKS = 10

BLOCK_FEATURES = {
    "block_id": tf.io.FixedLenFeature([], tf.int64),
    "uid": tf.io.FixedLenFeature([], tf.string),
    "title": tf.io.FixedLenFeature([], tf.string),
    "doc_title": tf.io.FixedLenFeature([], tf.string),
    "body": tf.io.FixedLenFeature([], tf.string),
    "token_ids": tf.io.VarLenFeature(tf.int64),
}


def pretrain_features(query_seq_length: int = QUERY_SEQ_LENGTH,
                      max_masks: int = MAX_MASKS,
                      with_host_features: bool = True) -> Dict[str, tf.io.FixedLenFeature]:
  """Feature spec of a masked-LM pre-training example."""
  spec = {
      "query_ids": tf.io.FixedLenFeature([query_seq_length], tf.int64),
      "query_mask": tf.io.FixedLenFeature([query_seq_length], tf.int64),
      "mlm_positions": tf.io.FixedLenFeature([max_masks], tf.int64),
      "mlm_ids": tf.io.FixedLenFeature([max_masks], tf.int64),
      "mlm_weights": tf.io.FixedLenFeature([max_masks], tf.float32),
      "source_block_id": tf.io.FixedLenFeature([], tf.int64),
  }
  if with_host_features:
    spec.update(PRETRAIN_HOST_FEATURES)
  return spec


PRETRAIN_HOST_FEATURES = {
    "source_uid": tf.io.FixedLenFeature([], tf.string),
    "answer": tf.io.FixedLenFeature([], tf.string),
    "sentence": tf.io.FixedLenFeature([], tf.string),
}
PRETRAIN_FEATURES = pretrain_features()


def ict_features(query_seq_length: int = QUERY_SEQ_LENGTH,
                 block_seq_length: int = BLOCK_SEQ_LENGTH) -> Dict[str, tf.io.FixedLenFeature]:
  """Feature spec of an Inverse Cloze Task example."""
  return {
      "query_ids": tf.io.FixedLenFeature([query_seq_length], tf.int64),
      "query_mask": tf.io.FixedLenFeature([query_seq_length], tf.int64),
      "block_ids": tf.io.FixedLenFeature([block_seq_length], tf.int64),
      "block_mask": tf.io.FixedLenFeature([block_seq_length], tf.int64),
      "block_type_ids": tf.io.FixedLenFeature([block_seq_length], tf.int64),
      "block_id": tf.io.FixedLenFeature([], tf.int64),
      "sentence_removed": tf.io.FixedLenFeature([], tf.int64),
  }


ICT_FEATURES = ict_features()

# Fields of one line of sentences-*.jsonl (byte offsets are into UTF-8 encodings).
SENTENCE_FIELDS = {
    "block_id": "int, the block the sentence is in",
    "block_uid": "str, that block's uid",
    "title": "str, that block's title",
    "sentence_index": "int, position of the sentence within the block body",
    "sentence": "str, the sentence text",
    "sentence_byte_start": "int, byte offset of the sentence within the block body",
    "sentence_byte_limit": "int, byte offset just past the sentence within the block body",
    "spans": "list of {span_byte_start, span_byte_limit, label}, byte offsets within the "
             "sentence, sorted, non-overlapping",
}


class MissingOutputError(FileNotFoundError):
  """A data_prep output directory (or its manifest) is missing."""


def _cast_ints(parsed: Dict[str, tf.Tensor]) -> Dict[str, tf.Tensor]:
  return {k: tf.cast(v, tf.int32) if v.dtype == tf.int64 else v for k, v in parsed.items()}


def parse_pretrain_example(serialized, query_seq_length: int = QUERY_SEQ_LENGTH,
                           max_masks: int = MAX_MASKS, with_host_features: bool = True):
  """Serialized pre-training tf.Example(s) -> dict of tensors; int64 features become int32."""
  spec = pretrain_features(query_seq_length, max_masks, with_host_features)
  parse = tf.io.parse_example if serialized.shape.rank else tf.io.parse_single_example
  return _cast_ints(parse(serialized, spec))


def parse_ict_example(serialized, query_seq_length: int = QUERY_SEQ_LENGTH,
                      block_seq_length: int = BLOCK_SEQ_LENGTH):
  """Serialized ICT tf.Example(s) -> dict of int32 tensors."""
  spec = ict_features(query_seq_length, block_seq_length)
  parse = tf.io.parse_example if serialized.shape.rank else tf.io.parse_single_example
  return _cast_ints(parse(serialized, spec))


def load_manifest(directory: str) -> Dict:
  """The ``manifest.json`` of a data_prep output directory; a clear error if there is none."""
  path = os.path.join(directory, MANIFEST)
  if not tf.io.gfile.exists(path):
    raise MissingOutputError(
        f"no {MANIFEST} in {directory!r}: the directory is missing or its data_prep run did not "
        f"finish; run the data_prep pipeline that writes it first")
  with tf.io.gfile.GFile(path, "r") as f:
    return json.load(f)


def shard_files(directory: str, prefix: str, suffix: str = TFRECORD_SUFFIX) -> List[str]:
  """Sorted shard files ``<prefix>-SSSSS-of-NNNNN<suffix>`` of a directory."""
  if not tf.io.gfile.isdir(directory):
    raise MissingOutputError(f"directory not found: {directory}")
  return sorted(
      os.path.join(directory, f) for f in tf.io.gfile.listdir(directory)
      if f.startswith(prefix + "-") and f.endswith(suffix) and "-of-" in f)


def _decode(v):
  return v.decode("utf-8") if isinstance(v, bytes) else v


def iter_tf_examples(files: List[str]) -> Iterator[tf.train.Example]:
  for path in files:
    for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
      yield tf.train.Example.FromString(record)


def example_to_dict(example: tf.train.Example) -> Dict:
  """tf.Example -> plain dict: scalars for length-1 features, lists otherwise, str for bytes."""
  out = {}
  for key, feature in example.features.feature.items():
    kind = feature.WhichOneof("kind")
    values = list(getattr(feature, kind).value) if kind else []
    if kind == "bytes_list":
      values = [_decode(v) for v in values]
    out[key] = values
  return out


_BLOCK_LIST_FEATURES = ("token_ids",)


def read_blocks(blocks_dir: str, check_manifest: bool = True) -> List[Dict]:
  """All blocks of a blocks directory, sorted by ``block_id``.

  Each block is ``{"block_id": int, "uid": str, "title": str, "doc_title": str, "body": str,
  "token_ids": [int, ...]}``. With ``check_manifest``, the count and fingerprint are checked
  against ``manifest.json``.
  """
  manifest = load_manifest(blocks_dir) if check_manifest else None
  blocks = []
  for ex in iter_tf_examples(shard_files(blocks_dir, BLOCKS_PREFIX)):
    d = example_to_dict(ex)
    blocks.append({k: (v if k in _BLOCK_LIST_FEATURES else v[0]) for k, v in d.items()})
  blocks.sort(key=lambda b: b["block_id"])
  if manifest is not None:
    if len(blocks) != manifest["num_blocks"]:
      raise ValueError(f"{blocks_dir}: {len(blocks)} blocks on disk, manifest says "
                       f"{manifest['num_blocks']}")
    if blocks_fingerprint(b["uid"] for b in blocks) != manifest["fingerprint"]:
      raise ValueError(f"{blocks_dir}: the blocks do not match the manifest fingerprint")
  return blocks


def blocks_fingerprint(uids_in_block_id_order) -> str:
  """Hex SHA1 over the block uids in block_id order, each followed by a newline."""
  import hashlib
  h = hashlib.sha1()
  for uid in uids_in_block_id_order:
    h.update(_decode(uid).encode("ascii") + b"\n")
  return h.hexdigest()


def read_sentences(sentences_dir: str) -> Iterator[Dict]:
  """The annotated sentences (dicts with :data:`SENTENCE_FIELDS`), shard by shard."""
  for path in shard_files(sentences_dir, SENTENCES_PREFIX, JSONL_SUFFIX):
    with tf.io.gfile.GFile(path, "r") as f:
      for line in f:
        if line.strip():
          yield json.loads(line)


def example_files(examples_dir: str, split: str = TRAIN_SPLIT) -> List[str]:
  """The ``<split>-*.tfrecord`` shards of a pre-training or ICT examples directory."""
  return shard_files(examples_dir, split)


def read_examples(examples_dir: str, split: str = TRAIN_SPLIT) -> List[Dict]:
  """All examples of one split as plain dicts (for tests and inspection, not for training)."""
  return [example_to_dict(ex) for ex in iter_tf_examples(example_files(examples_dir, split))]


def make_dataset(examples_dir: str, split: str, parse_fn, shuffle_files: bool = False,
                 **parse_kwargs) -> tf.data.Dataset:
  """A tf.data pipeline over one split, each record parsed with ``parse_fn``.

  Example::

    ds = make_dataset(d, "train", parse_pretrain_example, with_host_features=False)
  """
  files = example_files(examples_dir, split)
  if not files:
    raise MissingOutputError(f"no {split}-*.tfrecord files in {examples_dir}")
  ds = tf.data.Dataset.from_tensor_slices(files)
  if shuffle_files:
    ds = ds.shuffle(len(files))
  ds = ds.interleave(tf.data.TFRecordDataset, num_parallel_calls=tf.data.AUTOTUNE)
  return ds.map(lambda s: parse_fn(s, **parse_kwargs), num_parallel_calls=tf.data.AUTOTUNE)
