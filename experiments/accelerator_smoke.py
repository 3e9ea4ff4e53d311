r"""One-command accelerator smoke run: a CPU-sized experiment on whatever device is present.

    python -m experiments.accelerator_smoke --experiment=realm_pretrain_cpu --strategy=tpu
    python -m experiments.accelerator_smoke --experiment=realm_pretrain_cpu --retrieval=device \
        --strategy=mirrored
    python -m experiments.accelerator_smoke --experiment=openqa_cpu --strategy=one_device

1. a small synthetic world through ``data_prep`` (blocks, masked sentences, ICT examples and
   questions; ``--world_scale`` of the demo's world) in ``--output_dir``;
2. the strategy: ``tpu``: ``TPUStrategy`` through ``TPUClusterResolver(--tpu)`` (``local`` on a
   TPU VM); ``mirrored``: ``MirroredStrategy`` over the GPUs; ``one_device``: the first GPU,
   else the CPU;
3. the experiment's real trainer (``realm-train``'s ``train_lib.run_experiment``, the demo's
   YAML) for ``--steps`` steps, its training inputs checked as each input pipeline builds them
   (``tpu_readiness``: fully static shapes, TPU dtypes). REALM pre-training, and Open-QA with
   a trainable block tower (``--trainable_blocks``), run beside ``realm-refresh`` (a second
   process), whose newer indexes they swap in; ICT and the reading warm start retrieve
   nothing and run alone;
4. the report: steps/s and examples/s after the first loop; the compile time (the first
   loop's time beyond the others' and beyond its wait for the refresher's first index); each
   device's peak memory where TensorFlow reports it; the run's health (every logged loss
   finite, its first and last values, ``TRAINING_DONE``; with the refresher: its builds, its
   exit status, the index age; REALM's retrieval health alarms, reported, not judged); and, on
   one replica off TPU, ``tpu_readiness``'s check of the trained model's train step on one
   batch: compiled whole with XLA against uncompiled (the loss and the weights after one
   ``CHECK_OPTIMIZER`` update, so the gradients, to ``tpu_readiness``'s tolerances; the
   metrics, statistics derived from the step, to a share of their spread over the run).

On a TPU every step the trainer runs is one XLA program, the replicated step with its
collectives (all-gathers, all-reduces) included: a run that completes is the check a CPU
cannot make. Exit status: 0 healthy, 1 unhealthy (the report says why), 2 an expected error
(``error: ...``). Only ``main`` reads the flags; the functions take what they need.
"""

import json
import math
import os
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional

from absl import flags
import numpy as np
from official.core import task_factory
import tensorflow as tf

from data_prep import pipeline
from data_prep import synthetic_world
# pylint: disable-next=unused-import (its flags)
from experiments.pipeline import recipe_flags  # noqa: F401
from experiments.pipeline import stages
from experiments.pipeline.common import Clock
from realm_tf import configs
from realm_tf import model_dir as model_dir_lib
from realm_tf import tasks  # noqa: F401  pylint: disable=unused-import
from realm_tf import tpu_readiness
from realm_tf import train_lib
from realm_tf.binaries import cli
from realm_tf.retrieval.publication import refresher
from realm_tf.retrieval.publication import testing

FLAGS = flags.FLAGS
EXPERIMENTS = ("ict_cpu", "reader_read_cpu", "realm_pretrain_cpu", "openqa_cpu")


def define_flags() -> None:
  """The smoke run's flags, beside experiments/pipeline/recipe_flags.py's (``--output_dir``,
  ``--seed``, ``--world_scale``, ``--refresh_every``: the checkpoint, summary and host
  round-trip interval)."""
  flags.DEFINE_enum("experiment", "realm_pretrain_cpu", EXPERIMENTS,
                    "The CPU-sized experiment.")
  flags.DEFINE_enum("strategy", "one_device", ["tpu", "mirrored", "one_device"],
                    "tpu: TPUStrategy (--tpu); mirrored: every GPU; one_device: a GPU, or the "
                    "CPU.")
  flags.DEFINE_string("tpu", "local",
                      "The TPU's address for TPUClusterResolver (local: this TPU VM).")
  flags.DEFINE_enum("retrieval", "host", ["host", "device"],
                    "realm_pretrain_cpu's task.retrieval.")
  flags.DEFINE_integer("steps", 200, "Training steps.")
  flags.DEFINE_integer("trainable_blocks", 8,
                       "openqa_cpu: the top N blocks of each beam embedded by a trainable block "
                       "tower, with the refresher beside the fine-tuner (0: a frozen index).")
  flags.DEFINE_string("params_override", "", "More overrides, after the smoke run's own.")


