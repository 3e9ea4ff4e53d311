"""MIPS indexes: exactness of brute force, ScaNN recall, save/load round trips, clear errors."""

import os
import shutil
import tempfile
import time

from absl.testing import parameterized
import numpy as np
import pytest
import tensorflow as tf

from realm_tf.retrieval import errors
from realm_tf.retrieval.index import mips_index
from realm_tf.retrieval.publication import index_io


def _random(n, d, seed=0):
  return np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)


def _clustered(n, d=128, num_clusters=400, seed=0):
  """Gaussian clusters (unequal sizes and spreads) and queries near the data.

  Unnormalized, as REALM's inner-product scores are; see bench_index_scale for the same.
  """
  rng = np.random.default_rng(seed)
  centres = rng.standard_normal((num_clusters, d)).astype(np.float32)
  spread = rng.uniform(0.3, 0.9, num_clusters).astype(np.float32)
  weights = rng.lognormal(0.0, 1.0, num_clusters)
  labels = rng.choice(num_clusters, n, p=weights / weights.sum())
  emb = centres[labels] + spread[labels, None] * rng.standard_normal((n, d)).astype(np.float32)

  def queries(m, seed):
    r = np.random.default_rng(seed)
    rows = r.integers(0, n, m)
    noise = r.standard_normal((m, d)).astype(np.float32)
    return emb[rows] + 0.5 * spread[labels[rows], None] * noise
  return emb, queries


def _tie_recalls_numpy(queries, embeddings, ids, k=10):
  """Per-query recall@k against NumPy exact search; a result scoring at least the exact k-th
  counts."""
  scores = queries @ embeddings.T
  kth = np.sort(scores, axis=1)[:, -k][:, None]
  got = np.take_along_axis(scores, ids[:, :k], 1)
  return (got >= kth - 1e-5 * np.maximum(1.0, np.abs(kth))).sum(1) / k


def _tie_recall_numpy(queries, embeddings, ids, k=10):
  return float(_tie_recalls_numpy(queries, embeddings, ids, k).mean())


def _lower_bound_numpy(per_query, z):
  return per_query.mean() - z * per_query.std(ddof=1) / np.sqrt(len(per_query))


def _numpy_topk(queries, embeddings, k):
  scores = queries @ embeddings.T
  ids = np.argsort(-scores, axis=1, kind="stable")[:, :k]
  return ids, np.take_along_axis(scores, ids, 1)


class BruteForceIndexTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters((1, 1000), (7, 64), (10, 1000))
  def test_matches_numpy(self, k, rows_per_block):
    emb, queries = _random(900, 24), _random(13, 24, seed=1)
    ids, scores = mips_index.BruteForceIndex(emb, rows_per_block=rows_per_block).search(
        queries, k)
    want_ids, want_scores = _numpy_topk(queries, emb, k)
    self.assertAllEqual(ids, want_ids)
    self.assertAllClose(scores, want_scores, rtol=1e-5, atol=1e-5)
    self.assertEqual(ids.dtype, np.int64)

  def test_bad_k_and_queries(self):
    index = mips_index.BruteForceIndex(_random(5, 4))
    with self.assertRaisesRegex(ValueError, r"k must lie in \[1, 5\]"):
      index.search(_random(1, 4), 6)
    with self.assertRaisesRegex(errors.DimensionMismatchError, "dimension 3 but the index"):
      index.search(_random(1, 3), 2)

  def test_empty_corpus(self):
    with self.assertRaisesRegex(errors.EmptyCorpusError, "empty corpus"):
      mips_index.BruteForceIndex(np.zeros([0, 8], np.float32))
    with self.assertRaisesRegex(errors.EmptyCorpusError, "empty corpus"):
      mips_index.ScannIndex.build(np.zeros([0, 8], np.float32))


class ScannSettingsTest(tf.test.TestCase):

  def test_rule_by_size(self):
    s = mips_index.ScannSettings()
    self.assertEqual(s.resolve(100)["mode"], "brute_force")
    self.assertEqual(s.resolve(10_000)["mode"], "ah")
    self.assertEqual(s.resolve(100_000)["mode"], "tree_ah")
    big = s.resolve(1_000_000)
    # 100 leaves: only the starting point; the build tunes it (and the reordering depth).
    self.assertEqual((big["mode"], big["num_leaves"], big["num_leaves_to_search"]),
                     ("tree_ah", 1000, 100))
    self.assertTrue(big["tune_leaves"] and big["tune_reordering"])
    self.assertEqual((big["reordering_dtype"], big["reordering_num_neighbors"]), ("int8", 1000))
    fixed = mips_index.ScannSettings(num_leaves_to_search=7, reordering_num_neighbors=60,
                                     target_recall=None).resolve(1_000_000)
    self.assertEqual((fixed["num_leaves_to_search"], fixed["reordering_num_neighbors"],
                      fixed["tune_leaves"], fixed["tune_reordering"]), (7, 60, False, False))
    self.assertEqual(s.resolve(13_353_718)["num_leaves"], 3654)
    forced = mips_index.ScannSettings(use_tree=True, num_leaves=40).resolve(5000)
    self.assertEqual((forced["num_leaves"], forced["num_leaves_to_search"]), (40, 4))


