r"""Benchmark: the REALM training step in float32 vs ``runtime.mixed_precision_dtype=bfloat16``.

    python -m experiments.benchmarks.bench_bf16 --steps=20 --repeats=2

The step is ``RealmPretrainTask.train_step`` (forward, backward, AdamW) of ``realm_pretrain_cpu``
with the demo's YAML (batch 16, 8 candidates, query/block 32, reader 64), on the synthetic world
and the published, never-refreshed index that ``bench_train_loop`` prepares (its ``prepare``,
reused; the batches are retrieved once, with the index's ICT query tower), and, with ``--wide``, the same step with wider towers and reader (``--wide_hidden``,
``--wide_layers``, at ``--wide_batch`` examples a step: tiny models hide what bfloat16 gains in
the matrix products). Per model,
float32 and bfloat16 share the initial weights and the same pre-built batches of features (the
host's retrieval is not timed: the step alone), and run one after the other in the same process
(f32, bf16, f32, bf16, ...), each under ``train_lib.precision_policy`` as ``run_experiment``
applies it. Each run traces and warms up for ``--warmup`` steps, then times ``--steps`` steps
(``--xla``: the step compiled with ``jit_compile=True``, as on a TPU). Prints each run's steps/s
and the ratio bfloat16 / float32 of the medians.

Last, the host's query-tower snapshot (``CandidateBuilder`` builds it while the trainer's global
policy is set, so with ``bfloat16`` it computes in bfloat16 on the host CPU): forward queries/s
in float32 vs bfloat16 (the wider shape with ``--wide``).

``--onednn_check`` (on by default) first reports the CPU's bfloat16 flags (``/proc/cpuinfo``:
``avx512_bf16``, ``amx_bf16``) and which oneDNN kernels TensorFlow picks for a float32 and a
bfloat16 Dense layer, from ``ONEDNN_VERBOSE=1`` in a subprocess.
"""

import os
import re
import statistics
import subprocess
import sys
import shutil
import tempfile
import time

from absl import flags
import numpy as np
import tensorflow as tf

from experiments.benchmarks import bench_train_loop
from realm_tf import configs
from realm_tf import hardware
from realm_tf import modeling
from realm_tf import train_lib
from realm_tf.binaries import cli
from realm_tf.tasks import realm_pretrain

flags.DEFINE_integer("warmup", 3, "Untimed steps per run (the first traces).")
flags.DEFINE_bool("wide", True, "Also time a wider model.")
flags.DEFINE_integer("wide_hidden", 256, "Hidden size of the wider towers and reader.")
flags.DEFINE_integer("wide_layers", 4, "Layers of the wider towers and reader.")
flags.DEFINE_integer("wide_batch", 4, "Examples per step of the wider model (the first of "
                     "each batch; its float32 step takes seconds here).")
flags.DEFINE_bool("xla", False, "Compile the step with jit_compile=True.")
flags.DEFINE_bool("onednn_check", True, "Report CPU flags and oneDNN's kernels first.")
flags.DEFINE_integer("num_batches", 4, "Distinct batches of features, cycled.")
FLAGS = flags.FLAGS

_PROBE = r"""
import tensorflow as tf, tf_keras
for policy in ("float32", "mixed_bfloat16"):
  tf_keras.mixed_precision.set_global_policy(policy)
  layer = tf_keras.layers.Dense(256)
  x = tf.random.normal([64, 256])
  dtype = tf.bfloat16 if "bfloat16" in policy else tf.float32
  q = tf.cast(tf.random.normal([2, 16, 4, 32]), dtype)   # attention scores, as BERT's einsum
  print("PROBE", policy, flush=True)
  for _ in range(3):
    y = layer(x)
    s = tf.einsum("aecd,abcd->acbe", q, q)
  print("PROBE_DONE", policy, y.dtype.name, s.dtype.name, flush=True)
"""


