"""The data directories: file names, manifests, shards, and the readers and the writer of whole
directories.

The one definition of the directories that the corpus pipelines write and that the index, the
trainers and the evaluation read. Nothing else lists shards or reads a manifest; what one
record holds is defined in ``features``.

Blocks directory::

  blocks-00000-of-0000N.tfrecord   tf.Example, one per block (features.BLOCK_FEATURES; shards
                                   in any order; read_blocks sorts by block_id)
  manifest.json                    {"num_blocks", "fingerprint", "num_shards", "vocab_file",
                                    "vocab_sha1", "lower_case", "block_seq_length", ...}

``fingerprint`` = hex SHA1 over the uids in block_id order, each followed by "\\n"
(:func:`corpus_fingerprint`).

Pre-training examples directory: ``train-*.tfrecord``, ``eval-*.tfrecord``, ``manifest.json``
(records: ``features.parse_pretrain_example``).

ICT examples directory: ``train-*.tfrecord``, ``eval-*.tfrecord``, ``manifest.json`` (records:
``features.ICT_RECORD_FEATURES``). The manifest (:func:`load_ict_manifest`) has
``"sampling": ICT_SAMPLING``, the default ``remove_prob`` and the ``cls_id``/``sep_id`` of its
vocabulary.

Sentences directory (intermediate): ``sentences-*.jsonl``, one JSON object per sentence
(``features.SENTENCE_FIELDS``), and ``manifest.json``.

Shards are named ``<prefix>-SSSSS-of-NNNNN<suffix>`` (:func:`shard_name`). A directory without
its ``manifest.json`` is absent: the manifest is written last.

Errors: :class:`DataError` and its subclasses, each with a one-line message naming the path.
"""

import hashlib
import json
import os
from typing import Dict, Iterable, Iterator, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from realm_tf import errors
from realm_tf.data import features

MANIFEST = "manifest.json"
BLOCKS_PREFIX = "blocks"
TFRECORD_SUFFIX = ".tfrecord"
SENTENCES_PREFIX = "sentences"
JSONL_SUFFIX = ".jsonl"
TRAIN_SPLIT = "train"
EVAL_SPLIT = "eval"

# Keys every blocks manifest has (the pipelines write more).
BLOCKS_MANIFEST_KEYS = ("num_blocks", "fingerprint", "num_shards")

# The manifest's ``sampling`` of an ICT directory in this format (older ones lack the key).
ICT_SAMPLING = "one random sentence per block per read, fresh removal coin"
ICT_MANIFEST_KEYS = ("sampling", "remove_prob", "cls_id", "sep_id")


def split_of(block_uid: str, eval_fraction: float) -> str:
  """``EVAL_SPLIT`` for a deterministic ``eval_fraction`` of block uids (the first 8 bytes of
  ``sha1("eval:" + uid)`` as a fraction of 2**64 below it), else ``TRAIN_SPLIT``: the held-out
  blocks of every pipeline that splits a corpus (masked sentences, ICT, the reader's MLM)."""
  digest = hashlib.sha1(("eval:" + block_uid).encode("utf-8")).digest()
  held_out = int.from_bytes(digest[:8], "big") / 2.0**64 < eval_fraction
  return EVAL_SPLIT if held_out else TRAIN_SPLIT


# ------------------------------------------------------------------------------------ errors --

class DataError(errors.RealmError, ValueError):
  """Base class: a data directory, manifest or file that is missing or does not fit."""


class MissingDataError(DataError, FileNotFoundError):
  """A data directory, its manifest or its shards are missing (e.g. an unfinished run)."""


class CorpusFormatError(DataError):
  """A blocks directory (or a file derived from it) that does not follow the format."""


class EmptyCorpusError(DataError):
  """A blocks directory, or one shard of it, with no blocks."""


class MissingCorpusError(MissingDataError, CorpusFormatError):
  """A blocks directory or its manifest is missing: both missing data and a bad corpus."""


# ---------------------------------------------------------------------- names and hashes --

def shard_name(prefix: str, index: int, num_shards: int, suffix: str = TFRECORD_SUFFIX) -> str:
  """``shard_name("blocks", 3, 8)`` -> ``"blocks-00003-of-00008.tfrecord"`` (prefix may be a
  path)."""
  return f"{prefix}-{index:05d}-of-{num_shards:05d}{suffix}"


