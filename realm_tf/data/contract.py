"""The on-disk contracts: file names, tf.Example features, manifests, readers and a writer.

The one definition of the directories that the corpus pipelines write and that the index, the
trainers and the evaluation read. Nothing else lists shards, reads a manifest or parses a
block.

Blocks directory::

  blocks-00000-of-0000N.tfrecord   tf.Example, one per block (shards in any order; read_blocks
                                   sorts by block_id)
  manifest.json                    {"num_blocks", "fingerprint", "num_shards", "vocab_file",
                                    "vocab_sha1", "lower_case", "block_seq_length", ...}

  block_id    int64   dense 0..num_blocks-1, ordered by (title, source text hash, position of
                      the block within its article): the same on every run and every runner
  uid         bytes   hex SHA1(title + " <sep> " + body), REALM's document uid (block_uid)
  title       bytes   article title (UTF-8)
  doc_title   bytes   same as title
  body        bytes   block text: whole sentences of the article, original spacing
  token_ids   int64[] [CLS] title [SEP] body [SEP], unpadded, at most block_seq_length (288)

``fingerprint`` = hex SHA1 over the uids in block_id order, each followed by "\\n"
(:func:`corpus_fingerprint`). :func:`pack_block_ids` turns ``token_ids`` into fixed-length
model inputs::

    {"token_ids": [[2, 7, 3, 9, 9, 3]]}  --pack_block_ids(seq_length=5)-->
    input_word_ids [[2, 7, 3, 9, 3]]   (trimmed; the final [SEP] is kept)
    input_mask     [[1, 1, 1, 1, 1]]
    input_type_ids [[0, 0, 0, 1, 1]]   (0 through the first [SEP], 1 after)

Pre-training examples directory: ``train-*.tfrecord``, ``eval-*.tfrecord``, ``manifest.json``;
features in :data:`PRETRAIN_FEATURES` (fixed length; :func:`parse_pretrain_example` casts the
int64s to int32) and host-only strings in :data:`PRETRAIN_HOST_FEATURES`; the other maskings of
the sentence that training draws from in :data:`PRETRAIN_VARIANT_FEATURES` (optional; see
:func:`choose_pretrain_variant`).

ICT examples directory: ``train-*.tfrecord``, ``eval-*.tfrecord``, ``manifest.json``. One
record per block with at least two sentences (:data:`ICT_RECORD_FEATURES`, written by
:func:`serialize_ict_block`): ``block_id``, the title's wordpieces ``title_ids`` and the body's
sentences as wordpieces, flattened in ``sentence_token_ids`` with ``sentence_lengths``. The
manifest (:func:`load_ict_manifest`) has ``"sampling": ICT_SAMPLING``, the default
``remove_prob`` and the ``cls_id``/``sep_id`` of its vocabulary. The pairs are drawn when read,
as ORQA does: :func:`sample_ict_examples` picks one sentence of each block as the query
``[CLS] sentence [SEP]`` (cut to ``query_seq_length``) and, with a fresh coin, removes it from
the block ``[CLS] title [SEP] other sentences [SEP]`` with probability ``remove_prob``; the
result has :func:`ict_features`.

Sentences directory (intermediate): ``sentences-*.jsonl``, one JSON object per sentence (see
:data:`SENTENCE_FIELDS`), and ``manifest.json``.

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

MANIFEST = "manifest.json"
BLOCKS_PREFIX = "blocks"
TFRECORD_SUFFIX = ".tfrecord"
SENTENCES_PREFIX = "sentences"
JSONL_SUFFIX = ".jsonl"
TRAIN_SPLIT = "train"
EVAL_SPLIT = "eval"

BLOCK_SEQ_LENGTH = 288
QUERY_SEQ_LENGTH = 96
MAX_MASKS = 10

# Keys every blocks manifest has (the pipelines write more).
BLOCKS_MANIFEST_KEYS = ("num_blocks", "fingerprint", "num_shards")

BLOCK_FEATURES = {
    "block_id": tf.io.FixedLenFeature([], tf.int64),
    "uid": tf.io.FixedLenFeature([], tf.string),
    "title": tf.io.FixedLenFeature([], tf.string),
    "doc_title": tf.io.FixedLenFeature([], tf.string),
    "body": tf.io.FixedLenFeature([], tf.string),
    "token_ids": tf.io.VarLenFeature(tf.int64),
}
# What parse_block_batch reads (``doc_title`` repeats ``title``).
_BLOCK_BATCH_FEATURES = {k: v for k, v in BLOCK_FEATURES.items() if k != "doc_title"}
_BLOCK_LIST_FEATURES = ("token_ids",)

PRETRAIN_HOST_FEATURES = {
    "source_uid": tf.io.FixedLenFeature([], tf.string),
    "answer": tf.io.FixedLenFeature([], tf.string),
    "sentence": tf.io.FixedLenFeature([], tf.string),
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


PRETRAIN_FEATURES = pretrain_features()

# The fixed features that each variant of a pre-training example repeats, as "variant_<name>".
PRETRAIN_VARIANT_FIELDS = ("query_ids", "query_mask", "mlm_positions", "mlm_ids", "mlm_weights",
                           "answer")


def pretrain_variant_features(with_host_features: bool = True) -> Dict[str, object]:
  """Feature spec of the variants of a pre-training example: the sentence's other maskings.

  ``num_variants`` V (0 in examples written without variants) and, flattened one variant after
  the other, ``variant_query_ids`` and ``variant_query_mask`` [V * query_seq_length],
  ``variant_mlm_positions``, ``variant_mlm_ids`` and ``variant_mlm_weights`` [V * max_masks] and
  ``variant_answer`` [V] (a host feature). Variable-length: parsed as ragged lists.
  """
  spec = {"num_variants": tf.io.FixedLenFeature([], tf.int64, default_value=0)}
  for name in PRETRAIN_VARIANT_FIELDS:
    if name == "answer" and not with_host_features:
      continue
    dtype = {"mlm_weights": tf.float32, "answer": tf.string}.get(name, tf.int64)
    spec["variant_" + name] = tf.io.RaggedFeature(dtype)
  return spec


PRETRAIN_VARIANT_FEATURES = pretrain_variant_features()


def ict_features(query_seq_length: int = QUERY_SEQ_LENGTH,
                 block_seq_length: int = BLOCK_SEQ_LENGTH) -> Dict[str, tf.TensorSpec]:
  """Spec of one sampled Inverse Cloze Task example (:func:`sample_ict_examples` gives
  batches of these): int32 query and block inputs, the block's id and whether the query
  sentence was cut out of the block (1) or left in (0)."""
  q, b = [query_seq_length], [block_seq_length]
  return {
      "query_ids": tf.TensorSpec(q, tf.int32),
      "query_mask": tf.TensorSpec(q, tf.int32),
      "block_ids": tf.TensorSpec(b, tf.int32),
      "block_mask": tf.TensorSpec(b, tf.int32),
      "block_type_ids": tf.TensorSpec(b, tf.int32),
      "block_id": tf.TensorSpec([], tf.int32),
      "sentence_removed": tf.TensorSpec([], tf.int32),
  }


ICT_FEATURES = ict_features()

# One ICT record per block: the sentences' wordpieces are ragged [(sentences), (wordpieces)].
ICT_RECORD_FEATURES = {
    "block_id": tf.io.FixedLenFeature([], tf.int64),
    "title_ids": tf.io.RaggedFeature(tf.int64),
    "sentences": tf.io.RaggedFeature(
        tf.int64, value_key="sentence_token_ids",
        partitions=[tf.io.RaggedFeature.RowLengths("sentence_lengths")]),
}
# The manifest's ``sampling`` of an ICT directory in this format (older ones lack the key).
ICT_SAMPLING = "one random sentence per block per read, fresh removal coin"
ICT_MANIFEST_KEYS = ("sampling", "remove_prob", "cls_id", "sep_id")

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


# ------------------------------------------------------------------------------------ errors --

class DataError(ValueError):
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


def _decode(value):
  return value.decode("utf-8") if isinstance(value, bytes) else value


def block_uid(title: str, body: str) -> str:
  """REALM's document uid: hex ``SHA1(title + " <sep> " + body)`` over UTF-8."""
  return hashlib.sha1(f"{title} <sep> {body}".encode("utf-8")).hexdigest()