def onednn_report() -> str:
  """CPU bfloat16 flags and the oneDNN matmul kernels TF runs per policy."""
  cpu_flags = hardware.cpu_flags()
  wanted = ["avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "amx_int8"]
  lines = ["CPU flags: " + ", ".join(f"{f}={'yes' if f in cpu_flags else 'no'}" for f in wanted)]
  env = dict(os.environ, ONEDNN_VERBOSE="1", TF_CPP_MIN_LOG_LEVEL="2")
  proc = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True,
                        timeout=300, check=False)
  policy, kernels = None, {}
  for line in proc.stdout.splitlines():
    if line.startswith("PROBE_DONE"):
      _, name, dense, scores = line.split()
      lines.append(f"  {name}: Dense output {dense}, attention einsum {scores}")
      policy = None
    elif line.startswith("PROBE"):
      policy = line.split()[1]
    elif policy and line.startswith("onednn_verbose") and ",exec," in line:
      fields = line.split(",")
      # onednn_verbose,[timestamp,]exec,cpu,<primitive>,<implementation>,<prop>,<memory descs>
      i = fields.index("exec")
      kernel = ":".join(f for f in fields[i + 2:i + 4] if f)
      dtypes = sorted(set(re.findall(r"(?:src|wei|dst)[_:](bf16|f32)", line)))
      kernels.setdefault(policy, set()).add(f"{kernel} ({'/'.join(dtypes)})")
  for name, found in kernels.items():
    lines.append(f"  oneDNN kernels under {name}: " + "; ".join(sorted(found)))
  if not kernels:
    lines.append("  oneDNN printed no exec lines (oneDNN off? TF_ENABLE_ONEDNN_OPTS="
                 f"{os.environ.get('TF_ENABLE_ONEDNN_OPTS', 'unset')}); stderr tail: "
                 f"{proc.stderr[-500:]!r}")
  return "\n".join(lines)


def params_for(base_overrides, dtype, wide: bool, with_init: bool, values):
  overrides = list(base_overrides) + [f"runtime.mixed_precision_dtype={dtype}"]
  if wide:
    h, layers = values.wide_hidden, values.wide_layers
    for tower in ("retriever", "reader"):
      overrides += [f"task.model.{tower}.encoder.hidden_size={h}",
                    f"task.model.{tower}.encoder.num_layers={layers}",
                    f"task.model.{tower}.encoder.num_attention_heads={max(1, h // 64)}",
                    f"task.model.{tower}.encoder.intermediate_size={4 * h}"]
  if not with_init:
    overrides.append("task.retriever_init_checkpoint=")
  return configs.load_experiment("realm_pretrain_cpu", [bench_train_loop.CONFIG],
                                 ",".join(overrides))


def feature_batches(params, count):
  """``count`` batches of device features, retrieved once through the published index."""
  task = realm_pretrain.RealmPretrainTask(params.task)
  builder = task.candidate_builder()
  examples = task.loader(params.task.train_data).load(None)
  batches = []
  for batch in examples.take(count).as_numpy_iterator():
    features = builder.features(batch)
    batches.append({k: tf.constant(features[k]) for k in realm_pretrain.DEVICE_FEATURES})
  return batches


def initial_weights(params):
  with train_lib.precision_policy("float32"):
    task = realm_pretrain.RealmPretrainTask(params.task)
    model = task.build_model()
    task.initialize(model)
    return model.get_weights()


def time_steps(params, weights, batches, values) -> tuple:
  """Steps/s of ``steps`` train steps after ``warmup`` under the params' precision policy,
  the last loss, and the reader's compute dtype."""
  with train_lib.precision_policy(params.runtime.mixed_precision_dtype):
    task = realm_pretrain.RealmPretrainTask(params.task)
    model = task.build_model()
    model.set_weights(weights)
    optimizer = task.create_optimizer(params.trainer.optimizer_config, params.runtime)
    metrics = task.build_metrics(training=True)
    step = tf.function(lambda x: task.train_step(x, model, optimizer, metrics)["loss"],
                       jit_compile=values.xla)
    for i in range(values.warmup):
      step(batches[i % len(batches)]).numpy()
    start = time.perf_counter()
    for i in range(values.steps):
      loss = step(batches[i % len(batches)])
    loss = float(loss.numpy())
    elapsed = time.perf_counter() - start
    compute = model.reader.encoder.compute_dtype
  return values.steps / elapsed, loss, compute


