"""The retrieve-then-predict model of REALM pre-training (the device side).

It sees only fixed-shape int32 tensors that the host pipeline made: the masked query, the k
candidate blocks (null block first, the trivial block already dropped) and the k reader inputs.
It recomputes the candidates' scores ``f(x,z)`` with the *current* towers, so gradients reach
both embedders, and reads every candidate with the knowledge-augmented encoder.
"""

import tensorflow as tf
import tf_keras

from realm_tf import configs
from realm_tf import modeling


class RealmPretrainer(tf_keras.Model):
  """Query/block embedders + reader; ``call`` returns retrieval and MLM logits.

  Inputs (``features``): ``query_word_ids``/``query_mask``/``query_type_ids`` ``[b, Lq]``;
  ``candidate_word_ids``/``candidate_mask``/``candidate_type_ids`` ``[b, k, Lb]``;
  ``reader_word_ids``/``reader_mask``/``reader_type_ids`` ``[b, k, Lr]``;
  ``mlm_positions`` ``[b, m]`` (positions in the query, which also start the reader input).

  Outputs: ``retrieval_logits`` ``[b, k]`` and ``mlm_logits`` ``[b, k, m, vocab]``.
  """

  def __init__(self, query_embedder, block_embedder, reader, **kwargs):
    super().__init__(**kwargs)
    self.query_embedder = query_embedder
    self.block_embedder = block_embedder
    self.reader = reader

  @classmethod
  def from_config_dataclass(cls, config: configs.RealmModelConfig) -> "RealmPretrainer":
    query_embedder, block_embedder = modeling.build_embedders(config.retriever)
    return cls(query_embedder, block_embedder, modeling.build_reader(config.reader))

  def checkpoint_items(self):
    """The items of the model-directory checkpoint contract."""
    return dict(query_embedder=self.query_embedder, block_embedder=self.block_embedder,
                reader=self.reader)

  def call(self, features, training=None):
    query = self.query_embedder(_tower_inputs(features, "query"), training=training)  # [b, d]
    batch = tf.shape(features["candidate_word_ids"])[0]
    k = features["candidate_word_ids"].shape[1]
    blocks = self.block_embedder(_tower_inputs(features, "candidate"), training=training)
    blocks = tf.reshape(blocks, [batch, k, -1])                                       # [b, k, d]
    retrieval_logits = tf.einsum("bd,bkd->bk", query, blocks)
    return dict(retrieval_logits=retrieval_logits,
                mlm_logits=read_candidates(self.reader, features, training))


def read_candidates(reader, features, training=None):
  """The reader's MLM logits ``[b, k, m, vocab]`` for each of the k candidates.

  ``features``: ``reader_word_ids``/``reader_mask``/``reader_type_ids`` ``[b, k, Lr]`` and
  ``mlm_positions`` ``[b, m]`` (positions in the query, which starts every reader input).
  """
  k = features["reader_word_ids"].shape[1]
  positions = tf.repeat(features["mlm_positions"], k, axis=0)                         # [b*k, m]
  inputs = dict(_tower_inputs(features, "reader"), masked_lm_positions=positions)
  logits = reader(inputs, training=training)["mlm_logits"]                            # [b*k, m, V]
  return tf.reshape(logits, [-1, k, positions.shape[-1], logits.shape[-1]])


def _tower_inputs(features, prefix):
  """``{prefix}_word_ids`` etc. -> a BERT input dict, flattened to ``[-1, seq_len]``."""
  return {f"input_{n}": tf.reshape(features[f"{prefix}_{n}"],
                                   [-1, features[f"{prefix}_{n}"].shape[-1]])
          for n in ("word_ids", "mask", "type_ids")}
