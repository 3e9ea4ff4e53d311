"""Imports the corpus Google released with ORQA and REALM into a blocks directory.

The release ships the 13,353,718 Wikipedia blocks that ORQA's and REALM's ``block_emb`` rows
embed as two TFRecord files of raw UTF-8 strings, one string per record:

* ``blocks.tfr``: the text of block ``i`` (no title);
* ``titles.tfr``: the title of the page block ``i`` comes from.

:func:`import_released_blocks` reads both in step and writes a blocks directory in the format of
``realm_tf.data.manifests``: ``block_id`` = record index (row ``i`` of ``block_emb``), ``title``
= the title, ``body`` = the block text, ``token_ids`` = ``[CLS] title [SEP] body [SEP]`` as
``RealmTokenizer.block_inputs`` packs them. It streams: blocks are tokenized in batches in a
``tf.data`` pipeline and written shard by shard, and the corpus fingerprint is hashed as the
blocks go by, so memory does not grow with the corpus.

Example (``realm-index import`` is the same as a binary)::

    manifest = import_released_blocks("enwiki/blocks.tfr", "enwiki/titles.tfr",
                                      "orqa/vocab.txt", "data/released_blocks")
    manifest["num_blocks"]  # 13353718
"""

import hashlib
import json
import math
import os
from typing import Dict, List, Optional

import numpy as np
import tensorflow as tf
import tqdm

from realm_tf import tokenization
from realm_tf.data import features
from realm_tf.data import manifests

# Blocks per output shard when the number of shards is not given.
BLOCKS_PER_SHARD = 200_000
DEFAULT_BATCH_SIZE = 4096


class _Fingerprint:
  """:func:`manifests.corpus_fingerprint`, fed one uid at a time."""

  def __init__(self):
    self._sha1 = hashlib.sha1()

  def update(self, uid: str) -> None:
    self._sha1.update(uid.encode("ascii") + b"\n")

  def hexdigest(self) -> str:
    return self._sha1.hexdigest()


def _absolute(path: str) -> str:
  """A local path made absolute; a URL (``gs://...``) as it is."""
  return path if "://" in path else os.path.abspath(path)


def _first_line(error: Exception) -> str:
  text = str(getattr(error, "message", "") or error).strip()
  return text.splitlines()[0][:300] if text else repr(error)


def count_records(path: str) -> int:
  """The number of records of a TFRecord file.

  Raises MissingDataError when the file does not exist and CorpusFormatError when it cannot be
  read as TFRecords.
  """
  if not tf.io.gfile.exists(path):
    raise manifests.MissingDataError(f"file not found: {path}")
  if tf.io.gfile.isdir(path):
    raise manifests.CorpusFormatError(f"{path} is a directory, not a TFRecord file")
  dataset = tf.data.TFRecordDataset(path).batch(1 << 16)
  try:
    count = dataset.reduce(np.int64(0), lambda n, b: n + tf.shape(b, out_type=tf.int64)[0])
  except tf.errors.OpError as e:
    raise manifests.CorpusFormatError(
        f"cannot read {path} as TFRecords: {_first_line(e)}") from None
  return int(count)


def _decode(record: bytes, path: str, index: int) -> str:
  try:
    return record.decode("utf-8")
  except UnicodeDecodeError as e:
    raise manifests.CorpusFormatError(
        f"{path}: record {index} is not valid UTF-8 ({e.reason} at byte {e.start})") from None


def _stale_shards(blocks_dir: str) -> List[str]:
  return manifests.shard_files(blocks_dir, manifests.BLOCKS_PREFIX)


def _prepare_output(blocks_dir: str) -> None:
  """Creates ``blocks_dir``; refuses a finished corpus there and removes an unfinished one's
  shards (a directory without its manifest is absent)."""
  if tf.io.gfile.exists(os.path.join(blocks_dir, manifests.MANIFEST)):
    raise manifests.DataError(
        f"{blocks_dir} already holds a blocks directory ({manifests.MANIFEST}); remove it or "
        "choose another output directory")
  tf.io.gfile.makedirs(blocks_dir)
  for path in _stale_shards(blocks_dir):
    tf.io.gfile.remove(path)


