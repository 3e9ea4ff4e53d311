"""Training and evaluation of REALM's tasks on Model Garden's orbit loop.

``run_experiment`` is ``official.core.train_lib.run_experiment`` with a small runner subclass
for what REALM needs beyond it:

* the model directory follows the model-directory contract: ``model_config.yaml`` and
  ``vocab.txt`` are written first (checking the vocabulary against the towers), and Model
  Garden's checkpoints carry the model's ``checkpoint_items`` (``query_embedder``,
  ``block_embedder``, ``reader``) at the top level, so the refresher restores the towers alone;
* ``ckpt-0`` is saved before the first step, so that a refresher can build the first index
  from the initialized towers (REALM pre-training waits for that index);
* ``TRAINING_DONE`` is written at the end, so that the refresher exits;
* a task may define ``validation_begin(model)``, called at the start of each validation pass
  (REALM embeds the corpus with the current block tower there), and ``check_health(phase,
  step, logs)``, called with the logs of every training loop and validation pass, whose
  returned values join those logs and their summaries (REALM's retrieval-health alarms);
* a task with ``validate_at_start`` set is validated once before the first step in
  ``train_and_eval`` (REALM: the step-0 values the health alarms compare against);
* the last training logs gain ``examples_per_second`` and are returned with the eval logs.

Everything else is Model Garden's: ``steps_per_loop`` host round trips, summaries under
``model_dir/train`` and ``model_dir/validation``, checkpoint intervals and retention,
``validation_interval``, the modes ``train``, ``eval``, ``train_and_eval`` and
``continuous_eval``, and ``params.yaml``.
"""

import contextlib
import os
import time
from typing import Any, Dict, Optional, Tuple

from absl import logging
import tensorflow as tf
from official.common import distribute_utils
from official.core import base_trainer
from official.core import task_factory
from official.core import train_lib as mg_train_lib
from official.core import train_utils
from official.modeling import performance

from realm_tf import configs
from realm_tf import hardware
from realm_tf import health
from realm_tf import model_dir as model_dir_lib
from realm_tf.modeling import precision

MODES = ("train", "eval", "train_and_eval", "continuous_eval")


