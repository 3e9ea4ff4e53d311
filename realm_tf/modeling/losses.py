"""REALM's marginal likelihood over retrieved blocks, and the metrics the paper watches.

    p(y|x) = sum_z p(y|z,x) p(z|x),   p(z|x) = softmax_z f(x,z)

Per masked token j the loss is ``-logsumexp_z(log p(z|x) + log p(y_j|z,x))``. Autodiff of this
gives the paper's retriever gradient ``sum_z r(z) d f(x,z)`` with
``r(z) = [p(y|z,x)/p(y|x) - 1] p(z|x)``.
"""

from typing import Dict

import tensorflow as tf


def marginal_log_likelihood(retrieval_logits, mlm_logits, mlm_ids) -> Dict[str, tf.Tensor]:
  """Per-token log-likelihoods.

  Args:
    retrieval_logits: ``f(x, z)`` for the candidates, float ``[batch, k]``.
    mlm_logits: reader logits, float ``[batch, k, num_masks, vocab]``.
    mlm_ids: the masked tokens' true ids, int ``[batch, num_masks]``.

  Returns:
    dict with ``log_p_z`` ``[batch, k]``, ``token_log_p_given_z`` ``[batch, k, num_masks]``
    (``log p(y_j|z,x)``) and ``token_log_p`` ``[batch, num_masks]`` (``log p(y_j|x)``).
  """
  log_p_z = tf.nn.log_softmax(tf.cast(retrieval_logits, tf.float32), axis=-1)
  log_probs = tf.nn.log_softmax(tf.cast(mlm_logits, tf.float32), axis=-1)
  k = tf.shape(log_probs)[1]
  ids = tf.tile(mlm_ids[:, None, :], [1, k, 1])
  token_log_p_given_z = tf.gather(log_probs, ids, batch_dims=3)
  token_log_p = tf.reduce_logsumexp(log_p_z[:, :, None] + token_log_p_given_z, axis=1)
  return dict(log_p_z=log_p_z, token_log_p_given_z=token_log_p_given_z,
              token_log_p=token_log_p)


def realm_metrics(retrieval_logits, mlm_logits, mlm_ids, mlm_weights) -> Dict[str, tf.Tensor]:
  """Per-example quantities for the loss and the summaries (candidate 0 is the null block).

  The retrieval utility is the paper's (and the original code's) per masked token:
  ``log p(y_j|x) - log p(y_j|null,x)``. A pass-level value is the mean over all real mask
  tokens: the mean of the per-example ``retrieval_utility`` weighted by ``num_tokens`` (an
  example without a real mask token weighs nothing).

  Returns per-example ``[batch]`` tensors: ``nll_sum`` (sum over real mask tokens of
  ``-log p(y_j|x)``), ``num_tokens``, ``retrieval_utility_sum`` (``log p(y_j|x) -
  log p(y_j|null,x)`` summed over the real mask tokens), ``retrieval_utility`` (that sum
  divided by ``max(num_tokens, 1)``: the example's mean per masked token), ``entropy`` of
  ``p(z|x)``, ``correct`` (tokens whose marginal argmax is right), and ``token_log_p``
  ``[batch, num_masks]`` and ``token_log_p_given_z`` ``[batch, k, num_masks]``.
  """
  weights = tf.cast(mlm_weights, tf.float32)
  out = marginal_log_likelihood(retrieval_logits, mlm_logits, mlm_ids)
  log_p_y = tf.reduce_sum(out["token_log_p"] * weights, axis=1)
  log_p_y_null = tf.reduce_sum(out["token_log_p_given_z"][:, 0, :] * weights, axis=1)
  p_z = tf.exp(out["log_p_z"])
  # Marginal prediction: argmax over the vocabulary of sum_z p(z|x) p(.|z,x).
  marginal = tf.reduce_logsumexp(
      out["log_p_z"][:, :, None, None] + tf.nn.log_softmax(tf.cast(mlm_logits, tf.float32)),
      axis=1)
  correct = tf.cast(tf.equal(tf.argmax(marginal, -1, output_type=tf.int32),
                             tf.cast(mlm_ids, tf.int32)), tf.float32)
  num_tokens = tf.reduce_sum(weights, axis=1)
  utility_sum = log_p_y - log_p_y_null
  return dict(
      nll_sum=-log_p_y,
      num_tokens=num_tokens,
      retrieval_utility_sum=utility_sum,
      retrieval_utility=utility_sum / tf.maximum(num_tokens, 1.0),
      entropy=-tf.reduce_sum(p_z * out["log_p_z"], axis=1),
      correct=tf.reduce_sum(correct * weights, axis=1),
      token_log_p=out["token_log_p"],
      token_log_p_given_z=out["token_log_p_given_z"])


def global_mean_share(total, count):
  """This replica's share of a global mean: ``total / (count summed over all replicas)``.

  Summing the shares over replicas gives the mean over the global batch, so gradients need no
  further scaling under any strategy (the optimizer sums the replicas' gradients). ``total``
  and ``count`` are this replica's sums (e.g. of per-token losses and of real tokens).
  """
  ctx = tf.distribute.get_replica_context()
  count = tf.cast(count, tf.float32)
  if ctx is not None and ctx.num_replicas_in_sync > 1:
    count = ctx.all_reduce(tf.distribute.ReduceOp.SUM, count)
  return tf.cast(total, tf.float32) / tf.maximum(count, 1.0)


def realm_loss_share(metrics: Dict[str, tf.Tensor]) -> tf.Tensor:
  """This replica's share of the global per-token mean of ``-log p(y|x)``, from
  ``realm_metrics``' per-example ``nll_sum`` and ``num_tokens``."""
  return global_mean_share(tf.reduce_sum(metrics["nll_sum"]),
                           tf.reduce_sum(metrics["num_tokens"]))


def num_replicas() -> int:
  ctx = tf.distribute.get_replica_context()
  return ctx.num_replicas_in_sync if ctx is not None else 1
