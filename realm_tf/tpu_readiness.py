"""TPU readiness without a TPU: what a TPU needs of a training step, checked on any device.

A TPU runs a step only if the whole replicated step compiles with XLA: every tensor that
enters it has a fully static shape (``drop_remainder``, fixed candidate and span counts) and a
TPU dtype (int32, float32, bfloat16: no strings, no int64 on the device), and every op in it
has an XLA kernel (no host callbacks, no ``py_function``). This module checks both:

* :func:`input_problems` / :func:`check_inputs`: the shapes and dtypes of a step's inputs
  (a dataset's ``element_spec``, ``tf.TensorSpec``\\ s, or the symbolic tensors a step is
  traced with); :func:`checked_dataset_fn` wraps a ``strategy.distribute_datasets_from_function``
  dataset function so that every input pipeline's dataset is checked as it is built;
* :func:`run_step`: a task's real ``train_step`` or ``validation_step`` inside
  ``strategy.run`` in one ``tf.function``, compiled whole with XLA (``jit_compile``) or not,
  so that the two can be compared (:func:`differences`).

What XLA can compile here: a step on one replica, whole (forward, gradients, the optimizer's
update, the metrics). TensorFlow compiles cross-replica collectives with XLA only on GPUs and
TPUs ("Collectives are not yet implemented for CPU devices when compiling with XLA"), and
``MirroredStrategy``'s ``all_gather`` always leaves the replica for a ``merge_call``, which
XLA cannot hold: a step replicated over CPU devices runs uncompiled (:func:`step_function`
says so in its error). Example::

    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    eager = run_step(task, model_a, batch, strategy, optimizer=opt_a, metrics=m_a)
    xla = run_step(task, model_b, batch, strategy, optimizer=opt_b, metrics=m_b,
                   jit_compile=True)
    assert not differences(eager, xla)
"""

import dataclasses
import time
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf
from official.modeling.optimization.configs import optimization_config

from realm_tf import errors

TPU_DTYPES = (tf.int32, tf.float32, tf.bfloat16)
# The optimizer of the checks: plain SGD, so that a weight updated by a compiled step and by an
# uncompiled one differ by 0.1 x the difference of their gradients. (Adam's first update,
# lr * g / (|g| + eps), is about lr * sign(g): it compares signs, random where g is ~0.)
CHECK_OPTIMIZER = optimization_config.OptimizationConfig({
    "optimizer": {"type": "sgd", "sgd": {"momentum": 0.0}},
    "learning_rate": {"type": "constant", "constant": {"learning_rate": 0.1}}})
# Tolerances of a compiled step against the uncompiled one (XLA fuses and reorders float
# sums): the loss relative; a metric relative or absolute (a score margin is a difference of
# close logits); a weight after the update within WEIGHT_ATOL plus UPDATE_RTOL of the largest
# update of its variable (with CHECK_OPTIMIZER).
LOSS_RTOL = 1e-4
METRIC_ATOL = 1e-5
WEIGHT_ATOL = 2e-5
UPDATE_RTOL = 1e-3


class NotTpuReadyError(errors.RealmError):
  """Inputs or a step that a TPU cannot run (each problem is named). Derives from no built-in
  exception but ``Exception`` (through ``RealmError``), so that raised while a step is traced it
  keeps its type through AutoGraph."""


def _specs(features, prefix: str = ""):
  """``(name, shape, dtype)`` of every leaf of a nest of specs or tensors."""
  if isinstance(features, dict):
    for key in sorted(features):
      yield from _specs(features[key], f"{prefix}{key}" if not prefix else f"{prefix}/{key}")
  elif isinstance(features, (list, tuple)):
    for i, value in enumerate(features):
      yield from _specs(value, f"{prefix}[{i}]")
  elif isinstance(features, (tf.RaggedTensor, tf.SparseTensor, tf.RaggedTensorSpec,
                             tf.SparseTensorSpec)):
    yield prefix or "input", None, features.dtype
  else:
    yield prefix or "input", tf.TensorShape(features.shape), tf.as_dtype(features.dtype)