RETRIEVING = ("realm_pretrain_cpu", "openqa_cpu")
# How far a metric of the compiled step may be from the uncompiled one's: this share of the
# metric's spread over the run (the standard deviation of its training summaries), when that
# is beyond tpu_readiness's tolerances. The metrics are statistics derived from the step (a
# retrieval margin is a difference of close logits, which another summation order moves by
# more than the loss); the loss and the weights are what the check is for, and keep
# tpu_readiness's tolerances.
METRIC_SPREAD_SHARE = 0.1
# Two kinds of metric need more room, both seen failing healthy 20-step runs while the loss
# agreed to 5-6 digits (2026-12-04). A difference of retrieval logits: its float error scales
# with the logits' size (LayerNorm'd 128-d embeddings: ~128), not with its own (a margin of
# 0.0035 moved 1.9e-5); it may move 2 * LOSS_RTOL of that size. A share of the retrieved blocks:
# a near tie of two scores may retrieve the other block (distinct_candidates 0.1125 against
# 0.1083: 1 of 240 blocks); it may move RETRIEVED_SWAP_SHARE of them (at least one block).
# Retrieval that a compile broke changes many blocks, and the loss.
LOGIT_DIFFERENCES = ("retrieval_margin",)
RETRIEVED_SHARES = ("distinct_candidates", "candidates_with_answer")
RETRIEVED_SWAP_SHARE = 0.01


_say = Clock("smoke").say


def make_strategy(params, name: str, tpu: str = "local"):
  """The strategy ``name`` (``tpu``, ``mirrored``, ``one_device``: see ``--strategy``; ``tpu``:
  the TPU's address); ``params.runtime`` is set to match."""
  gpus = len(tf.config.list_physical_devices("GPU"))
  runtime = params.runtime
  if name == "tpu":
    return train_lib.get_strategy(params, tpu=tpu)
  if name == "mirrored" and not gpus:
    _say("no GPU: MirroredStrategy over the CPU (one replica)")
  runtime.distribution_strategy = name
  runtime.num_gpus = gpus if name == "mirrored" else min(gpus, 1)
  return train_lib.get_strategy(params)


def prepare(out: str, seed: int, world_scale: float = 1.0):
  """The world of ``seed`` (``world_scale`` times the demo's) and its data_prep outputs (reused
  when ``out`` already holds them)."""
  done = os.path.join(out, "prepared.json")
  if os.path.exists(done):
    with open(done) as f:
      return json.load(f)
  files = synthetic_world.write_world(stages.make_world(seed, seed, world_scale),
                                      os.path.join(out, "world"), vocab_size=3000,
                                      whole_word_names=True)
  dirs = pipeline.prepare_all(files["articles"], files["vocab"], os.path.join(out, "data"),
                              patterns_file=files["patterns"], eval_fraction=0.2,
                              seed=seed, block_seq_length=32,
                              query_seq_length=32)["dirs"]
  prepared = dict(files=files, dirs=dirs)
  with open(done, "w") as f:
    json.dump(prepared, f)
  return prepared


