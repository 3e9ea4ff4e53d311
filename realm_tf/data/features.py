"""The tf.Example records of the data directories: their features, writers and parsers.

What one record of each directory (``manifests``) holds, and the one place that writes, parses
and packs records.

Block (``blocks-*.tfrecord``, :data:`BLOCK_FEATURES`)::

  block_id    int64   dense 0..num_blocks-1, ordered by (title, source text hash, position of
                      the block within its article): the same on every run and every runner
  uid         bytes   hex SHA1(title + " <sep> " + body), REALM's document uid (block_uid)
  title       bytes   article title (UTF-8)
  doc_title   bytes   same as title
  body        bytes   block text: whole sentences of the article, original spacing
  token_ids   int64[] [CLS] title [SEP] body [SEP], unpadded, at most block_seq_length (288)

:func:`pack_block_ids` turns ``token_ids`` into fixed-length model inputs::

    {"token_ids": [[2, 7, 3, 9, 9, 3]]}  --pack_block_ids(seq_length=5)-->
    input_word_ids [[2, 7, 3, 9, 3]]   (trimmed; the final [SEP] is kept)
    input_mask     [[1, 1, 1, 1, 1]]
    input_type_ids [[0, 0, 0, 1, 1]]   (0 through the first [SEP], 1 after)

Pre-training example: features in :data:`PRETRAIN_FEATURES` (fixed length;
:func:`parse_pretrain_example` casts the int64s to int32) and host-only strings in
:data:`PRETRAIN_HOST_FEATURES`; the other maskings of the sentence that training draws from in
:data:`PRETRAIN_VARIANT_FEATURES` (optional; see :func:`choose_pretrain_variant`).

ICT record: one per block with at least two sentences (:data:`ICT_RECORD_FEATURES`, written by
:func:`serialize_ict_block`): ``block_id``, the title's wordpieces ``title_ids`` and the body's
sentences as wordpieces, flattened in ``sentence_token_ids`` with ``sentence_lengths``. The
pairs are drawn when read, as ORQA does: :func:`sample_ict_examples` picks one sentence of each
block as the query ``[CLS] sentence [SEP]`` (cut to ``query_seq_length``) and, with a fresh
coin, removes it from the block ``[CLS] title [SEP] other sentences [SEP]`` with probability
``remove_prob``; the result has :func:`ict_features`.

Sentence (one JSON line of ``sentences-*.jsonl``): :data:`SENTENCE_FIELDS`.
"""

import hashlib
from typing import Dict, Sequence

import tensorflow as tf

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
# What parse_block_batch reads (``doc_title`` repeats ``title``).
_BLOCK_BATCH_FEATURES = {k: v for k, v in BLOCK_FEATURES.items() if k != "doc_title"}
_BLOCK_LIST_FEATURES = ("token_ids",)

# The pre-training examples whose sentence comes from the knowledge corpus Z (the blocks REALM
# retrieves from) name their block: ``source_block_id`` (its row) and ``source_uid``, which REALM
# excludes from their candidates ("prohibit trivial retrieval"). Examples from a corpus of
# documents that is not Z (the paper's X = CC-News over Z = Wikipedia) have
# ``source_block_id`` = EXTERNAL_SOURCE_BLOCK_ID and an empty ``source_uid``: nothing is
# excluded. ``source_corpus`` names the corpus either way (KNOWLEDGE_CORPUS for Z; examples
# written before the feature existed are all from Z and parse as such).
EXTERNAL_SOURCE_BLOCK_ID = -1
KNOWLEDGE_CORPUS = "knowledge"