class ScannIndexTest(tf.test.TestCase, parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)

  @parameterized.named_parameters(
      ("brute_force", 500, mips_index.ScannSettings()),
      ("ah", 5000, mips_index.ScannSettings()),
      ("tree_ah", 5000, mips_index.ScannSettings(use_tree=True, num_leaves=50)))
  def test_save_load_round_trip(self, n, settings):
    emb, queries = _random(n, 32), _random(20, 32, seed=1)
    index = mips_index.ScannIndex.build(emb, settings)
    ids, scores = index.search(queries, 10)
    # Written under one name, renamed, then loaded: ScaNN's paths are relative.
    index.save(os.path.join(self.dir, "tmp"), {"corpus_fingerprint": "abc"})
    os.rename(os.path.join(self.dir, "tmp"), os.path.join(self.dir, "final"))
    loaded = index_io.load_index(os.path.join(self.dir, "final"), expected_dim=32,
                                   expected_fingerprint="abc")
    self.assertIsInstance(loaded, mips_index.ScannIndex)
    self.assertEqual(loaded.settings(), index.settings())
    ids2, scores2 = loaded.search(queries, 10)
    self.assertAllEqual(ids, ids2)
    self.assertAllEqual(scores, scores2)
    one_ids, _ = loaded.search(queries[:1], 10)  # The single-query path agrees too.
    self.assertAllEqual(one_ids, ids[:1])
    self.assertAllClose(np.load(os.path.join(self.dir, "final", "embeddings.npy")), emb)
    # A sanity check on 20 fresh queries (200 neighbours): the tuned target (0.95 on the
    # tuning sample) is tested on its own below; held out, random vectors give 0.94-0.97.
    self.assertGreaterEqual(mips_index.measure_recall(loaded, emb, queries), 0.9)
    if n < mips_index.ScannSettings().brute_force_below:  # Exact scoring: the numpy answer.
      self.assertAllEqual(ids, _numpy_topk(queries, emb, 10)[0])

  def test_brute_force_round_trip(self):
    emb, queries = _random(300, 8), _random(5, 8, seed=1)
    index = mips_index.BruteForceIndex(emb)
    index.save(self.dir, {"corpus_fingerprint": "abc"})
    loaded = index_io.load_index(self.dir, expected_dim=8, expected_fingerprint="abc")
    self.assertIsInstance(loaded, mips_index.BruteForceIndex)
    for a, b in zip(index.search(queries, 4), loaded.search(queries, 4)):
      self.assertAllEqual(a, b)

  def test_load_refuses_mismatch(self):
    mips_index.BruteForceIndex(_random(50, 8)).save(self.dir, {"corpus_fingerprint": "abc"})
    with self.assertRaisesRegex(errors.DimensionMismatchError,
                                "has dimension 8 but the model's embeddings have dimension 128"):
      index_io.load_index(self.dir, expected_dim=128)
    with self.assertRaisesRegex(errors.FingerprintMismatchError,
                                "built over corpus abc but this run uses corpus def"):
      index_io.load_index(self.dir, expected_fingerprint="def")

  def test_load_refuses_incomplete(self):
    mips_index.ScannIndex.build(_random(3000, 8)).save(self.dir)
    os.remove(os.path.join(self.dir, "manifest.json"))
    with self.assertRaisesRegex(errors.IndexFormatError, "no complete index"):
      index_io.load_index(self.dir)
    with self.assertRaisesRegex(errors.IndexFormatError, "not found"):
      index_io.load_index(os.path.join(self.dir, "nope"))

  def test_recall_counts_ties(self):
    emb = np.ones([20, 4], np.float32)  # Every block ties with every other.
    index = mips_index.BruteForceIndex(emb)
    self.assertEqual(mips_index.measure_recall(index, emb, _random(3, 4), k=5), 1.0)

  def test_tuned_index_on_clustered_vectors(self):
    """Acceptance: the default build tunes itself to recall@10 >= 0.95 (NumPy exact search),
    records the chosen leaves and depth, keeps < 200 bytes per block in the searcher (no float
    copy), and a reload searches with the recorded values and returns the same results."""
    n = 30_000
    emb, make_queries = _clustered(n)
    tune_q, test_q = make_queries(2000, seed=1), make_queries(2000, seed=2)
    index = mips_index.ScannIndex.build(emb, tuning_queries=tune_q)
    settings = index.settings()
    self.assertEqual(settings["mode"], "tree_ah")
    tuning = settings["tuning"]
    leaves, reorder = settings["num_leaves_to_search"], settings["reordering_num_neighbors"]
    self.assertTrue(tuning["target_reached"])
    self.assertEqual((tuning["target_recall"], tuning["k"], tuning["query_source"]),
                     (0.95, 10, "given"))
    self.assertLess(leaves, settings["num_leaves"])  # A real choice, not "search everything".
    self.assertLessEqual(reorder, settings["max_reordering_num_neighbors"])
    ids, scores = index.search(tune_q, 10)
    per_query = _tie_recalls_numpy(tune_q, emb, ids)
    recall, bound = per_query.mean(), _lower_bound_numpy(per_query, tuning["confidence"])
    self.assertAlmostEqual(recall, tuning["recall"], places=3)
    self.assertAlmostEqual(bound, tuning["recall_lower_bound"], places=3)
    self.assertEqual(tuning["confidence"], 2.0)
    self.assertGreaterEqual(bound, 0.95 + tuning["margin"])
    held_out = _tie_recall_numpy(test_q, emb, index.search(test_q, 10)[0])
    print(f"tuned ScaNN on {n} clustered: {leaves}/{settings['num_leaves']} leaves, reorder "
          f"{reorder}; recall@10 {recall:.4f} (tuning, lower bound {bound:.4f}), "
          f"{held_out:.4f} (held out)")
    # Fresh queries reach the target: the lower bound holds (five builds: 0.959-0.963 on
    # 3,000 fresh queries; 2,000 estimate it to +- 0.004, one standard error).
    self.assertGreaterEqual(held_out, 0.945)
    # One leaf fewer misses the aim (the smallest that reaches it, on the same sample).
    fewer = _tie_recalls_numpy(tune_q, emb, index.search(
        tune_q, 10, leaves_to_search=max(1, leaves - 1), reordering_num_neighbors=reorder)[0])
    self.assertLess(_lower_bound_numpy(fewer, tuning["confidence"]), 0.95 + tuning["margin"])

    path = os.path.join(self.dir, "clustered")
    index.save(path, {"corpus_fingerprint": "abc"})
    manifest = mips_index.read_manifest(path)
    self.assertEqual(manifest["settings"]["num_leaves_to_search"], leaves)
    self.assertEqual(manifest["settings"]["reordering_num_neighbors"], reorder)
    self.assertEqual(manifest["settings"]["tuning"]["recall"], tuning["recall"])
    # Bytes per block of the searcher: its saved assets, the float embeddings excluded.
    per_block = mips_index.searcher_bytes(path) / n
    self.assertLess(per_block, 200)
    scann_files = os.listdir(os.path.join(path, mips_index.SCANN_DIR))
    self.assertNotIn("dataset.npy", scann_files)  # ScaNN's float32 copy.
    self.assertIn("int8_dataset.npy", scann_files)
    print(f"searcher bytes per block: {per_block:.1f} ({sorted(scann_files)})")

    loaded = index_io.load_index(path, expected_dim=128, expected_fingerprint="abc")
    self.assertEqual(loaded.settings(), settings)
    ids2, scores2 = loaded.search(tune_q, 10)
    self.assertAllEqual(ids2, ids)
    self.assertAllEqual(scores2, scores)
    explicit, _ = loaded.search(tune_q, 10, leaves_to_search=leaves,
                                reordering_num_neighbors=reorder)
    self.assertAllEqual(explicit, ids)  # The reload searches with the recorded values.
    self.assertAllEqual(loaded.search(tune_q[:1], 10)[0], ids[:1])
    # Its float embeddings are a memory map of the saved file, not a resident copy.
    self.assertIsInstance(loaded.embeddings, np.memmap)
    self.assertAllEqual(loaded.embeddings[ids[0]], emb[ids[0]])
    self.assertIsInstance(index.embeddings, np.memmap)  # After save, the built one's too.

  def test_tuning_on_own_rows_and_fixed_values(self):
    """Without queries the build tunes on sample rows (each leaving itself out); values given
    explicitly are kept; no target: no tuning."""
    emb, make_queries = _clustered(20_000, d=32, num_clusters=200, seed=3)
    index = mips_index.ScannIndex.build(emb)
    tuning = index.settings()["tuning"]
    self.assertEqual((tuning["query_source"], tuning["queries"]), ("embeddings", 2000))
    self.assertGreaterEqual(tuning["recall_lower_bound"], 0.95 + tuning["margin"])
    # Fresh queries near the data (four builds: 0.952-0.958 on 3,000; +- 0.004 at 2,000).
    test_q = make_queries(2000, seed=4)
    self.assertGreaterEqual(_tie_recall_numpy(test_q, emb, index.search(test_q, 10)[0]), 0.94)
    fixed = mips_index.ScannIndex.build(emb, mips_index.ScannSettings(
        num_leaves_to_search=5, tuning_queries=100)).settings()
    self.assertEqual(fixed["num_leaves_to_search"], 5)
    self.assertIn("tuning", fixed)  # The reordering depth is still tuned.
    off = mips_index.ScannIndex.build(emb, mips_index.ScannSettings(target_recall=None))
    self.assertNotIn("tuning", off.settings())
    self.assertEqual(off.settings()["reordering_num_neighbors"], 1000)
    with self.assertRaisesRegex(ValueError, "reordering_dtype"):
      mips_index.ScannSettings(reordering_dtype="int4").resolve(5000)

  def test_handle_serves_memory_mapped_embeddings(self):
    """IndexHandle: no float32 copy resident in either index around a swap; embeddings() is a
    read-only memory map of the current index's file."""
    from realm_tf.retrieval.publication import handle as handle_lib  # pylint: disable=g-import-not-at-top
    from realm_tf.retrieval.publication import publish  # pylint: disable=g-import-not-at-top
    index_dir = os.path.join(self.dir, "index")
    first, second = _random(3000, 16, seed=5), _random(3000, 16, seed=6)
    publish.publish(mips_index.ScannIndex.build(first), index_dir, 1)
    handle = handle_lib.IndexHandle(index_dir, expected_dim=16, poll_seconds=0.05)
    self.addCleanup(handle.close)
    handle.wait_for_first()
    table = handle.embeddings()
    self.assertIsInstance(table, np.memmap)
    self.assertFalse(table.flags.writeable)
    self.assertAllEqual(table[[3, 7]], first[[3, 7]])
    publish.publish(mips_index.ScannIndex.build(second), index_dir, 2)
    deadline = time.time() + 30
    while not handle.maybe_swap():
      self.assertLess(time.time(), deadline)
      time.sleep(0.05)
    self.assertEqual(handle.step, 2)
    self.assertIsInstance(handle.index._embeddings, np.memmap)  # pylint: disable=protected-access
    self.assertAllEqual(handle.embeddings()[[3, 7]], second[[3, 7]])
    self.assertAllEqual(table[[3, 7]], first[[3, 7]])  # The old map stays valid.

  @pytest.mark.slow
  def test_default_recall_on_100k_random_vectors(self):
    """Acceptance: recall@10 >= 0.95 with the default settings, 100,000 x 128 Gaussian."""
    self._check_default_recall(100_000)

  def test_default_recall_on_20k_random_vectors(self):
    """The 100k test's fast sibling: the same build and check at the smallest size that gets
    the tree (ScannSettings.tree_above), 20,000 x 128 Gaussian."""
    self.assertEqual(mips_index.ScannSettings().tree_above, 20_000)
    self._check_default_recall(20_000)

  def _check_default_recall(self, n):
    # 2,000 queries, as many as the build tunes on: recall on them has a standard error of
    # ~0.0015, so the 0.95 bar sits ~5 SE under the ~0.957 the tuned index gives. With 200
    # queries (SE ~0.005) a healthy build fell under it about one run in 15: 0.949 in CI on
    # 2026-12-05, while 3,000 fresh queries on builds of the same data measure 0.957-0.958.
    emb, queries = _random(n, 128), _random(2000, 128, seed=1)
    start = time.time()
    index = mips_index.ScannIndex.build(emb)
    build = time.time() - start
    exact_ids, _ = mips_index.BruteForceIndex(emb).search(queries, 10)
    ids, _ = index.search(queries, 10)
    recall = mips_index.recall_at_k(ids, exact_ids)
    self.assertEqual(index.settings()["mode"], "tree_ah")
    print(f"ScaNN default settings on {n} x 128 random: recall@10 {recall:.4f}, "
          f"build {build:.1f}s, settings {index.settings()}")
    self.assertGreaterEqual(recall, 0.95)


if __name__ == "__main__":
  tf.test.main()
