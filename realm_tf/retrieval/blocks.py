"""Reading (and, for tests and small custom corpora, writing) a blocks directory.

A blocks directory, as ``data_prep`` writes it, holds

* ``blocks-00000-of-0000N.tfrecord`` shards of ``tf.train.Example`` with ``block_id`` (int64,
  dense ``0..n-1``), ``uid`` (bytes, hex ``SHA1(title + " <sep> " + body)``), ``title``,
  ``body`` (bytes) and ``token_ids`` (int64 list: the packed ``[CLS] title [SEP] body [SEP]``
  wordpiece ids, unpadded);
* ``manifest.json`` with at least ``num_blocks``, ``vocab_file``, ``vocab_sha1``,
  ``lower_case``, ``block_seq_length``, ``fingerprint`` (SHA1 over the uids in ``block_id``
  order) and ``num_shards``.

The format is defined by ``data_prep.schema``; this module takes its names, features and
fingerprint from there and adds what the retrieval side needs on top: errors in this package's
types, and the vectorized packing of ``token_ids`` into fixed-length model inputs::

    {"token_ids": [[2, 7, 3, 9, 9, 3]]}  --pack_block_ids(seq_length=5)-->
    input_word_ids [[2, 7, 3, 9, 3]]   (trimmed; the final [SEP] is kept)
    input_mask     [[1, 1, 1, 1, 1]]
    input_type_ids [[0, 0, 0, 1, 1]]   (0 through the first [SEP], 1 after)
"""

import hashlib
import json
import os
from typing import Dict, Iterable, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from data_prep import schema
from realm_tf.retrieval import errors

MANIFEST_NAME = schema.MANIFEST
SHARD_PATTERN = f"{schema.BLOCKS_PREFIX}-*-of-*{schema.TFRECORD_SUFFIX}"
REQUIRED_MANIFEST_KEYS = ("num_blocks", "fingerprint", "num_shards")

# The features the retrieval side reads (``doc_title`` is left out).
FEATURES = {k: schema.BLOCK_FEATURES[k] for k in ("block_id", "uid", "title", "body",
                                                   "token_ids")}


def block_uid(title: str, body: str) -> str:
  """REALM's document uid: hex ``SHA1(title + " <sep> " + body)``."""
  return hashlib.sha1(f"{title} <sep> {body}".encode("utf-8")).hexdigest()


def corpus_fingerprint(uids: Iterable) -> str:
  """SHA1 over the uids in ``block_id`` order, each followed by a newline."""
  return schema.blocks_fingerprint(uids)


def file_sha1(path: str) -> str:
  h = hashlib.sha1()
  with tf.io.gfile.GFile(path, "rb") as f:
    h.update(f.read())
  return h.hexdigest()


def load_manifest(blocks_dir: str) -> dict:
  """The manifest of ``blocks_dir``; clear errors for a missing directory or an empty corpus."""
  if not tf.io.gfile.isdir(blocks_dir):
    raise errors.CorpusFormatError(f"blocks directory not found: {blocks_dir}")
  path = os.path.join(blocks_dir, MANIFEST_NAME)
  if not tf.io.gfile.exists(path):
    raise errors.CorpusFormatError(
        f"{blocks_dir} is not a blocks directory: no {MANIFEST_NAME} (write one with "
        "data_prep's blocks pipeline)")
  with tf.io.gfile.GFile(path) as f:
    try:
      manifest = json.load(f)
    except ValueError as e:
      raise errors.CorpusFormatError(f"{path} is not valid JSON: {e}") from None
  missing = [k for k in REQUIRED_MANIFEST_KEYS if k not in manifest]
  if missing:
    raise errors.CorpusFormatError(f"{path} lacks the keys {missing}")
  if int(manifest["num_blocks"]) <= 0:
    raise errors.EmptyCorpusError(f"the corpus in {blocks_dir} is empty (num_blocks = "
                                  f"{manifest['num_blocks']}): nothing to index")
  return manifest


def shard_files(blocks_dir: str, manifest: Optional[dict] = None) -> List[str]:
  """The sorted TFRecord shards of ``blocks_dir``, checked against the manifest."""
  manifest = manifest or load_manifest(blocks_dir)
  files = schema.shard_files(blocks_dir, schema.BLOCKS_PREFIX)
  if not files:
    raise errors.EmptyCorpusError(f"no {SHARD_PATTERN} files in {blocks_dir}")
  expected = int(manifest.get("num_shards", len(files)))
  if len(files) != expected:
    raise errors.CorpusFormatError(
        f"{blocks_dir}: manifest says {expected} shards but {len(files)} files match "
        f"{SHARD_PATTERN} (an unfinished data_prep run?)")
  return files


def parse_batch(serialized: tf.Tensor) -> Dict[str, tf.Tensor]:
  """A batch of serialized examples -> dict of tensors (``token_ids`` ragged int64)."""
  parsed = tf.io.parse_example(serialized, FEATURES)
  if isinstance(parsed["token_ids"], tf.SparseTensor):
    parsed["token_ids"] = tf.RaggedTensor.from_sparse(parsed["token_ids"])
  return parsed