PRETRAIN_HOST_FEATURES = {
    "source_uid": tf.io.FixedLenFeature([], tf.string),
    "source_corpus": tf.io.FixedLenFeature([], tf.string, default_value=KNOWLEDGE_CORPUS),
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


def block_uid(title: str, body: str) -> str:
  """REALM's document uid: hex ``SHA1(title + " <sep> " + body)`` over UTF-8."""
  return hashlib.sha1(f"{title} <sep> {body}".encode("utf-8")).hexdigest()


def example_to_dict(example: tf.train.Example) -> Dict:
  """tf.Example -> plain dict of lists (str for bytes)."""
  out = {}
  for key, feature in example.features.feature.items():
    kind = feature.WhichOneof("kind")
    values = list(getattr(feature, kind).value) if kind else []
    if kind == "bytes_list":
      values = [v.decode("utf-8") for v in values]
    out[key] = values
  return out


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


def ict_draws(num_sentences: tf.Tensor, seed, remove_prob: float):
  """The random choices of :func:`sample_ict_examples`, from ``stateless_uniform([b, 2], seed)``.

  Returns ``(index, removed)``: sentence ``floor(u[:, 0] * num_sentences)`` of each row, int32
  ``[b]``, and ``u[:, 1] < remove_prob``, bool ``[b]``.
  """
  n = tf.cast(num_sentences, tf.int32)
  u = tf.random.stateless_uniform(tf.stack([tf.size(n), 2]), seed=seed)
  index = tf.minimum(tf.cast(u[:, 0] * tf.cast(n, tf.float32), tf.int32), n - 1)
  return index, u[:, 1] < remove_prob


def mask_query_spans(word_ids, input_mask, seed, prob: float, mask_id: int, max_span: int):
  """With probability ``prob`` per row, a span of 1 to ``max_span`` wordpieces (uniform, at most
  the sentence) at a uniform place of a ``[CLS] sentence [SEP]`` query becomes ``[MASK]``: ICT
  queries shaped like REALM's masked ones. Draws from ``stateless_uniform([b, 3], seed)``."""
  batch, width = tf.shape(word_ids)[0], word_ids.shape[1]
  u = tf.random.stateless_uniform(tf.stack([batch, 3]), seed=seed)
  inner = tf.maximum(tf.reduce_sum(tf.cast(input_mask, tf.int32), axis=1) - 2, 0)
  span = tf.minimum(1 + tf.cast(u[:, 0] * max_span, tf.int32), inner)
  start = 1 + tf.minimum(tf.cast(u[:, 1] * tf.cast(inner - span + 1, tf.float32), tf.int32),
                         inner - span)
  pos = tf.range(width)[tf.newaxis, :]
  hit = ((pos >= start[:, tf.newaxis]) & (pos < (start + span)[:, tf.newaxis]) &
         (u[:, 2] < prob)[:, tf.newaxis])
  return tf.where(hit, tf.cast(mask_id, word_ids.dtype), word_ids)


def sample_ict_examples(parsed: Dict[str, tf.Tensor], seed, query_seq_length: int,
                        block_seq_length: int, remove_prob: float, cls_id: int,
                        sep_id: int, query_mask_prob: float = 0.0, mask_id: int = -1,
                        max_mask_span: int = 3) -> Dict[str, tf.Tensor]:
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
    query_mask_prob: probability that a span of the query is masked (:func:`mask_query_spans`
      with ``mask_id`` and ``max_mask_span``); 0, ORQA's ICT.

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
  query_ids = query["input_word_ids"]
  if query_mask_prob > 0:
    query_ids = mask_query_spans(query_ids, query["input_mask"],
                                 tf.random.experimental.stateless_fold_in(seed, 1),
                                 query_mask_prob, mask_id, max_mask_span)
  out = {
      "query_ids": query_ids, "query_mask": query["input_mask"],
      "block_ids": block["input_word_ids"], "block_mask": block["input_mask"],
      "block_type_ids": block["input_type_ids"],
      "block_id": tf.cast(parsed["block_id"], tf.int32),
      "sentence_removed": tf.cast(removed, tf.int32),
  }
  rows = parsed["block_id"].shape[:1]  # Static when the batch size is.
  spec = ict_features(query_seq_length, block_seq_length)
  return {k: tf.ensure_shape(v, rows.concatenate(spec[k].shape)) for k, v in out.items()}
