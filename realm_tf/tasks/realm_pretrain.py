"""The REALM pre-training task, registered with Model Garden's task factory."""

import logging
from typing import Dict

import tensorflow as tf
from official.core import base_task
from official.core import task_factory

from realm_tf import configs
from realm_tf import model_dir as model_dir_lib
from realm_tf.tasks import losses
from realm_tf.tasks import retrieval_inputs
from realm_tf.tasks.realm_model import RealmPretrainer
from realm_tf.tokenization import RealmTokenizer

DEVICE_FEATURES = ("query_word_ids", "query_mask", "query_type_ids", "candidate_word_ids",
                   "candidate_mask", "candidate_type_ids", "reader_word_ids", "reader_mask",
                   "reader_type_ids", "mlm_positions", "mlm_ids", "mlm_weights", "index_step")


def replica_loss(model, features, training: bool):
  """The replicated computation: per-replica loss share and metric sums.

  The loss is the mean over all real mask tokens of the global batch of
  ``-log sum_z p(z|x) p(y_j|z,x)``; each replica returns its share (its token sum divided by
  the all-reduced global token count), so summing over replicas gives the global mean and the
  gradients need no further scaling under any strategy.
  """
  out = model(features, training=training)
  m = losses.realm_metrics(out["retrieval_logits"], out["mlm_logits"], features["mlm_ids"],
                           features["mlm_weights"])
  local_tokens = tf.reduce_sum(m["num_tokens"])
  ctx = tf.distribute.get_replica_context()
  global_tokens = (ctx.all_reduce(tf.distribute.ReduceOp.SUM, local_tokens)
                   if ctx is not None else local_tokens)
  loss = tf.reduce_sum(m["nll_sum"]) / tf.maximum(global_tokens, 1.0)
  sums = dict(loss=loss, tokens=local_tokens, correct=tf.reduce_sum(m["correct"]),
              retrieval_utility=tf.reduce_sum(m["retrieval_utility"]),
              entropy=tf.reduce_sum(m["entropy"]),
              examples=tf.cast(tf.shape(m["entropy"])[0], tf.float32))
  return loss, sums


@task_factory.register_task_cls(configs.RealmPretrainTaskConfig)
class RealmPretrainTask(base_task.Task):
  """Retrieve (host) -> rescore + read + marginalize (device)."""

  def __init__(self, params: configs.RealmPretrainTaskConfig, logging_dir=None, name="realm"):
    super().__init__(params, logging_dir=logging_dir, name=name)
    self._builder = None

  @property
  def jit_compile(self) -> bool:
    return self.task_config.jit_compile

  # ---- model ----
  def build_model(self) -> RealmPretrainer:
    return RealmPretrainer.from_config_dataclass(self.task_config.model)

  def initialize(self, model: RealmPretrainer):
    """Restores the towers from the ICT (or converted) checkpoint and the reader, if given."""
    cfg = self.task_config
    if cfg.retriever_init_checkpoint:
      path = model_dir_lib.resolve_checkpoint(cfg.retriever_init_checkpoint)
      model_dir_lib.restore(path, query_embedder=model.query_embedder,
                            block_embedder=model.block_embedder)
      logging.info("retriever initialized from %s", path)
    if cfg.reader_init_checkpoint:
      path = model_dir_lib.resolve_checkpoint(cfg.reader_init_checkpoint)
      model_dir_lib.restore(path, allow_missing=True, reader=model.reader)
      logging.info("reader initialized from %s", path)

  def write_model_metadata(self, model_dir: str):
    model_dir_lib.write_metadata(model_dir, self.task_config.model,
                                 self.task_config.model.vocab_file)

  # ---- inputs ----
  def candidate_builder(self, handle=None) -> retrieval_inputs.CandidateBuilder:
    """The host pipeline over ``train_data.blocks_dir`` and the index in ``index_dir``."""
    from data_prep import schema  # pylint: disable=g-import-not-at-top
    from realm_tf.retrieval.handle import IndexHandle  # pylint: disable=g-import-not-at-top
    cfg = self.task_config
    blocks_dir = cfg.train_data.blocks_dir
    manifest = schema.load_manifest(blocks_dir)
    if handle is None:
      handle = IndexHandle(cfg.index_dir, expected_fingerprint=manifest["fingerprint"],
                           expected_dim=cfg.model.retriever.projection_size,
                           wait_seconds=cfg.index_wait_seconds)
      handle.wait_for_first()
    tokenizer = RealmTokenizer(cfg.model.vocab_file, lower_case=cfg.model.lower_case)
    return retrieval_inputs.CandidateBuilder(
        schema.read_blocks(blocks_dir), cfg.model, handle, tokenizer.cls_id, tokenizer.sep_id,
        refresh=cfg.refresh_index)

  def build_inputs(self, params: configs.RealmDataConfig, input_context=None):
    cfg = self.task_config
    batch_size = (input_context.get_per_replica_batch_size(params.global_batch_size)
                  if input_context else params.global_batch_size)
    if self._builder is None:
      self._builder = self.candidate_builder()
    builder = self._builder
    examples = retrieval_inputs.read_examples(params.input_path,
                                              cfg.model.retriever.query_seq_length,
                                              cfg.model.max_masks)
    if input_context and input_context.num_input_pipelines > 1:
      examples = examples.shard(input_context.num_input_pipelines,
                                input_context.input_pipeline_id)
    if params.is_training:
      examples = examples.shuffle(params.shuffle_buffer_size, seed=params.seed).repeat()
    examples = examples.batch(batch_size, drop_remainder=params.is_training)

    def generate():
      for batch in examples.as_numpy_iterator():
        if builder.maybe_swap():
          logging.info("swapped in the index of step %d", builder.handle.step)
        features = builder.features(batch)
        yield {k: features[k] for k in DEVICE_FEATURES}

    signature = retrieval_inputs.feature_signature(cfg.model)
    signature = {k: signature[k] for k in DEVICE_FEATURES}
    return tf.data.Dataset.from_generator(generate, output_signature=signature).prefetch(1)

  # ---- steps ----
  def train_step(self, inputs, model, optimizer, metrics=None):
    with tf.GradientTape() as tape:
      loss, sums = replica_loss(model, inputs, training=True)
    # Off-policy delay: how many steps old the index that retrieved these candidates is.
    sums["index_age"] = tf.reduce_sum(tf.cast(optimizer.iterations, tf.float32) -
                                      tf.cast(inputs["index_step"], tf.float32))
    grads = tape.gradient(loss, model.trainable_variables)
    # The reader's pooler takes no part in the MLM loss: leave it out.
    optimizer.apply_gradients((g, v) for g, v in zip(grads, model.trainable_variables)
                              if g is not None)
    return sums

  def summarize(self, totals: Dict[str, float], num_steps: int) -> Dict[str, float]:
    """Logged metrics from the per-step sums accumulated over ``num_steps`` steps."""
    n = max(totals.get("examples", 0.0), 1.0)
    return dict(loss=totals["loss"] / max(num_steps, 1),
                mlm_accuracy=totals["correct"] / max(totals["tokens"], 1.0),
                retrieval_utility=totals["retrieval_utility"] / n,
                retrieval_entropy=totals["entropy"] / n,
                index_age=totals["index_age"] / n)

  def close(self):
    if self._builder is not None:
      self._builder.handle.close()
