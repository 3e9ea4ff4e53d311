"""ORQA's Inverse Cloze Task: warm-starts REALM's retriever.

A sentence is the pseudo-query and its block (with the sentence removed 90% of the time, done by
``data_prep``) the positive; the other blocks of the batch are the negatives:
``loss = -log softmax_j(q_i . b_j)[i]``. Under several replicas each replica scores against
the blocks of the whole global batch (gathered across replicas), as ORQA's TPU code did.
"""

import os
from typing import Dict

import tensorflow as tf
from official.core import base_task
from official.core import task_factory

from realm_tf import configs
from realm_tf import model_dir as model_dir_lib
from realm_tf import modeling


class RetrieverModel(tf.Module):
  """The two towers (one object when shared) in the model-directory contract's names."""

  def __init__(self, query_embedder, block_embedder):
    super().__init__()
    self.query_embedder = query_embedder
    self.block_embedder = block_embedder

  @property
  def trainable_variables(self):
    seen, out = set(), []
    for v in self.query_embedder.trainable_variables + self.block_embedder.trainable_variables:
      if id(v) not in seen:
        seen.add(id(v))
        out.append(v)
    return out

  def checkpoint_items(self):
    return dict(query_embedder=self.query_embedder, block_embedder=self.block_embedder)


def example_records(params: configs.RealmDataConfig, input_context=None,
                    query_seq_length: int = 0, block_seq_length: int = 0):
  """Serialized ICT examples (sharded per input pipeline; shuffled and repeated when training)
  and the per-replica batch size.

  The lengths, when given, are checked against the examples' ``manifest.json`` (if present), so
  a mismatch is a clear error instead of a parse failure inside tf.data.
  """
  files = tf.io.gfile.glob(params.input_path)
  if not files:
    raise FileNotFoundError(f"no ICT examples match {params.input_path}")
  from data_prep import schema  # pylint: disable=g-import-not-at-top
  directory = os.path.dirname(files[0])
  if tf.io.gfile.exists(os.path.join(directory, schema.MANIFEST)):
    written = schema.load_manifest(directory)
    for key, wanted in (("query_seq_length", query_seq_length),
                        ("block_seq_length", block_seq_length)):
      if wanted and key in written and written[key] != wanted:
        raise ValueError(f"the ICT examples in {directory} have {key}="
                         f"{written[key]} but the config asks for {wanted}; rebuild them with "
                         f"data_prep or set the config's {key} to {written[key]}")
  batch_size = (input_context.get_per_replica_batch_size(params.global_batch_size)
                if input_context else params.global_batch_size)
  ds = tf.data.TFRecordDataset(files)
  if input_context and input_context.num_input_pipelines > 1:
    ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
  if params.is_training:
    ds = ds.shuffle(params.shuffle_buffer_size, seed=params.seed).repeat()
  return ds, batch_size


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
  if ctx is not None and ctx.num_replicas_in_sync > 1:
    b = ctx.all_gather(b, axis=0)
    offset = ctx.replica_id_in_sync_group * local
  labels = tf.range(local) + offset
  return tf.matmul(q, b, transpose_b=True), labels


@task_factory.register_task_cls(configs.IctTaskConfig)
class IctTask(base_task.Task):
  """ICT with in-batch negatives; logs loss and in-batch recall@k."""

  @property
  def jit_compile(self) -> bool:
    return self.task_config.jit_compile

  def build_model(self) -> RetrieverModel:
    return RetrieverModel(*modeling.build_embedders(self.task_config.model))

  def initialize(self, model: RetrieverModel):
    if self.task_config.init_checkpoint:
      model_dir_lib.restore(model_dir_lib.resolve_checkpoint(self.task_config.init_checkpoint),
                            allow_missing=True, **model.checkpoint_items())

  def write_model_metadata(self, model_dir: str):
    cfg = self.task_config
    # No reader in ICT; the recorded one mirrors the retriever's encoder.
    model_config = configs.RealmModelConfig(
        retriever=cfg.model, reader=configs.ReaderConfig(encoder=cfg.model.encoder),
        vocab_file=cfg.vocab_file)
    model_dir_lib.write_metadata(model_dir, model_config, cfg.vocab_file)

  def build_inputs(self, params: configs.RealmDataConfig, input_context=None):
    from data_prep import schema  # pylint: disable=g-import-not-at-top
    cfg = self.task_config.model
    ds, batch_size = example_records(params, input_context, cfg.query_seq_length,
                                     cfg.block_seq_length)
    ds = ds.map(lambda r: schema.parse_ict_example(r, cfg.query_seq_length,
                                                   cfg.block_seq_length))
    return ds.batch(batch_size, drop_remainder=True).prefetch(2)

  def train_step(self, inputs, model, optimizer, metrics=None):
    with tf.GradientTape() as tape:
      logits, labels = ict_logits(model, inputs, training=True)
      losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
      # Each replica's share of the global mean (the columns are the global batch).
      loss = tf.reduce_sum(losses) / tf.cast(tf.shape(logits)[1], tf.float32)
    variables = model.trainable_variables
    optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
    sums = dict(loss=loss, examples=tf.cast(tf.shape(logits)[0], tf.float32))
    rank = tf.reduce_sum(tf.cast(logits > tf.gather(logits, labels, batch_dims=1)[:, None],
                                 tf.float32), axis=1)
    for k in self.task_config.recall_at:
      sums[f"recall@{k}"] = tf.reduce_sum(tf.cast(rank < k, tf.float32))
    return sums

  def summarize(self, totals: Dict[str, float], num_steps: int) -> Dict[str, float]:
    n = max(totals.get("examples", 0.0), 1.0)
    out = dict(loss=totals["loss"] / max(num_steps, 1))
    out.update({k: v / n for k, v in totals.items() if k.startswith("recall@")})
    return out

  def close(self):
    pass
