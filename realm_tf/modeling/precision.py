"""bfloat16 training on CPU without losing bias updates (issue 44).

TensorFlow's CPU kernel for ``BiasAddGrad`` (the gradient of ``tf.nn.bias_add``, so of every
``tf_keras.layers.Dense`` bias and of Model Garden's ``MaskedLM`` output bias) sums a
bfloat16 gradient in bfloat16. Each addition then rounds to 8 bits of mantissa, and once the
running sum is large the small terms after it vanish. The span scorer's output bias is the
extreme case: its exact gradient is 0 (the reader's softmax is unchanged by a shift of all
span scores), a sum of one ``-1/b`` per question and thousands of small probabilities. In
``test_tpu_readiness``'s bfloat16 check the uncompiled step gave it a gradient of 0.025 (float32:
1e-8); on 960 softmax-like rows whose bfloat16 terms sum to -4e-4 the kernel returned -0.034.
``tf.reduce_sum`` accumulates bfloat16 in float32 on CPU. XLA on CPU got the 960 rows right but
lost the small terms of ``tests/test_precision.py``'s 3,000 rows too, so compiled steps are
covered as well.

``accumulate_bias_gradients_in_float32`` replaces the registered gradient of ``BiasAdd`` with
one that, for bfloat16 and float16 gradients, sums in float32 and casts back; float32 and
float64 gradients go to TensorFlow's own function unchanged, so float32 training is
bit-identical. It changes TensorFlow's process-wide gradient registry (there is no public way
to override one op type's gradient under ``tf.GradientTape``), once per process;
``train_lib.precision_policy`` calls it when it turns bfloat16 on.
"""

import tensorflow as tf
from tensorflow.python.framework import ops as tf_ops
from tensorflow.python.ops import nn_grad

_HALF = (tf.bfloat16, tf.float16)


def _bias_add_grad(op, received_grad):
  if received_grad.dtype not in _HALF:
    return nn_grad._BiasAddGrad(op, received_grad)  # pylint: disable=protected-access
  try:
    data_format = op.get_attr("data_format")
  except ValueError:
    data_format = None
  channel_axis = 1 if data_format in (b"NCHW", "NCHW") else -1
  rank = received_grad.shape.rank
  axes = [a for a in range(rank) if a != channel_axis % rank]
  bias_grad = tf.reduce_sum(tf.cast(received_grad, tf.float32), axis=axes)
  return received_grad, tf.cast(bias_grad, received_grad.dtype)


def accumulate_bias_gradients_in_float32() -> None:
  """Installs ``_bias_add_grad`` as ``BiasAdd``'s gradient (idempotent; see the module)."""
  registry = tf_ops._gradient_registry._registry  # pylint: disable=protected-access
  entry = registry["BiasAdd"]
  if entry["type"] is not _bias_add_grad:
    entry["type"] = _bias_add_grad