def experiment_params(data, out: str, name: str, steps: int, refresh_every: int,
                      retrieval: str = "host", trainable_blocks: int = 8,
                      params_override: str = ""):
  """The config of the experiment ``name``: its demo YAML, ``prepare``'s ``data``, ``steps``
  steps, a checkpoint (so an index) and a host round trip every ``refresh_every`` steps, then
  ``params_override``; ``retrieval`` and ``trainable_blocks``: see their flags."""
  files, dirs = data["files"], data["dirs"]
  vocab = files["vocab"]
  index_dir = os.path.join(out, "index")
  settings = {
      "ict_cpu": {"task.vocab_file": vocab, "task.model.encoder.vocab_size": stages.vocab_size(
          vocab), "task.train_data.input_path": f"{dirs['ict']}/train-*"},
      "reader_read_cpu": dict(stages.towers(vocab), **{
          "task.train_data.input_path": [f"{dirs['pretrain']}/train-*"],
          "task.train_data.blocks_dir": [dirs["blocks"]]}),
      "realm_pretrain_cpu": dict(stages.towers(vocab), **{
          "task.train_data.input_path": f"{dirs['pretrain']}/train-*",
          "task.train_data.blocks_dir": dirs["blocks"], "task.index_dir": index_dir,
          "task.retrieval": retrieval}),
      "openqa_cpu": dict(stages.towers(vocab), **{
          "task.train_data.input_path": files["qa_train"], "task.index_dir": index_dir,
          "task.blocks_dir": dirs["blocks"], "task.init_checkpoint": os.path.join(out, "init"),
          "task.trainable_blocks": trainable_blocks}),
  }[name]
  settings.update({"trainer.train_steps": steps,
                   "trainer.optimizer_config.learning_rate.polynomial.decay_steps": steps},
                  **stages.intervals(refresh_every))
  return configs.load_experiment(name, [stages.config(name)],
                                 [stages.nested(settings), params_override])


def frozen_start(params, out: str, data, seed: int) -> None:
  """Open-QA's starting model: random towers in ``out/init`` (and, without a trainable block
  tower, the frozen index of their block tower)."""
  init = os.path.join(out, "init")
  trainer = testing.TinyTrainer(init, data["files"]["vocab"], config=params.task.model,
                                seed=seed)
  trainer.perturb(0.3)   # untrained towers score every block alike
  trainer.save(0)
  trainer.finish(0)
  if not params.task.trainable_blocks:
    refresher.build_index_for_checkpoint(
        None, init, data["dirs"]["blocks"], params.task.index_dir,
        refresher.BuildOptions(index_type="brute_force", progress=False))


def start_refresher(model_dir: str, params, out: str, blocks: str):
  """``realm-refresh`` on ``model_dir`` into the task's ``index_dir``, logging to
  ``out/refresh.log``; returns the process and the log's path."""
  log = open(os.path.join(out, "refresh.log"), "w")  # pylint: disable=consider-using-with
  proc = subprocess.Popen(
      [sys.executable, "-m", "realm_tf.binaries.refresh", f"--model_dir={model_dir}",
       f"--index_dir={params.task.index_dir}", f"--blocks_dir={blocks}", "--poll_seconds=1",
       "--model_dir_wait_seconds=600", "--keep=2", "--noprogress"],
      stdout=log, stderr=subprocess.STDOUT)
  return proc, log.name


def checked_task(params, model_dir: str, name: str):
  """The experiment's task, its ``build_inputs`` checked by ``tpu_readiness`` for training
  (``name``: the experiment's, for the messages)."""
  task = task_factory.get_task(params.task, logging_dir=model_dir)
  build_inputs = task.build_inputs
  checked = []

  def build(data_config, input_context=None):
    if not data_config.is_training:
      return build_inputs(data_config, input_context)
    dataset = tpu_readiness.checked_dataset_fn(
        lambda ctx: build_inputs(data_config, ctx), f"{name} training inputs")(
            input_context)
    checked.append(dataset.element_spec)
    return dataset
  task.build_inputs = build
  return task, checked


def device_memory(strategy):
  """``{device: peak bytes}`` of the devices that report it (TensorFlow's allocator
  statistics, ``tf.config.experimental.get_memory_info``)."""
  peaks = {}
  for device in strategy.extended.worker_devices:
    try:
      peaks[device] = tf.config.experimental.get_memory_info(device)["peak"]
    except (ValueError, tf.errors.OpError):
      pass   # not reported
  return peaks


def metric_spreads(model_dir: str) -> Dict[str, float]:
  """``{tag: standard deviation}`` of each scalar of the run's training summaries."""
  return {tag: float(np.std([v for _, v in values])) for tag, values in
          model_dir_lib.read_summaries(model_dir, "train").items()}


