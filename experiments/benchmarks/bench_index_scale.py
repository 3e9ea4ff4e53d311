r"""Benchmark: the project's ScaNN index at scale against raw ScaNN and exact search.

    python -m experiments.benchmarks.bench_index_scale                     # 10^5 vectors
    python -m experiments.benchmarks.bench_index_scale --num_vectors=1e6,4e6 --num_queries=500

Data: ``--num_vectors`` clustered 128-d vectors: ``--num_clusters`` Gaussian centres (standard
normal coordinates), unequal cluster sizes (log-normal weights), a per-cluster spread drawn
uniformly in [0.3, 0.9] (a point is its centre plus spread x standard normal noise: wide
clusters overlap their neighbours, narrow ones do not). Unnormalized inner product search, as
REALM's: its retriever scores a block by the raw dot product of two 128-d projections, without
normalization, so norms matter (here they vary with the cluster's spread) and MIPS is not
cosine search. Queries are drawn near the data: a random vector plus half its cluster's spread
of noise, none of them seen by any build.

Rows, all measured in the same run on the same queries:

* ``project``: ``ScannIndex.build`` with the default ``ScannSettings()``: it tunes its leaves and
  reordering depth on rows of its own embeddings (``tuning_queries``), never on the benchmark's
  queries. Searched after ``save``, as a loaded index is: its final exact rescoring of the best
  100 int8 candidates reads the saved ``embeddings.npy`` through a memory map (warm page
  cache); B/block counts the searcher only.
* ``raw``: ScaNN's own builder by hand, in the same memory class (k-means tree of
  ``round(sqrt(n))`` leaves, 4-bit codes of 2 dimensions, anisotropic threshold 0.2, int8
  reordering; no SOAR, which would not fit 200 bytes per block at 2 dimensions per code), its
  leaves and reordering depth hand-tuned *on the benchmark's queries*: for each depth in
  ``--raw_reorder``, the fewest leaves reaching the project's recall; the fastest of those.
* ``raw-f32``: the same with SOAR spilling and float32 reordering, as ScaNN is used without a
  memory limit (512 more bytes per block), tuned the same way: for reference.
* ``exact``: blocked brute force (``BruteForceIndex``, NumPy matmul), the recall reference.

Columns: build seconds, bytes per block of the searcher (its saved assets, the float
embeddings excluded: ``mips_index.searcher_bytes``), queries per second at batch 128 (best of
``--repeats`` passes), recall@10 against exact search (a result scoring at least the exact
10th best counts). Ratios: project / raw qps at equal recall (acceptance: >= 0.8x, with the
project's recall >= 0.95), and each against exact. No timing is asserted; on a shared host the
qps are indicative.
"""

import os
import shutil
import tempfile
import time

from absl import flags
import numpy as np

from realm_tf.binaries import cli
from realm_tf.retrieval import mips_index

flags.DEFINE_list("num_vectors", ["100000"], "Corpus sizes (1e6 and 4e6 for the full run).")
flags.DEFINE_integer("dim", 128, "Embedding dimension.")
flags.DEFINE_integer("num_clusters", 2048, "Gaussian cluster centres.")
flags.DEFINE_integer("num_queries", 1000, "Held-out queries (recall and timing).")
flags.DEFINE_integer("batch", 128, "Query batch size for the qps.")
flags.DEFINE_integer("repeats", 3, "Timed passes over the queries (best one kept).")
flags.DEFINE_list("raw_reorder", ["100", "300", "1000"], "Reordering depths tried for raw.")
flags.DEFINE_bool("raw_f32", True, "Also the raw ScaNN row with SOAR and float32 reordering.")
flags.DEFINE_integer("seed", 0, "Data seed.")
flags.DEFINE_string("work_dir", None, "Scratch directory (default: a temporary one).")
FLAGS = flags.FLAGS


