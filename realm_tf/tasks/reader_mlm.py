"""BERT's masked-LM pre-training of the reader on a corpus's blocks.

REALM's reader starts from BERT, which fills a mask from its context before REALM begins. A
reader converted from an encoder that never had a masked LM (all-MiniLM-L6-v2, trained
contrastively on sentence pairs; its head is fresh, tied to the word embeddings) fills salient
spans at 7% per token after 300 reading steps on real text (experiments/NOTES.md, section 30):
a salient span gives two or three labels per 192-wordpiece read. This task gives it BERT's own
objective first, ~19 labels per 128-wordpiece window, on the corpus's text.

Each block's body (between the title's ``[SEP]`` and the last one) is cut into windows of
``model.reader.seq_length - 2`` wordpieces (a shorter last window is kept from 16), each read
as ``[CLS] window [SEP]``. BERT's masking (``create_pretraining_data.py``): ``mask_rate`` of the
window's wordpieces, rounded, at least one and at most ``max_predictions``, chosen uniformly;
80% of them become ``[MASK]``, 10% a wordpiece drawn uniformly from the whole vocabulary, 10%
stay. Training draws the masks afresh at each read (RoBERTa's dynamic masking, where BERT
stored ten draws); validation's are fixed by its seed. The held-out blocks
(``manifests.split_of``, the same blocks whose masked sentences REALM holds out) are
validation's only.
"""

import logging
from typing import Dict

import numpy as np
import tensorflow as tf
import tf_keras
from official.core import task_factory

from realm_tf import configs
from realm_tf.data import loaders
from realm_tf.data import manifests
from realm_tf.modeling import losses
from realm_tf.tasks import reader_read
from realm_tf.tokenization import RealmTokenizer

MIN_WINDOW = 16   # wordpieces of the shortest window kept
VALIDATION_SEED = 0


def block_windows(blocks, sep_id: int, width: int, split: str,
                  held_out_fraction: float) -> np.ndarray:
  """``[n, width]`` int32: the bodies of ``split``'s blocks cut into windows, zero-padded."""
  windows = []
  for block in blocks:
    if manifests.split_of(block["uid"], held_out_fraction) != split:
      continue
    ids = block["token_ids"]
    seps = [i for i, t in enumerate(ids) if t == sep_id]
    body = ids[seps[0] + 1:seps[-1]] if len(seps) > 1 else ids[1:]
    for start in range(0, len(body), width):
      window = body[start:start + width]
      if len(window) >= min(MIN_WINDOW, width):
        windows.append(window + [0] * (width - len(window)))
  return np.array(windows, np.int32).reshape([-1, width])


def bert_mask(window: tf.Tensor, seed: tf.Tensor, cls_id: int, sep_id: int, mask_id: int,
              vocab_size: int, mask_rate: float, max_predictions: int) -> Dict[str, tf.Tensor]:
  """BERT's masking of ``[CLS] window [SEP]`` (``window``: ``[w]`` int32, zero-padded), drawn
  from ``seed`` (``[2]`` int64): the reader's inputs and ``mlm_*`` targets."""
  real = tf.reduce_sum(tf.cast(window > 0, tf.int32))
  ids = tf.concat([[cls_id], window[:real], [sep_id], window[real:]], 0)            # [w + 2]
  maskable = tf.concat([[False], window > 0, [False]], 0)
  n = tf.clip_by_value(tf.cast(tf.round(tf.cast(real, tf.float32) * mask_rate), tf.int32),
                       1, max_predictions)
  draw = tf.random.stateless_uniform(tf.shape(ids), seed)
  # The maskable positions in a random order, then the others.
  order = tf.argsort(tf.where(maskable, draw, 2.0))[:max_predictions]
  weights = tf.range(max_predictions) < n
  positions = tf.where(weights, order, 0)
  originals = tf.where(weights, tf.gather(ids, positions), 0)
  seeds = tf.random.experimental.stateless_split(seed, 2)
  coin = tf.random.stateless_uniform([max_predictions], seeds[0])
  random_ids = tf.random.stateless_uniform([max_predictions], seeds[1], maxval=vocab_size,
                                           dtype=tf.int32)
  replaced = tf.where(coin < 0.8, mask_id, tf.where(coin < 0.9, random_ids, originals))
  word_ids = tf.tensor_scatter_nd_update(ids, tf.boolean_mask(positions, weights)[:, None],
                                         tf.boolean_mask(replaced, weights))
  return {"input_word_ids": word_ids, "input_mask": tf.cast(ids > 0, tf.int32),
          "input_type_ids": tf.zeros_like(ids), "masked_lm_positions": positions,
          "mlm_ids": originals, "mlm_weights": tf.cast(weights, tf.float32)}


