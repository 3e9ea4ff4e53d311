"""ORQA's answer-span scorer, the reader head used for Open-QA fine-tuning."""

import tensorflow as tf
import tf_keras


def candidate_spans(input_type_ids, input_mask, max_span_width: int = 10):
  """All spans of at most ``max_span_width`` tokens inside the block part of reader inputs.

  The block part is where ``input_type_ids == 1`` and ``input_mask == 1``, less the final
  ``[SEP]``. Returns int32 ``starts``, ``ends`` (inclusive) and a float ``mask``, each
  ``[batch, seq_len * max_span_width]``; padded candidates have mask 0.

  Example: with a block part at positions 4..6 and width 2, the valid spans are
  (4,4) (4,5) (5,5) (5,6) (6,6).
  """
  seq_len = tf.shape(input_type_ids)[1]
  starts = tf.repeat(tf.range(seq_len), max_span_width)
  ends = starts + tf.tile(tf.range(max_span_width), [seq_len])
  in_block = tf.cast(input_type_ids, tf.bool) & tf.cast(input_mask, tf.bool)
  # The last in-block token is the closing [SEP]: never part of an answer.
  last = tf.reduce_sum(tf.cast(in_block, tf.int32), axis=1) + tf.argmax(
      tf.cast(in_block, tf.int32), axis=1, output_type=tf.int32) - 1
  block_start = tf.argmax(tf.cast(in_block, tf.int32), axis=1, output_type=tf.int32)
  valid = ((starts[None, :] >= block_start[:, None]) & (ends[None, :] < last[:, None]))
  batch = tf.shape(input_type_ids)[0]
  starts = tf.tile(starts[None, :], [batch, 1])
  ends = tf.minimum(tf.tile(ends[None, :], [batch, 1]), seq_len - 1)
  return starts, ends, tf.cast(valid, tf.float32)


@tf_keras.utils.register_keras_serializable(package="realm_tf")
class SpanScorer(tf_keras.layers.Layer):
  """``Dense(1)(LayerNorm(ReLU(start + end)))`` over a ``Dense(2 * hidden)`` projection.

  As in ORQA: one dense layer of width ``2 * span_hidden_size`` is split into start and end
  halves; a candidate span's hidden vector is the sum of its start token's start half and its
  end token's end half. The Open-QA task adds the retriever logit to these scores.

  Args:
    span_hidden_size: width of each half (ORQA: 256, so the dense layer is 512 wide).
    initializer_range: stddev of the truncated-normal initializers.
  """

  def __init__(self, span_hidden_size: int = 256, initializer_range: float = 0.02, **kwargs):
    kwargs.setdefault("name", "span_scorer")
    super().__init__(**kwargs)
    self.span_hidden_size = span_hidden_size
    self.initializer_range = initializer_range
    init = lambda: tf_keras.initializers.TruncatedNormal(stddev=initializer_range)
    self.projection = tf_keras.layers.Dense(2 * span_hidden_size, kernel_initializer=init(),
                                            name="dense")
    # tf.keras LayerNormalization's default epsilon, as in ORQA's reader.
    self.layer_norm = tf_keras.layers.LayerNormalization(epsilon=1e-3,
                                                         name="layer_normalization")
    self.output_dense = tf_keras.layers.Dense(1, kernel_initializer=init(), name="dense_1")

  def call(self, sequence_output, starts, ends):
    """``sequence_output`` [b, L, H]; ``starts``/``ends`` int32 [b, C] -> logits [b, C]."""
    start_proj, end_proj = tf.split(self.projection(sequence_output), 2, axis=-1)
    hidden = (tf.gather(start_proj, starts, batch_dims=1) +
              tf.gather(end_proj, ends, batch_dims=1))
    hidden = self.layer_norm(tf.nn.relu(hidden))
    return tf.squeeze(self.output_dense(hidden), -1)

  def get_config(self):
    config = super().get_config()
    config.update(span_hidden_size=self.span_hidden_size,
                  initializer_range=self.initializer_range)
    return config