def clustered(n, dim, num_clusters, seed):
  """``(vectors [n, dim], query_fn(m, seed))``: see the module doc."""
  rng = np.random.default_rng(seed)
  c = max(1, min(num_clusters, n // 20))
  centres = rng.standard_normal((c, dim), dtype=np.float32)
  spread = rng.uniform(0.3, 0.9, c).astype(np.float32)
  weights = rng.lognormal(0.0, 1.0, c)
  labels = rng.choice(c, n, p=weights / weights.sum())
  vectors = np.empty((n, dim), np.float32)
  for start in range(0, n, 1 << 18):
    lab = labels[start:start + (1 << 18)]
    vectors[start:start + len(lab)] = centres[lab] + spread[lab, None] * rng.standard_normal(
        (len(lab), dim), dtype=np.float32)

  def queries(m, query_seed):
    r = np.random.default_rng(query_seed)
    rows = r.integers(0, n, m)
    noise = r.standard_normal((m, dim), dtype=np.float32)
    return vectors[rows] + 0.5 * spread[labels[rows], None] * noise
  return vectors, queries


def _dir_bytes(path):
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path)
             for f in files)


def _qps(search, queries, batch, repeats):
  search(queries[:batch])  # Warm-up.
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    for i in range(0, len(queries), batch):
      search(queries[i:i + batch])
    best = min(best, time.perf_counter() - start)
  return len(queries) / best


def _recall(vectors, queries, ids, kth):
  # pylint: disable-next=protected-access
  return mips_index._tie_recall(vectors, queries, np.asarray(ids, np.int64), kth, 10)


