"""The REALM retrieval embedder: ``LayerNorm(Dense_128(BERT pooled output))``."""

import tensorflow as tf
import tf_keras

from realm_tf.modeling import encoders


@tf_keras.utils.register_keras_serializable(package="realm_tf")
class RealmEmbedder(encoders.NetworkConfigMixin, tf_keras.Model):
  """Embeds queries (``[CLS] x [SEP]``) or blocks (``[CLS] title [SEP] body [SEP]``).

  Args:
    network: a BERT encoder returning a dict with ``pooled_output`` (a built
      ``BertEncoderV2``).
    projection_size: width of the embedding (128 in REALM).
    initializer_range: stddev of the truncated-normal initializer of the projection.
    projection_dropout: dropout rate on the normalized embedding when training. ORQA's
      retriever module (``orqa/models/ict_model.py``) applies 0.1 after its LayerNorm, and
      REALM loads that module with the train tags, so both ICT and REALM train the
      retriever with it.

  Example::

    embedder = RealmEmbedder(build_bert_encoder(config.encoder), projection_size=128)
    emb = embedder(tokenizer.query_inputs(["who wrote hamlet?"]))  # float32 [1, 128]
  """

  def __init__(self, network, projection_size: int = 128, initializer_range: float = 0.02,
               projection_dropout: float = 0.0, **kwargs):
    super().__init__(**kwargs)
    self._config = dict(projection_size=projection_size, initializer_range=initializer_range,
                        projection_dropout=projection_dropout)
    self.encoder = network
    self.projection = tf_keras.layers.Dense(
        projection_size, name="dense",
        kernel_initializer=tf_keras.initializers.TruncatedNormal(stddev=initializer_range))
    # TF1's layer_norm, as in the released module, uses epsilon 1e-12.
    self.layer_norm = tf_keras.layers.LayerNormalization(epsilon=1e-12, name="LayerNorm")
    self.dropout = tf_keras.layers.Dropout(projection_dropout)

  def call(self, inputs, training=None):
    """``inputs``: dict of int32 ``input_word_ids``, ``input_mask``, ``input_type_ids``."""
    outputs = self.encoder(
        dict(input_word_ids=inputs["input_word_ids"], input_mask=inputs["input_mask"],
             input_type_ids=inputs["input_type_ids"]), training=training)
    return self.dropout(self.layer_norm(self.projection(outputs["pooled_output"])),
                        training=training)

  def build_from_length(self, seq_length: int = 2):
    """Creates every variable by calling the model once on a dummy batch."""
    ones = tf.ones([1, seq_length], tf.int32)
    self(dict(input_word_ids=ones, input_mask=ones, input_type_ids=ones * 0))
    return self


def inference_function(tower, float32: bool = False, reduce_retracing: bool = False):
  """``tower(inputs, training=False)`` (an embedder, or any Keras model without
  tensor-dependent Python control flow) as a ``tf.function`` traced without autograph:
  autograph's conversion of the Keras layers was ~1.5 s of each trace, for nothing.
  ``float32``: the output cast to float32 (bfloat16 towers)."""
  if float32:
    return tf.function(lambda x: tf.cast(tower(x, training=False), tf.float32), autograph=False,
                       reduce_retracing=reduce_retracing)
  return tf.function(lambda x: tower(x, training=False), autograph=False,
                     reduce_retracing=reduce_retracing)