def corpus_fingerprint(uids: Iterable) -> str:
  """Hex SHA1 over the block uids (str or bytes) in block_id order, each followed by "\\n"."""
  h = hashlib.sha1()
  for uid in uids:
    h.update((uid if isinstance(uid, bytes) else uid.encode("ascii")) + b"\n")
  return h.hexdigest()


def file_sha1(path: str) -> str:
  """Hex SHA1 of a local or remote file's bytes (e.g. ``vocab_sha1`` of a manifest)."""
  h = hashlib.sha1()
  with tf.io.gfile.GFile(path, "rb") as f:
    while True:
      chunk = f.read(1 << 20)
      if not chunk:
        break
      h.update(chunk)
  return h.hexdigest()


# ------------------------------------------------------------------ manifests and shards --

def _read_manifest(directory: str, missing_error, format_error, not_found: str,
                   no_manifest: str) -> Dict:
  """The JSON object in ``directory/manifest.json``; the errors' classes and texts are given."""
  if not tf.io.gfile.isdir(directory):
    raise missing_error(not_found)
  path = os.path.join(directory, MANIFEST)
  if not tf.io.gfile.exists(path):
    raise missing_error(no_manifest)
  with tf.io.gfile.GFile(path, "r") as f:
    try:
      manifest = json.load(f)
    except ValueError as e:
      raise format_error(f"{path} is not valid JSON: {e}") from None
  if not isinstance(manifest, dict):
    raise format_error(f"{path} is not a JSON object")
  return manifest


def load_manifest(directory: str) -> Dict:
  """The ``manifest.json`` of any data directory (blocks, sentences, examples).

  Raises MissingDataError when the directory or its manifest is missing, DataError when the
  manifest is not a JSON object.
  """
  return _read_manifest(
      directory, MissingDataError, DataError, f"directory not found: {directory}",
      f"no {MANIFEST} in {directory}: its pipeline run did not finish or it is not a data "
      "directory; run the pipeline that writes it first")


def load_blocks_manifest(blocks_dir: str) -> Dict:
  """The manifest of a blocks directory, checked: it has :data:`BLOCKS_MANIFEST_KEYS` and blocks.

  Raises MissingCorpusError (a missing directory or manifest), CorpusFormatError (bad JSON,
  missing keys) or EmptyCorpusError (``num_blocks`` 0).
  """
  manifest = _read_manifest(
      blocks_dir, MissingCorpusError, CorpusFormatError,
      f"blocks directory not found: {blocks_dir}",
      f"{blocks_dir} is not a blocks directory: no {MANIFEST} (write one with the blocks "
      "pipeline, or write_blocks for a small corpus)")
  path = os.path.join(blocks_dir, MANIFEST)
  missing = [k for k in BLOCKS_MANIFEST_KEYS if k not in manifest]
  if missing:
    raise CorpusFormatError(f"{path} lacks the keys {missing}")
  if int(manifest["num_blocks"]) <= 0:
    raise EmptyCorpusError(f"the corpus in {blocks_dir} is empty (num_blocks = "
                           f"{manifest['num_blocks']}): nothing to index")
  return manifest


def shard_files(directory: str, prefix: str, suffix: str = TFRECORD_SUFFIX) -> List[str]:
  """Sorted shard files ``<prefix>-SSSSS-of-NNNNN<suffix>`` of a directory (maybe none).

  Raises MissingDataError when the directory does not exist.
  """
  if not tf.io.gfile.isdir(directory):
    raise MissingDataError(f"directory not found: {directory}")
  return sorted(
      os.path.join(directory, f) for f in tf.io.gfile.listdir(directory)
      if f.startswith(prefix + "-") and f.endswith(suffix) and "-of-" in f)


def block_shard_files(blocks_dir: str, manifest: Optional[Dict] = None) -> List[str]:
  """The sorted TFRecord shards of ``blocks_dir``, checked against the manifest's num_shards."""
  manifest = manifest or load_blocks_manifest(blocks_dir)
  files = shard_files(blocks_dir, BLOCKS_PREFIX)
  pattern = f"{BLOCKS_PREFIX}-*-of-*{TFRECORD_SUFFIX}"
  if not files:
    raise EmptyCorpusError(f"no {pattern} files in {blocks_dir}")
  expected = int(manifest.get("num_shards", len(files)))
  if len(files) != expected:
    raise CorpusFormatError(
        f"{blocks_dir}: manifest says {expected} shards but {len(files)} files match "
        f"{pattern} (an unfinished run of the blocks pipeline?)")
  return files


