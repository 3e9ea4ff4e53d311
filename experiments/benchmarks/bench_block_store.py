r"""The trainer's corpus in memory: block dicts + dense packed arrays vs the block store.

    python -m experiments.benchmarks.bench_block_store                       # 20,000 blocks
    python -m experiments.benchmarks.bench_block_store --num_blocks=1000000

Synthesizes a blocks directory (``features.serialize_block``, the format of the blocks
pipeline) of ``--num_blocks`` blocks with a 30,522-id vocabulary and REALM-like lengths: 85% of
the blocks fill the 288 wordpieces, the rest are uniform in [24, 287]; titles of 1-12
wordpieces; body texts of about 4.2 bytes per wordpiece. Then, each in its own subprocess (so
that one's memory does not pollute the other's):

* ``before``: today's path, ``manifests.read_blocks`` + the dense arrays of
  ``candidates.pack_blocks`` and the per-row uid and body lists (the CandidateBuilder of
  before the store, reproduced below as ``DenseBuilder``);
* ``build``: the block store's one-off build from the TFRecords (``BlockStore.open`` on a
  directory without a store);
* ``after``: ``BlockStore.open`` of the built store and a ``CandidateBuilder`` over it.

For each: seconds to start (read the corpus and build the host-side structures), growth of the
resident set (``VmRSS`` of /proc/self/status, after TensorFlow is warmed up; ``RssAnon`` is the
part that is not file pages) right after the start and after the candidate batches, and
candidate-building throughput: ``--batches`` batches of ``--batch_size`` queries x
``--num_candidates`` candidates (random ranked rows through ``select_candidates``, then
``features``; REALM's lengths 96/288/384). The ``before`` path needs ~12 KB of RAM per block, so
above ``--before_max_blocks`` it runs on the first ``--before_max_blocks`` blocks and its memory
and start-up are extrapolated linearly (said so in the output); ``after`` also runs at that
size, and the two must give identical features there (checked by a hash of every batch).
Ratios before / after are printed, all measured in this run on this machine.
"""

import gc
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from absl import flags
import numpy as np
import tensorflow as tf

from realm_tf import configs
from realm_tf.binaries import cli
from realm_tf.data import block_store
from realm_tf.data import features as features_lib
from realm_tf.data import manifests
from realm_tf.tasks import candidates

flags.DEFINE_integer("num_blocks", 20000, "Blocks in the corpus (1000000 for the full size).")
flags.DEFINE_integer("before_max_blocks", 100000, "Largest corpus the before path reads; "
                     "larger ones are extrapolated from this size.")
flags.DEFINE_integer("batches", 30, "Candidate batches timed per path.")
flags.DEFINE_integer("batch_size", 64, "Queries per batch.")
flags.DEFINE_integer("num_candidates", 8, "Candidates per query (the null block included).")
flags.DEFINE_integer("seed", 0, "Seed of the corpus and the batches.")
flags.DEFINE_string("work_dir", None, "Where the corpora are written (kept, and reused when "
                    "they match); default: a temporary directory, removed at the end.")
flags.DEFINE_string("role", "", "Internal: run one measurement (before, build, after).")
flags.DEFINE_string("blocks_dir", "", "Internal: the corpus of --role.")
FLAGS = flags.FLAGS

VOCAB, CLS, SEP = 30522, 101, 102
SEQ_LENGTH, SHARD_BLOCKS, GENERATOR = 288, 125000, 2
UIDS = "bench_uids.npy"   # the benchmark's own file beside the corpus: the uids, for queries


# ---------------------------------------------------------------------------- the corpus --

def _chunk(start, stop, seed, words):
  """Blocks ``start..stop - 1``: (titles, bodies, token id lists), the same for every run."""
  rng = np.random.default_rng([seed, start])
  m = stop - start
  full = rng.random(m) < 0.85
  lengths = np.where(full, SEQ_LENGTH, rng.integers(24, SEQ_LENGTH, m))
  title_lengths = rng.integers(1, 13, m)
  ids = rng.integers(1000, VOCAB, [m, SEQ_LENGTH])
  titles, bodies, tokens = [], [], []
  for j in range(m):
    i, n, t = start + j, int(lengths[j]), int(title_lengths[j])
    body_len = n - t - 3
    offset = int(rng.integers(0, len(words) - 5 * SEQ_LENGTH))
    titles.append(f"Title {i}")
    bodies.append(f"{i} " + words[offset:offset + int(4.2 * body_len)])
    row = ids[j]
    tokens.append([CLS, *row[:t].tolist(), SEP, *row[t:t + body_len].tolist(), SEP])
  return titles, bodies, tokens


