r"""Benchmark: the index's BM25 part (``retrieval/sparse/sparse_index.py``) at scale: build
time, peak memory, bytes per block on disk and in memory once loaded, and query latency.

    nice python -m experiments.benchmarks.bench_sparse_index                    # 10^4, 10^5
    nice python -m experiments.benchmarks.bench_sparse_index --num_blocks=1e6   # ~10 min

Data: ``--num_blocks`` synthetic blocks of ``--words_per_block`` words (a 288-wordpiece block
of English holds ~200 words) drawn from a Zipfian vocabulary of ``--vocab_size`` word types
(exponent 1, as word frequencies in English text), generated 1,000 blocks at a time from a
seeded generator, as ``SparseIndex.build`` reads a ``BlockStore``: the corpus's text is never
held whole. Queries: ``--num_queries`` of 8 words from the same distribution.

Each size is built in a process of its own (so peak memory is that size's), then loaded and
queried in another (so nothing of the build stays resident); they report:

* ``build s`` and ``build GiB``: ``SparseIndex.build`` over the stream, and the process's peak
  resident memory (VmHWM) less its resident memory before the build (the interpreter and its
  imports);
* ``disk B/block``: the saved index (``save``) over the number of blocks;
* ``loaded B/block``: anonymous resident memory (RssAnon) of ``load`` in the second process,
  after the queries, less that before loading, over the number of blocks. Postings are
  memory-mapped (page cache, shared and evictable), so this is the vocabulary and the
  per-block arrays;
* ``text B/block``: the blocks' text in UTF-8, for scale;
* ``p50 ms``, ``p95 ms``: one query's ``search(k=20)`` on the loaded index (postings read
  through the map, after one warm-up pass over the queries).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from absl import flags
import numpy as np

from realm_tf.binaries import cli

flags.DEFINE_list("num_blocks", ["1e4", "1e5"], "Corpus sizes, one process each.")
flags.DEFINE_integer("words_per_block", 200, "Words per block.")
flags.DEFINE_integer("vocab_size", 200_000, "Word types of the Zipfian vocabulary.")
flags.DEFINE_integer("num_queries", 100, "Timed queries.")
flags.DEFINE_integer("seed", 0, "Seed of the text.")
flags.DEFINE_string("child", "", "Internal: 'build' or 'load' one size, print its JSON.")
flags.DEFINE_string("blocks", "", "Internal: the child's size.")
flags.DEFINE_string("path", "", "Internal: the child's index directory.")

FLAGS = flags.FLAGS
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _status(field: str) -> int:
  """A ``/proc/self/status`` memory field, in bytes."""
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith(field + ":"):
        return int(line.split()[1]) * 1024
  raise KeyError(field)


def _texts(n: int, words_per_block: int, vocab_size: int, seed: int, chunk: int = 1000):
  """``n`` blocks' text, generated ``chunk`` blocks at a time; yields each text."""
  rng = np.random.default_rng(seed)
  p = 1.0 / np.arange(1, vocab_size + 1)
  cdf = np.cumsum(p / p.sum())
  for start in range(0, n, chunk):
    m = min(chunk, n - start)
    ids = np.minimum(np.searchsorted(cdf, rng.random((m, words_per_block))), vocab_size - 1)
    for row in ids:
      yield " ".join(f"w{i}" for i in row)


def build_one(n: int, path: str, values) -> dict:
  """Builds and saves the index of ``n`` blocks in ``path``: its build figures."""
  from realm_tf.retrieval.sparse import sparse_index  # pylint: disable=g-import-not-at-top
  text_bytes = [0]

  def counted():
    for text in _texts(n, values.words_per_block, values.vocab_size, values.seed):
      text_bytes[0] += len(text.encode())
      yield text

  before = _status("VmRSS")
  started = time.perf_counter()
  index = sparse_index.SparseIndex.build(counted())
  build_seconds = time.perf_counter() - started
  peak = _status("VmHWM") - before
  index.save(path)
  disk = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
  return dict(blocks=n, build_seconds=build_seconds, build_gib=peak / 2**30,
              disk_per_block=disk / n, text_per_block=text_bytes[0] / n,
              postings_per_block=sum(len(s.rows) for s in index.segments) / n)


def load_one(n: int, path: str, values) -> dict:
  """Loads the saved index (a fresh process: no memory of the build) and times queries."""
  from realm_tf.retrieval.sparse import sparse_index  # pylint: disable=g-import-not-at-top
  queries = list(_texts(values.num_queries, 8, values.vocab_size, values.seed + 1))
  anon = _status("RssAnon")
  loaded = sparse_index.SparseIndex.load(path)
  loaded.search(queries, 20)  # Warm-up: the postings the queries touch are read once.
  times = []
  for q in queries:
    t = time.perf_counter()
    loaded.search([q], 20)
    times.append(time.perf_counter() - t)
  ms = np.asarray(times) * 1000
  return dict(loaded_per_block=(_status("RssAnon") - anon) / n, vocab=len(loaded.vocab),
              p50_ms=float(np.percentile(ms, 50)), p95_ms=float(np.percentile(ms, 95)))


def _child(step: str, n: str, path: str, values) -> dict:
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.benchmarks.bench_sparse_index", f"--child={step}",
       f"--blocks={n}", f"--path={path}", f"--words_per_block={values.words_per_block}",
       f"--vocab_size={values.vocab_size}", f"--num_queries={values.num_queries}",
       f"--seed={values.seed}"],
      cwd=REPO, capture_output=True, text=True, check=False,
      env=dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3"))
  lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
  if proc.returncode or not lines:
    raise RuntimeError(f"{step} of {n} blocks failed:\n{proc.stderr[-3000:]}")
  return json.loads(lines[-1][len("RESULT "):])


def main(argv):
  del argv
  if FLAGS.child:
    run = {"build": build_one, "load": load_one}[FLAGS.child]
    print("RESULT " + json.dumps(run(int(float(FLAGS.blocks)), FLAGS.path)), flush=True)
    return
  rows = []
  for n in FLAGS.num_blocks:
    root = tempfile.mkdtemp(prefix="bench_sparse_")
    try:
      path = os.path.join(root, "sparse")
      rows.append(dict(_child("build", n, path, FLAGS), **_child("load", n, path, FLAGS)))
      print(f"{n}: {rows[-1]}", flush=True)
    finally:
      shutil.rmtree(root, ignore_errors=True)
  print(f"\nBM25 part (sparse_index.SparseIndex), {FLAGS.words_per_block} Zipfian words per "
        f"block from {FLAGS.vocab_size} types; queries of 8 words, search k=20")
  print("| blocks | postings/block | build s | build GiB | disk B/block | loaded B/block | "
        "text B/block | p50 ms | p95 ms |")
  print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
  for r in rows:
    print(f"| {r['blocks']:,} | {r['postings_per_block']:.0f} | {r['build_seconds']:.0f} | "
          f"{r['build_gib']:.2f} | {r['disk_per_block']:.0f} | {r['loaded_per_block']:.0f} | "
          f"{r['text_per_block']:.0f} | {r['p50_ms']:.1f} | {r['p95_ms']:.1f} |")


if __name__ == "__main__":
  cli.run_main(main)