class RealmTrainer(base_trainer.Trainer):
  """Model Garden's trainer with a validation hook and a throughput log."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self._loop_start = None
    self._loop_step = None
    self.last_train_logs: Dict[str, float] = {}

  def train_loop_begin(self):
    before = getattr(self.task, "before_train_loop", None)
    if before is not None:
      before(self.model)   # e.g. REALM's device retrieval swapping in a newer index
    self._loop_start, self._loop_step = time.time(), int(self.global_step.numpy())
    return super().train_loop_begin()

  def train_loop_end(self):
    logs = super().train_loop_end()
    steps = int(self.global_step.numpy()) - self._loop_step
    seconds = max(time.time() - self._loop_start, 1e-9)
    logs["examples_per_second"] = (steps * self.config.task.train_data.global_batch_size /
                                   seconds)
    logs.update(self._health("train", logs))
    self.last_train_logs = {k: float(v) for k, v in logs.items()}
    return logs

  def _health(self, phase, logs):
    check = getattr(self.task, "check_health", None)
    return check(phase, int(self.global_step.numpy()), logs) if check is not None else {}

  def eval_begin(self):
    begin = getattr(self.task, "validation_begin", None)
    if begin is not None:
      begin(self.model)
    return super().eval_begin()

  def eval_end(self, *args):
    logs = super().eval_end(*args)
    logs.update(self._health("validation", logs))
    return logs


class _EvalCheckpointManager(tf.train.CheckpointManager):
  """For evaluation: restores the latest checkpoint without the training state that an
  evaluation never builds (the optimizer's slots), so that TensorFlow does not list them as
  'unrestored values' when the restore's status is deleted."""

  def restore_or_initialize(self):
    if self.latest_checkpoint is None:
      return super().restore_or_initialize()
    # expect_partial: the checkpoint's optimizer slots have nothing to restore into here;
    # the model is the trainer's own, so every model variable is in it.
    self.checkpoint.restore(self.latest_checkpoint).expect_partial()
    return self.latest_checkpoint


class _NoOrbitInfoCopy(logging.logging.Filter):
  """Drops the absl copy of orbit's INFO lines: orbit's controller both logs and prints each
  one (``train | step ...``, ``saved checkpoint ...``), so without it every line showed twice."""

  def filter(self, record):
    return not (record.levelno == logging.logging.INFO and
                os.path.basename(os.path.dirname(record.pathname)) == "orbit" and
                os.path.basename(record.pathname) == "controller.py")


def _log_orbit_lines_once():
  handler = logging.get_absl_handler()
  if not any(isinstance(f, _NoOrbitInfoCopy) for f in handler.filters):
    handler.addFilter(_NoOrbitInfoCopy())


class RealmExperimentRunner(mg_train_lib.OrbitExperimentRunner):
  """``OrbitExperimentRunner`` with REALM's model-directory contract (see module doc)."""

  def _maybe_build_checkpoint_manager(self) -> Optional[tf.train.CheckpointManager]:
    manager = super()._maybe_build_checkpoint_manager()
    if manager is None or "train" in self._mode:
      return manager
    return _EvalCheckpointManager(self.trainer.checkpoint, directory=manager.directory,
                                  max_to_keep=None, step_counter=self.trainer.global_step,
                                  init_fn=self.trainer.initialize)

  def _build_trainer(self, task, train: bool, evaluate: bool) -> base_trainer.Trainer:
    with self.strategy.scope():
      return train_utils.create_trainer(
          self.params, task, train=train, evaluate=evaluate,
          checkpoint_exporter=self._build_best_checkpoint_exporter(),
          trainer_cls=RealmTrainer)

  def run(self) -> Tuple[Any, Dict[str, float]]:
    mode, params = self._mode, self.params
    manager = self.checkpoint_manager
    if "train" in mode and manager.latest_checkpoint is None:
      # The initialized model (task.initialize ran when the controller found no checkpoint).
      manager.save(checkpoint_number=0)
    logs = {}
    with self.strategy.scope():
      if mode == "train":
        self.controller.train(steps=params.trainer.train_steps)
      elif mode == "train_and_eval":
        trainer = self.trainer
        if getattr(trainer.task, "validate_at_start", False) and trainer.global_step == 0:
          self.controller.evaluate(steps=params.trainer.validation_steps)
        logs = self.controller.train_and_evaluate(
            train_steps=params.trainer.train_steps,
            eval_steps=params.trainer.validation_steps,
            eval_interval=params.trainer.validation_interval) or {}
      elif mode == "eval":
        logs = self.controller.evaluate(steps=params.trainer.validation_steps) or {}
      else:
        return super().run()
    if "train" in mode:
      model_dir_lib.mark_training_done(self.model_dir, int(self.trainer.global_step.numpy()))
    logs = {k: float(v) for k, v in logs.items()}
    if mode == "train_and_eval":
      logs = {f"validation/{k}": v for k, v in logs.items()}
    return self.trainer.model, {**self.trainer.last_train_logs, **logs}


def persist_health_baselines(task, model_dir: str):
  """Keeps the task's health alarms' step-0 recalls (its ``health.HealthMonitor``
  attributes) in ``model_dir/health_baseline.json``, so that a resumed run keeps them."""
  for value in vars(task).values():
    if isinstance(value, health.HealthMonitor):
      value.persist_to(os.path.join(model_dir, health.BASELINE_FILE))


@contextlib.contextmanager
def precision_policy(dtype: Optional[str]):
  """Keras's global policy for ``runtime.mixed_precision_dtype`` within the block:
  ``bfloat16`` computes in that type with float32 variables, and bias gradients accumulate in
  float32 (``modeling.precision``: TensorFlow's CPU kernel sums them in bfloat16).

  Raises ConfigError for ``float16``: it needs loss scaling, which the tasks' own
  ``train_step`` does not do (Model Garden's does), so small gradients would underflow to 0;
  bfloat16 has float32's range and needs none.
  """
  if dtype == "float16":
    raise configs.ConfigError("runtime.mixed_precision_dtype=float16 is not supported (no loss "
                              "scaling); use bfloat16 or float32")
  if dtype == "bfloat16":
    precision.accumulate_bias_gradients_in_float32()
  performance.set_mixed_precision_policy(dtype or "float32")
  try:
    yield
  finally:
    performance.set_mixed_precision_policy("float32")


def check_bfloat16_device(strategy: Optional[tf.distribute.Strategy] = None) -> None:
  """Raises ConfigError, in one line, where bfloat16 steps would run on a CPU that does not
  compute bfloat16 (``hardware.cpu_bfloat16_problem``). ``strategy``: where the steps run
  (default: this process's devices); TPUs and GPUs compute bfloat16 themselves."""
  if strategy is not None:
    kinds = {tf.DeviceSpec.from_string(d).device_type for d in strategy.extended.worker_devices}
  else:
    kinds = {d.device_type for d in tf.config.list_logical_devices()}
  if kinds <= {"CPU"}:
    problem = hardware.cpu_bfloat16_problem()
    if problem:
      raise configs.ConfigError(problem)


def get_strategy(params, tpu: Optional[str] = None) -> tf.distribute.Strategy:
  """The strategy of ``params.runtime`` (``tpu`` overrides its TPU address)."""
  runtime = params.runtime
  name = runtime.distribution_strategy
  if tpu:
    name = "tpu"
  if name == "default":
    return tf.distribute.get_strategy()
  return distribute_utils.get_distribution_strategy(
      distribution_strategy=name, all_reduce_alg=runtime.all_reduce_alg,
      num_gpus=runtime.num_gpus, tpu_address=tpu or runtime.tpu)


def run_experiment(params, model_dir: str, mode: str = "train",
                   strategy: Optional[tf.distribute.Strategy] = None,
                   task=None) -> Dict[str, float]:
  """Trains and/or evaluates the experiment ``params`` in ``model_dir``.

  Applies ``runtime.mixed_precision_dtype`` (e.g. ``bfloat16``: the towers compute in
  bfloat16, their variables stay float32), writes ``params.yaml``, ``model_config.yaml`` and
  ``vocab.txt``, then runs ``mode``. Resumes from the newest checkpoint in ``model_dir``
  (same step, same optimizer state); otherwise initializes from the task's init checkpoints.
  Returns the last training logs and, for ``eval``, the validation logs (for
  ``train_and_eval``, the last validation logs with a ``validation/`` prefix).
  """
  if mode not in MODES:
    raise ValueError(f"unknown mode {mode!r}; one of {', '.join(MODES)}")
  _log_orbit_lines_once()
  with precision_policy(params.runtime.mixed_precision_dtype):
    strategy = strategy or get_strategy(params)
    if params.runtime.mixed_precision_dtype == "bfloat16":
      check_bfloat16_device(strategy)
    task = task or task_factory.get_task(params.task, logging_dir=model_dir)
    model_config, vocab_file = task.model_dir_config()
    if "train" in mode:
      # First: it checks the vocabulary against the towers.
      model_dir_lib.write_metadata(model_dir, model_config, vocab_file)
      train_utils.serialize_config(params, model_dir)
    elif not tf.io.gfile.isdir(model_dir):
      raise model_dir_lib.ModelDirError(f"model directory not found: {model_dir}")
    logging.info("%s %s in %s on %s", mode, task.name, model_dir, type(strategy).__name__)
    persist_health_baselines(task, model_dir)
    runner = RealmExperimentRunner(distribution_strategy=strategy, task=task, mode=mode,
                                   params=params, model_dir=model_dir)
    _, logs = runner.run()
  return logs