def step_differences(eager, xla, spreads: Dict[str, float],
                     sizes: Optional[Dict[str, float]] = None) -> List[str]:
  """What differs between the uncompiled and the compiled step (``tpu_readiness.StepResult``s;
  empty: the same): the loss and the weights after the update (so the gradients) beyond
  ``tpu_readiness``'s tolerances; a metric beyond them and beyond ``METRIC_SPREAD_SHARE`` of its
  spread over the run (``spreads``: ``metric_spreads``). With the step's ``sizes``
  (``retrieval_sizes``), ``LOGIT_DIFFERENCES`` and ``RETRIEVED_SHARES`` get the room above."""
  names = sorted(set(eager.metrics) | set(xla.metrics))
  sizes = sizes or {}
  out = tpu_readiness.differences(eager, xla, ignore_metrics=names)
  for name in names:
    a, b = eager.metrics.get(name), xla.metrics.get(name)
    if a is None or b is None:
      out.append(f"metric {name}: {b!r} != {a!r}")
      continue
    allowed = max(tpu_readiness.METRIC_ATOL + tpu_readiness.LOSS_RTOL * abs(a),
                  METRIC_SPREAD_SHARE * spreads.get(name, 0.0))
    if name in LOGIT_DIFFERENCES and "logits" in sizes:
      allowed = max(allowed, 2 * tpu_readiness.LOSS_RTOL * sizes["logits"])
    if name in RETRIEVED_SHARES and "retrieved" in sizes:
      allowed = max(allowed, max(1.0, RETRIEVED_SWAP_SHARE * sizes["retrieved"])
                    / sizes["retrieved"])
    if not abs(b - a) <= allowed and not (math.isnan(a) and math.isnan(b)):
      out.append(f"metric {name}: {b!r} != {a!r} (allowed {allowed:.2g}; its spread over the "
                 f"run {spreads.get(name, 0.0):.2g})")
  return out


def retrieval_sizes(task, model, batch) -> Dict[str, float]:
  """For a model that scores retrieved candidates on ``batch`` (else ``{}``): ``logits``, the
  size of its retrieval logits ``f(x, z)`` (the batch's mean of each example's largest
  ``|f(x, z)|``), and ``retrieved``, the number of retrieved blocks (``b * (k - 1)``: the
  null block is not retrieved)."""
  if not hasattr(model, "query_embedder"):
    return {}
  # Device retrieval makes the candidates inside train_step, from the task's loaded index.
  device = getattr(task, "_device", None)
  features = device.features(batch, model.query_embedder) if device is not None else batch
  if "candidate_word_ids" not in features:
    return {}
  out = model(features, training=False)
  if not isinstance(out, dict) or "retrieval_logits" not in out:
    return {}
  logits = np.asarray(out["retrieval_logits"])
  return {"logits": float(np.mean(np.max(np.abs(logits), axis=-1))),
          "retrieved": float(logits.shape[0] * (logits.shape[1] - 1))}


def xla_check(params, model_dir: str, strategy):
  """``tpu_readiness``'s check of the trained model's train step on one batch, from the last
  checkpoint, on one replica: compiled whole with XLA against uncompiled (``step_differences``:
  the loss, the weights after one ``CHECK_OPTIMIZER`` update, the metrics). Returns a report
  line and whether they agree."""
  if strategy.num_replicas_in_sync > 1:
    # MirroredStrategy's all_gather (ICT, device retrieval) leaves the replica for a
    # merge_call, which a replica compiled with XLA cannot hold.
    return "not run over several replicas (MirroredStrategy cannot compile them whole)", True
  task = task_factory.get_task(params.task, logging_dir=model_dir)
  checkpoint = model_dir_lib.latest_checkpoint(model_dir)
  sides = []
  for _ in range(2):
    with strategy.scope():
      model = task.build_model()
      model_dir_lib.restore(checkpoint, **model.checkpoint_items)
      optimizer = task.create_optimizer(tpu_readiness.CHECK_OPTIMIZER, params.runtime)
      metrics = task.build_metrics(training=True)
      if hasattr(task, "before_train_loop"):
        task.before_train_loop(model)
    sides.append((model, optimizer, metrics))
  batch = next(iter(strategy.distribute_datasets_from_function(
      lambda ctx: task.build_inputs(params.task.train_data, ctx))))
  sizes = retrieval_sizes(task, sides[0][0], batch)   # before the step updates the weights
  eager, xla = (tpu_readiness.run_step(task, model, batch, strategy, optimizer, metrics,
                                       jit_compile=jit)
                for jit, (model, optimizer, metrics) in zip((False, True), sides))
  differences = step_differences(eager, xla, metric_spreads(model_dir), sizes)
  gap = max(float(abs(a - b).max()) for a, b in zip(eager.weights, xla.weights) if a.size)
  metric_gap = max([abs(xla.metrics[n] - v) for n, v in eager.metrics.items()
                    if n in xla.metrics] or [0.0])
  return (f"{'; '.join(differences) if differences else 'the same'}: loss {xla.loss:.6g} "
          f"compiled, {eager.loss:.6g} not; weights after an SGD update within {gap:.2g} "
          f"(largest update {max(eager.updates):.2g}); metrics within {metric_gap:.2g}"
          + (f" (retrieval logits of size {sizes['logits']:.3g}, {sizes['retrieved']:.0f} "
             "blocks retrieved)" if sizes else "") + "; first "
          f"call {xla.seconds:.1f} s compiled, {eager.seconds:.1f} s not"), not differences


