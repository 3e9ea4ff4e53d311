r"""Profile: where the CPU-seconds of the demo's REALM training step go (issue 43).

    python -m experiments.benchmarks.profile_realm_step --steps=20

On the demo's ``realm_pretrain_cpu`` config (batch 16, 16 candidates, 2-layer 64-wide towers,
query/block 32, reader 64) over ``bench_train_loop``'s world and index, with pre-built batches
(the host's retrieval timed on its own), each part runs as its own ``tf.function``:

* the whole train step (forward, backward, AdamW, metrics), float32 and uncompiled as the
  trainer runs it today; then the same step compiled with XLA and in bfloat16;
* forward only of the query tower (b queries), the block tower (b x k candidates) and the
  reader (b x k reader inputs with the MLM head); the same with their backward (gradient of
  the sum of the outputs);
* the optimizer's update alone (gradients precomputed);
* the host's candidate building for one batch (query-tower snapshot, search, gather, packing).

It prints seconds per call, the share of the step, the analytic matrix-multiply FLOPs of each
part (2 per multiply-add; backward = 2 x forward) and the achieved GFLOP/s, against the peak
given by ``--peak_gflops`` (the two cores' float32 FMA rate).
"""

import os
import shutil
import statistics
import tempfile
import time

from absl import flags
import numpy as np
import tensorflow as tf

from experiments.benchmarks import bench_bf16
from experiments.benchmarks import bench_train_loop
from realm_tf import train_lib
from realm_tf.binaries import cli
from realm_tf.modeling import models
from realm_tf.tasks import realm_pretrain

flags.DEFINE_float("peak_gflops", 0.0, "The machine's float32 peak in GFLOP/s (0: measured "
                   "with a 2048^2 matrix product on all cores).")
FLAGS = flags.FLAGS


def encoder_flops(enc, tokens, seq_len):
  """Forward FLOPs of a BERT encoder over ``tokens`` tokens in sequences of ``seq_len``."""
  h, i = enc.hidden_size, enc.intermediate_size
  per_token = 2 * (4 * h * h + 2 * h * i) + 2 * 2 * seq_len * h
  return enc.num_layers * per_token * tokens


def part_flops(params, batch, masks, vocab):
  m = params.task.model
  r, q = m.retriever, m.reader
  k, lq, lb, lr, d = (m.num_candidates, r.query_seq_length, r.block_seq_length, q.seq_length,
                      r.projection_size)
  h = r.encoder.hidden_size
  query = encoder_flops(r.encoder, batch * lq, lq) + batch * 2 * (h * h + h * d)
  blocks = encoder_flops(r.encoder, batch * k * lb, lb) + batch * k * 2 * (h * h + h * d)
  hr = q.encoder.hidden_size
  reader = (encoder_flops(q.encoder, batch * k * lr, lr) +
            batch * k * masks * 2 * (hr * hr + hr * vocab))
  return dict(query=query, blocks=blocks, reader=reader)


