r"""Benchmark: REALM training steps/s of the orbit loop against the earlier hand-written loop.

    python -m experiments.benchmarks.bench_train_loop --steps=100 --repeats=2

Both loops train the same ``realm_pretrain_cpu`` config (the demo's YAML: batch 16, 8
candidates, reader input 64) from the same initial weights on the same synthetic world,
retrieving through the same published, never-refreshed index, in the same process, one after
the other (old, new, old, new, ...). The earlier loop (kept here as the baseline) ran each step
as its own ``tf.function`` call and copied every metric to the host after every step; the
orbit loop runs ``steps_per_loop`` steps per call and reads the metrics once per loop.

Timing excludes each run's first loop (tracing): old loop, steps after the first
``steps_per_loop``; orbit loop, its ``steps_per_second`` summaries after the first.
Prints each run's steps/s and the ratio new / old of the medians.
"""

import os
import shutil
import statistics
import tempfile
import time

from absl import flags
import tensorflow as tf

from data_prep import pipeline
from data_prep import synthetic_world
from realm_tf import configs
from realm_tf import train_lib
from realm_tf import tasks  # noqa: F401  pylint: disable=unused-import
from realm_tf.binaries import cli
from realm_tf.retrieval.publication import refresher
from realm_tf.tokenization import load_vocab

flags.DEFINE_integer("steps", 100, "Training steps per run.")
flags.DEFINE_integer("steps_per_loop", 25, "Orbit's steps_per_loop (the old loop: 1).")
flags.DEFINE_integer("repeats", 2, "Runs of each loop, interleaved.")
flags.DEFINE_float("world_scale", 0.3, "Size of the synthetic world.")
flags.DEFINE_string("work_dir", None, "Scratch directory (default: a temporary one).")
FLAGS = flags.FLAGS

CONFIG = os.path.join(os.path.dirname(__file__), "..", "configs", "realm_pretrain_cpu__demo.yaml")


def prepare(work, values):
  """World -> data -> a one-step ICT model dir -> its index (the retriever's start)."""
  s = values.world_scale
  world = synthetic_world.generate_world(
      seed=0, num_regions=round(6 * s), num_cities=round(30 * s), num_people=round(100 * s),
      num_organizations=round(24 * s), num_works=round(50 * s))
  files = synthetic_world.write_world(world, os.path.join(work, "world"), vocab_size=3000,
                                      whole_word_names=True)
  dirs = pipeline.prepare_all(files["articles"], files["vocab"], os.path.join(work, "data"),
                              patterns_file=files["patterns"], block_seq_length=32,
                              query_seq_length=32, eval_fraction=0.2)["dirs"]
  vocab, n = files["vocab"], len(load_vocab(files["vocab"]))
  ict = configs.load_experiment("ict_cpu", params_override=",".join([
      f"task.vocab_file={vocab}", f"task.model.encoder.vocab_size={n}",
      "task.model.query_seq_length=32", "task.model.block_seq_length=32",
      f"task.train_data.input_path={os.path.join(dirs['ict'], 'train-*')}",
      "task.train_data.global_batch_size=16", "trainer.train_steps=1",
      "trainer.steps_per_loop=1", "trainer.summary_interval=1"]))
  ict_dir = os.path.join(work, "ict")
  train_lib.run_experiment(ict, ict_dir)
  index_dir = os.path.join(work, "index")
  refresher.build_index_for_checkpoint(None, ict_dir, dirs["blocks"], index_dir,
                                       refresher.BuildOptions(index_type="brute_force",
                                                              progress=False))
  return vocab, n, dirs, ict_dir, index_dir


def task_overrides(vocab, n, dirs, ict_dir, index_dir):
  """The REALM task over ``prepare``'s outputs: its world, the never-refreshed index and the
  ICT towers (the benchmarks' shared overrides)."""
  return [f"task.model.vocab_file={vocab}", f"task.model.retriever.encoder.vocab_size={n}",
          f"task.model.reader.encoder.vocab_size={n}",
          f"task.train_data.input_path={os.path.join(dirs['pretrain'], 'train-*')}",
          f"task.train_data.blocks_dir={dirs['blocks']}", f"task.index_dir={index_dir}",
          "task.refresh_index=false", f"task.retriever_init_checkpoint={ict_dir}"]