def first_index_watch(model_dir: str, index_dir: str):
  """A daemon thread noting when ``ckpt-0`` (saved before the first step) and then the first
  index appear; returns ``{"ckpt0": t, "index": t}`` as it fills."""
  seen = {}

  def watch():
    for key, path in (("ckpt0", os.path.join(model_dir, "ckpt-0.index")),
                      ("index", os.path.join(index_dir, "LATEST"))):
      while not os.path.exists(path):
        time.sleep(0.2)
      seen[key] = time.time()
  threading.Thread(target=watch, daemon=True).start()
  return seen


def index_wait(seen) -> float:
  """Seconds between ``ckpt-0`` and the first index: how long the first training loop
  waited for the refresher."""
  return max(seen["index"] - seen["ckpt0"], 0.0) if "index" in seen else 0.0


def health(model_dir: str, loop: int, refresher=None, waited: float = 0.0):
  """The report of a finished run from its training summaries (loops of ``loop`` steps):
  its lines and the reasons it is unhealthy (none: healthy). ``refresher``: the refresher's
  ``(exit status, log path)``; ``waited``: the first loop's wait for the first index."""
  scalars = model_dir_lib.read_summaries(model_dir, "train")
  rates = [rate for _, rate in scalars.get("steps_per_second", [])]
  examples = [rate for _, rate in scalars.get("examples_per_second", [])]
  losses = scalars.get("training_loss", [])
  lines, problems = [], []
  if len(rates) > 1:
    steady = float(np.median([loop / r for r in rates[1:]]))
    first = loop / rates[0]
    lines.append(f"speed: {loop / steady:.2f} steps/s, {float(np.median(examples[1:])):.1f} "
                 f"examples/s (median of the {len(rates) - 1} loops of {loop} steps after the "
                 "first)")
    lines.append(f"compile: the first loop took {first:.1f} s against {steady:.1f} s for the "
                 "others" + (f", {waited:.1f} s of it waiting for the refresher's first index"
                             if waited else "")
                 + f": ~{max(first - steady - waited, 0.0):.1f} s of tracing and compiling")
  else:
    problems.append(f"{len(rates)} training loop(s) logged: raise --steps")
  if not losses or not np.isfinite([v for _, v in losses]).all():
    problems.append(f"training losses not all finite: {losses}")
  else:
    lines.append(f"loss: {losses[0][1]:.4g} at step {losses[0][0]} -> {losses[-1][1]:.4g} at "
                 f"step {losses[-1][0]}, finite at all {len(losses)} summaries")
  alarms = sorted(tag[len("alarm/"):] for tag, values in scalars.items()
                  if tag.startswith("alarm/") and values[-1][1] > 0)
  if "health_alarms" in scalars:   # REALM's retrieval health (realm_tf.health): reported
    lines.append("retrieval health alarms at the end (not judged here): "
                 + (", ".join(alarms) or "none"))
  if not model_dir_lib.training_done(model_dir):
    problems.append("no TRAINING_DONE")
  if refresher is not None:
    status, log = refresher
    with open(log) as f:
      builds = sum(line.startswith("[realm-refresh] published") for line in f)
    ages = scalars.get("index_age", [])
    lines.append(f"refresher: {builds} index(es) built, exit status {status}"
                 + (f"; index age {ages[-1][1]:.0f} steps at step {ages[-1][0]}" if ages else ""))
    if status != 0 or builds < 2:
      problems.append(f"refresher: exit status {status}, {builds} build(s) (log: {log})")
  return lines, problems


