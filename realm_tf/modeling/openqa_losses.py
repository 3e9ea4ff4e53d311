"""ORQA's Open-QA fine-tuning objective (``language/orqa/models/orqa_model.py``), batched.

For one question, with the retriever beam ``z_1..z_B`` (scores ``s(z)``) and the read blocks
``z_1..z_R`` (R <= B) with their span scores ``S(z, span)`` (the span MLP plus ``s(z)``):

* retriever loss: ``-log sum_{z correct} p(z) `` with ``p = softmax_B(s)``; a block is correct
  when it holds an answer (ORQA's ``has_answer``);
* reader loss: ``-log sum_{(z, span) gold} p(z, span)`` with ``p = softmax`` over every span of
  every read block; a span is gold when it is a token-level occurrence of an answer;
* each term counts only for questions where something is correct, as in ORQA (its
  ``reduce_any`` masks); the loss is the mean over the batch of their sum.

Invalid candidates (beyond a block, padding) are masked with ORQA's ``-10000``.
"""

from typing import Dict

import tensorflow as tf

MASK_SCORE = -10000.0


def mask_to_score(mask) -> tf.Tensor:
  """0 where ``mask`` is set, ``-10000`` elsewhere (ORQA's ``mask_to_score``)."""
  return (1.0 - tf.cast(mask, tf.float32)) * MASK_SCORE


def marginal_log_loss(logits, is_correct) -> tf.Tensor:
  """``logsumexp(logits) - logsumexp(logits over the correct entries)`` on the last axis."""
  logits = tf.cast(logits, tf.float32)
  return (tf.reduce_logsumexp(logits, -1) -
          tf.reduce_logsumexp(logits + mask_to_score(is_correct), -1))


def correct_spans(starts, ends, gold_starts, gold_ends, gold_mask) -> tf.Tensor:
  """Whether each candidate span is one of the gold spans.

  Args:
    starts, ends: int ``[..., C]`` candidate spans (inclusive ends).
    gold_starts, gold_ends: int ``[..., G]`` gold spans; ``gold_mask`` ``[..., G]`` marks the
      real ones.

  Returns:
    bool ``[..., C]``.
  """
  same = ((starts[..., :, None] == gold_starts[..., None, :]) &
          (ends[..., :, None] == gold_ends[..., None, :]) &
          tf.cast(gold_mask, tf.bool)[..., None, :])
  return tf.reduce_any(same, axis=-1)


def openqa_loss(retriever_logits, retriever_correct, reader_logits, reader_correct
                ) -> Dict[str, tf.Tensor]:
  """ORQA's loss for a batch of questions.

  Args:
    retriever_logits: ``[b, B]`` scores of the retriever beam (current query tower).
    retriever_correct: bool ``[b, B]``: the block holds an answer.
    reader_logits: ``[b, R, C]`` span scores of the read blocks (retriever score included,
      invalid spans already masked).
    reader_correct: bool ``[b, R, C]``: the span is gold.

  Returns:
    ``loss`` (scalar, mean over the batch), per-question ``retriever_loss``/``reader_loss``
    ``[b]`` (0 where dropped) and ``any_retriever_correct``/``any_reader_correct`` ``[b]``.
  """
  b = tf.shape(reader_logits)[0]
  any_retrieved = tf.reduce_any(tf.cast(retriever_correct, tf.bool), -1)
  any_read = tf.reduce_any(tf.reshape(tf.cast(reader_correct, tf.bool), [b, -1]), -1)
  retriever_loss = marginal_log_loss(retriever_logits, retriever_correct)
  reader_loss = marginal_log_loss(tf.reshape(reader_logits, [b, -1]),
                                  tf.reshape(reader_correct, [b, -1]))
  retriever_loss *= tf.cast(any_retrieved, tf.float32)
  reader_loss *= tf.cast(any_read, tf.float32)
  return dict(loss=tf.reduce_mean(retriever_loss + reader_loss),
              retriever_loss=retriever_loss, reader_loss=reader_loss,
              any_retriever_correct=any_retrieved, any_reader_correct=any_read)
