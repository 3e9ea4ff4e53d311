r"""Benchmark: the memory of a ScaNN index's row ids after updates, at REALM's 13.3M blocks.

    nice -n 19 python -m experiments.benchmarks.bench_row_ids --num_blocks=13300000

An exact (brute-force) ScaNN searcher over ``--num_blocks`` random ``--dim``-d points (the ids
do not depend on the searcher's kind; exact scoring builds in seconds), wrapped in a
``ScannIndex``; then ``--fraction`` of the blocks appended and as many deleted, as
``realm-index upsert`` does. Prints the bytes of the row ids the index keeps (an int64 array),
the peak Python allocation while deleting (``tracemalloc``: the transient row -> point array),
and, for comparison, what ScaNN's Python wrapper kept for the same points (a list of ints and
a dict, which it saved as a pickle). One query is checked against NumPy's exact search over
the live rows, and the index is saved and loaded again (``scann/row_ids.npy``).
"""

import os
import tempfile
import time
import tracemalloc

from absl import app
from absl import flags
import numpy as np

from realm_tf.retrieval.index import scann_index
from realm_tf.retrieval.publication import index_io

flags.DEFINE_integer("num_blocks", 13_300_000, "Points in the searcher.")
flags.DEFINE_integer("dim", 4, "Their dimension (small: the ids are what is measured).")
flags.DEFINE_float("fraction", 0.01, "Fraction of the blocks appended, and deleted.")
FLAGS = flags.FLAGS

MB = 1 << 20


def _wrapper_bytes(num_points: int) -> int:
  """Bytes of the docids list and dict ScaNN's ``ScannSearcher`` keeps for these points."""
  tracemalloc.start()
  docids = list(range(num_points))
  docid_to_id = {docid: i for i, docid in enumerate(docids)}
  size, _ = tracemalloc.get_traced_memory()
  tracemalloc.stop()
  del docids, docid_to_id
  return size


def main(unused_argv):
  n, dim, m = FLAGS.num_blocks, FLAGS.dim, int(FLAGS.fraction * FLAGS.num_blocks)
  rng = np.random.default_rng(0)
  table = rng.standard_normal((n, dim), dtype=np.float32)
  scann_ops_pybind, _ = scann_index._scann()  # pylint: disable=protected-access
  start = time.time()
  searcher = scann_ops_pybind.builder(table, 10, "dot_product").score_brute_force().build()
  index = scann_index.ScannIndex(
      searcher.searcher, n, dim, {"mode": "brute_force", "updates": {
          "appended": 0, "deleted": 0, "points": n, "imbalance": 0.0}}, embeddings=table)
  print(f"built an exact searcher over {n:,} x {dim} in {time.time() - start:.1f} s")
  new = rng.standard_normal((m, dim), dtype=np.float32)
  start = time.time()
  index.append(new)
  appended = time.time() - start
  tracemalloc.start()
  start = time.time()
  index.delete(rng.choice(n + m, m, replace=False))
  deleted = time.time() - start
  _, peak = tracemalloc.get_traced_memory()
  tracemalloc.stop()
  ids = index._row_of  # pylint: disable=protected-access
  full = np.concatenate([table, new])
  query = rng.standard_normal((1, dim), dtype=np.float32)
  live = np.setdiff1d(np.arange(n + m), index.deleted)
  want = live[np.argsort(-(full[live] @ query[0]), kind="stable")[:10]]
  got = index.search(query, 10)[0][0]
  with tempfile.TemporaryDirectory() as tmp:
    index.save(tmp)
    reloaded = index_io.load_index(tmp)
    same = np.array_equal(reloaded.search(query, 10)[0][0], got)
    on_disk = os.path.getsize(os.path.join(tmp, scann_index.SCANN_DIR,
                                           scann_index.ROW_IDS_NAME))
  points = len(ids)
  wrapper = _wrapper_bytes(points)
  print(f"after appending {m:,} and deleting {m:,} (append {appended:.1f} s, delete "
        f"{deleted:.1f} s): {points:,} points")
  print(f"row ids kept: {ids.dtype} array, {ids.nbytes / MB:.1f} MiB "
        f"({ids.nbytes / points:.2f} bytes/point); row_ids.npy {on_disk / MB:.1f} MiB")
  print(f"peak Python allocation while deleting: {peak / MB:.1f} MiB (transient)")
  print(f"ScaNN's wrapper for the same points (list + dict of ints): {wrapper / MB:.1f} MiB "
        f"({wrapper / points:.1f} bytes/point)")
  print(f"exact top-10 of a query equals NumPy's: {np.array_equal(got, want)}; "
        f"the same after save and load: {same}")


if __name__ == "__main__":
  app.run(main)
