"""A strategy-agnostic training loop for REALM's tasks (ICT and REALM pre-training).

Why not Model Garden's ``train_lib.run_experiment``: its checkpoint nests the model under
``model/``, while the refresher restores the towers by the model-directory contract's top-level
names (``query_embedder``, ``block_embedder``, ``reader``), and REALM's host input pipeline must
swap indexes between steps. The loop is small; the task objects follow Model Garden's
``base_task.Task`` API (``build_model``, ``build_inputs``, ``train_step``) so each piece stays
familiar.
"""

import logging
import os
import time
from typing import Dict, Optional

import tensorflow as tf
from official.modeling import optimization
from tqdm import tqdm

from realm_tf import model_dir as model_dir_lib


def get_strategy(distribution_strategy: str = "default", tpu: Optional[str] = None,
                 num_gpus: int = 0):
  """A tf.distribute strategy by name, through Model Garden's distribute utilities."""
  from official.common import distribute_utils  # pylint: disable=g-import-not-at-top
  if tpu:
    distribution_strategy = "tpu"
  if distribution_strategy in ("default", "one_device") and not tpu:
    return tf.distribute.get_strategy()
  return distribute_utils.get_distribution_strategy(
      distribution_strategy=distribution_strategy, num_gpus=num_gpus, tpu_address=tpu)


def create_optimizer(trainer_config):
  factory = optimization.OptimizerFactory(trainer_config.optimizer_config)
  return factory.build_optimizer(factory.build_learning_rate())


def run(task, params, model_dir: str, strategy=None) -> Dict[str, float]:
  """Trains ``task`` (a REALM or ICT task) to ``params.trainer.train_steps``.

  Resumes from the newest checkpoint in ``model_dir`` (same step, same optimizer state);
  otherwise initializes from the task's init checkpoints and saves ``ckpt-0`` at once, so a
  refresher can build the first index. Writes TensorBoard summaries under
  ``model_dir/train`` and ``TRAINING_DONE`` at the end. Returns the last logged metrics.
  """
  strategy = strategy or tf.distribute.get_strategy()
  trainer = params.trainer
  task.write_model_metadata(model_dir)  # first: it checks the vocabulary against the towers
  with strategy.scope():
    model = task.build_model()
    optimizer = create_optimizer(trainer)
    checkpoint = model_dir_lib.make_checkpoint(**model.checkpoint_items(), optimizer=optimizer)
  manager = tf.train.CheckpointManager(checkpoint, model_dir, max_to_keep=trainer.max_to_keep)
  if manager.latest_checkpoint:
    checkpoint.restore(manager.latest_checkpoint).assert_existing_objects_matched()
    logging.info("resumed from %s at step %d", manager.latest_checkpoint,
                 int(optimizer.iterations.numpy()))
  else:
    task.initialize(model)
    manager.save(checkpoint_number=0)

  dataset = strategy.distribute_datasets_from_function(
      lambda ctx: task.build_inputs(params.task.train_data, ctx))
  iterator = iter(dataset)
  # XLA cannot place clusters on logical CPU devices, so mirrored CPU runs go without it.
  cpu_mirrored = isinstance(strategy, tf.distribute.MirroredStrategy) and all(
      "CPU" in d.upper() for d in strategy.extended.worker_devices)
  replica_step = tf.function(
      lambda inputs: task.train_step(inputs, model, optimizer),
      jit_compile=getattr(task, "jit_compile", False) and not cpu_mirrored)

  @tf.function
  def train_step(inputs):
    per_replica = strategy.run(replica_step, args=(inputs,))
    return {k: strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None)
            for k, v in per_replica.items()}

  writer = tf.summary.create_file_writer(os.path.join(model_dir, "train"))
  step = last_saved = int(optimizer.iterations.numpy())
  totals, last, t0, n_examples, num_steps = {}, {}, time.time(), 0, 0
  progress = tqdm(total=trainer.train_steps, initial=step, desc=task.name, unit="step",
                  disable=None)
  while step < trainer.train_steps:
    sums = {k: float(v) for k, v in train_step(next(iterator)).items()}
    step = int(optimizer.iterations.numpy())
    for k, v in sums.items():
      totals[k] = totals.get(k, 0.0) + v
    n_examples += int(sums.get("examples", 0))
    num_steps += 1
    progress.update(1)
    if step % trainer.summary_interval == 0 or step == trainer.train_steps:
      last = task.summarize(totals, num_steps)
      last["examples_per_second"] = n_examples / max(time.time() - t0, 1e-9)
      last["learning_rate"] = float(optimizer.learning_rate(step - 1)
                                    if callable(optimizer.learning_rate)
                                    else optimizer.learning_rate)
      with writer.as_default(step=step):
        for k, v in last.items():
          tf.summary.scalar(k, v)
      progress.set_postfix({k: f"{v:.3g}" for k, v in last.items()
                            if k in ("loss", "mlm_accuracy", "index_age", "recall@1")})
      logging.info("step %d: %s", step, {k: round(v, 4) for k, v in last.items()})
      totals, t0, n_examples, num_steps = {}, time.time(), 0, 0
    # Checkpoints are numbered by global step: the refresher names its indexes after them.
    if step - last_saved >= trainer.checkpoint_interval or step >= trainer.train_steps:
      manager.save(checkpoint_number=step)
      last_saved = step
  progress.close()
  writer.flush()
  model_dir_lib.mark_training_done(model_dir, step)
  task.close()
  return last
