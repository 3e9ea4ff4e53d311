"""Masked-LM warm start of the reader: the toy-scale stand-in for its BERT initialization.

Input: the ICT examples as the ICT loader samples them (a random sentence of a block, and the
block with the sentence cut out 90% of the time, drawn afresh at each read). Each pair becomes a
reader input in REALM's layout, ``[CLS] sentence [SEP] block body [SEP]`` (no title, as the
reader sees blocks), and ``mask_rate`` of the sentence's wordpieces are replaced by ``[MASK]``
(at least one, at most ``max_masks``), fresh at every step. The loss is the mean cross-entropy
of the masked tokens; names repeat across an article's sentences, so the reader learns to fill
a mask from the second segment, the skill REALM pre-training relies on.
"""

import tensorflow as tf
import tf_keras
from official.core import task_factory

from realm_tf import configs
from realm_tf import modeling
from realm_tf.data import contract
from realm_tf.data import loaders
from realm_tf.modeling import losses
from realm_tf.tasks import base
from realm_tf.modeling.models import ReaderModel


def mask_sentences(word_ids, query_length, mask_id: int, mask_rate: float, max_masks: int,
                   seed=None):
  """Masks ``mask_rate`` of positions ``1 .. query_length - 2`` of each row (the sentence).

  Returns ``(masked_word_ids, positions, labels, weights)``; ``positions``/``labels``/``weights``
  are ``[b, max_masks]``, padded with weight 0.
  """
  b, n = tf.shape(word_ids)[0], tf.shape(word_ids)[1]
  pos = tf.range(n)[tf.newaxis, :]
  inside = (pos >= 1) & (pos < query_length[:, tf.newaxis] - 1)
  noise = tf.random.uniform([b, n], seed=seed)
  chosen = inside & (noise < mask_rate)
  # At least one mask per row: the sentence position with the smallest noise.
  first = tf.argmin(tf.where(inside, noise, 2.0), axis=1, output_type=tf.int32)
  chosen |= tf.one_hot(first, n, on_value=True, off_value=False) & inside
  # Keep the max_masks chosen positions with the smallest noise, in position order.
  score = tf.where(chosen, noise, 2.0)
  k = tf.minimum(max_masks, n)
  kth = tf.sort(score, axis=1)[:, k - 1:k]
  chosen &= score <= kth
  order = tf.argsort(tf.where(chosen, pos, n + pos), axis=1)[:, :max_masks]
  positions = tf.cast(order, tf.int32)
  weights = tf.cast(tf.gather(chosen, positions, batch_dims=1), tf.float32)
  positions = positions * tf.cast(weights > 0, tf.int32)
  labels = tf.gather(word_ids, positions, batch_dims=1) * tf.cast(weights > 0, tf.int32)
  masked = tf.where(chosen, mask_id, word_ids)
  return masked, positions, labels, weights


def with_null_blocks(inputs, query_length, sep_id: int, rate: float):
  """Replaces the body of ``rate`` of the rows by nothing: ``[CLS] sentence [SEP] [SEP]``.

  REALM's reader reads the null block beside the retrieved ones; a reader that never saw an
  empty second segment would score it badly, and REALM's retriever would learn only to avoid it.
  """
  if rate <= 0:
    return inputs
  ids = inputs["input_word_ids"]
  pos = tf.range(tf.shape(ids)[1])[tf.newaxis, :]
  null = (tf.random.uniform([tf.shape(ids)[0]]) < rate)[:, tf.newaxis]
  qlen = query_length[:, tf.newaxis]
  ids = tf.where(null & (pos == qlen), sep_id, tf.where(null & (pos > qlen), 0, ids))
  mask = tf.where(null, tf.cast(pos <= qlen, tf.int32), inputs["input_mask"])
  types = tf.where(null, tf.cast(pos == qlen, tf.int32), inputs["input_type_ids"])
  return dict(input_word_ids=ids, input_mask=mask, input_type_ids=types)


@task_factory.register_task_cls(configs.ReaderMlmTaskConfig)
class ReaderMlmTask(base.RealmBaseTask):
  """Masked-LM on ``[CLS] sentence [SEP] body [SEP]``; logs loss and masked-token accuracy."""

  def build_model(self) -> ReaderModel:
    return ReaderModel(modeling.build_reader(self.task_config.model))

  def model_dir_config(self):
    cfg = self.task_config
    return configs.RealmModelConfig(
        reader=cfg.model, retriever=configs.RetrieverConfig(encoder=cfg.model.encoder),
        vocab_file=cfg.vocab_file), cfg.vocab_file

  def build_inputs(self, params: configs.IctDataConfig, input_context=None):
    from realm_tf.tokenization import RealmTokenizer  # pylint: disable=g-import-not-at-top
    cfg = self.task_config
    tokenizer = RealmTokenizer(cfg.vocab_file)
    sep_id, mask_id = tokenizer.sep_id, tokenizer.mask_id
    lengths = dict(query_seq_length=cfg.query_seq_length, block_seq_length=cfg.block_seq_length)
    loader = loaders.get_loader(params, **lengths)

    def to_reader(ex):
      query = tf.ragged.boolean_mask(ex["query_ids"], ex["query_mask"] > 0)
      body = tf.ragged.boolean_mask(ex["block_ids"],
                                    (ex["block_type_ids"] > 0) & (ex["block_mask"] > 0))
      inputs = contract.pack_block_ids(tf.concat([query, body], axis=1),
                                       cfg.model.seq_length, sep_id)
      query_length = tf.cast(query.row_lengths(), tf.int32)
      inputs = with_null_blocks(inputs, query_length, sep_id, cfg.null_block_rate)
      masked, positions, labels, weights = mask_sentences(
          inputs["input_word_ids"], query_length, mask_id, cfg.mask_rate, cfg.max_masks)
      return dict(inputs, input_word_ids=masked, masked_lm_positions=positions,
                  masked_lm_ids=labels, masked_lm_weights=weights)

    return loader.load(input_context).map(
        to_reader, num_parallel_calls=tf.data.AUTOTUNE).prefetch(2)

  def build_losses(self, labels, model_outputs, aux_losses=None) -> tf.Tensor:
    """This replica's share of the global mean cross-entropy of the masked tokens."""
    nll = tf.nn.sparse_softmax_cross_entropy_with_logits(labels["masked_lm_ids"],
                                                         model_outputs)
    w = labels["masked_lm_weights"]
    return losses.global_mean_share(tf.reduce_sum(nll * w), tf.reduce_sum(w))

  def build_metrics(self, training=None):
    return [tf_keras.metrics.Mean("mlm_accuracy")]

  def forward(self, inputs, model, metrics, training: bool):
    logits = model.reader(inputs, training=training)["mlm_logits"]
    loss = self.build_losses(inputs, logits)
    correct = tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32),
                               inputs["masked_lm_ids"]), tf.float32)
    for metric in metrics or []:
      metric.update_state(correct, sample_weight=inputs["masked_lm_weights"])
    return loss