def corpus_fingerprint(uids: Iterable) -> str:
  """Hex SHA1 over the block uids (str or bytes) in block_id order, each followed by "\\n"."""
  h = hashlib.sha1()
  for uid in uids:
    h.update(_decode(uid).encode("ascii") + b"\n")
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


# ----------------------------------------------------------------------------- tf.Example --

def _iter_records(files: Sequence[str]) -> Iterator[bytes]:
  for path in files:
    for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
      yield record


def iter_tf_examples(files: Sequence[str]) -> Iterator[tf.train.Example]:
  """The tf.Examples of TFRecord files, file by file."""
  for record in _iter_records(files):
    yield tf.train.Example.FromString(record)


def example_to_dict(example: tf.train.Example) -> Dict:
  """tf.Example -> plain dict of lists (str for bytes)."""
  out = {}
  for key, feature in example.features.feature.items():
    kind = feature.WhichOneof("kind")
    values = list(getattr(feature, kind).value) if kind else []
    if kind == "bytes_list":
      values = [_decode(v) for v in values]
    out[key] = values
  return out


# --------------------------------------------------------------------------------- blocks --

def serialize_block(block_id: int, uid: str, title: str, body: str,
                    token_ids: Sequence[int]) -> bytes:
  """One block -> serialized tf.Example with :data:`BLOCK_FEATURES` (``doc_title`` = title)."""
  def text(value):
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value.encode("utf-8")]))

  def ints(values):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in values]))

  return tf.train.Example(features=tf.train.Features(feature={
      "block_id": ints([block_id]),
      "uid": text(uid),
      "title": text(title),
      "doc_title": text(title),
      "body": text(body),
      "token_ids": ints(token_ids),
  })).SerializeToString()