def timed(fn, args, steps):
  fetch = lambda out: [tf.convert_to_tensor(t).numpy() for t in tf.nest.flatten(out)
                       if t is not None]
  for _ in range(2):
    fetch(fn(*args))
  times = []
  for _ in range(steps):
    start = time.perf_counter()
    fetch(fn(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def peak_gflops(values):
  if values.peak_gflops:
    return values.peak_gflops
  a = tf.random.normal([2048, 2048])
  mm = tf.function(lambda x: tf.matmul(x, x))
  seconds = timed(mm, (a,), 10)
  return 2 * 2048 ** 3 / seconds / 1e9


def main(argv):
  del argv
  # This profile's defaults of bench_train_loop's flags (one given on the command line wins).
  FLAGS.set_default("steps", 20)
  FLAGS.set_default("world_scale", 1.0)
  work = FLAGS.work_dir or tempfile.mkdtemp(prefix="profile_realm_step_")
  prepared = bench_train_loop.prepare(work, FLAGS)
  n = prepared[1]   # the vocabulary's size
  base = bench_train_loop.task_overrides(*prepared) + ["task.model.num_candidates=16"]
  params = bench_bf16.params_for(base, "float32", False, True, FLAGS)
  batches = bench_bf16.feature_batches(params, 4)
  batch = batches[0]
  b = int(batch["query_word_ids"].shape[0])
  masks = int(batch["mlm_positions"].shape[1])
  steps = FLAGS.steps
  rows = []

  # The host's candidate building (input pipeline, before the step).
  task = realm_pretrain.RealmPretrainTask(params.task)
  builder = task.candidate_builder()
  examples = list(task.loader(params.task.train_data).load(None).take(4).as_numpy_iterator())
  builder.features(examples[0])
  start = time.perf_counter()
  for i in range(steps):
    builder.features(examples[i % len(examples)])
  host = (time.perf_counter() - start) / steps

  model = task.build_model()
  task.initialize(model)
  flops = part_flops(params, b, masks, n)
  # Each part: its forward (the features -> its output) and the variables it trains.
  parts = {
      "query tower": (lambda f: model.query_embedder(models.tower_inputs(f, "query"),
                                                     training=True),
                      model.query_embedder.trainable_variables, flops["query"]),
      "block tower (b x k)": (lambda f: model.block_embedder(
          models.tower_inputs(f, "candidate"), training=True),
                              model.block_embedder.trainable_variables, flops["blocks"]),
      "reader + MLM head (b x k)": (lambda f: models.read_candidates(model.reader, f,
                                                                     training=True),
                                    model.reader.trainable_variables, flops["reader"]),
  }
  for name, (forward, variables, fl) in parts.items():
    def forward_backward(f, forward=forward, variables=variables):
      with tf.GradientTape() as tape:
        out = tf.reduce_sum(forward(f))
      return [tf.convert_to_tensor(g) for g in tape.gradient(out, variables) if g is not None]
    rows.append((name + ", forward", timed(tf.function(forward), (batch,), steps), fl))
    rows.append((name + ", forward + backward",
                 timed(tf.function(forward_backward), (batch,), steps), 3 * fl))

  optimizer = task.create_optimizer(params.trainer.optimizer_config, params.runtime)
  grads = [tf.zeros_like(v) for v in model.trainable_variables]

  @tf.function
  def apply(g):
    optimizer.apply_gradients(zip(g, model.trainable_variables))
    return tf.constant(0.0)
  rows.append(("optimizer update (AdamW)", timed(apply, (grads,), steps), 0))

  total = 3 * sum(flops.values())
  step_rates = {}
  weights = bench_bf16.initial_weights(params)
  for label, dtype, xla in (("float32", "float32", False), ("float32, XLA", "float32", True),
                            ("bfloat16", "bfloat16", False), ("bfloat16, XLA", "bfloat16", True)):
    FLAGS.xla = xla
    rate, _, _ = bench_bf16.time_steps(bench_bf16.params_for(base, dtype, False, True, FLAGS),
                                       weights, batches, FLAGS)
    step_rates[label] = rate
  step = 1 / step_rates["float32"]
  peak = peak_gflops(FLAGS)
  print(f"\nREALM train step profile: batch {b}, k={params.task.model.num_candidates}, "
        f"{masks} masks, vocab {n}, {os.cpu_count()} CPUs, median of {steps} calls; "
        f"float32 peak {peak:.0f} GFLOP/s (measured: 2048^2 matmul)")
  print(f"{'part':44s} {'ms':>8s} {'% step':>7s} {'GFLOP':>7s} {'GFLOP/s':>8s} {'% peak':>7s}")
  print(f"{'host candidate building (1 batch)':44s} {host * 1e3:8.1f} {100 * host / step:7.1f}")
  for name, seconds, fl in rows:
    rate = fl / seconds / 1e9
    print(f"{name:44s} {seconds * 1e3:8.1f} {100 * seconds / step:7.1f} {fl / 1e9:7.2f} "
          f"{rate:8.1f} {100 * rate / peak:7.1f}")
  for label, rate in step_rates.items():
    print(f"{'whole train step, ' + label:44s} {1e3 / rate:8.1f} "
          f"{100 * step_rates['float32'] / rate:7.1f} {total / 1e9:7.2f} "
          f"{total * rate / 1e9:8.1f} {100 * total * rate / 1e9 / peak:7.1f}")
  if not FLAGS.work_dir:
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
  cli.run_main(main)
