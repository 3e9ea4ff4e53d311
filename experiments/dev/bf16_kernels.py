r"""Dev only: how far each bfloat16 op of a training step is from exact, per kernel path.

Each op runs on bfloat16 inputs; its reference is the same op in float64 on those very inputs
(already rounded to bfloat16), so what is left is the kernel's own rounding. Errors are in
units u = 2^-8, bfloat16's unit roundoff (the largest relative error of one rounding to
nearest), of the reference's largest value (of each probability above 1e-3 for Softmax). An
op that sums in float32 and rounds its output once stays at or below ~1 u; one that rounds
partial results to bfloat16 grows with the length of its sum. Run it with oneDNN on and off
(NOTES 42):

  python -m experiments.dev.bf16_kernels
  TF_ENABLE_ONEDNN_OPTS=0 python -m experiments.dev.bf16_kernels
"""
from absl import app
import numpy as np
import tensorflow as tf
from tensorflow.python.ops import gen_linalg_ops
from tensorflow.python.ops import gen_math_ops

from realm_tf import hardware

U = 2.0 ** -8


def _rounded(rng, shape, scale=1.0):
  """float64 values that bfloat16 holds exactly."""
  return tf.cast(tf.cast(rng.standard_normal(shape) * scale, tf.bfloat16), tf.float64).numpy()


def _error(got, want) -> float:
  got = tf.cast(got, tf.float64).numpy()
  return float(np.max(np.abs(got - want)) / np.max(np.abs(want)) / U)


def _softmax_error(logits) -> float:
  """Softmax's largest relative error over the probabilities above 1e-3, in u."""
  e = np.exp(logits - logits.max(-1, keepdims=True))
  want = e / e.sum(-1, keepdims=True)
  got = tf.cast(tf.nn.softmax(tf.constant(logits, tf.bfloat16)), tf.float64).numpy()
  big = want > 1e-3
  return float(np.max(np.abs(got - want)[big] / want[big]) / U)


def rows(seed: int = 0):
  """(op, length of its sum, error in u) for the ops of a BERT tower's step."""
  rng = np.random.default_rng(seed)
  bf = lambda x: tf.constant(x, tf.bfloat16)
  out = []
  for k in (64, 256, 1024, 4096):
    a, b = _rounded(rng, (32, k)), _rounded(rng, (k, 32))
    out.append(("MatMul", k, _error(tf.matmul(bf(a), bf(b)), a @ b)))
    q, kt = _rounded(rng, (4, 2, 8, k)), _rounded(rng, (4, 2, k, 8))
    out.append(("BatchMatMulV2", k, _error(gen_math_ops.batch_mat_mul_v2(bf(q), bf(kt)), q @ kt)))
    out.append(("Einsum bnfh,bnht->bnft (attention scores)", k,
                _error(gen_linalg_ops.einsum([bf(q), bf(kt)], "bnfh,bnht->bnft"), q @ kt)))
    # EinsumDense's kernel gradient: a sum over the batch and the sequence (4 x k terms).
    x, dy = _rounded(rng, (4, k, 16)), _rounded(rng, (4, k, 2, 8))
    out.append(("Einsum abc,abde->cde (kernel gradient)", 4 * k,
                _error(gen_linalg_ops.einsum([bf(x), bf(dy)], "abc,abde->cde"),
                      np.einsum("abc,abde->cde", x, dy))))
    v = np.abs(_rounded(rng, (8, k)))
    out.append(("Sum", k, _error(tf.reduce_sum(bf(v), -1), v.sum(-1))))
  for n in (16, 64):
    for scale in (1, 4, 16):
      out.append((f"Softmax (logits scale {scale})", n,
                  _softmax_error(_rounded(rng, (256, n), scale))))
  return out


def main(argv):
  del argv
  print(f"{hardware.cpu_model()}; oneDNN {'on' if hardware.onednn_enabled() else 'off'}; "
        f"bfloat16 problem: {hardware.cpu_bfloat16_problem() or 'none'}")
  for op, length, error in rows():
    print(f"{op:44s} {length:6d} {error:6.2f} u")


if __name__ == "__main__":
  app.run(main)