def parse_block(serialized: bytes) -> Dict:
  """A serialized block -> ``{"block_id": int, "uid", "title", "doc_title", "body": str,
  "token_ids": [int, ...]}``."""
  d = example_to_dict(tf.train.Example.FromString(serialized))
  return {k: (v if k in _BLOCK_LIST_FEATURES else v[0]) for k, v in d.items()}


def read_blocks(blocks_dir: str, check_manifest: bool = True) -> List[Dict]:
  """All blocks of a blocks directory (dicts as :func:`parse_block` gives), sorted by block_id.

  With ``check_manifest``, the shards, the count and the fingerprint are checked against
  ``manifest.json`` (CorpusFormatError when they differ).
  """
  if check_manifest:
    manifest = load_blocks_manifest(blocks_dir)
    files = block_shard_files(blocks_dir, manifest)
  else:
    manifest, files = None, shard_files(blocks_dir, BLOCKS_PREFIX)
  blocks = sorted((parse_block(r) for r in _iter_records(files)), key=lambda b: b["block_id"])
  if manifest is not None:
    if len(blocks) != manifest["num_blocks"]:
      raise CorpusFormatError(f"{blocks_dir}: {len(blocks)} blocks on disk, manifest says "
                              f"{manifest['num_blocks']}")
    if corpus_fingerprint(b["uid"] for b in blocks) != manifest["fingerprint"]:
      raise CorpusFormatError(f"{blocks_dir}: the blocks do not match the manifest fingerprint")
  return blocks


def parse_block_batch(serialized: tf.Tensor) -> Dict[str, tf.Tensor]:
  """A batch of serialized blocks -> dict of tensors (``token_ids`` ragged int64; no
  ``doc_title``)."""
  parsed = tf.io.parse_example(serialized, _BLOCK_BATCH_FEATURES)
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