@task_factory.register_task_cls(configs.ReaderMlmTaskConfig)
class ReaderMlmTask(reader_read.ReaderReadTask):
  """The mean ``-log p(y)`` of BERT's masked wordpieces; the reader restored strictly, its
  masked-LM head included (``ReaderReadTask.initialize``)."""

  def build_inputs(self, params: configs.BlockMlmDataConfig, input_context=None):
    cfg = self.task_config
    tokenizer = RealmTokenizer(cfg.model.vocab_file, lower_case=cfg.model.lower_case)
    split = manifests.TRAIN_SPLIT if params.is_training else manifests.EVAL_SPLIT
    windows = block_windows(manifests.read_blocks(params.blocks_dir), tokenizer.sep_id,
                            cfg.model.reader.seq_length - 2, split, params.held_out_fraction)
    if not len(windows):
      raise loaders.InputError(
          f"{params.blocks_dir}: no {split} block (held_out_fraction="
          f"{params.held_out_fraction}); give a fraction that holds some blocks out")
    logging.info("reader MLM: %d %s windows of %s", len(windows), split, params.blocks_dir)
    seed = params.seed if params.is_training else VALIDATION_SEED
    dataset = tf.data.Dataset.from_tensor_slices(windows)
    if input_context and input_context.num_input_pipelines > 1:
      dataset = dataset.shard(input_context.num_input_pipelines,
                              input_context.input_pipeline_id)
    if params.is_training:
      # Shuffled and repeated before masking, so that each read draws fresh masks.
      dataset = dataset.shuffle(len(windows), seed=seed).repeat()
    seeds = tf.data.Dataset.random(seed=seed).batch(2)
    dataset = tf.data.Dataset.zip((dataset, seeds)).map(lambda w, s: bert_mask(
        w, s, tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id,
        cfg.model.reader.encoder.vocab_size, params.mask_rate, params.max_predictions))
    return dataset.batch(loaders.per_replica_batch_size(params.global_batch_size, input_context),
                         drop_remainder=params.is_training or params.drop_remainder).prefetch(2)

  def build_metrics(self, training=None):
    return [tf_keras.metrics.Mean("mlm_accuracy")]

  def forward(self, inputs, model, metrics, training: bool):
    logits = model.reader({k: inputs[k] for k in ("input_word_ids", "input_mask",
                                                  "input_type_ids", "masked_lm_positions")},
                          training=training)["mlm_logits"]                        # [b, m, V]
    weights = inputs["mlm_weights"]
    nll = tf_keras.losses.sparse_categorical_crossentropy(inputs["mlm_ids"], logits,
                                                          from_logits=True)
    loss = losses.global_mean_share(tf.reduce_sum(nll * weights), tf.reduce_sum(weights))
    if metrics:
      correct = tf.cast(tf.argmax(logits, -1, output_type=tf.int32) == inputs["mlm_ids"],
                        tf.float32)
      metrics[0].update_state(tf.reduce_sum(correct * weights) / tf.reduce_sum(weights),
                              sample_weight=tf.reduce_sum(weights))
    return loss