def input_problems(features, static_batch: bool = True) -> List[str]:
  """One line per leaf of ``features`` that a TPU step cannot take: a shape that is not fully
  static (a ragged or sparse value counts as one), or a dtype other than ``TPU_DTYPES``.

  ``features``: a nest (dicts, lists) of ``tf.TensorSpec``, ``tf.Tensor`` or the like, e.g. a
  dataset's ``element_spec`` or the inputs a step function is being traced with.
  ``static_batch=False`` lets the first (batch) dimension alone be unknown: a validation pass
  may end with a partial batch, which TPUStrategy compiles with a dynamic batch dimension
  (XLA's dynamic padder); training batches are always full.
  """
  problems = []
  allowed = ", ".join(d.name for d in TPU_DTYPES)
  for name, shape, dtype in _specs(features):
    if shape is None:
      problems.append(f"{name}: a ragged or sparse value; pad it to a fixed shape on the host")
    elif not (shape if static_batch or not shape.rank else shape[1:]).is_fully_defined():
      problems.append(f"{name}: shape {shape} is not fully static (batch with "
                      "drop_remainder=True; pad to a fixed length)")
    if dtype not in TPU_DTYPES:
      fix = ("keep strings on the host side" if dtype == tf.string
             else "cast it on the host" if dtype.is_integer or dtype.is_floating or dtype.is_bool
             else "keep it on the host side")
      problems.append(f"{name}: dtype {dtype.name} is not a TPU dtype ({allowed}); {fix}")
  return problems


def check_inputs(features, where: str, static_batch: bool = True) -> None:
  """Raises ``NotTpuReadyError`` naming ``where`` and every problem of ``input_problems``."""
  problems = input_problems(features, static_batch)
  if problems:
    raise NotTpuReadyError(f"{where}: not TPU-ready:\n  " + "\n  ".join(problems))


def checked_dataset_fn(dataset_fn: Callable, where: str, static_batch: bool = True
                       ) -> Callable:
  """``dataset_fn(input_context)`` whose dataset's ``element_spec`` is checked
  (``check_inputs``) when it is built, e.g. by ``strategy.distribute_datasets_from_function``
  once per input pipeline (host)."""
  def checked(input_context=None):
    dataset = dataset_fn(input_context)
    pipeline = f" (input pipeline {input_context.input_pipeline_id})" if input_context else ""
    check_inputs(dataset.element_spec, where + pipeline, static_batch)
    return dataset
  return checked


def is_tpu(strategy: tf.distribute.Strategy) -> bool:
  return isinstance(strategy, (tf.distribute.TPUStrategy,
                               tf.distribute.experimental.TPUStrategy))


def step_function(strategy: tf.distribute.Strategy, replica_fn: Callable,
                  jit_compile: bool) -> Callable:
  """``replica_fn`` run by ``strategy.run`` inside one ``tf.function``, as Model Garden's
  trainer runs a step. With ``jit_compile`` the step is compiled whole with XLA: on a TPU
  the strategy does so anyway; on one replica the whole function is compiled; over several
  GPUs each replica's function is (TensorFlow's XLA path for ``MirroredStrategy``).

  Raises:
    ValueError: ``jit_compile`` over several replicas on other devices (CPUs), where
      TensorFlow cannot compile the collectives with XLA.
  """
  def run(inputs):
    return strategy.run(replica_fn, args=(inputs,))
  if not jit_compile or is_tpu(strategy):
    return tf.function(run)
  if strategy.num_replicas_in_sync == 1:
    return tf.function(run, jit_compile=True)
  devices = strategy.extended.worker_devices
  if all(tf.DeviceSpec.from_string(d).device_type == "GPU" for d in devices):
    compiled = tf.function(replica_fn, jit_compile=True)
    return tf.function(lambda inputs: strategy.run(compiled, args=(inputs,)))
  raise ValueError(f"XLA cannot compile a step replicated over {', '.join(devices)}: "
                   "TensorFlow compiles cross-replica collectives only on GPUs and TPUs; "
                   "compile the step on one replica and run the replicated step uncompiled")