def write_blocks(blocks_dir: str, titles: Sequence[str], bodies: Sequence[str], tokenizer,
                 block_seq_length: int, num_shards: int = 1, vocab_file: Optional[str] = None
                 ) -> Dict:
  """Writes a small blocks directory in the format above (for tests, demos, custom corpora).

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
  uids = [block_uid(t, b) for t, b in zip(titles, bodies)]
  n = len(titles)
  for shard in range(num_shards):
    path = os.path.join(blocks_dir, shard_name(BLOCKS_PREFIX, shard, num_shards))
    with tf.io.TFRecordWriter(path) as writer:
      for i in range(shard * n // num_shards, (shard + 1) * n // num_shards):
        writer.write(serialize_block(i, uids[i], titles[i], bodies[i], token_ids[i]))
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


# ---------------------------------------------------------------- examples and sentences --

def _cast_ints(parsed: Dict[str, tf.Tensor]) -> Dict[str, tf.Tensor]:
  return {k: tf.cast(v, tf.int32) if v.dtype == tf.int64 else v for k, v in parsed.items()}


def _parse(serialized, spec):
  parse = tf.io.parse_example if serialized.shape.rank else tf.io.parse_single_example
  return _cast_ints(parse(serialized, spec))


def parse_pretrain_example(serialized, query_seq_length: int = QUERY_SEQ_LENGTH,
                           max_masks: int = MAX_MASKS, with_host_features: bool = True,
                           with_variants: bool = False):
  """Serialized pre-training tf.Example(s) -> dict of tensors; int64 features become int32.

  With ``with_variants``, also :func:`pretrain_variant_features` (ragged ``[batch, (n)]`` for a
  batch), for :func:`choose_pretrain_variant`.
  """
  spec = pretrain_features(query_seq_length, max_masks, with_host_features)
  if with_variants:
    spec.update(pretrain_variant_features(with_host_features))
  return _parse(serialized, spec)


def choose_pretrain_variant(parsed: Dict[str, tf.Tensor], seed) -> Dict[str, tf.Tensor]:
  """A batch parsed ``with_variants`` -> the same batch with each row's masking drawn afresh.

  Row ``r`` with ``V_r > 0`` variants takes its variant ``floor(u_r * V_r)``, ``u`` =
  ``tf.random.stateless_uniform([batch], seed)``: one seed gives the same choices, so a seed
  that differs for every batch read (e.g. ``(seed, batch index)``) draws afresh at every read,
  reproducibly. Rows without variants (examples written before variants) keep their fixed
  features. Returns the keys, shapes and dtypes of :func:`parse_pretrain_example` without
  ``with_variants``.

  Args:
    parsed: :func:`parse_pretrain_example` of a batch (rank-1 ``serialized``),
      ``with_variants=True``.
    seed: a shape ``[2]`` integer tensor (the stateless random ops' seed).
  """
  out = {k: v for k, v in parsed.items()
         if k != "num_variants" and not k.startswith("variant_")}
  num = tf.cast(parsed["num_variants"], tf.int32)
  has = num > 0
  u = tf.random.stateless_uniform(tf.shape(num), seed)
  pick = tf.minimum(tf.cast(u * tf.cast(num, tf.float32), tf.int32), tf.maximum(num - 1, 0))
  for name in PRETRAIN_VARIANT_FIELDS:
    if "variant_" + name not in parsed or name not in out:
      continue
    flat = parsed["variant_" + name]  # Ragged [batch, (V_r * width)].
    fixed = out[name] if out[name].shape.rank == 2 else out[name][:, tf.newaxis]
    width = fixed.shape[-1]
    variants = tf.reshape(flat.values, [-1, width])  # Every variant of the batch, row by row.
    # A row without variants points at one appended padding row, then keeps its fixed value.
    padded = tf.concat([variants, tf.zeros_like(fixed[:1])], axis=0)
    first = tf.cast(flat.row_starts(), tf.int32) // width
    index = tf.where(has, first + pick, tf.shape(variants)[0])
    chosen = tf.where(has[:, tf.newaxis], tf.gather(padded, index), fixed)
    out[name] = chosen if out[name].shape.rank == 2 else chosen[:, 0]
  return out


def serialize_ict_block(block_id: int, title_ids: Sequence[int],
                        sentences: Sequence[Sequence[int]]) -> bytes:
  """One block's ICT record (:data:`ICT_RECORD_FEATURES`): its id, its title's wordpieces and
  its body's sentences, each a list of wordpieces (at least two, none empty)."""
  if len(sentences) < 2 or not all(len(s) for s in sentences):
    raise ValueError(f"block {block_id}: an ICT record needs two or more non-empty sentences, "
                     f"got lengths {[len(s) for s in sentences]}")

  def ints(values):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in values]))

  return tf.train.Example(features=tf.train.Features(feature={
      "block_id": ints([block_id]),
      "title_ids": ints(title_ids),
      "sentence_token_ids": ints([i for s in sentences for i in s]),
      "sentence_lengths": ints([len(s) for s in sentences]),
  })).SerializeToString()


def parse_ict_example(serialized) -> Dict[str, tf.Tensor]:
  """Serialized ICT records ``[b]`` -> ``block_id`` int32 ``[b]``, ``title_ids`` int32 ragged
  ``[b, (t)]`` and ``sentences`` int32 ragged ``[b, (sentences), (wordpieces)]``."""
  if serialized.shape.rank != 1:
    raise ValueError(f"parse_ict_example takes a batch of records (rank 1), got shape "
                     f"{serialized.shape}")
  return _cast_ints(tf.io.parse_example(serialized, ICT_RECORD_FEATURES))


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


def ict_draws(num_sentences: tf.Tensor, seed, remove_prob: float):
  """The random choices of :func:`sample_ict_examples`, from ``stateless_uniform([b, 2], seed)``.

  Returns ``(index, removed)``: sentence ``floor(u[:, 0] * num_sentences)`` of each row, int32
  ``[b]``, and ``u[:, 1] < remove_prob``, bool ``[b]``.
  """
  n = tf.cast(num_sentences, tf.int32)
  u = tf.random.stateless_uniform(tf.stack([tf.size(n), 2]), seed=seed)
  index = tf.minimum(tf.cast(u[:, 0] * tf.cast(n, tf.float32), tf.int32), n - 1)
  return index, u[:, 1] < remove_prob


