"""The knowledge-augmented encoder: a BERT over ``[CLS] query [SEP] body [SEP]`` with heads."""

from typing import Optional

import tensorflow as tf
import tf_keras
from official.nlp.modeling import layers

from realm_tf.modeling import encoders
from realm_tf.modeling.span_scorer import SpanScorer


@tf_keras.utils.register_keras_serializable(package="realm_tf")
class KnowledgeAugmentedEncoder(encoders.NetworkConfigMixin, tf_keras.Model):
  """REALM's reader: BERT, its masked-LM head (tied to the word embeddings) and,
  optionally, ORQA's span scorer.

  Args:
    network: a built BERT encoder (``BertEncoderV2``).
    mlm_activation: activation of the MLM transform (BERT: ``gelu``).
    initializer_range: stddev of the heads' truncated-normal initializers.
    span_hidden_size: if set, adds a ``SpanScorer`` with this hidden width (ORQA: 256).

  Call with a dict of int32 ``input_word_ids``, ``input_mask``, ``input_type_ids`` and
  optionally ``masked_lm_positions`` ``[batch, num_masks]``. Returns a dict with
  ``sequence_output`` and, when positions are given, ``mlm_logits``
  ``[batch, num_masks, vocab]``.
  """

  def __init__(self, network, mlm_activation: str = "gelu", initializer_range: float = 0.02,
               span_hidden_size: Optional[int] = None, **kwargs):
    super().__init__(**kwargs)
    self._config = dict(mlm_activation=mlm_activation, initializer_range=initializer_range,
                        span_hidden_size=span_hidden_size)
    initializer = tf_keras.initializers.TruncatedNormal(stddev=initializer_range)
    self.encoder = network
    self.masked_lm = layers.MaskedLM(
        embedding_table=network.get_embedding_table(),
        activation=encoders.get_activation(mlm_activation),
        initializer=initializer, name="cls/predictions")
    self.span_scorer = (SpanScorer(span_hidden_size, initializer_range=initializer_range)
                        if span_hidden_size else None)

  def call(self, inputs, training=None):
    outputs = self.encoder(
        dict(input_word_ids=inputs["input_word_ids"], input_mask=inputs["input_mask"],
             input_type_ids=inputs["input_type_ids"]), training=training)
    result = dict(sequence_output=outputs["sequence_output"])
    if "masked_lm_positions" in inputs:
      result["mlm_logits"] = self.masked_lm(outputs["sequence_output"],
                                            masked_positions=inputs["masked_lm_positions"])
    return result

  def build_from_length(self, seq_length: int = 2):
    """Creates every variable (heads included) with one dummy call."""
    ones = tf.ones([1, seq_length], tf.int32)
    out = self(dict(input_word_ids=ones, input_mask=ones, input_type_ids=ones * 0,
                    masked_lm_positions=tf.zeros([1, 1], tf.int32)))
    if self.span_scorer is not None:
      zeros = tf.zeros([1, 1], tf.int32)
      self.span_scorer(out["sequence_output"], zeros, zeros)
    return self
