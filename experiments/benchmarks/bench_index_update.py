r"""Benchmark: upserting 1% of a 10^5-block corpus against a full rebuild, embedding included.

    nice -n 10 python -m experiments.benchmarks.bench_index_update \
        --num_blocks=100000 --fraction=0.01

Everything in a temporary directory: a corpus of ``--num_blocks`` random-word blocks
(``retrieval.publication.testing.make_corpus``, 32 wordpieces each), a model with the demo's towers
(2 layers, 64 wide, projection 128; untrained weights embed as fast as trained ones) and its
ScaNN index, built once (``realm-index build``'s code) with the block store opened (a serving
deployment has both). Then, timed:

1. **update (cold)**: ``--fraction`` x ``num_blocks`` new one-block documents (JSON lines, what
   ``realm-index upsert --input`` reads) through a new ``Updater`` in this process, whose
   modules (TensorFlow, realm_tf, spaCy) are imported: what ``realm-index upsert`` does after
   its imports. The blocks cut by ``data_prep.blocks``' rules, the corpus's next version
   written, the block store extended, the block tower built, restored and checked, only the
   new blocks embedded (one trace), ScaNN's ``upsert``, the health rule, ``step-N-u1``
   published;
2. **update (warm)**: another ``--fraction`` through the same ``Updater`` (as ``realm-serve``'s
   ``POST /documents``: tower restored, functions traced);
3. **full rebuild**: a new ``Refresher`` builds the updated corpus from scratch in this
   process, as ``realm-index build`` does: restore, embed every block, ScaNN build and recall
   tuning, the recall check, publish;
4. **the two commands as processes** (imports included, wall clock): ``realm-index upsert``
   of a third ``--fraction``, then ``realm-index build`` of the resulting corpus into another
   index directory.

Prints the times, the ratios rebuild / update, and the recall@10 of the updated and the
rebuilt index against exact search over the same live rows (the from-scratch embedding) on
the same queries (query-tower embeddings of sample blocks, as the refresher measures it).
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
import spacy  # pylint: disable=unused-import  # Imported: the cold update excludes imports.

from realm_tf.binaries import cli
from realm_tf.data import block_store
from realm_tf.retrieval.index import mips_index
from realm_tf.retrieval.index import tuning as index_tuning
from realm_tf.retrieval.publication import index_io
from realm_tf.retrieval.publication import publish
from realm_tf.retrieval.publication import refresher
from realm_tf.retrieval.publication import testing
from realm_tf.retrieval.publication import updates

flags.DEFINE_integer("num_blocks", 100_000, "Blocks in the corpus.")
flags.DEFINE_float("fraction", 0.01, "Fraction of the corpus each update adds.")
flags.DEFINE_integer("queries", 1000, "Queries for the recall comparison.")
flags.DEFINE_string("work_dir", None, "Where to build (default: a temporary directory).")

FLAGS = flags.FLAGS


def _documents(path, n, seed):
  titles, bodies = testing.random_texts(n, seed=seed, min_words=8, max_words=20)
  with open(path, "w", encoding="utf-8") as f:
    for t, b in zip(titles, bodies):
      f.write(json.dumps({"title": f"new {seed} {t}", "text": b + "."}) + "\n")
  return path


def _wall(command):
  start = time.time()
  subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  return time.time() - start


def _recall(index, table, live, queries):
  kth = index_tuning.exact_kth_scores(table, queries, 10,
                                      deleted=np.setdiff1d(np.arange(len(table)), live))
  return index_tuning.tie_recall(table, queries, index.search(queries, 10)[0], kth, 10)


def main(argv):
  del argv
  root = FLAGS.work_dir or tempfile.mkdtemp(prefix="bench_index_update_")
  os.makedirs(root, exist_ok=True)
  vocab = testing.write_vocab(os.path.join(root, "vocab.txt"))
  blocks, model, index = (os.path.join(root, n) for n in ("blocks", "model", "index"))
  start = time.time()
  testing.make_corpus(blocks, vocab, FLAGS.num_blocks, num_shards=8, min_words=8,
                      max_words=30)
  trainer = testing.TinyTrainer(model, vocab, hidden_size=64, projection_size=128,
                                query_seq_length=32, block_seq_length=32)
  trainer.perturb(0.3)
  trainer.save(1)
  options = refresher.BuildOptions(index_type="scann", progress=False, tensorboard_dir="")
  refresher.build_index_for_checkpoint(None, model, blocks, index, options)
  block_store.BlockStore.open(blocks)
  built = publish.read_latest(index)
  tuning = mips_index.read_manifest(built)["settings"].get("tuning", {})
  print(f"set-up: {FLAGS.num_blocks} blocks, index {built} "
        f"({mips_index.read_manifest(built)['settings']['mode']}) in "
        f"{time.time() - start:.0f} s", flush=True)

  m = int(FLAGS.fraction * FLAGS.num_blocks)
  first = _documents(os.path.join(root, "first.jsonl"), m, seed=1)
  second = _documents(os.path.join(root, "second.jsonl"), m, seed=2)
  start = time.time()
  updater = updates.Updater(index, model)
  cold = updater.upsert(updates.read_documents(first))
  cold_seconds = time.time() - start
  start = time.time()
  warm = updater.upsert(updates.read_documents(second))
  warm_seconds = time.time() - start
  updated = index_io.load_index(warm.index)
  print(f"update (cold) {len(cold.added)} blocks: {cold_seconds:.2f} s {cold.seconds}")
  print(f"update (warm) {len(warm.added)} blocks: {warm_seconds:.2f} s {warm.seconds}; "
        f"maintenance: {warm.maintenance}", flush=True)

  trainer.save(2)  # The same weights: the rebuild embeds as the updates did.
  start = time.time()
  build = refresher.Refresher(model, blocks, index, options)
  rebuilt_path = build.build(refresher.find_checkpoint(model))
  rebuild_seconds = time.time() - start
  rebuilt = index_io.load_index(rebuilt_path, load_embeddings=True)
  table = np.asarray(rebuilt.embeddings)
  live = np.setdiff1d(np.arange(len(table)), rebuilt.deleted)
  queries = build.sample_queries(FLAGS.queries)
  r_updated, r_rebuilt = _recall(updated, table, live, queries), _recall(rebuilt, table, live,
                                                                         queries)
  print(f"full rebuild of {len(table)} blocks: {rebuild_seconds:.2f} s", flush=True)

  third = _documents(os.path.join(root, "third.jsonl"), m, seed=3)
  command = [sys.executable, "-m", "realm_tf.binaries.index"]
  upsert_process = _wall(command + ["upsert", f"--index_dir={index}", f"--input={third}"])
  build_process = _wall(command + ["build", f"--model_dir={model}", f"--blocks_dir={blocks}",
                                   f"--index_dir={os.path.join(root, 'index_cli')}"])
  print()
  print("| what | blocks | seconds | rebuild / this |")
  print("|---|---:|---:|---:|")
  print(f"| update, cold (a new Updater: realm-index upsert after its imports) | {m} | "
        f"{cold_seconds:.2f} | {rebuild_seconds / cold_seconds:.1f}x |")
  print(f"| update, warm (the same Updater: realm-serve's POST /documents) | {m} | "
        f"{warm_seconds:.2f} | {rebuild_seconds / warm_seconds:.1f}x |")
  print(f"| full rebuild (realm-index build's work) | {len(table)} | {rebuild_seconds:.2f} | "
        "1.0x |")
  print(f"| `realm-index upsert` process, imports included | {m} | {upsert_process:.2f} | "
        f"{build_process / upsert_process:.1f}x (of the build process) |")
  print(f"| `realm-index build` process, imports included | {len(table) + m} | "
        f"{build_process:.2f} | 1.0x |")
  print()
  print(f"recall@10 on {len(queries)} query-tower queries against exact search over the "
        f"{len(live)} live blocks: updated index {r_updated:.4f}, rebuilt {r_rebuilt:.4f} "
        f"(difference {r_updated - r_rebuilt:+.4f}; the first build's tuning: target "
        f"{tuning.get('target_recall')}, margin {tuning.get('margin')}, sample lower bound "
        f"{tuning.get('recall_lower_bound')})")
  if not FLAGS.work_dir:
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
  cli.run_main(main)