def bench_model(name, base_overrides, wide, with_init, batches, values):
  f32 = params_for(base_overrides, "float32", wide, with_init, values)
  bf16 = params_for(base_overrides, "bfloat16", wide, with_init, values)
  weights = initial_weights(f32)
  enc = f32.task.model.reader.encoder
  rates = {"float32": [], "bfloat16": []}
  for r in range(values.repeats):
    for dtype, params in (("float32", f32), ("bfloat16", bf16)):
      rate, loss, compute = time_steps(params, weights, batches, values)
      rates[dtype].append(rate)
      print(f"{name} run {r}: {dtype:8s} {rate:.3f} steps/s (computes in {compute}; loss "
            f"after {values.warmup + values.steps} steps {loss:.4f})", flush=True)
  f, b = statistics.median(rates["float32"]), statistics.median(rates["bfloat16"])
  shape = (f"{enc.num_layers} layers x {enc.hidden_size}, batch "
           f"{int(batches[0]['query_word_ids'].shape[0])}, k={f32.task.model.num_candidates}, "
           f"Lq/Lb/Lr={f32.task.model.retriever.query_seq_length}/"
           f"{f32.task.model.retriever.block_seq_length}/{f32.task.model.reader.seq_length}")
  return (f"{name} ({shape}): float32 median {f:.3f} steps/s {np.round(rates['float32'], 3).tolist()}, "
          f"bfloat16 median {b:.3f} steps/s {np.round(rates['bfloat16'], 3).tolist()}; "
          f"ratio bf16 / f32: {b / f:.3f}")


def bench_query_tower(params, batches, values):
  """The host's query-tower snapshot (``CandidateBuilder`` builds it while the trainer's
  global policy is set, so under ``bfloat16`` it computes in bfloat16 on the host CPU):
  forward queries/s per policy, interleaved, with the params' encoder shape."""
  inputs = [{"input_word_ids": b["query_word_ids"], "input_mask": b["query_mask"],
             "input_type_ids": b["query_type_ids"]} for b in batches]
  rates = {"float32": [], "bfloat16": []}
  weights = None
  for _ in range(values.repeats):
    for dtype in rates:
      with train_lib.precision_policy(dtype):
        tower = modeling.build_embedder(params.task.model.retriever, "snapshot_embedder")
        if weights is None:
          weights = tower.get_weights()
        tower.set_weights(weights)
        embed = tf.function(lambda x, tower=tower: tf.cast(tower(x, training=False),
                                                             tf.float32))
        for x in inputs:
          embed(x).numpy()
        start = time.perf_counter()
        count = 0
        for _ in range(max(1, values.steps // len(inputs))):
          for x in inputs:
            embed(x).numpy()
            count += int(x["input_word_ids"].shape[0])
        rates[dtype].append(count / (time.perf_counter() - start))
  f, b = statistics.median(rates["float32"]), statistics.median(rates["bfloat16"])
  enc = params.task.model.retriever.encoder
  return (f"host query tower ({enc.num_layers} layers x {enc.hidden_size}, Lq="
          f"{params.task.model.retriever.query_seq_length}, forward only): float32 median "
          f"{f:.0f} queries/s {np.round(rates['float32'], 0).tolist()}, bfloat16 median "
          f"{b:.0f} queries/s {np.round(rates['bfloat16'], 0).tolist()}; ratio bf16 / f32: "
          f"{b / f:.3f}")


def main(argv):
  del argv
  FLAGS.set_default("steps", 20)   # bench_train_loop's --steps, this benchmark's default
  if FLAGS.onednn_check:
    print(onednn_report(), flush=True)
  work = FLAGS.work_dir or tempfile.mkdtemp(prefix="bench_bf16_")
  base = bench_train_loop.task_overrides(*bench_train_loop.prepare(work, FLAGS))
  # Token ids only: the same batches feed the wider model (its towers start at random; the
  # index's query-tower snapshot, which retrieves them, is the narrow ICT one).
  batches = feature_batches(params_for(base, "float32", False, True, FLAGS),
                            FLAGS.num_batches)
  summaries = [bench_model("realm_pretrain_cpu", base, False, True, batches, FLAGS)]
  if FLAGS.wide:
    wide_batches = [{k: v[:FLAGS.wide_batch] for k, v in b.items()} for b in batches]
    summaries.append(bench_model(f"wide {FLAGS.wide_layers}x{FLAGS.wide_hidden}", base,
                                 True, False, wide_batches, FLAGS))
  summaries.append(bench_query_tower(params_for(base, "float32", FLAGS.wide, False, FLAGS),
                                     batches, FLAGS))
  print(f"\nREALM train step (forward + backward + AdamW, host retrieval not timed), "
        f"{FLAGS.steps} timed steps after {FLAGS.warmup} per run, {FLAGS.repeats} runs per "
        f"dtype, interleaved, xla={FLAGS.xla}, {os.cpu_count()} CPUs"
        f"{'' if os.path.exists('/tmp/cpu_free_C') else ' (measured under load)'}")
  for line in summaries:
    print(line)
  if not FLAGS.work_dir:
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
  cli.run_main(main)