def pack_block_ids(token_ids: tf.RaggedTensor, seq_length: int, sep_id: int,
                   segment_ids: bool = True) -> Dict[str, tf.Tensor]:
  """Packed, unpadded ids (ragged ``[b, (n)]``) -> fixed int32 model inputs ``[b, seq_length]``.

  Rows longer than ``seq_length`` are trimmed and their last position set to ``[SEP]``. Type
  ids are 0 through the first ``[SEP]`` and 1 after it (all 0 when ``segment_ids`` is False, for
  the query layout).
  """
  token_ids = tf.cast(token_ids, tf.int32)
  lengths = tf.cast(token_ids.row_lengths(), tf.int32)
  dense = token_ids.to_tensor(default_value=0, shape=[None, seq_length])
  last = tf.equal(tf.range(seq_length), seq_length - 1)[tf.newaxis, :]
  dense = tf.where((lengths > seq_length)[:, tf.newaxis] & last, sep_id, dense)
  mask = tf.sequence_mask(tf.minimum(lengths, seq_length), seq_length)
  if segment_ids:
    is_sep = tf.equal(dense, sep_id) & mask
    has_sep = tf.reduce_any(is_sep, axis=1)
    first_sep = tf.where(has_sep, tf.argmax(tf.cast(is_sep, tf.int32), axis=1,
                                            output_type=tf.int32), seq_length)
    type_ids = (tf.range(seq_length)[tf.newaxis, :] > first_sep[:, tf.newaxis]) & mask
  else:
    type_ids = tf.zeros_like(mask)
  return {"input_word_ids": dense, "input_mask": tf.cast(mask, tf.int32),
          "input_type_ids": tf.cast(type_ids, tf.int32)}


def read_blocks(blocks_dir: str, block_ids: Optional[Sequence[int]] = None,
                fields: Sequence[str] = ("title", "body")) -> Dict[int, Dict[str, object]]:
  """``{block_id: {field: value}}`` for the wanted blocks (all when ``block_ids`` is None).

  Scans the shards once; strings are decoded to ``str``. For showing search results.
  """
  wanted = None if block_ids is None else set(int(i) for i in block_ids)
  found = {}
  dataset = tf.data.TFRecordDataset(shard_files(blocks_dir)).batch(1024).map(parse_batch)
  for batch in dataset.as_numpy_iterator():
    for row, block_id in enumerate(batch["block_id"]):
      block_id = int(block_id)
      if wanted is not None and block_id not in wanted:
        continue
      item = {}
      for name in fields:
        value = batch[name][row]
        item[name] = value.decode("utf-8") if isinstance(value, bytes) else value
      found[block_id] = item
    if wanted is not None and len(found) == len(wanted):
      break
  return found


def write_blocks(blocks_dir: str, titles: Sequence[str], bodies: Sequence[str], tokenizer,
                 block_seq_length: int, num_shards: int = 1, vocab_file: Optional[str] = None
                 ) -> dict:
  """Writes a small blocks directory in the format above (for tests, demos, custom corpora).

  ``tokenizer`` is a ``RealmTokenizer``; ``token_ids`` are its ``block_inputs`` without padding.
  Returns the manifest.
  """
  if len(titles) != len(bodies):
    raise ValueError(f"{len(titles)} titles but {len(bodies)} bodies")
  tf.io.gfile.makedirs(blocks_dir)
  token_ids: List[np.ndarray] = []
  for start in range(0, len(titles), 512):
    inputs = tokenizer.block_inputs(list(titles[start:start + 512]),
                                    list(bodies[start:start + 512]), block_seq_length)
    ids, mask = inputs["input_word_ids"].numpy(), inputs["input_mask"].numpy()
    token_ids.extend(row[:m.sum()] for row, m in zip(ids, mask))
  uids = [block_uid(t, b) for t, b in zip(titles, bodies)]
  n = len(titles)
  for shard in range(num_shards):
    path = os.path.join(blocks_dir, f"blocks-{shard:05d}-of-{num_shards:05d}.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
      for i in range(shard * n // num_shards, (shard + 1) * n // num_shards):
        feature = {
            "block_id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
            "uid": tf.train.Feature(bytes_list=tf.train.BytesList(value=[uids[i].encode()])),
            "title": tf.train.Feature(
                bytes_list=tf.train.BytesList(value=[titles[i].encode("utf-8")])),
            "doc_title": tf.train.Feature(
                bytes_list=tf.train.BytesList(value=[titles[i].encode("utf-8")])),
            "body": tf.train.Feature(
                bytes_list=tf.train.BytesList(value=[bodies[i].encode("utf-8")])),
            "token_ids": tf.train.Feature(
                int64_list=tf.train.Int64List(value=token_ids[i].tolist())),
        }
        writer.write(tf.train.Example(
            features=tf.train.Features(feature=feature)).SerializeToString())
  vocab_file = vocab_file or tokenizer.vocab_file
  manifest = {
      "num_blocks": n,
      "vocab_file": vocab_file,
      "vocab_sha1": file_sha1(vocab_file),
      "lower_case": bool(tokenizer.lower_case),
      "block_seq_length": int(block_seq_length),
      "fingerprint": corpus_fingerprint(uids),
      "num_shards": num_shards,
  }
  with tf.io.gfile.GFile(os.path.join(blocks_dir, MANIFEST_NAME), "w") as f:
    json.dump(manifest, f, indent=2)
  return manifest
