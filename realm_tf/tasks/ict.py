"""ORQA's Inverse Cloze Task: warm-starts REALM's retriever.

A sentence is the pseudo-query and its block (with the sentence removed 90% of the time) the
positive; the ICT loader draws both afresh each time it reads a block (one random sentence, a
fresh removal coin), as ORQA does. The other blocks of the batch are the negatives:
``loss = -log softmax_j(q_i . b_j)[i]``. Under several replicas each replica scores against
the blocks of the whole global batch (gathered across replicas), as ORQA's TPU code did.
"""

from absl import logging
import tensorflow as tf
import tf_keras
from official.core import task_factory

from realm_tf import configs
from realm_tf import model_dir as model_dir_lib
from realm_tf.data import loaders
from realm_tf.modeling import losses
from realm_tf.tasks import base
from realm_tf.modeling.models import RetrieverModel
from realm_tf.tokenization import RealmTokenizer


def ict_logits(model: RetrieverModel, features, training: bool):
  """In-batch scores ``[local_batch, global_batch]`` and the positives' columns."""
  q = model.query_embedder(dict(input_word_ids=features["query_ids"],
                                input_mask=features["query_mask"],
                                input_type_ids=tf.zeros_like(features["query_ids"])),
                           training=training)
  b = model.block_embedder(dict(input_word_ids=features["block_ids"],
                                input_mask=features["block_mask"],
                                input_type_ids=features["block_type_ids"]), training=training)
  ctx = tf.distribute.get_replica_context()
  local = tf.shape(q)[0]
  offset = 0
  # Scored in float32: under bfloat16 the all-gather would fail (MirroredStrategy's
  # collectives take no bfloat16).
  q, b = tf.cast(q, tf.float32), tf.cast(b, tf.float32)
  if ctx is not None and ctx.num_replicas_in_sync > 1:
    b = ctx.all_gather(b, axis=0)
    offset = ctx.replica_id_in_sync_group * local
  labels = tf.range(local) + offset
  return tf.matmul(q, b, transpose_b=True), labels


@task_factory.register_task_cls(configs.IctTaskConfig)
class IctTask(base.RealmBaseTask):
  """ICT with in-batch negatives; logs loss and in-batch recall@k."""

  def build_model(self) -> RetrieverModel:
    return RetrieverModel.from_config_dataclass(self.task_config.model)

  def initialize(self, model: RetrieverModel):
    """``init_checkpoint`` as the base task restores it, or, with
    ``init_encoders_from_reader``, its reader's encoder into each tower's encoder: every
    encoder variable must be there, at its shape (ModelDirError otherwise)."""
    cfg = self.task_config
    if cfg.init_encoders_from_reader and not cfg.init_checkpoint:
      raise configs.ConfigError("task.init_encoders_from_reader needs task.init_checkpoint: "
                                "the reader's start")
    if not cfg.init_encoders_from_reader:
      return super().initialize(model)
    path = model_dir_lib.resolve_checkpoint(cfg.init_checkpoint)
    towers = {id(e): e for e in (model.query_embedder, model.block_embedder)}.values()
    for embedder in towers:
      model_dir_lib.restore(path, part=True, reader=tf.train.Checkpoint(encoder=embedder.encoder))
    logging.info("ICT towers' encoders initialized from the reader of %s", path)

  def model_dir_config(self):
    """The model directory's config: no reader in ICT, the recorded one mirrors the towers."""
    cfg = self.task_config
    return configs.RealmModelConfig(
        retriever=cfg.model, reader=configs.ReaderConfig(encoder=cfg.model.encoder),
        vocab_file=cfg.vocab_file), cfg.vocab_file

  def build_inputs(self, params: configs.IctDataConfig, input_context=None):
    cfg = self.task_config.model
    mask_id = None
    if params.query_mask_prob > 0:
      mask_id = RealmTokenizer(self.task_config.vocab_file).mask_id
    return loaders.get_loader(params, query_seq_length=cfg.query_seq_length,
                              block_seq_length=cfg.block_seq_length,
                              mask_id=mask_id).load(input_context)

  def build_losses(self, labels, model_outputs, aux_losses=None) -> tf.Tensor:
    """This replica's share of the global mean in-batch cross-entropy."""
    nll = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, model_outputs)
    return losses.global_mean_share(tf.reduce_sum(nll), tf.shape(nll)[0])

  def build_metrics(self, training=None):
    return [tf_keras.metrics.Mean(f"recall@{k}") for k in self.task_config.recall_at]

  def forward(self, inputs, model, metrics, training: bool):
    logits, labels = ict_logits(model, inputs, training=training)
    loss = self.build_losses(labels, logits)
    rank = tf.reduce_sum(tf.cast(logits > tf.gather(logits, labels, batch_dims=1)[:, None],
                                 tf.float32), axis=1)
    for k, metric in zip(self.task_config.recall_at, metrics or []):
      metric.update_state(tf.cast(rank < k, tf.float32))
    return loss
