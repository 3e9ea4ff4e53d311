"""REALM's models: the towers and readers that the tasks train, in the model-directory names.

Each model exposes ``checkpoint_items``, a property (as Model Garden's models do): Model
Garden's trainer puts these items at the top level of every checkpoint, beside ``model``, so
a checkpoint of any task follows the model-directory contract (``query_embedder``,
``block_embedder``, ``reader``) and the refresher can restore the towers alone.
"""

import tensorflow as tf
import tf_keras

from realm_tf import configs
from realm_tf.modeling import factory
from realm_tf.modeling import openqa_losses
from realm_tf.modeling import span_scorer


def _unique(variables):
  seen, out = set(), []
  for v in variables:
    if id(v) not in seen:
      seen.add(id(v))
      out.append(v)
  return out


class RetrieverModel(tf.Module):
  """The two towers (one object when shared), for ICT."""

  def __init__(self, query_embedder, block_embedder):
    super().__init__()
    self.query_embedder = query_embedder
    self.block_embedder = block_embedder

  @classmethod
  def from_config_dataclass(cls, config: configs.RetrieverConfig) -> "RetrieverModel":
    return cls(*factory.build_embedders(config))

  @property
  def trainable_variables(self):
    return _unique(self.query_embedder.trainable_variables +
                   self.block_embedder.trainable_variables)

  @property
  def checkpoint_items(self):
    return dict(query_embedder=self.query_embedder, block_embedder=self.block_embedder)


class ReaderModel(tf.Module):
  """The reader alone, for its warm starts."""

  def __init__(self, reader):
    super().__init__()
    self.reader = reader

  @property
  def trainable_variables(self):
    return self.reader.trainable_variables

  @property
  def checkpoint_items(self):
    return dict(reader=self.reader)


class RealmPretrainer(tf_keras.Model):
  """Query/block embedders + reader; ``call`` returns retrieval and MLM logits.

  It sees only fixed-shape int32 tensors that the host pipeline made: the masked query, the k
  candidate blocks (null block first, the trivial block already dropped) and the k reader
  inputs. It recomputes the candidates' scores ``f(x,z)`` with the *current* towers, so
  gradients reach both embedders, and reads every candidate with the reader.

  Inputs (``features``): ``query_word_ids``/``query_mask``/``query_type_ids`` ``[b, Lq]``;
  ``candidate_word_ids``/``candidate_mask``/``candidate_type_ids`` ``[b, k, Lb]``;
  ``reader_word_ids``/``reader_mask``/``reader_type_ids`` ``[b, k, Lr]``;
  ``mlm_positions`` ``[b, m]`` (positions in the query, which also start the reader input).

  Outputs: ``retrieval_logits`` ``[b, k]``, ``mlm_logits`` ``[b, k, m, vocab]``, and the
  embeddings they came from, ``query_embedding`` ``[b, d]`` and ``candidate_embeddings``
  ``[b, k, d]`` (for the retrieval-health signals, ``realm_tf.health``).
  """

  def __init__(self, query_embedder, block_embedder, reader, **kwargs):
    super().__init__(**kwargs)
    self.query_embedder = query_embedder
    self.block_embedder = block_embedder
    self.reader = reader

  @classmethod
  def from_config_dataclass(cls, config: configs.RealmModelConfig) -> "RealmPretrainer":
    query_embedder, block_embedder = factory.build_embedders(config.retriever)
    return cls(query_embedder, block_embedder, factory.build_reader(config.reader))

  @property
  def checkpoint_items(self):
    return dict(query_embedder=self.query_embedder, block_embedder=self.block_embedder,
                reader=self.reader)

  def call(self, features, training=None):
    query = self.query_embedder(tower_inputs(features, "query"), training=training)  # [b, d]
    batch = tf.shape(features["candidate_word_ids"])[0]
    k = features["candidate_word_ids"].shape[1]
    # A frozen block tower (``trainable`` False) embeds as its index did: without dropout.
    blocks = self.block_embedder(tower_inputs(features, "candidate"),
                                 training=training and self.block_embedder.trainable)
    blocks = tf.reshape(blocks, [batch, k, blocks.shape[-1]])                        # [b, k, d]
    retrieval_logits = tf.einsum("bd,bkd->bk", query, blocks)
    return dict(retrieval_logits=retrieval_logits,
                mlm_logits=read_candidates(self.reader, features, training),
                query_embedding=query, candidate_embeddings=blocks)


def read_candidates(reader, features, training=None):
  """The reader's MLM logits ``[b, k, m, vocab]`` for each of the k candidates.

  ``features``: ``reader_word_ids``/``reader_mask``/``reader_type_ids`` ``[b, k, Lr]`` and
  ``mlm_positions`` ``[b, m]`` (positions in the query, which starts every reader input).
  """
  k = features["reader_word_ids"].shape[1]
  positions = tf.repeat(features["mlm_positions"], k, axis=0)                        # [b*k, m]
  inputs = dict(tower_inputs(features, "reader"), masked_lm_positions=positions)
  logits = reader(inputs, training=training)["mlm_logits"]                           # [b*k, m, V]
  return tf.reshape(logits, [-1, k, positions.shape[-1], logits.shape[-1]])


