"""bfloat16 steps keep every bias update (issue 44; ``realm_tf.modeling.precision``).

Reference: the sum, in float64, of the bias gradient's terms as bfloat16 rounds them. A scalar
bias near 1.0 gets one large term and thousands of small ones; TensorFlow's CPU
``BiasAddGrad`` kernel, summing in bfloat16, dropped the small ones (the Open-QA span scorer's
output bias in ``test_tpu_readiness``'s bfloat16 check).
"""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from realm_tf import train_lib

ROWS, LR = 3000, 0.01


def upstream():
  """d loss / d logits: one -1.0 and many 1e-3 (as a softmax's gradient: -1 on the gold,
  small probabilities elsewhere)."""
  w = np.full([ROWS, 1], 1e-3, np.float32)
  w[0] = -1.0
  return w


def reference_gradient(w):
  return float(np.sum(tf.cast(tf.cast(w, tf.bfloat16), tf.float64).numpy()))


@pytest.mark.parametrize("jit_compile", [False, True])
def test_a_scalar_bias_near_one_gets_its_whole_update_in_bfloat16(jit_compile):
  w = upstream()
  want = 1.0 - LR * reference_gradient(w)   # 1.0 - 0.01 * 1.999
  with train_lib.precision_policy("bfloat16"):
    tf_keras.utils.set_random_seed(0)
    layer = tf_keras.layers.Dense(1, bias_initializer=tf_keras.initializers.Constant(1.0))
    x = tf.random.normal([ROWS, 4])
    layer.build(x.shape)
    assert layer.compute_dtype == "bfloat16" and layer.bias.dtype == tf.float32
    optimizer = tf_keras.optimizers.SGD(LR)

    @tf.function(jit_compile=jit_compile)
    def step():
      with tf.GradientTape() as tape:
        logits = tf.cast(layer(x), tf.float32)
        loss = tf.reduce_sum(logits * w)
      grads = tape.gradient(loss, layer.trainable_variables)
      optimizer.apply_gradients(zip(grads, layer.trainable_variables))
    step()
  got = float(layer.bias.numpy()[0])
  # The result's own bfloat16 rounding (2 ** -8 relative of a gradient near 2) is the slack.
  assert got == pytest.approx(want, abs=LR * 2.0 * 2 ** -8), (got, want)
  assert abs(got - 1.0) > 0.015   # the kernel's bfloat16 sum gave ~1.0 - 0.01 * (-1.0 + ~0)


def test_float32_bias_gradients_are_tensorflows_own():
  with train_lib.precision_policy("bfloat16"):
    pass   # installs the override
  x = tf.random.normal([50, 3])
  bias = tf.Variable(tf.zeros([3]))
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(tf.nn.bias_add(x, bias) ** 2)
  got = tape.gradient(loss, bias)
  want = tf.raw_ops.BiasAddGrad(out_backprop=2 * (x + bias))
  np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_channels_first_bias_gradient_in_bfloat16():
  """The NCHW layout sums over every axis but 1: 2 x 4 x 5 ones per channel."""
  with train_lib.precision_policy("bfloat16"):
    pass
  x = tf.cast(tf.random.normal([2, 3, 4, 5]), tf.bfloat16)
  bias = tf.zeros([3], tf.bfloat16)
  with tf.GradientTape() as tape:
    tape.watch(bias)
    y = tf.nn.bias_add(x, bias, data_format="NCHW")
    loss = tf.reduce_sum(tf.cast(y, tf.float32))
  got = tape.gradient(loss, bias)
  np.testing.assert_allclose(tf.cast(got, tf.float32).numpy(), [40.0] * 3)