@dataclasses.dataclass
class StepResult:
  """One step's global loss, the model's variables after it and the largest change of each,
  the metrics' results, and the seconds of the first call (tracing and compiling included)."""
  loss: float
  weights: List[np.ndarray]
  updates: List[float]
  metrics: Dict[str, float]
  seconds: float


def replica_step(task, model, optimizer=None, metrics: Optional[Sequence] = None) -> Callable:
  """The replica function of ``task.train_step`` (with an ``optimizer``) or
  ``task.validation_step`` (without), as Model Garden's trainer calls them. Its inputs are
  checked (``check_inputs``; a validation batch may be partial) when it is traced, so a step
  given a dynamic shape or a string feature fails before anything compiles."""
  where = (f"the inputs of {type(task).__name__}."
           f"{'train' if optimizer is not None else 'validation'}_step")

  def replica_fn(features):
    check_inputs(features, where, static_batch=optimizer is not None)
    if optimizer is not None:
      return task.train_step(features, model=model, optimizer=optimizer, metrics=metrics)
    return task.validation_step(features, model=model, metrics=metrics)
  return replica_fn


def run_step(task, model, inputs, strategy: tf.distribute.Strategy, optimizer=None,
             metrics: Optional[Sequence] = None, jit_compile: bool = False) -> StepResult:
  """Runs ``replica_step`` once on ``inputs`` (a batch, or a distributed batch of
  ``strategy``) in ``strategy.run`` inside a ``tf.function`` (``step_function``)."""
  fn = step_function(strategy, replica_step(task, model, optimizer, metrics), jit_compile)
  for metric in metrics or []:
    metric.reset_state()   # this step's metrics alone
  before = [v.numpy() for v in model.variables]
  start = time.perf_counter()
  logs = fn(inputs)
  # The trainer's loss: the mean over replicas of (share x replicas), the global mean.
  loss = float(strategy.reduce("MEAN", logs[task.loss], axis=None))
  seconds = time.perf_counter() - start
  after = [v.numpy() for v in model.variables]
  return StepResult(loss=loss, weights=after,
                    updates=[float(np.max(np.abs(a - b))) if a.size else 0.0
                             for a, b in zip(after, before)],
                    metrics={m.name: float(m.result()) for m in metrics or []},
                    seconds=seconds)


def differences(want: StepResult, got: StepResult, loss_rtol: float = LOSS_RTOL,
                weight_atol: float = WEIGHT_ATOL, update_rtol: float = UPDATE_RTOL,
                metric_atol: float = METRIC_ATOL, ignore_metrics: Sequence[str] = ()
                ) -> List[str]:
  """What differs between two runs of a step beyond the tolerances (empty: the same): the
  loss (relative), the metrics but ``ignore_metrics`` (relative or absolute), each weight
  (see ``UPDATE_RTOL``)."""
  out = []
  if not np.isclose(got.loss, want.loss, rtol=loss_rtol, atol=0):
    out.append(f"loss {got.loss!r} != {want.loss!r}")
  for name in sorted((set(want.metrics) | set(got.metrics)) - set(ignore_metrics)):
    a, b = want.metrics.get(name), got.metrics.get(name)
    if a is None or b is None or not np.isclose(b, a, rtol=loss_rtol, atol=metric_atol):
      out.append(f"metric {name}: {b!r} != {a!r}")
  if len(want.weights) != len(got.weights):
    out.append(f"{len(got.weights)} weights != {len(want.weights)}")
  for i, (a, b) in enumerate(zip(want.weights, got.weights)):
    gap = float(np.max(np.abs(a - b))) if a.size else 0.0
    allowed = weight_atol + update_rtol * max(want.updates[i], got.updates[i])
    if a.shape != b.shape or gap > allowed:
      out.append(f"weight {i} {a.shape}: max difference {gap:.3g} > {allowed:.3g} (its "
                 f"largest update {want.updates[i]:.3g})")
  return out