def tower_inputs(features, prefix):
  """``{prefix}_word_ids`` etc. -> a BERT input dict, flattened to ``[-1, seq_len]``."""
  return {f"input_{n}": tf.reshape(features[f"{prefix}_{n}"],
                                   [-1, features[f"{prefix}_{n}"].shape[-1]])
          for n in ("word_ids", "mask", "type_ids")}


class OpenQaModel(tf_keras.Model):
  """ORQA's model: the query tower scores the retriever beam, the reader scores answer spans.

  The block embeddings are inputs (``beam_emb``, taken from the index on the host), so the
  retriever logits ``q . e(z)`` are recomputed with the current query tower and their gradient
  reaches it, never the blocks (as in ORQA and REALM's fine-tuning). With a ``block_embedder``
  (the task's ``trainable_blocks``) and the features ``beam_block_word_ids``/``_mask``/
  ``_type_ids`` ``[b, N, Lb]``, the top N blocks of the beam are embedded with the current
  block tower instead, so the block tower trains too; the rest keep the index's embeddings.

  Inputs (``features``): ``question_word_ids``/``question_mask``/``question_type_ids``
  ``[b, Lq]``; ``beam_emb`` ``[b, B, d]``; ``reader_word_ids``/``reader_mask``/
  ``reader_type_ids`` ``[b, R, Lr]`` (R <= B: the top of the beam); optionally
  ``block_prior`` ``[b, R]``, each read block's score in place of its retriever logit (a BM25
  or fused beam's rule: ``inputs.OpenQaInputBuilder``'s ``block_prior``).

  Outputs: ``retriever_logits`` ``[b, B]``; ``reader_logits`` ``[b, R, C]``, the span scores
  plus the block's retriever logit (or its ``block_prior``), invalid spans at ``-10000``
  (ORQA's mask); and the
  candidate spans ``span_starts``/``span_ends`` ``[b, R, C]`` (positions in the reader input).
  """

  def __init__(self, query_embedder, reader, max_span_width: int = 10, block_embedder=None,
               **kwargs):
    super().__init__(**kwargs)
    if reader.span_scorer is None:
      raise ValueError("the Open-QA reader needs a span scorer (build_reader(..., "
                       "with_span_scorer=True))")
    self.query_embedder = query_embedder
    self.reader = reader
    self.max_span_width = max_span_width
    self.block_embedder = block_embedder

  @classmethod
  def from_config_dataclass(cls, config: configs.RealmModelConfig,
                            block_tower: bool = False) -> "OpenQaModel":
    """``block_tower``: add a trainable block tower, separate from the query tower."""
    query_embedder, _ = factory.build_embedders(config.retriever)
    block_embedder = (factory.build_embedder(config.retriever, "block_embedder")
                      if block_tower else None)
    return cls(query_embedder, factory.build_reader(config.reader, with_span_scorer=True),
               max_span_width=config.reader.max_span_width, block_embedder=block_embedder)

  @property
  def checkpoint_items(self):
    items = dict(query_embedder=self.query_embedder, reader=self.reader)
    if self.block_embedder is not None:
      items["block_embedder"] = self.block_embedder
    return items

  def call(self, features, training=None):
    query = self.query_embedder(tower_inputs(features, "question"), training=training)
    beam_emb = tf.cast(features["beam_emb"], query.dtype)                          # [b, B, d]
    if self.block_embedder is not None and "beam_block_word_ids" in features:
      batch = tf.shape(beam_emb)[0]
      fresh = features["beam_block_word_ids"].shape[1]
      blocks = self.block_embedder(tower_inputs(features, "beam_block"), training=training)
      blocks = tf.reshape(tf.cast(blocks, query.dtype), [batch, fresh, -1])       # [b, N, d]
      beam_emb = tf.concat([blocks, beam_emb[:, fresh:]], axis=1)
    retriever_logits = tf.einsum("bd,bkd->bk", query, beam_emb)
    shape = tf.shape(features["reader_word_ids"])
    batch, read = shape[0], features["reader_word_ids"].shape[1]
    inputs = tower_inputs(features, "reader")
    sequence = self.reader(inputs, training=training)["sequence_output"]     # [b*R, Lr, H]
    starts, ends, valid = span_scorer.candidate_spans(
        inputs["input_type_ids"], inputs["input_mask"], self.max_span_width)
    span_logits = tf.cast(self.reader.span_scorer(sequence, starts, ends), tf.float32)
    span_logits += openqa_losses.mask_to_score(valid)
    num_spans = starts.shape[-1]
    prior = features.get("block_prior")
    prior = retriever_logits[:, :read] if prior is None else prior
    reader_logits = (tf.reshape(span_logits, [batch, read, num_spans]) +
                     tf.cast(prior[:, :, None], tf.float32))
    return dict(retriever_logits=tf.cast(retriever_logits, tf.float32),
                reader_logits=reader_logits,
                span_starts=tf.reshape(starts, [batch, read, num_spans]),
                span_ends=tf.reshape(ends, [batch, read, num_spans]))