def main(argv):
  del argv
  # The smoke run's own defaults of the shared flags (one given on the command line wins).
  for name, value in (("output_dir", "accelerator_smoke_out"), ("world_scale", 0.25),
                      ("refresh_every", 25)):
    FLAGS.set_default(name, value)
  out = os.path.abspath(FLAGS.output_dir)
  os.makedirs(out, exist_ok=True)
  model_dir = os.path.join(out, f"run-{int(time.time())}")
  _say(f"preparing a world (scale {FLAGS.world_scale}) under {out}")
  data = prepare(out, FLAGS.seed, FLAGS.world_scale)
  params = experiment_params(data, os.path.join(model_dir, "aux"), FLAGS.experiment,
                             FLAGS.steps, FLAGS.refresh_every, retrieval=FLAGS.retrieval,
                             trainable_blocks=FLAGS.trainable_blocks,
                             params_override=FLAGS.params_override)
  os.makedirs(os.path.join(model_dir, "aux"), exist_ok=True)
  strategy = make_strategy(params, FLAGS.strategy, FLAGS.tpu)
  if FLAGS.experiment == "openqa_cpu":
    frozen_start(params, os.path.join(model_dir, "aux"), data, FLAGS.seed)
  refresher = None
  if FLAGS.experiment in RETRIEVING and (FLAGS.experiment != "openqa_cpu"
                                         or params.task.trainable_blocks):
    refresher = start_refresher(model_dir, params, os.path.join(model_dir, "aux"),
                                data["dirs"]["blocks"])
  task, checked = checked_task(params, model_dir, FLAGS.experiment)
  seen = first_index_watch(model_dir, params.task.index_dir) if refresher else {}
  _say(f"training {FLAGS.experiment} for {FLAGS.steps} steps in {model_dir}"
       + (" beside realm-refresh" if refresher else ""))
  start = time.time()
  try:
    train_lib.run_experiment(params, model_dir, mode="train", strategy=strategy, task=task)
    if refresher:
      refresher[0].wait(timeout=600)   # it exits after TRAINING_DONE
  finally:
    if refresher and refresher[0].poll() is None:
      refresher[0].kill()
  seconds = time.time() - start
  lines, problems = health(model_dir, FLAGS.refresh_every,
                           refresher and (refresher[0].returncode, refresher[1]),
                           index_wait(seen))
  replicas = strategy.num_replicas_in_sync
  _say(f"{FLAGS.experiment} on {type(strategy).__name__}, {replicas} replica(s) "
       f"({', '.join(strategy.extended.worker_devices)}): {FLAGS.steps} steps in {seconds:.0f} s")
  _say(f"inputs: {len(checked)} training input pipeline(s), every feature of fully static "
       f"shape and a TPU dtype (per-replica batch "
       f"{params.task.train_data.global_batch_size // replicas})")
  for line in lines:
    _say(line)
  peaks = device_memory(strategy)
  _say("device memory: " + (", ".join(f"{d} peak {b / 2**20:.0f} MiB" for d, b in peaks.items())
                            if peaks else "not reported by these devices"))
  if tpu_readiness.is_tpu(strategy):
    _say("XLA: every step of this run was one XLA program compiled by the TPU")
  else:
    try:
      line, same = xla_check(params, model_dir, strategy)
    except Exception as e:  # pylint: disable=broad-except
      line, same = f"FAILED: {type(e).__name__}: {str(e)[:2000]}", False
    _say(f"XLA check of the train step (one batch, tpu_readiness): {line}")
    if not same:
      problems.append("the XLA check of the train step failed")
  if problems:
    _say("UNHEALTHY: " + "; ".join(problems))
    sys.exit(1)
  _say("healthy")


def run():
  define_flags()
  cli.run_main(main)


if __name__ == "__main__":
  run()