def _tokenized_batches(blocks_tfr: str, titles_tfr: str, tokenizer: tokenization.RealmTokenizer,
                       block_seq_length: int, num_blocks: int,
                       batch_size: int) -> tf.data.Dataset:
  """Batches of ``(titles, bodies, word_ids [b, L], lengths [b])``, in record order.

  The raw records are passed through unchanged (the caller checks their UTF-8); the tokenizer
  sees them with invalid bytes replaced, so that a bad record is reported by the caller, not
  as a failure inside the pipeline.
  """

  def tokenize(titles, bodies):
    def clean(texts):
      return tf.strings.unicode_transcode(texts, "UTF-8", "UTF-8", errors="replace")

    inputs = tokenizer.block_inputs(clean(titles), clean(bodies), block_seq_length)
    return titles, bodies, inputs["input_word_ids"], tf.reduce_sum(inputs["input_mask"], 1)

  dataset = tf.data.Dataset.zip((tf.data.TFRecordDataset(titles_tfr),
                                 tf.data.TFRecordDataset(blocks_tfr)))
  dataset = dataset.take(num_blocks).batch(batch_size)
  return dataset.map(tokenize, num_parallel_calls=tf.data.AUTOTUNE,
                     deterministic=True).prefetch(2)


def import_released_blocks(blocks_tfr: str,
                           titles_tfr: str,
                           vocab_file: str,
                           blocks_dir: str,
                           lower_case: bool = True,
                           block_seq_length: int = features.BLOCK_SEQ_LENGTH,
                           num_shards: Optional[int] = None,
                           progress: bool = True,
                           limit: Optional[int] = None,
                           batch_size: int = DEFAULT_BATCH_SIZE) -> Dict:
  """Writes the released ``blocks.tfr`` + ``titles.tfr`` as a blocks directory.

  Both files are counted first, so that a mismatched pair is refused before anything is
  tokenized; then they are read in step, tokenized in batches and written shard by shard
  (shard ``s`` of ``N`` holds the blocks ``s * n // N`` up to ``(s + 1) * n // N``, as
  ``manifests.write_blocks`` splits them). The manifest is written last.

  Args:
    blocks_tfr: the released ``blocks.tfr`` (one UTF-8 block text per record).
    titles_tfr: the released ``titles.tfr`` (record ``i``: the title of block ``i``).
    vocab_file: the WordPiece vocabulary of the model that will read the blocks.
    blocks_dir: the output directory; it must not hold a finished corpus already.
    lower_case: whether the vocabulary is uncased.
    block_seq_length: the length ``token_ids`` are trimmed to (REALM and ORQA: 288).
    num_shards: output shards (None or 0: one per ``BLOCKS_PER_SHARD`` blocks; at most one per
      block).
    progress: show a tqdm progress bar.
    limit: import only the first ``limit`` blocks (None or 0: all); the two files must still
      have the same number of records.
    batch_size: blocks tokenized at a time.

  Returns:
    The manifest: the keys of ``manifests.write_blocks``' manifest (``num_blocks``,
    ``vocab_file``, ``vocab_sha1``, ``lower_case``, ``block_seq_length``, ``fingerprint``,
    ``num_shards``) plus ``source`` = ``{"blocks_tfr", "titles_tfr"}``.

  Raises:
    MissingDataError: an input file does not exist.
    CorpusFormatError: an input file is not TFRecords, the two files have different numbers of
      records, or a record is not valid UTF-8 (the message names the file and record index).
    EmptyCorpusError: the files have no records.
    DataError: ``blocks_dir`` already holds a corpus.
    VocabError: the vocabulary is missing or lacks the special tokens.
  """
  if block_seq_length < 3:
    raise ValueError(f"block_seq_length must be at least 3, got {block_seq_length}")
  if batch_size < 1:
    raise ValueError(f"batch_size must be positive, got {batch_size}")
  if limit is not None and limit < 0:
    raise ValueError(f"limit must not be negative, got {limit}")
  tokenizer = tokenization.RealmTokenizer(vocab_file, lower_case=lower_case)
  num_texts, num_titles = count_records(blocks_tfr), count_records(titles_tfr)
  if num_texts != num_titles:
    raise manifests.CorpusFormatError(
        f"{blocks_tfr} has {num_texts} records but {titles_tfr} has {num_titles}: record i "
        "of the titles must be the title of block i (use the two files of one release)")
  if num_texts == 0:
    raise manifests.EmptyCorpusError(f"{blocks_tfr} and {titles_tfr} hold no records")
  n = min(num_texts, limit) if limit else num_texts
  num_shards = num_shards or math.ceil(n / BLOCKS_PER_SHARD)
  if num_shards < 0:
    raise ValueError(f"num_shards must not be negative, got {num_shards}")
  num_shards = min(num_shards, n)
  _prepare_output(blocks_dir)

  fingerprint = _Fingerprint()
  bar = tqdm.tqdm(total=n, desc="importing blocks", unit="block", disable=not progress,
                  mininterval=2.0)
  shard, writer = -1, None
  shard_end = 0
  block_id = 0
  try:
    batches = _tokenized_batches(blocks_tfr, titles_tfr, tokenizer, block_seq_length, n,
                                 batch_size)
    for titles, bodies, word_ids, lengths in batches.as_numpy_iterator():
      for row, length in enumerate(lengths.tolist()):
        if block_id == shard_end:
          if writer is not None:
            writer.close()
          shard += 1
          shard_end = (shard + 1) * n // num_shards
          writer = tf.io.TFRecordWriter(os.path.join(
              blocks_dir, manifests.shard_name(manifests.BLOCKS_PREFIX, shard, num_shards)))
        title = _decode(titles[row], titles_tfr, block_id)
        body = _decode(bodies[row], blocks_tfr, block_id)
        uid = features.block_uid(title, body)
        fingerprint.update(uid)
        writer.write(features.serialize_block(block_id, uid, title, body,
                                              word_ids[row, :length].tolist()))
        block_id += 1
      bar.update(len(lengths))
    if writer is not None:
      writer.close()
      writer = None
    if block_id != n:
      raise manifests.CorpusFormatError(
          f"read {block_id} blocks from {blocks_tfr} and {titles_tfr}, expected {n} (did the "
          "files change while being read?)")
  except tf.errors.OpError as e:
    _discard(blocks_dir, writer)
    raise manifests.CorpusFormatError(
        f"cannot read {blocks_tfr} / {titles_tfr}: {_first_line(e)}") from None
  except BaseException:
    _discard(blocks_dir, writer)
    raise
  finally:
    bar.close()

  manifest = {
      "num_blocks": n,
      "vocab_file": vocab_file,
      "vocab_sha1": manifests.file_sha1(vocab_file),
      "lower_case": bool(lower_case),
      "block_seq_length": int(block_seq_length),
      "fingerprint": fingerprint.hexdigest(),
      "num_shards": num_shards,
      "source": {"blocks_tfr": _absolute(blocks_tfr), "titles_tfr": _absolute(titles_tfr)},
  }
  path = os.path.join(blocks_dir, manifests.MANIFEST)
  with tf.io.gfile.GFile(path + ".tmp", "w") as f:
    json.dump(manifest, f, indent=2)
  tf.io.gfile.rename(path + ".tmp", path, overwrite=True)
  return manifest


def _discard(blocks_dir: str, writer: Optional[tf.io.TFRecordWriter]) -> None:
  """Removes the shards of an import that failed, so that no half corpus is left behind."""
  if writer is not None:
    writer.close()
  for path in _stale_shards(blocks_dir):
    tf.io.gfile.remove(path)
