r"""Benchmark: realm-serve's answer latency for each retriever (dense, BM25, hybrid) over the same
model and corpus, in one run, with one client and with eight.

    nice -n 10 python -m experiments.benchmarks.bench_serve_retrievers \
        --num_blocks=10000 --requests=200 --max_seconds=60

``bench_serve_load``'s world (``--num_blocks`` random-word blocks, an untrained Open-QA model of
the demo's size, an exact index of its block tower, which carries its BM25 part) served by one
``realm-serve`` process on 127.0.0.1 (``--max_in_flight``, ``--max_batch`` 8, 5 blocks read).
For each concurrency, the retrievers take turns in rounds of ``--round`` requests until each
has sent ``--requests`` or ``--max_seconds`` passed for it, so that a drift of the machine
falls on all three alike. Each request is ``POST /answer`` with a random question, top_k 3.

Prints, per concurrency and retriever: requests answered, p50 and p95 latency, answered per
second, and the ratio of each percentile to dense's at the same concurrency (the hybrid's is
the issue's number). Every request must be answered (200); any other status fails the run.
"""

import os
import shutil
import tempfile

from absl import flags
import numpy as np

from experiments.benchmarks import bench_serve_load as load
from realm_tf.binaries import cli

# bench_serve_load's flags (--num_blocks, --concurrency, --requests: per retriever and
# concurrency, --max_seconds: of one retriever at one concurrency), with defaults of this run
# (main sets them; one given on the command line wins).
flags.DEFINE_list("retrievers", ["dense", "bm25", "hybrid"], "Retrievers compared.")
flags.DEFINE_integer("round", 40, "Requests of one retriever before the next takes its turn.")

FLAGS = flags.FLAGS
DEFAULTS = (("num_blocks", 10000), ("concurrency", ["1", "8"]), ("requests", 200),
            ("max_seconds", 60.0))


def main(argv):
  del argv
  for name, value in DEFAULTS:
    FLAGS.set_default(name, value)
  root = tempfile.mkdtemp(prefix="bench_serve_retrievers_")
  try:
    model, index, _, questions = load.make_world(root, FLAGS.num_blocks)
    with load.serving(model, index, os.path.join(root, "serve.log"),
                      [f"--max_in_flight={FLAGS.max_in_flight}", "--max_batch=8"]) as (port, _):
      for retriever in FLAGS.retrievers:  # Warm-up: traced functions, each retriever's path.
        load.load_run(port, 2, 20, 60, questions, retriever)
      rows = {}
      for threads in [int(c) for c in FLAGS.concurrency]:
        latencies = {r: [] for r in FLAGS.retrievers}
        seconds = {r: 0.0 for r in FLAGS.retrievers}
        rounds = 0
        while any(len(latencies[r]) < FLAGS.requests and seconds[r] < FLAGS.max_seconds
                  for r in FLAGS.retrievers):
          for r in FLAGS.retrievers:
            if len(latencies[r]) >= FLAGS.requests or seconds[r] >= FLAGS.max_seconds:
              continue
            statuses, took, elapsed = load.load_run(
                port, threads, min(FLAGS.round, FLAGS.requests - len(latencies[r])),
                FLAGS.max_seconds - seconds[r], questions, r, seed=1000 * rounds)
            if set(statuses) - {200}:
              raise RuntimeError(f"{r} at concurrency {threads}: statuses {sorted(set(statuses))}")
            latencies[r] += took
            seconds[r] += elapsed
          rounds += 1  # Each round's clients draw new questions, the same for each retriever.
        for r in FLAGS.retrievers:
          ms = np.asarray(latencies[r]) * 1000
          rows[threads, r] = (len(ms), np.percentile(ms, 50), np.percentile(ms, 95),
                              len(ms) / seconds[r])
        print(f"concurrency {threads}: done", flush=True)
    print(f"\nrealm-serve, {FLAGS.num_blocks} random-word blocks, --max_batch=8, 5 blocks read, "
          "top_k 3; a random question each request; retrievers in alternating rounds of "
          f"{FLAGS.round}")
    print("| clients | retriever | answered | p50 ms | p95 ms | answered/s | p50 / dense | "
          "p95 / dense |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for (threads, r), (n, p50, p95, rate) in rows.items():
      base = rows.get((threads, "dense"))
      ratio = (f"{p50 / base[1]:.2f} | {p95 / base[2]:.2f}" if base else "- | -")
      print(f"| {threads} | {r} | {n} | {p50:.1f} | {p95:.1f} | {rate:.1f} | {ratio} |")
  finally:
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
  cli.run_main(main)
