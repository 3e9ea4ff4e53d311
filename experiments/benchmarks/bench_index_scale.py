r"""Benchmark: the project's ScaNN index at scale against raw ScaNN and exact search, each row
in its own process, with its peak memory.

    python -m experiments.benchmarks.bench_index_scale                     # 10^5 vectors
    python -m experiments.benchmarks.bench_index_scale --num_vectors=1e6,4e6 --num_queries=500
    python -m experiments.benchmarks.bench_index_scale --num_vectors=1.33e7 --num_queries=500 \
        --noraw_f32 --raw_reorder=300 --repeats=2                           # REALM's 13.3M

Data: ``--num_vectors`` clustered 128-d vectors, written to ``<work_dir>/vectors-<n>.npy`` a
chunk at a time (never whole in memory): ``--num_clusters`` Gaussian centres (standard normal
coordinates), unequal cluster sizes (log-normal weights), a per-cluster spread drawn uniformly
in [0.3, 0.9] (a point is its centre plus spread x standard normal noise: wide clusters overlap
their neighbours, narrow ones do not). Unnormalized inner product search, as REALM's: its
retriever scores a block by the raw dot product of two 128-d projections, so norms matter and
MIPS is not cosine search. Queries are drawn near the data: a random vector plus half its
cluster's spread of noise, none of them seen by any build.

Rows, each a separate process reading the vectors file, all on the same queries:

* ``project``: ``mips_index.build_index`` with the default ``ScannSettings()`` (and
  ``--build_memory_gib``): built in shards when the budget asks for it; it tunes its leaves and
  reordering depth on rows of its own embeddings (never on the benchmark's queries), and is
  saved. Then a second process loads it (``load_index``, as ``realm-serve`` does) and searches:
  its final exact rescoring reads the saved ``embeddings.npy`` through a memory map.
* ``raw``: ScaNN's own builder by hand over the whole array in memory, in the same memory class
  (k-means tree of ``round(sqrt(n))`` leaves, 4-bit codes of 2 dimensions, anisotropic
  threshold 0.2, int8 reordering, no SOAR), its leaves and reordering depth hand-tuned *on the
  benchmark's queries*: for each depth in ``--raw_reorder``, the fewest leaves reaching the
  project's recall; the fastest of those.
* ``raw-f32``: the same with SOAR spilling and float32 reordering, as ScaNN is used without a
  memory limit (512 more bytes per block), tuned the same way: for reference.
* ``exact``: blocked brute force over the file, the recall reference (timed on two batches).

Columns: build seconds; peak resident memory of the build (``build GiB``: the most of the
process's VmRSS sampled every 50 ms, the interpreter and its imports included; the project's
includes its save: a shard's rows are read with plain reads, nothing mapped) and of the loaded
searcher while it searches (``search GiB``: its anonymous memory, RssAnon; the exact
rescoring's rows are read through a memory map of ``embeddings.npy``, whose page-cache pages
the kernel maps in 64 KB around each row read, so VmRSS soon counts most of a cached file:
shared, evictable memory, given in the notes);
bytes per block of the saved searcher (its assets, the float embeddings excluded:
``mips_index.searcher_bytes``); queries per second at batch 128 (best of ``--repeats``
passes); recall@10 against exact search (a result scoring at least the exact 10th best counts).
A row whose process passes ``--max_rss_gib`` stops itself and says so (a killed row never
sinks the others). Ratios: project / raw qps at equal recall (acceptance: >= 0.8x, with the
project's recall >= 0.95), and each against exact. No timing is asserted; on a shared host the
qps are indicative.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from absl import flags
import numpy as np

from realm_tf.binaries import cli
from realm_tf.retrieval.index import mips_index
from realm_tf.retrieval.index import sharded_index
from realm_tf.retrieval.index import tuning as index_tuning
from realm_tf.retrieval.publication import index_io

flags.DEFINE_list("num_vectors", ["100000"], "Corpus sizes (1e6 and 4e6 for the full run).")
flags.DEFINE_integer("dim", 128, "Embedding dimension.")
flags.DEFINE_integer("num_clusters", 2048, "Gaussian cluster centres.")
flags.DEFINE_integer("num_queries", 1000, "Held-out queries (recall and timing).")
flags.DEFINE_integer("batch", 128, "Query batch size for the qps.")
flags.DEFINE_integer("repeats", 3, "Timed passes over the queries (best one kept).")
flags.DEFINE_list("raw_reorder", ["100", "300", "1000"], "Reordering depths tried for raw.")
flags.DEFINE_bool("raw_f32", True, "Also the raw ScaNN row with SOAR and float32 reordering.")
flags.DEFINE_bool("raw", True, "The raw ScaNN row.")
flags.DEFINE_float("build_memory_gib", mips_index.ScannSettings().build_memory_gib,
                   "The project's ScannSettings.build_memory_gib (0: never shard).")
flags.DEFINE_float("max_rss_gib", 20.0, "A row's process stops itself past this resident size.")
flags.DEFINE_integer("seed", 0, "Data seed.")
flags.DEFINE_string("work_dir", None, "Scratch directory (default: a temporary one).")
flags.DEFINE_string("child", None, "Internal: run one row (project, load, raw, raw-f32) on the "
                    "data of --work_dir and --child_n, print its JSON.")
flags.DEFINE_integer("child_n", 0, "Internal: the size the child runs.")
FLAGS = flags.FLAGS
_GIB = 2**30


# ------------------------------------------------------------------------------ the data --
def write_clustered(path, n, dim, num_clusters, seed):
  """Writes ``n`` clustered vectors (module doc) to the ``.npy`` ``path`` a chunk at a time;
  returns ``query_fn(m, seed)`` (the queries read their base rows from the file)."""
  rng = np.random.default_rng(seed)
  c = max(1, min(num_clusters, n // 20))
  centres = rng.standard_normal((c, dim), dtype=np.float32)
  spread = rng.uniform(0.3, 0.9, c).astype(np.float32)
  weights = rng.lognormal(0.0, 1.0, c)
  labels = rng.choice(c, n, p=weights / weights.sum())
  with open(path + ".tmp", "wb") as f:
    np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False,
                                             "shape": (n, dim)})
    for start in range(0, n, 1 << 18):
      lab = labels[start:start + (1 << 18)]
      chunk = centres[lab] + spread[lab, None] * rng.standard_normal((len(lab), dim),
                                                                     dtype=np.float32)
      f.write(chunk.astype("<f4").tobytes())
  os.replace(path + ".tmp", path)

  def queries(m, query_seed):
    r = np.random.default_rng(query_seed)
    rows = r.integers(0, n, m)
    noise = r.standard_normal((m, dim), dtype=np.float32)
    table = np.load(path, mmap_mode="r")
    return np.asarray(table[rows]) + 0.5 * spread[labels[rows], None] * noise
  return queries


def exact_reference(path, queries, k=10):
  """``(top-k ids, kth scores, seconds)``: exact search over the file, a chunk at a time."""
  table = np.load(path, mmap_mode="r")
  top = sharded_index.ExactTop(queries, k)
  start = time.perf_counter()
  step = 1 << 20
  for lo in range(0, len(table), step):
    hi = min(lo + step, len(table))
    top.add(sharded_index.read_rows(table, lo, hi), lo, np.zeros([0], np.int64))
  return top.ids, top.scores[:, k - 1], time.perf_counter() - start


# ------------------------------------------------------------------------------- memory --
class PeakRss:
  """The most VmRSS (``peak``) and RssAnon (``peak_anon``) of this process, sampled every
  50 ms between ``start()`` and ``stop()`` (the whole process's: its imports included,
  ``base``); stops the process past ``limit`` bytes of VmRSS (a row that would be killed by
  the OOM killer says so instead)."""

  def __init__(self, limit):
    self.limit = limit
    self.peak = self.peak_anon = self.base = 0
    self._stop = threading.Event()
    self._thread = None

  @staticmethod
  def rss():
    """``(VmRSS, RssAnon)`` in bytes."""
    found = {}
    with open("/proc/self/status") as f:
      for line in f:
        if line.startswith(("VmRSS:", "RssAnon:")):
          found[line.split(":")[0]] = int(line.split()[1]) * 1024
    return found.get("VmRSS", 0), found.get("RssAnon", 0)

  def _sample(self):
    now, anon = self.rss()
    self.peak, self.peak_anon = max(self.peak, now), max(self.peak_anon, anon)
    return now

  def start(self):
    self.base = self.peak = self.rss()[0]
    self._stop.clear()
    self._thread = threading.Thread(target=self._run, daemon=True)
    self._thread.start()
    return self

  def _run(self):
    while not self._stop.wait(0.05):
      now = self._sample()
      if now > self.limit:
        print(json.dumps({"stopped": f"resident memory passed {self.limit / _GIB:.1f} GiB "
                                     f"({now / _GIB:.1f} GiB)"}), flush=True)
        os._exit(3)

  def stop(self):
    """The peak VmRSS (GiB) since ``start``."""
    self._stop.set()
    self._thread.join()
    self._sample()
    return self.peak / _GIB


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
  return index_tuning.tie_recall(vectors, queries, np.asarray(ids, np.int64), kth, 10)


# ------------------------------------------------------------------------------- the rows --
def _child_project(data, n, values):
  table = np.load(data["vectors"], mmap_mode="r")
  settings = mips_index.ScannSettings(build_memory_gib=values.build_memory_gib or None)
  peak = PeakRss(values.max_rss_gib * _GIB).start()
  start = time.perf_counter()
  index = mips_index.build_index(table, "scann", settings)
  build_s = time.perf_counter() - start
  path = os.path.join(values.work_dir, f"project-{n}")
  shutil.rmtree(path, ignore_errors=True)
  index.save(path)
  build_gib = peak.stop()
  s = index.settings()
  before = peak.base / _GIB
  shards = len(s.get("shards", [None]))
  return dict(build_s=build_s, build_gib=build_gib, bytes=mips_index.searcher_bytes(path) / n,
              note=(f"{before:.2f} GiB before the build; {shards} shard(s), leaves {s.get('num_leaves_to_search')}/"
                    f"{s.get('num_leaves')}, reorder {s['reordering_num_neighbors']}, tuning "
                    f"recall {s['tuning']['recall']} on {s['tuning']['queries']} own rows in "
                    f"{s['tuning']['seconds']}s"))


def _child_load(data, n, values):
  table = np.load(data["vectors"], mmap_mode="r")
  queries, kth = data["queries"], data["kth"]
  peak = PeakRss(values.max_rss_gib * _GIB).start()
  index = index_io.load_index(os.path.join(values.work_dir, f"project-{n}"))
  recall = _recall(table, queries, index.search(queries, 10)[0], kth)
  qps = _qps(lambda q: index.search(q, 10), queries, values.batch, values.repeats)
  total = peak.stop()
  return dict(search_gib=peak.peak_anon / _GIB, qps=qps, recall=recall,
              search_note=f"searching: {total:.2f} GiB VmRSS with the mapped page cache")


class _Raw:
  """A raw ScaNN searcher, searched with explicit leaves and reordering depth."""

  def __init__(self, vectors, leaves, soar, float_reorder):
    # ScaNN's raw API (heavy, optional): loaded only by the raw rows' child processes.
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

  def tune(self, vectors, queries, kth, target, reorders):
    """For each depth of ``reorders``, the fewest leaves reaching ``target`` on ``queries``;
    all (L, R, r)."""
    out = []
    for reorder in (int(r) for r in reorders):
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


def _child_raw(data, n, name, values):
  queries, kth, target = data["queries"], data["kth"], float(data["target"])
  peak = PeakRss(values.max_rss_gib * _GIB).start()
  vectors = np.load(data["vectors"])  # Raw ScaNN builds from an array in memory.
  raw = _Raw(vectors, max(2, int(round(np.sqrt(n)))), 1.5 if name == "raw-f32" else None,
             name == "raw-f32")
  path = os.path.join(values.work_dir, f"{name}-{n}")
  os.makedirs(path, exist_ok=True)
  raw.searcher.serialize(path, relative_path=True)
  raw_bytes = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path)
                  for f in files) / n
  shutil.rmtree(path, ignore_errors=True)
  build_gib = peak.stop()
  best = None
  for nl, reorder, r in raw.tune(vectors, queries, kth, target, values.raw_reorder):
    qps = _qps(lambda q, nl=nl, reorder=reorder: raw.search(q, nl, reorder), queries,
               values.batch, values.repeats)
    if best is None or qps > best["qps"]:
      best = dict(qps=qps, recall=r, note=f"hand-tuned on these queries: leaves {nl}/"
                  f"{raw.num_leaves}, reorder {reorder}")
  if best is None:
    best = dict(qps=float("nan"), recall=float("nan"), note=f"never reaches recall {target:.4f}")
  best.update(build_s=raw.build_s, build_gib=build_gib, bytes=raw_bytes,
              search_gib=float("nan"))
  return best


def _run_child(name, n, data_path, values):
  """Runs one row in its own process; its JSON, or ``{"failed": why}``."""
  cmd = [sys.executable, "-m", "experiments.benchmarks.bench_index_scale", f"--child={name}",
         f"--child_n={n}", f"--work_dir={values.work_dir}", f"--dim={values.dim}",
         f"--batch={values.batch}", f"--repeats={values.repeats}",
         f"--raw_reorder={','.join(values.raw_reorder)}",
         f"--build_memory_gib={values.build_memory_gib}", f"--max_rss_gib={values.max_rss_gib}"]
  start = time.perf_counter()
  proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                        check=False)
  lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
  out = json.loads(lines[-1]) if lines else {}
  if proc.returncode or "stopped" in out:
    why = out.get("stopped") or f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}"
    return {"failed": f"{why} after {time.perf_counter() - start:.0f} s"}
  return out


def bench(n, work_dir, values):
  vectors_path = os.path.join(work_dir, f"vectors-{n}.npy")
  make_queries = write_clustered(vectors_path, n, values.dim, values.num_clusters, values.seed)
  queries = make_queries(values.num_queries, values.seed + 1).astype(np.float32)
  exact_ids, kth, exact_s = exact_reference(vectors_path, queries)
  table = np.load(vectors_path, mmap_mode="r")
  rows = {}
  timed = queries[:2 * values.batch]  # Exact search: timed on two batches (the slow one).
  exact = mips_index.BruteForceIndex(table, check=False)
  rows["exact"] = dict(build_s=0.0, build_gib=0.0, search_gib=float("nan"),
                       bytes=values.dim * 4.0,
                       qps=_qps(lambda q: exact.search(q, 10), timed, values.batch, 1),
                       recall=_recall(table, queries, exact_ids, kth),
                       note=f"recall reference: {exact_s:.1f}s for {len(queries)} queries")
  data_path = os.path.join(work_dir, f"data-{n}.npz")
  np.savez(data_path, queries=queries, kth=kth, vectors=vectors_path, target=0.0)

  project = _run_child("project", n, data_path, values)
  if "failed" not in project:
    loaded = _run_child("load", n, data_path, values)
    project.update(loaded)
    project["note"] = f"{project['note']}; {loaded.get('search_note', loaded.get('failed'))}"
  rows["project"] = project
  target = project.get("recall", 0.95)
  np.savez(data_path, queries=queries, kth=kth, vectors=vectors_path, target=target)
  names = (["raw"] if values.raw else []) + (["raw-f32"] if values.raw_f32 else [])
  for name in names:
    rows[name] = _run_child(name, n, data_path, values)
  shutil.rmtree(os.path.join(work_dir, f"project-{n}"), ignore_errors=True)
  os.remove(vectors_path)
  return rows


def _verdict(project, raw):
  if "failed" in raw:
    return "raw could not be built here: see the largest size where both ran"
  if np.isnan(raw["qps"]):
    return "ok (raw never reaches that recall)"
  return "ok" if project["qps"] >= 0.8 * raw["qps"] else "MISSED"


def _print_row(n, name, r):
  if "failed" in r:
    print(f"{n:>9} {name:>8}  {r['failed']}", flush=True)
    return
  print(f"{n:>9} {name:>8} {r['build_s']:>8.1f} {r['build_gib']:>9.2f} "
        f"{r.get('search_gib', float('nan')):>10.2f} {r['bytes']:>8.1f} {r['qps']:>9.0f} "
        f"{r['recall']:>9.4f}  {r.get('note', '')}", flush=True)


def main(argv):
  del argv
  if FLAGS.child:
    data = dict(np.load(os.path.join(FLAGS.work_dir, f"data-{FLAGS.child_n}.npz")))
    data["vectors"] = str(data["vectors"])
    run = {"project": _child_project, "load": _child_load}.get(FLAGS.child)
    out = (run(data, FLAGS.child_n, FLAGS) if run
           else _child_raw(data, FLAGS.child_n, FLAGS.child, FLAGS))
    print(json.dumps(out), flush=True)
    return
  FLAGS.work_dir = FLAGS.work_dir or tempfile.mkdtemp(prefix="bench_index_scale_")
  own_dir = not FLAGS["work_dir"].present
  os.makedirs(FLAGS.work_dir, exist_ok=True)
  print(f"machine: {os.cpu_count()} CPUs visible, {os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / _GIB:.0f} GiB; "
        f"qps are indicative on a shared host; project build_memory_gib {FLAGS.build_memory_gib}")
  qps_head = f"qps@{FLAGS.batch}"
  print(f"{'vectors':>9} {'method':>8} {'build s':>8} {'build GiB':>9} {'search GiB':>10} "
        f"{'B/block':>8} {qps_head:>9} {'recall@10':>9}  notes")
  for size in FLAGS.num_vectors:
    n = int(float(size))
    rows = bench(n, FLAGS.work_dir, FLAGS)
    for name, r in rows.items():
      _print_row(n, name, r)
    p, e = rows["project"], rows["exact"]
    if "failed" in p:
      continue
    for name in ("raw", "raw-f32"):
      r = rows.get(name)
      if r and "failed" not in r:
        print(f"{n:>9} ratio project/{name} qps at equal recall: x{p['qps'] / r['qps']:.2f} "
              f"(recall {p['recall']:.4f} vs {r['recall']:.4f}); bytes/block "
              f"x{p['bytes'] / r['bytes']:.2f}; build memory x{p['build_gib'] / r['build_gib']:.2f}",
              flush=True)
    raw_verdict = _verdict(p, rows["raw"]) if "raw" in rows else "raw not run"
    print(f"{n:>9} ratio project/exact qps: x{p['qps'] / e['qps']:.1f}; acceptance "
          f"(recall >= 0.95, >= 0.8x raw qps, <= 200 B/block, build <= 12 GiB): recall "
          f"{'ok' if p['recall'] >= 0.95 else 'MISSED'}, qps {raw_verdict}, bytes "
          f"{'ok' if p['bytes'] <= 200 else 'MISSED'}, build memory "
          f"{'ok' if p['build_gib'] <= 12 else 'MISSED'}", flush=True)
  if own_dir:
    shutil.rmtree(FLAGS.work_dir, ignore_errors=True)


if __name__ == "__main__":
  cli.run_main(main)
