r"""Benchmark of the retrieval side: ScaNN vs exact MIPS, and the corpus embedder's overhead.

    python -m experiments.benchmarks.bench_index --sizes=100000,1000000

For each size: random Gaussian 128-d block embeddings (the hard case for ScaNN) and queries;
ScaNN with the default settings (``ScannSettings()``) against exact blocked brute force, both
timed in the same run on the same machine: build seconds, bytes per block on disk, queries per
second at batch 1 and batch 128, ScaNN recall@10. Then the corpus embedder (``embed_corpus``:
TFRecords -> tf.data -> packing -> model) against the raw Keras forward pass over the very
same batches, already in memory: the difference is the input pipeline's overhead.
"""

import os
import shutil
import tempfile
import time

from absl import flags
import numpy as np
import tensorflow as tf

from realm_tf.binaries import cli
from realm_tf.retrieval.index import mips_index
from realm_tf.retrieval.publication import corpus_embedding
from realm_tf.retrieval.publication import testing

flags.DEFINE_list("sizes", ["100000", "1000000"], "Numbers of blocks.")
flags.DEFINE_integer("dim", 128, "Embedding dimension.")
flags.DEFINE_integer("num_queries", 1000, "Queries for recall and batch-128 timing.")
flags.DEFINE_integer("single_queries", 200, "Queries timed one at a time (batch 1).")
flags.DEFINE_integer("embed_blocks", 2048, "Blocks for the embedding benchmark (0: skip).")
flags.DEFINE_integer("embed_hidden", 128, "Hidden size of the 2-layer BERT used there.")
flags.DEFINE_integer("embed_seq_length", 128, "Block length used there.")
flags.DEFINE_integer("embed_batch", 64, "Batch size used there.")
flags.DEFINE_bool("flat_row", False, "Also time ScaNN without its tree (use_tree=False) for "
                  "sizes where the default uses one: recall vs speed on random vectors.")
flags.DEFINE_bool("exact_row", True, "Time exact search too.")
flags.DEFINE_string("work_dir", None, "Scratch directory (default: a temporary one).")
FLAGS = flags.FLAGS


def _dir_bytes(path):
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path)
             for f in files)


def _qps(index, queries, batch, limit):
  queries = queries[:limit]
  index.search(queries[:batch], 10)  # Warm-up.
  start = time.perf_counter()
  for i in range(0, len(queries), batch):
    index.search(queries[i:i + batch], 10)
  return len(queries) / (time.perf_counter() - start)


def bench_index(n, dim, work_dir, values):
  rng = np.random.default_rng(0)
  emb = rng.standard_normal((n, dim), dtype=np.float32)
  queries = rng.standard_normal((values.num_queries, dim), dtype=np.float32)
  rows = {}
  start = time.perf_counter()
  exact = mips_index.BruteForceIndex(emb)
  exact_build = time.perf_counter() - start
  exact_ids, _ = exact.search(queries, 10)
  candidates = [("scann", mips_index.ScannSettings())]
  if values.flat_row and "num_leaves" in mips_index.ScannSettings().resolve(n):
    candidates.append(("flat", mips_index.ScannSettings(use_tree=False)))
  built = []
  for name, settings in candidates:
    start = time.perf_counter()
    index = mips_index.ScannIndex.build(emb, settings)
    built.append((name, index, time.perf_counter() - start))
  if values.exact_row:
    built.append(("exact", exact, exact_build))
  for name, index, build in built:
    recall = mips_index.recall_at_k(index.search(queries, 10)[0], exact_ids)
    path = os.path.join(work_dir, f"{name}-{n}")
    index.save(path)
    on_disk = _dir_bytes(path)
    extra = _dir_bytes(os.path.join(path, mips_index.SCANN_DIR)) if name != "exact" else on_disk
    shutil.rmtree(path)
    rows[name] = dict(
        build_s=build, qps1=_qps(index, queries, 1, values.single_queries),
        qps128=_qps(index, queries, 128, len(queries)), recall=recall,
        bytes_per_block=on_disk / n, index_bytes_per_block=extra / n,
        settings=index.settings())
  return rows


def bench_embedding(work_dir, values):
  vocab = testing.write_vocab(os.path.join(work_dir, "vocab.txt"))
  blocks_dir = os.path.join(work_dir, "blocks")
  # Long bodies, so that blocks fill the sequence length as real ones do.
  testing.make_corpus(blocks_dir, vocab, values.embed_blocks,
                      block_seq_length=values.embed_seq_length, num_shards=4,
                      min_words=values.embed_seq_length, max_words=2 * values.embed_seq_length)
  trainer = testing.TinyTrainer(os.path.join(work_dir, "model"), vocab,
                                hidden_size=values.embed_hidden, projection_size=128,
                                block_seq_length=values.embed_seq_length)
  embedder = trainer.block_embedder
  seq, batch = values.embed_seq_length, values.embed_batch

  def pipeline():
    return corpus_embedding.embed_corpus(embedder, blocks_dir, seq, trainer.config.vocab_file,
                                         batch_size=batch, progress=False)

  pipeline()  # Trace once.
  start = time.perf_counter()
  pipeline()
  pipeline_s = time.perf_counter() - start

  batches = [inputs for _, inputs in corpus_embedding.block_dataset(
      blocks_dir, seq, batch, trainer.config.vocab_file)]
  forward = tf.function(lambda x: embedder(x, training=False))
  forward(batches[0]).numpy()
  start = time.perf_counter()
  for inputs in batches:
    forward(inputs).numpy()
  raw_s = time.perf_counter() - start
  return values.embed_blocks / pipeline_s, values.embed_blocks / raw_s


def main(argv):
  del argv
  work_dir = FLAGS.work_dir or tempfile.mkdtemp(prefix="bench_index_")
  os.makedirs(work_dir, exist_ok=True)
  print(f"machine: {os.cpu_count()} CPUs visible; numbers are indicative on a shared host")
  print(f"{'blocks':>9} {'method':>6} {'build s':>8} {'B/block':>8} {'(index)':>8} "
        f"{'qps@1':>8} {'qps@128':>9} {'recall@10':>9}")
  for size in FLAGS.sizes:
    n = int(float(size))
    rows = bench_index(n, FLAGS.dim, work_dir, FLAGS)
    for name, r in rows.items():
      print(f"{n:>9} {name:>6} {r['build_s']:>8.1f} {r['bytes_per_block']:>8.0f} "
            f"{r['index_bytes_per_block']:>8.0f} {r['qps1']:>8.0f} {r['qps128']:>9.0f} "
            f"{r['recall']:>9.4f}", flush=True)
    for name, s in rows.items():
      if name != "exact" and "exact" in rows:
        e = rows["exact"]
        print(f"{n:>9} ratio {name}/exact: qps@1 x{s['qps1'] / e['qps1']:.1f}, "
              f"qps@128 x{s['qps128'] / e['qps128']:.1f}; settings {s['settings']}", flush=True)
  if FLAGS.embed_blocks:
    pipe, raw = bench_embedding(work_dir, FLAGS)
    print(f"embedding {FLAGS.embed_blocks} blocks of {FLAGS.embed_seq_length} tokens, 2-layer "
          f"BERT hidden {FLAGS.embed_hidden}, batch {FLAGS.embed_batch}: embed_corpus "
          f"{pipe:.0f} blocks/s, raw Keras forward on the same batches {raw:.0f} blocks/s "
          f"(pipeline overhead {100 * (raw / pipe - 1):+.1f}%)", flush=True)
  if not FLAGS.work_dir:
    shutil.rmtree(work_dir, ignore_errors=True)


if __name__ == "__main__":
  cli.run_main(main)
