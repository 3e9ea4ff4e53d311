"""ORQA's Open-QA loss against a direct NumPy computation."""

import numpy as np
import tensorflow as tf

from realm_tf.modeling import openqa_losses


def _nll(logits, correct):
  """-log sum_{correct} softmax(logits), from first principles (float64)."""
  p = np.exp(logits - logits.max())
  p /= p.sum()
  return -np.log(p[correct].sum())


def test_loss_matches_numpy_and_drops_terms_without_a_correct_entry():
  rng = np.random.default_rng(0)
  b, beam, read, spans = 4, 6, 3, 5
  retriever_logits = rng.normal(size=[b, beam])
  retriever_correct = rng.random([b, beam]) < 0.3
  retriever_correct[1] = False                        # nothing retrieved holds an answer
  reader_logits = rng.normal(size=[b, read, spans])
  reader_correct = rng.random([b, read, spans]) < 0.2
  reader_correct[2] = False                           # no gold span among the read blocks
  reader_correct[0, 0, 0] = True
  out = openqa_losses.openqa_loss(retriever_logits, retriever_correct, reader_logits,
                                  reader_correct)
  want_retriever = np.array([_nll(retriever_logits[i], retriever_correct[i])
                             if retriever_correct[i].any() else 0.0 for i in range(b)])
  want_reader = np.array([_nll(reader_logits[i].ravel(), reader_correct[i].ravel())
                          if reader_correct[i].any() else 0.0 for i in range(b)])
  np.testing.assert_allclose(out["retriever_loss"], want_retriever, rtol=1e-5)
  np.testing.assert_allclose(out["reader_loss"], want_reader, rtol=1e-5)
  np.testing.assert_allclose(out["loss"], (want_retriever + want_reader).mean(), rtol=1e-5)
  assert out["any_retriever_correct"].numpy().tolist() == retriever_correct.any(1).tolist()
  assert out["any_reader_correct"].numpy().tolist() == [True, True, False, True]


def test_gradient_is_softmax_minus_posterior():
  """d loss / d logits = softmax(logits) - softmax restricted to the correct entries."""
  logits = tf.Variable([[0.3, -1.2, 2.0, 0.1]])
  correct = tf.constant([[True, False, True, False]])
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(openqa_losses.marginal_log_loss(logits, correct))
  grad = tape.gradient(loss, logits).numpy()[0]
  x = logits.numpy()[0].astype(np.float64)
  p = np.exp(x) / np.exp(x).sum()
  q = np.where(correct.numpy()[0], np.exp(x), 0.0)
  np.testing.assert_allclose(grad, p - q / q.sum(), atol=1e-6)


def test_correct_spans():
  starts = tf.constant([[4, 4, 5, 6, 7]])
  ends = tf.constant([[4, 5, 6, 6, 8]])
  gold_starts = tf.constant([[4, 6, 0]])
  gold_ends = tf.constant([[5, 6, 0]])
  gold_mask = tf.constant([[1, 1, 0]])
  got = openqa_losses.correct_spans(starts, ends, gold_starts, gold_ends, gold_mask)
  assert got.numpy().tolist() == [[False, True, False, True, False]]