# ------------------------------------------------------------------------------------ readers --

def _iter_records(files: Sequence[str]) -> Iterator[bytes]:
  for path in files:
    for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
      yield record


def read_blocks(blocks_dir: str, check_manifest: bool = True) -> List[Dict]:
  """All blocks of a blocks directory (dicts as ``features.parse_block`` gives), sorted by block_id.

  With ``check_manifest``, the shards, the count and the fingerprint are checked against
  ``manifest.json`` (CorpusFormatError when they differ).
  """
  if check_manifest:
    manifest = load_blocks_manifest(blocks_dir)
    files = block_shard_files(blocks_dir, manifest)
  else:
    manifest, files = None, shard_files(blocks_dir, BLOCKS_PREFIX)
  blocks = sorted((features.parse_block(r) for r in _iter_records(files)), key=lambda b: b["block_id"])
  if manifest is not None:
    if len(blocks) != manifest["num_blocks"]:
      raise CorpusFormatError(f"{blocks_dir}: {len(blocks)} blocks on disk, manifest says "
                              f"{manifest['num_blocks']}")
    if corpus_fingerprint(b["uid"] for b in blocks) != manifest["fingerprint"]:
      raise CorpusFormatError(f"{blocks_dir}: the blocks do not match the manifest fingerprint")
  return blocks


def write_blocks(blocks_dir: str, titles: Sequence[str], bodies: Sequence[str], tokenizer,
                 block_seq_length: int, num_shards: int = 1, vocab_file: Optional[str] = None
                 ) -> Dict:
  """Writes a small blocks directory in the format of the module docstring (for tests, demos, custom corpora).

  ``tokenizer`` is a ``RealmTokenizer``; ``token_ids`` are its ``block_inputs`` without padding.
  Block ``i`` is ``(titles[i], bodies[i])``. Returns the manifest.
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
  uids = [features.block_uid(t, b) for t, b in zip(titles, bodies)]
  n = len(titles)
  for shard in range(num_shards):
    path = os.path.join(blocks_dir, shard_name(BLOCKS_PREFIX, shard, num_shards))
    with tf.io.TFRecordWriter(path) as writer:
      for i in range(shard * n // num_shards, (shard + 1) * n // num_shards):
        writer.write(features.serialize_block(i, uids[i], titles[i], bodies[i], token_ids[i]))
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
  with tf.io.gfile.GFile(os.path.join(blocks_dir, MANIFEST), "w") as f:
    json.dump(manifest, f, indent=2)
  return manifest


def load_ict_manifest(examples_dir: str) -> Dict:
  """The manifest of an ICT examples directory in the sampled format (:data:`ICT_SAMPLING`).

  Raises MissingDataError (no directory or manifest) or DataError for a directory of another
  format, e.g. the fixed (sentence, block) pairs of older versions.
  """
  manifest = load_manifest(examples_dir)
  missing = [k for k in ICT_MANIFEST_KEYS if k not in manifest]
  if missing or manifest["sampling"] != ICT_SAMPLING:
    raise DataError(f"{examples_dir} holds ICT examples in an older format (fixed pairs; its "
                    f"manifest lacks {missing or ['sampling = ' + repr(ICT_SAMPLING)]}): "
                    "rebuild it with python -m data_prep.ict_examples")
  return manifest


def example_files(examples_dir: str, split: str = TRAIN_SPLIT) -> List[str]:
  """The ``<split>-*.tfrecord`` shards of a pre-training or ICT examples directory."""
  return shard_files(examples_dir, split)


def read_examples(examples_dir: str, split: str = TRAIN_SPLIT) -> List[Dict]:
  """All examples of one split as plain dicts (for tests and inspection, not for training)."""
  return [features.example_to_dict(tf.train.Example.FromString(r))
          for r in _iter_records(example_files(examples_dir, split))]


def read_sentences(sentences_dir: str) -> Iterator[Dict]:
  """The annotated sentences (dicts with ``features.SENTENCE_FIELDS``), shard by shard."""
  for path in shard_files(sentences_dir, SENTENCES_PREFIX, JSONL_SUFFIX):
    with tf.io.gfile.GFile(path, "r") as f:
      for line in f:
        if line.strip():
          yield json.loads(line)