def write_corpus(blocks_dir, n, seed):
  """Writes (or reuses) the synthetic blocks directory of ``n`` blocks."""
  path = os.path.join(blocks_dir, manifests.MANIFEST)
  if os.path.exists(path):
    with open(path) as f:
      old = json.load(f)
    if old.get("synthetic") == [GENERATOR, seed] and old["num_blocks"] == n:
      print(f"reusing the corpus of {n} blocks in {blocks_dir}")
      return
  shutil.rmtree(blocks_dir, ignore_errors=True)
  os.makedirs(blocks_dir)
  rng = np.random.default_rng(seed)
  words = " ".join(rng.choice(["river", "city", "of", "the", "music", "album", "station",
                               "empire", "painter", "a", "in", "was", "born", "football"],
                              200000))
  num_shards = max(1, -(-n // SHARD_BLOCKS))
  fingerprint = hashlib.sha1()
  uids = np.zeros([n], "S40")
  start, total_tokens = time.time(), 0
  for shard in range(num_shards):
    lo, hi = shard * n // num_shards, (shard + 1) * n // num_shards
    name = manifests.shard_name(os.path.join(blocks_dir, manifests.BLOCKS_PREFIX), shard,
                                num_shards)
    with tf.io.TFRecordWriter(name) as writer:
      for a in range(lo, hi, 5000):
        titles, bodies, tokens = _chunk(a, min(a + 5000, hi), seed, words)
        for j, (title, body, ids) in enumerate(zip(titles, bodies, tokens)):
          uid = features_lib.block_uid(title, body)
          fingerprint.update(uid.encode("ascii") + b"\n")
          uids[a + j] = uid
          writer.write(features_lib.serialize_block(a + j, uid, title, body, ids))
          total_tokens += len(ids)
    print(f"  wrote shard {shard + 1}/{num_shards} ({hi} blocks, {time.time() - start:.0f} s)",
          flush=True)
  np.save(os.path.join(blocks_dir, UIDS), uids)
  manifest = dict(num_blocks=n, fingerprint=fingerprint.hexdigest(), num_shards=num_shards,
                  block_seq_length=SEQ_LENGTH, vocab_size=VOCAB, num_tokens=total_tokens,
                  synthetic=[GENERATOR, seed])
  with open(path, "w") as f:
    json.dump(manifest, f, indent=2)


# -------------------------------------------------------------------------- before: dense --

class DenseBuilder:
  """The CandidateBuilder of before the block store: the whole corpus packed into dense
  ``[n + 1, Lb]`` arrays, a uid array, body token and text lists, loops per candidate."""

  def __init__(self, blocks, config, cls_id, sep_id):
    self.config, self.k = config, config.num_candidates
    self.null_row = len(blocks)
    self.uids = np.array([b["uid"] for b in blocks] + [""])
    self.bodies_text = [b.get("body", "") for b in blocks] + [""]
    self.cls_id, self.sep_id = cls_id, sep_id
    (self.block_word_ids, self.block_mask, self.block_type_ids,
     self.bodies) = candidates.pack_blocks(blocks, config.retriever.block_seq_length, cls_id,
                                           sep_id)

  def select_candidates(self, ranked_ids, source_uids):
    out = np.full([len(ranked_ids), self.k], self.null_row, np.int32)
    for i, (row, uid) in enumerate(zip(ranked_ids, source_uids)):
      uid = uid.decode() if isinstance(uid, bytes) else uid
      out[i, 1:] = [int(b) for b in row if b >= 0 and self.uids[b] != uid][:self.k - 1]
    return out

  def features(self, examples, candidates):
    query_ids = examples["query_ids"].astype(np.int32)
    query_mask = examples["query_mask"].astype(np.int32)
    r_len = self.config.reader.seq_length
    b, k = candidates.shape
    reader_ids = np.zeros([b, k, r_len], np.int32)
    reader_types = np.zeros([b, k, r_len], np.int32)
    for i in range(b):
      q = query_ids[i, :int(query_mask[i].sum())]
      for j, row in enumerate(candidates[i]):
        body = self.bodies[row][:r_len - len(q)]
        if len(body) and body[-1] != self.sep_id:
          body = np.concatenate([body[:-1], [self.sep_id]])
        reader_ids[i, j, :len(q)] = q
        reader_ids[i, j, len(q):len(q) + len(body)] = body
        reader_types[i, j, len(q):len(q) + len(body)] = 1
    return dict(candidate_word_ids=self.block_word_ids[candidates],
                candidate_mask=self.block_mask[candidates],
                candidate_type_ids=self.block_type_ids[candidates],
                reader_word_ids=reader_ids, reader_mask=(reader_ids > 0).astype(np.int32),
                reader_type_ids=reader_types, candidate_rows=candidates)


# ----------------------------------------------------------------------- one measurement --

def _status():
  """kB of VmRSS, RssAnon, RssFile, VmHWM in /proc/self/status."""
  out = {}
  with open("/proc/self/status") as f:
    for line in f:
      key, _, value = line.partition(":")
      if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
        out[key] = int(value.split()[0])
  return out


def _warm_up(blocks_dir):
  """Starts TensorFlow's runtime and tf.data, which both paths use, before measuring."""
  files = manifests.shard_files(blocks_dir, manifests.BLOCKS_PREFIX)
  for _ in tf.data.TFRecordDataset(files[:1]).take(4).batch(2).as_numpy_iterator():
    pass
  features_lib.pack_block_ids(tf.ragged.constant([[CLS, SEP, SEP]]), 8, SEP)
  gc.collect()


def _batches(values, n, batch_size, k, seed, slack=4):
  rng = np.random.default_rng([seed, 1])
  for _ in range(values.batches):
    lengths = rng.integers(10, 61, batch_size)
    query_ids = np.zeros([batch_size, 96], np.int64)
    query_mask = np.zeros([batch_size, 96], np.int64)
    for i, m in enumerate(lengths):
      query_ids[i, :m] = [CLS, *rng.integers(1000, VOCAB, m - 2), SEP]
      query_mask[i, :m] = 1
    source = rng.integers(0, n, batch_size)
    ranked = rng.integers(0, n, [batch_size, k - 1 + slack])
    ranked[:, 0] = source   # the trivial hit, dropped
    masks = np.ones([batch_size, 10], np.int64)
    yield dict(query_ids=query_ids, query_mask=query_mask, mlm_positions=masks, mlm_ids=masks,
               mlm_weights=masks.astype(np.float32)), source, ranked


def run_role(role, blocks_dir, values):
  """One measurement in this process; returns a dict (printed as JSON)."""
  config = configs.RealmModelConfig(num_candidates=values.num_candidates)
  _warm_up(blocks_dir)
  n = int(manifests.load_blocks_manifest(blocks_dir)["num_blocks"])
  if role == "build":
    shutil.rmtree(os.path.join(blocks_dir, block_store.STORE_DIR), ignore_errors=True)
    rss0 = _status()
    start = time.perf_counter()
    store = block_store.BlockStore.open(blocks_dir, progress=False)
    seconds = time.perf_counter() - start
    return dict(n=n, build_s=seconds, disk_bytes=store.nbytes(),
                text_bytes=store.texts_nbytes(),
                token_bytes=store.num_tokens * store.token_dtype.itemsize,
                peak_growth_kb=_status()["VmHWM"] - rss0["VmRSS"])
  batches = list(_batches(values, n, values.batch_size, values.num_candidates, values.seed))
  uids = np.load(os.path.join(blocks_dir, UIDS), mmap_mode="r")
  sources = [np.array(uids[source]) for _, source, _ in batches]  # the queries' source uids
  del uids
  gc.collect()
  rss0 = _status()
  start = time.perf_counter()
  if role == "before":
    builder = DenseBuilder(manifests.read_blocks(blocks_dir), config, CLS, SEP)
  else:
    builder = candidates.CandidateBuilder(block_store.BlockStore.open(blocks_dir), config,
                                          None, CLS, SEP)
  startup = time.perf_counter() - start
  gc.collect()
  rss1 = _status()
  digest = hashlib.sha1()
  seconds, examples = 0.0, 0
  for (batch, _, ranked), source_uids in zip(batches, sources):
    start = time.perf_counter()
    rows = builder.select_candidates(ranked, source_uids)
    features = builder.features(batch, candidates=rows)
    seconds += time.perf_counter() - start
    examples += len(rows)
    for name in sorted(features):
      if name.startswith(("candidate_", "reader_")):
        digest.update(np.ascontiguousarray(features[name], np.int32).tobytes())
  rss2 = _status()
  return dict(n=n, startup_s=startup, rss_kb=rss1["VmRSS"] - rss0["VmRSS"],
              anon_kb=rss1["RssAnon"] - rss0["RssAnon"],
              rss_after_kb=rss2["VmRSS"] - rss0["VmRSS"],
              file_after_kb=rss2["RssFile"] - rss0["RssFile"],
              peak_kb=rss2["VmHWM"] - rss0["VmRSS"], examples_per_s=examples / seconds,
              features_sha1=digest.hexdigest())


def _subprocess(role, blocks_dir, values):
  argv = [sys.executable, "-m", "experiments.benchmarks.bench_block_store", f"--role={role}",
          f"--blocks_dir={blocks_dir}", f"--batches={values.batches}",
          f"--batch_size={values.batch_size}", f"--num_candidates={values.num_candidates}",
          f"--seed={values.seed}"]
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  done = subprocess.run(argv, capture_output=True, text=True, env=env)
  if done.returncode:
    sys.stderr.write(done.stderr[-4000:])
    raise RuntimeError(f"--role={role} failed with exit status {done.returncode}")
  return json.loads(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------- main --

def main(argv):
  del argv
  if FLAGS.role:
    print(json.dumps(run_role(FLAGS.role, FLAGS.blocks_dir, FLAGS)))
    return
  n, small = FLAGS.num_blocks, min(FLAGS.num_blocks, FLAGS.before_max_blocks)
  work_dir = FLAGS.work_dir or tempfile.mkdtemp(prefix="bench_block_store_")
  try:
    dirs = {n: os.path.join(work_dir, f"blocks-{n}")}
    dirs[small] = os.path.join(work_dir, f"blocks-{small}")
    for size in sorted(set(dirs)):
      print(f"corpus of {size} blocks:", flush=True)
      write_corpus(dirs[size], size, FLAGS.seed)
    results = {}
    for role, size in (("before", small), ("build", small), ("after", small), ("build", n),
                       ("after", n)):
      if (role, size) not in results:
        print(f"measuring {role} at {size} blocks ...", flush=True)
        results[role, size] = _subprocess(role, dirs[size], FLAGS)
    report(results, n, small, FLAGS)
  finally:
    if not FLAGS.work_dir:
      shutil.rmtree(work_dir, ignore_errors=True)


def report(results, n, small, values):
  before, after_small = results["before", small], results["after", small]
  build, after = results["build", n], results["after", n]
  scale = n / small
  mb = lambda kb: kb / 1024
  token_bytes = build["token_bytes"]
  target = 1.2 * token_bytes + 32 * n
  print(f"\ncorpus: {n} blocks, {token_bytes / n / 2:.0f} wordpieces per block on average; "
        f"{values.batches} batches of {values.batch_size} queries x {values.num_candidates} "
        "candidates")
  note = "" if small == n else f"  (measured at {small} blocks, x{scale:g} linearly)"
  print(f"before  read_blocks + pack_blocks: start-up {before['startup_s'] * scale:8.1f} s, "
        f"RSS growth {mb(before['rss_kb']) * scale:9.1f} MiB, "
        f"peak {mb(before['peak_kb']) * scale:9.1f} MiB{note}")
  print(f"        {before['examples_per_s']:8.0f} examples/s (at {small} blocks)")
  print(f"build   block store, one-off: {build['build_s']:8.1f} s, "
        f"{build['disk_bytes'] / 2**20:.1f} MiB on disk "
        f"(tokens {token_bytes / 2**20:.1f} MiB), peak RSS growth "
        f"{mb(build['peak_growth_kb']):.1f} MiB (TensorFlow's parsing buffers included)")
  print(f"after   BlockStore.open + CandidateBuilder: start-up {after['startup_s']:8.3f} s, "
        f"RSS growth {mb(after['rss_kb']):9.1f} MiB (anon {mb(after['anon_kb']):.1f})")
  other = mb(after["rss_after_kb"] - after["file_after_kb"])
  print(f"        after the batches: RSS growth {mb(after['rss_after_kb']):.1f} MiB = "
        f"{mb(after['file_after_kb']):.1f} of pages of the store's files + {other:.1f} of "
        "other memory (the batches' buffers, the allocator's caches: not the corpus)")
  at = "" if small == n else f"; {after_small['examples_per_s']:.0f} at {small}"
  print(f"        {after['examples_per_s']:8.0f} examples/s (at {n} blocks{at})")
  hot = build["disk_bytes"] - build["text_bytes"]
  held = (after["file_after_kb"] + max(after["anon_kb"], 0)) * 1024
  print(f"target  resident <= 1.2 x token bytes + 32 B/block = {target / 2**20:.1f} MiB: the "
        f"store's pages after the batches {held / 2**20:.1f} MiB "
        f"({'met' if held <= target else 'NOT met'}); every training page touched "
        f"{hot / 2**20:.1f} MiB (= token bytes + {(hot - token_bytes) / n:.0f} B/block; the "
        "body texts, read only for recall hits, not counted)")
  same = before["features_sha1"] == after_small["features_sha1"]
  print(f"features of before and after at {small} blocks identical: {same}")
  print(f"ratio before / after: start-up x{before['startup_s'] * scale / after['startup_s']:.3g}"
        f", RSS growth x{before['rss_kb'] * scale / max(after['rss_after_kb'], 1):.0f} "
        f"(vs the store's after the batches), examples/s "
        f"x{after['examples_per_s'] / before['examples_per_s']:.2f} (after / before"
        + ("" if small == n else
           f"; x{after_small['examples_per_s'] / before['examples_per_s']:.2f} both at {small}")
        + ")")


if __name__ == "__main__":
  cli.run_main(main)