def sample_ict_examples(parsed: Dict[str, tf.Tensor], seed, query_seq_length: int,
                        block_seq_length: int, remove_prob: float, cls_id: int,
                        sep_id: int) -> Dict[str, tf.Tensor]:
  """ORQA's Inverse Cloze Task: one fresh (query, block) pair per parsed ICT record.

  In each row, sentence ``i`` (uniform over the block's sentences, :func:`ict_draws`) is the
  query ``[CLS] sentence_i[:query_seq_length - 2] [SEP]``; the block is ``[CLS] title [SEP]
  context [SEP]``, the context being the block's sentences in order without sentence ``i``
  with probability ``remove_prob`` (with it otherwise). The title keeps at most
  ``block_seq_length - 3`` wordpieces, then the context is cut to fit and the final ``[SEP]``
  kept: the layout and type ids of the tokenizer's ``block_inputs`` (:func:`pack_block_ids`).

  Args:
    parsed: a batch of records, as :func:`parse_ict_example` gives.
    seed: the stateless seed of this batch, int ``[2]``; one seed, one set of pairs.
    query_seq_length: query length.
    block_seq_length: block length.
    remove_prob: probability that the query sentence is cut out of its block.
    cls_id: the ``[CLS]`` id.
    sep_id: the ``[SEP]`` id.

  Returns:
    A batch of examples with :func:`ict_features` (int32).
  """
  sentences = parsed["sentences"]
  index, removed = ict_draws(sentences.row_lengths(), seed, remove_prob)
  batch = tf.shape(index)[0]
  splits = sentences.row_splits.dtype
  cls = tf.RaggedTensor.from_tensor(tf.fill([batch, 1], cls_id), row_splits_dtype=splits)
  sep = tf.RaggedTensor.from_tensor(tf.fill([batch, 1], sep_id), row_splits_dtype=splits)
  query = tf.gather(sentences, index, batch_dims=1)
  query = pack_block_ids(tf.concat([cls, query, sep], axis=1), query_seq_length, sep_id,
                         segment_ids=False)
  position = tf.ragged.range(tf.cast(sentences.row_lengths(), tf.int32),
                             row_splits_dtype=splits)
  keep = tf.logical_or(tf.not_equal(position, index[:, tf.newaxis]),
                       tf.logical_not(removed)[:, tf.newaxis])
  context = tf.ragged.boolean_mask(sentences, keep).merge_dims(1, 2)
  title = parsed["title_ids"][:, :max(block_seq_length - 3, 0)]
  block = pack_block_ids(tf.concat([cls, title, sep, context, sep], axis=1), block_seq_length,
                         sep_id)
  out = {
      "query_ids": query["input_word_ids"], "query_mask": query["input_mask"],
      "block_ids": block["input_word_ids"], "block_mask": block["input_mask"],
      "block_type_ids": block["input_type_ids"],
      "block_id": tf.cast(parsed["block_id"], tf.int32),
      "sentence_removed": tf.cast(removed, tf.int32),
  }
  rows = parsed["block_id"].shape[:1]  # Static when the batch size is.
  spec = ict_features(query_seq_length, block_seq_length)
  return {k: tf.ensure_shape(v, rows.concatenate(spec[k].shape)) for k, v in out.items()}


def example_files(examples_dir: str, split: str = TRAIN_SPLIT) -> List[str]:
  """The ``<split>-*.tfrecord`` shards of a pre-training or ICT examples directory."""
  return shard_files(examples_dir, split)


def read_examples(examples_dir: str, split: str = TRAIN_SPLIT) -> List[Dict]:
  """All examples of one split as plain dicts (for tests and inspection, not for training)."""
  return [example_to_dict(ex) for ex in iter_tf_examples(example_files(examples_dir, split))]


def read_sentences(sentences_dir: str) -> Iterator[Dict]:
  """The annotated sentences (dicts with :data:`SENTENCE_FIELDS`), shard by shard."""
  for path in shard_files(sentences_dir, SENTENCES_PREFIX, JSONL_SUFFIX):
    with tf.io.gfile.GFile(path, "r") as f:
      for line in f:
        if line.strip():
          yield json.loads(line)