def realm_params(vocab, n, dirs, ict_dir, index_dir, steps_per_loop, values):
  every = steps_per_loop
  return configs.load_experiment("realm_pretrain_cpu", [CONFIG], ",".join(
      task_overrides(vocab, n, dirs, ict_dir, index_dir) + [
          f"trainer.train_steps={values.steps}", f"trainer.steps_per_loop={every}",
          f"trainer.summary_interval={every}", f"trainer.checkpoint_interval={values.steps}",
          f"trainer.validation_interval={values.steps}"]))


def old_loop(params, values) -> float:
  """The earlier loop's pattern: one tf.function call and a host copy of every metric per
  step. Returns steps/s after the first ``steps_per_loop`` steps."""
  strategy = train_lib.get_strategy(params)
  task = tasks.realm_pretrain.RealmPretrainTask(params.task)
  with strategy.scope():
    model = task.build_model()
    optimizer = task.create_optimizer(params.trainer.optimizer_config, params.runtime)
    metrics = task.build_metrics(training=True)
  task.initialize(model)
  dataset = strategy.distribute_datasets_from_function(
      lambda ctx: task.build_inputs(params.task.train_data, ctx))
  iterator = iter(dataset)

  @tf.function
  def step(inputs):
    logs = strategy.run(lambda x: task.train_step(x, model, optimizer, metrics), args=(inputs,))
    return strategy.reduce("SUM", logs["loss"], axis=None)

  warm = values.steps_per_loop
  start = None
  for i in range(values.steps):
    if i == warm:
      start = time.time()
    loss = float(step(next(iterator)))
    _ = [float(m.result()) for m in metrics] + [loss]   # every metric, every step
  return (values.steps - warm) / (time.time() - start)


def orbit_loop(params, model_dir) -> float:
  """``train_lib.run_experiment``; steps/s from its summaries after the first loop."""
  train_lib.run_experiment(params, model_dir)
  rates = {}
  for path in tf.io.gfile.glob(os.path.join(model_dir, "train", "events.out.tfevents.*")):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.tag == "steps_per_second":
          rates[event.step] = float(tf.make_ndarray(value.tensor))
  later = [rate for step, rate in sorted(rates.items())[1:]]
  # Mean time per step over the later loops -> steps/s.
  return len(later) / sum(1.0 / r for r in later)


def main(argv):
  del argv
  work = FLAGS.work_dir or tempfile.mkdtemp(prefix="bench_train_loop_")
  vocab, n, dirs, ict_dir, index_dir = prepare(work, FLAGS)
  old_rates, new_rates = [], []
  for r in range(FLAGS.repeats):
    old_rates.append(old_loop(realm_params(vocab, n, dirs, ict_dir, index_dir, 1, FLAGS), FLAGS))
    print(f"run {r}: old loop   {old_rates[-1]:.2f} steps/s", flush=True)
    model_dir = os.path.join(work, f"orbit_{r}")
    shutil.rmtree(model_dir, ignore_errors=True)
    new_rates.append(orbit_loop(realm_params(vocab, n, dirs, ict_dir, index_dir,
                                             FLAGS.steps_per_loop, FLAGS), model_dir))
    print(f"run {r}: orbit loop {new_rates[-1]:.2f} steps/s", flush=True)
  old, new = statistics.median(old_rates), statistics.median(new_rates)
  print(f"\nREALM training, realm_pretrain_cpu + demo YAML, {FLAGS.steps} steps per run, "
        f"{FLAGS.repeats} runs each, interleaved")
  print(f"old loop (sync every step):     median {old:.2f} steps/s  {old_rates}")
  print(f"orbit loop (steps_per_loop={FLAGS.steps_per_loop}): median {new:.2f} steps/s  "
        f"{new_rates}")
  print(f"ratio new / old: {new / old:.3f}")
  if not FLAGS.work_dir:
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
  cli.run_main(main)