class _Raw:
  """A raw ScaNN searcher, searched with explicit leaves and reordering depth."""

  def __init__(self, vectors, leaves, soar, float_reorder):
    from scann.scann_ops.py import scann_builder  # pylint: disable=g-import-not-at-top
    from scann.scann_ops.py import scann_ops_pybind  # pylint: disable=g-import-not-at-top
    start = time.perf_counter()
    quantize = (scann_builder.ReorderType.FLOAT32 if float_reorder
                else scann_builder.ReorderType.INT8)
    builder = scann_ops_pybind.builder(vectors, 10, "dot_product").tree(
        num_leaves=leaves, num_leaves_to_search=max(1, leaves // 10),
        training_sample_size=min(len(vectors), 100_000), soar_lambda=soar).score_ah(
            2, anisotropic_quantization_threshold=0.2).reorder(1000, quantize=quantize)
    self.searcher = builder.build()
    self.build_s = time.perf_counter() - start
    self.num_leaves = leaves

  def search(self, queries, leaves, reorder):
    return self.searcher.search_batched_parallel(queries, final_num_neighbors=10,
                                                 pre_reorder_num_neighbors=reorder,
                                                 leaves_to_search=leaves)[0]

  def tune(self, vectors, queries, kth, target):
    """For each depth, the fewest leaves reaching ``target`` on ``queries``; all (L, R, r)."""
    out = []
    for reorder in (int(r) for r in FLAGS.raw_reorder):
      def rec(leaves, reorder=reorder):
        return _recall(vectors, queries, self.search(queries, leaves, reorder), kth)
      if rec(self.num_leaves) < target:
        continue
      lo, hi = 0, self.num_leaves  # rec(lo) < target (0: none), rec(hi) >= target.
      while hi - lo > 1:
        mid = (lo + hi) // 2
        if rec(mid) >= target:
          hi = mid
        else:
          lo = mid
      out.append((hi, reorder, rec(hi)))
    return out


def bench(n, work_dir):
  vectors, make_queries = clustered(n, FLAGS.dim, FLAGS.num_clusters, FLAGS.seed)
  queries = make_queries(FLAGS.num_queries, FLAGS.seed + 1)
  start = time.perf_counter()
  exact = mips_index.BruteForceIndex(vectors)
  kth = np.concatenate([exact.search(queries[i:i + 128], 10)[1][:, -1]
                        for i in range(0, len(queries), 128)])
  exact_ids = exact.search(queries[:FLAGS.batch], 10)[0]
  exact_s = time.perf_counter() - start
  rows = {}
  # Exact search: timed on two batches only (it is the slow one).
  timed = queries[:2 * FLAGS.batch]
  rows["exact"] = dict(build_s=0.0, bytes=n * FLAGS.dim * 4 / n,
                       qps=_qps(lambda q: exact.search(q, 10), timed, FLAGS.batch, 1),
                       recall=_recall(vectors, queries[:FLAGS.batch], exact_ids,
                                      kth[:FLAGS.batch]),
                       note=f"recall reference: {exact_s:.1f}s for {len(queries)} queries")

  start = time.perf_counter()
  index = mips_index.ScannIndex.build(vectors)
  build_s = time.perf_counter() - start
  path = os.path.join(work_dir, f"project-{n}")
  index.save(path)
  settings = index.settings()
  project_recall = _recall(vectors, queries, index.search(queries, 10)[0], kth)
  rows["project"] = dict(
      build_s=build_s, bytes=mips_index.searcher_bytes(path) / n,
      qps=_qps(lambda q: index.search(q, 10), queries, FLAGS.batch, FLAGS.repeats),
      recall=project_recall,
      note=(f"leaves {settings.get('num_leaves_to_search')}/{settings.get('num_leaves')}, "
            f"reorder {settings['reordering_num_neighbors']}, {settings['dimensions_per_block']}"
            f" dims/code, soar {settings.get('soar_lambda')}, tuning recall "
            f"{settings['tuning']['recall']} on {settings['tuning']['queries']} own rows in "
            f"{settings['tuning']['seconds']}s"))
  del index
  shutil.rmtree(path, ignore_errors=True)

  leaves = max(2, int(round(np.sqrt(n))))
  variants = [("raw", None, False)] + ([("raw-f32", 1.5, True)] if FLAGS.raw_f32 else [])
  for name, soar, float_reorder in variants:
    raw = _Raw(vectors, leaves, soar, float_reorder)
    path = os.path.join(work_dir, f"{name}-{n}")
    os.makedirs(path)
    raw.searcher.serialize(path, relative_path=True)
    raw_bytes = _dir_bytes(path) / n
    shutil.rmtree(path, ignore_errors=True)
    best = None
    for nl, reorder, r in raw.tune(vectors, queries, kth, project_recall):
      qps = _qps(lambda q, nl=nl, reorder=reorder: raw.search(q, nl, reorder), queries,
                 FLAGS.batch, FLAGS.repeats)
      if best is None or qps > best["qps"]:
        best = dict(build_s=raw.build_s, bytes=raw_bytes, qps=qps, recall=r,
                    note=f"hand-tuned on these queries: leaves {nl}/{leaves}, reorder {reorder}")
    if best is None:
      best = dict(build_s=raw.build_s, bytes=raw_bytes, qps=float("nan"), recall=float("nan"),
                  note=f"never reaches recall {project_recall:.4f}")
    rows[name] = best
    del raw
  return rows


def _verdict(project_qps, raw_qps):
  if np.isnan(raw_qps):
    return "ok (raw never reaches that recall)"
  return "ok" if project_qps >= 0.8 * raw_qps else "MISSED"


def main(argv):
  del argv
  work_dir = FLAGS.work_dir or tempfile.mkdtemp(prefix="bench_index_scale_")
  os.makedirs(work_dir, exist_ok=True)
  print(f"machine: {os.cpu_count()} CPUs visible; qps are indicative on a shared host")
  qps_head = f"qps@{FLAGS.batch}"
  print(f"{'vectors':>9} {'method':>8} {'build s':>8} {'B/block':>8} {qps_head:>9} "
        f"{'recall@10':>9}  notes")
  for size in FLAGS.num_vectors:
    n = int(float(size))
    rows = bench(n, work_dir)
    for name, r in rows.items():
      print(f"{n:>9} {name:>8} {r['build_s']:>8.1f} {r['bytes']:>8.1f} {r['qps']:>9.0f} "
            f"{r['recall']:>9.4f}  {r['note']}", flush=True)
    p, e = rows["project"], rows["exact"]
    for name in ("raw", "raw-f32"):
      if name in rows:
        print(f"{n:>9} ratio project/{name} qps at equal recall: "
              f"x{p['qps'] / rows[name]['qps']:.2f} (recall {p['recall']:.4f} vs "
              f"{rows[name]['recall']:.4f}); bytes/block x{p['bytes'] / rows[name]['bytes']:.2f}",
              flush=True)
    print(f"{n:>9} ratio project/exact qps: x{p['qps'] / e['qps']:.1f}; acceptance "
          f"(project recall >= 0.95, >= 0.8x raw qps, <= 200 B/block): "
          f"recall {'ok' if p['recall'] >= 0.95 else 'MISSED'}, qps "
          f"{_verdict(p['qps'], rows['raw']['qps'])}, bytes "
          f"{'ok' if p['bytes'] <= 200 else 'MISSED'}", flush=True)
  if not FLAGS.work_dir:
    shutil.rmtree(work_dir, ignore_errors=True)


if __name__ == "__main__":
  cli.run_main(main)
