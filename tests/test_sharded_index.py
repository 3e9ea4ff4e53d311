"""ShardedIndex: ScaNN in shards searched as one index, against NumPy's exact search (the tie
rule: by score, then the lower block id), an unsharded index, a reloaded one, and the build's
measured peak memory."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from realm_tf.retrieval.index import base as index_base
from realm_tf.retrieval.index import mips_index
from realm_tf.retrieval.index import sharded_index
from realm_tf.retrieval.publication import index_io
from realm_tf.retrieval.publication import publish
from realm_tf.retrieval.publication.handle import IndexHandle

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _clustered(n, d, seed=0, num_clusters=100):
  rng = np.random.default_rng(seed)
  centres = rng.standard_normal((num_clusters, d)).astype(np.float32)
  labels = rng.integers(0, num_clusters, n)
  return centres[labels] + 0.5 * rng.standard_normal((n, d)).astype(np.float32)


def _reference(table, queries, k, deleted=()):
  """NumPy: the top k live rows by inner product, ties by the lower row. Each score is its own
  product and sum, so equal rows score equally: a BLAS matmul need not (on an AMD EPYC,
  OpenBLAS gave two equal rows different float32 scores)."""
  scores = (np.asarray(queries, np.float64)[:, None, :]
            * np.asarray(table, np.float64)[None, :, :]).sum(-1)
  scores[:, np.asarray(deleted, np.int64)] = -np.inf
  order = np.lexsort((np.broadcast_to(np.arange(len(table)), scores.shape), -scores), axis=-1)
  top = order[:, :k]
  return top, np.take_along_axis(scores, top, 1)


def test_rows_per_shard_and_bounds():
  # One piece when it fits; no budget: never shards.
  assert sharded_index.rows_per_shard(1000, 128, 8.0) == 1000
  assert sharded_index.rows_per_shard(10**9, 128, None) == 10**9
  # REALM's 13.3M 128-d blocks in 8 GiB: searchers 2.7 GB resident, shards of ~1.9M.
  rows = sharded_index.rows_per_shard(13_353_718, 128, 8.0)
  assert 1_700_000 < rows < 2_100_000
  assert 13_353_718 * 200 + rows * 128 * 24 <= 8 * 2**30
  bounds = sharded_index.shard_bounds(13_353_718, rows)
  assert bounds[0] == 0 and bounds[-1] == 13_353_718 and len(bounds) - 1 == 7
  assert max(np.diff(bounds)) - min(np.diff(bounds)) <= 1 and max(np.diff(bounds)) <= rows
  # A budget below the searchers' own size: the smallest shards allowed.
  assert sharded_index.rows_per_shard(10**8, 128, 1.0) == sharded_index.MIN_ROWS_PER_SHARD


def test_read_rows_and_stream_npy(tmp_path):
  table = _clustered(1000, 8)
  path = str(tmp_path / "t.npy")
  np.save(path, table)
  mapped = np.load(path, mmap_mode="r")
  np.testing.assert_array_equal(sharded_index.read_rows(mapped, 100, 357), table[100:357])
  extra = _clustered(20, 8, seed=1)
  grown = index_base.RowTable(mapped, extra)
  np.testing.assert_array_equal(sharded_index.read_rows(grown, 990, 1015),
                                np.concatenate([table[990:], extra[:15]]))
  out = str(tmp_path / "out.npy")
  sharded_index.stream_npy(out, grown)
  np.testing.assert_array_equal(np.load(out), np.concatenate([table, extra]))


def test_exact_shards_equal_numpy_with_ties(tmp_path):
  """Shards ScaNN scores exactly (under brute_force_below): the merged top k is NumPy's, tie
  rule included, for rows duplicated across shards."""
  table = _clustered(900, 16)
  table[700:760] = table[100:160]  # Exact ties between shard 0 and shard 2.
  table[450] = table[20]
  queries = np.concatenate([table[100:120], _clustered(30, 16, seed=2)])
  index = mips_index.ShardedIndex.build(table, max_rows=300)
  one = mips_index.ScannIndex.build(table)  # Unsharded, scored exactly as well.
  assert len(index.shards) == 3 and index.settings()["mode"] == "brute_force"
  for k in (1, 10, 50):
    ids, scores = index.search(queries, k)
    want_ids, want_scores = _reference(table, queries, k)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-5)
    np.testing.assert_array_equal(ids, want_ids)
    one_ids, one_scores = one.search(queries, k)
    np.testing.assert_allclose(one_scores, scores, rtol=1e-5)
    np.testing.assert_array_equal(one_ids, ids)
  assert mips_index.ShardedIndex.build(table, max_rows=300).search(queries[:1], 2)[0][0, 1] == 700


def test_hashed_shards_find_the_exact_top_k_as_one_index_does():
  """Shards with hashing and the final exact rescoring of 1,000 candidates: exact search's
  top 10; one unsharded index of the same settings finds at least as few."""
  table = _clustered(9000, 32, seed=3)
  queries = _clustered(50, 32, seed=4)
  settings = mips_index.ScannSettings(brute_force_below=1000, target_recall=None,
                                      reordering_num_neighbors=1000, exact_rescoring=1000)
  sharded = mips_index.ShardedIndex.build(table, settings, max_rows=3000)
  one = mips_index.ScannIndex.build(table, settings)
  assert sharded.settings()["mode"] == "ah" and len(sharded.shards) == 3
  want_ids, want_scores = _reference(table, queries, 10)
  ids, scores = sharded.search(queries, 10)
  np.testing.assert_allclose(scores, want_scores, rtol=1e-5)
  np.testing.assert_array_equal(ids, want_ids)
  one_hits = np.mean([len(set(a) & set(w)) for a, w in zip(one.search(queries, 10)[0].tolist(),
                                                          want_ids.tolist())])
  assert 9.0 <= one_hits <= 10.0


def test_the_tuning_holds_for_the_whole_index():
  """Tuned to recall@10 0.95 on the merged search (not shard by shard): fresh queries reach it
  (less the tests' usual allowance), and the record is the whole index's."""
  table = _clustered(45_000, 32, seed=5, num_clusters=300)
  rng = np.random.default_rng(6)
  fresh = table[rng.integers(0, len(table), 1500)] + 0.25 * rng.standard_normal(
      (1500, 32)).astype(np.float32)
  index = mips_index.ShardedIndex.build(table, mips_index.ScannSettings(tree_above=10_000),
                                        max_rows=15_000)
  s = index.settings()
  assert s["mode"] == "tree_ah" and len(s["shards"]) == 3
  assert s["tuning"]["target_reached"] and s["tuning"]["recall"] >= 0.95
  for shard in index.shards:  # Every shard searches with the whole index's choice.
    assert shard.settings()["num_leaves_to_search"] == s["num_leaves_to_search"]
    assert shard.settings()["reordering_num_neighbors"] == s["reordering_num_neighbors"]
  assert mips_index.measure_recall(index, table, fresh) >= 0.93


def test_save_load_updates_and_hot_swap(tmp_path):
  table = _clustered(1200, 16, seed=7)
  queries = _clustered(40, 16, seed=8)
  index = mips_index.ShardedIndex.build(table, max_rows=500)
  assert [s["num_blocks"] for s in index.settings()["shards"]] == [400, 400, 400]
  path = str(tmp_path / "a")
  index.save(path)
  loaded = index_io.load_index(path, expected_dim=16)
  assert isinstance(loaded, mips_index.ShardedIndex)
  assert mips_index.searcher_bytes(path) > 0
  for a, b in zip(index.search(queries, 10), loaded.search(queries, 10)):
    np.testing.assert_array_equal(a, b)
  # Updates across shards: appended rows join the last shard, deletions hit every shard.
  new = _clustered(30, 16, seed=9) * 3
  rows = loaded.append(new)
  np.testing.assert_array_equal(rows, np.arange(1200, 1230))
  gone = [5, 450, 1100, 1201]
  loaded.delete(gone)
  grown = np.concatenate([table, new])
  want = _reference(grown, queries, 10, gone)[0]
  np.testing.assert_array_equal(loaded.search(queries, 10)[0], want)
  np.testing.assert_array_equal(loaded.search(new[2:3], 1)[0], [[1202]])
  with pytest.raises(ValueError, match="deleted already"):
    loaded.delete([450])
  loaded, _ = loaded.maintained()
  path_b = str(tmp_path / "b")
  loaded.save(path_b)
  again = index_io.load_index(path_b)
  assert again.num_blocks == 1230 and again.deleted.tolist() == sorted(gone)
  np.testing.assert_array_equal(again.search(queries, 10)[0], want)
  np.testing.assert_array_equal(np.asarray(again.embeddings), grown)
  # The handle swaps a newer sharded publication in as one.
  index_dir = str(tmp_path / "index")
  with publish.lock(index_dir):
    publish.publish(index, index_dir, 10, {"corpus_fingerprint": "x"})
  handle = IndexHandle(index_dir, expected_dim=16, poll_seconds=0.05)
  handle.wait_for_first()
  np.testing.assert_array_equal(handle.search(queries, 10)[0], _reference(table, queries, 10)[0])
  with publish.lock(index_dir):
    publish.publish(again, index_dir, 20, {"corpus_fingerprint": "x"})
  for _ in range(200):
    if handle.maybe_swap():
      break
    handle._stop.wait(0.05)  # pylint: disable=protected-access
  assert handle.step == 20
  np.testing.assert_array_equal(handle.search(queries, 10)[0], want)
  np.testing.assert_array_equal(handle.embeddings(), grown)
  handle.close()


def test_a_shard_that_does_not_tile_is_refused(tmp_path):
  index = mips_index.ShardedIndex.build(_clustered(600, 8), max_rows=300)
  path = str(tmp_path / "a")
  index.save(path)
  manifest = json.load(open(os.path.join(path, "manifest.json")))
  manifest["settings"]["shards"][1]["start"] = 299
  json.dump(manifest, open(os.path.join(path, "manifest.json"), "w"))
  with pytest.raises(mips_index.errors.IndexFormatError, match="do not tile"):
    index_io.load_index(path)


_CHILD = r"""
import json, sys, threading, time
import numpy as np
from realm_tf.retrieval.index import mips_index, sharded_index
sharded_index.MIN_ROWS_PER_SHARD = 1000
path, budget = sys.argv[1], float(sys.argv[2])
table = np.load(path, mmap_mode="r")
def rss():
  for line in open("/proc/self/status"):
    if line.startswith("VmRSS:"):
      return int(line.split()[1]) * 1024
peak = [rss()]
base = peak[0]
done = threading.Event()
def watch():
  while not done.wait(0.01):
    peak[0] = max(peak[0], rss())
threading.Thread(target=watch, daemon=True).start()
settings = mips_index.ScannSettings(target_recall=None, build_memory_gib=budget or None)
index = mips_index.build_index(table, "scann", settings)
done.set()
peak[0] = max(peak[0], rss())
print(json.dumps({"shards": len(index.settings().get("shards", [0])),
                  "grew": peak[0] - base}))
"""


def _build_peak(path, budget):
  out = subprocess.run([sys.executable, "-c", _CHILD, path, str(budget)], cwd=REPO, check=True,
                       capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3"))
  return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_small_budget_shards_and_bounds_the_build_memory(tmp_path):
  """The same 160k x 64 file (41 MB) built in one piece and under a budget that asks for
  8 shards: the sharded build's resident growth (measured) stays under the budget's bound and
  well under the one-piece build's."""
  n, d = 160_000, 64
  path = str(tmp_path / "emb.npy")
  np.save(path, _clustered(n, d, seed=10, num_clusters=400))
  rows = n // 8
  budget = (n * sharded_index._SEARCHER_BYTES_PER_BLOCK +  # pylint: disable=protected-access
            rows * d * sharded_index._BUILD_BYTES_PER_FLOAT) / 2**30  # pylint: disable=protected-access
  whole = _build_peak(path, 0)
  sharded = _build_peak(path, budget)
  assert whole["shards"] == 1 and sharded["shards"] == 8
  print(f"build growth: one piece {whole['grew'] / 2**20:.0f} MiB, 8 shards "
        f"{sharded['grew'] / 2**20:.0f} MiB (budget {budget * 1024:.0f} MiB)")
  assert sharded["grew"] <= budget * 2**30 + 16 * 2**20  # Allocator slack.
  assert sharded["grew"] < 0.6 * whole["grew"]
