"""MIPS indexes: exactness of brute force, ScaNN recall, save/load round trips, clear errors."""

import os
import shutil
import tempfile
import time

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from realm_tf.retrieval import errors
from realm_tf.retrieval import mips_index


def _random(n, d, seed=0):
  return np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)


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
    self.assertEqual(s.resolve(100_000)["mode"], "ah")
    big = s.resolve(1_000_000)
    self.assertEqual((big["mode"], big["num_leaves"], big["num_leaves_to_search"]),
                     ("tree_ah", 1000, 100))
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
      ("tree_ah", 5000, mips_index.ScannSettings(use_tree=True, num_leaves=50,
                                                 num_leaves_to_search=25)))
  def test_save_load_round_trip(self, n, settings):
    emb, queries = _random(n, 32), _random(20, 32, seed=1)
    index = mips_index.ScannIndex.build(emb, settings)
    ids, scores = index.search(queries, 10)
    # Written under one name, renamed, then loaded: ScaNN's paths are relative.
    index.save(os.path.join(self.dir, "tmp"), {"corpus_fingerprint": "abc"})
    os.rename(os.path.join(self.dir, "tmp"), os.path.join(self.dir, "final"))
    loaded = mips_index.load_index(os.path.join(self.dir, "final"), expected_dim=32,
                                   expected_fingerprint="abc")
    self.assertIsInstance(loaded, mips_index.ScannIndex)
    self.assertEqual(loaded.settings(), index.settings())
    ids2, scores2 = loaded.search(queries, 10)
    self.assertAllEqual(ids, ids2)
    self.assertAllEqual(scores, scores2)
    one_ids, _ = loaded.search(queries[:1], 10)  # The single-query path agrees too.
    self.assertAllEqual(one_ids, ids[:1])
    self.assertAllClose(np.load(os.path.join(self.dir, "final", "embeddings.npy")), emb)
    self.assertGreaterEqual(mips_index.measure_recall(loaded, emb, queries), 0.95)
    if n < mips_index.ScannSettings().brute_force_below:  # Exact scoring: the numpy answer.
      self.assertAllEqual(ids, _numpy_topk(queries, emb, 10)[0])

  def test_brute_force_round_trip(self):
    emb, queries = _random(300, 8), _random(5, 8, seed=1)
    index = mips_index.BruteForceIndex(emb)
    index.save(self.dir, {"corpus_fingerprint": "abc"})
    loaded = mips_index.load_index(self.dir, expected_dim=8, expected_fingerprint="abc")
    self.assertIsInstance(loaded, mips_index.BruteForceIndex)
    for a, b in zip(index.search(queries, 4), loaded.search(queries, 4)):
      self.assertAllEqual(a, b)

  def test_load_refuses_mismatch(self):
    mips_index.BruteForceIndex(_random(50, 8)).save(self.dir, {"corpus_fingerprint": "abc"})
    with self.assertRaisesRegex(errors.DimensionMismatchError,
                                "has dimension 8 but the model's embeddings have dimension 128"):
      mips_index.load_index(self.dir, expected_dim=128)
    with self.assertRaisesRegex(errors.FingerprintMismatchError,
                                "built over corpus abc but this run uses corpus def"):
      mips_index.load_index(self.dir, expected_fingerprint="def")

  def test_load_refuses_incomplete(self):
    mips_index.ScannIndex.build(_random(3000, 8)).save(self.dir)
    os.remove(os.path.join(self.dir, "manifest.json"))
    with self.assertRaisesRegex(errors.IndexFormatError, "no complete index"):
      mips_index.load_index(self.dir)
    with self.assertRaisesRegex(errors.IndexFormatError, "not found"):
      mips_index.load_index(os.path.join(self.dir, "nope"))

  def test_recall_counts_ties(self):
    emb = np.ones([20, 4], np.float32)  # Every block ties with every other.
    index = mips_index.BruteForceIndex(emb)
    self.assertEqual(mips_index.measure_recall(index, emb, _random(3, 4), k=5), 1.0)

  def test_default_recall_on_100k_random_vectors(self):
    """Acceptance: recall@10 >= 0.95 with the default settings, 100,000 x 128 Gaussian."""
    self._check_default_recall(100_000)

  def _check_default_recall(self, n):
    emb, queries = _random(n, 128), _random(200, 128, seed=1)
    start = time.time()
    index = mips_index.ScannIndex.build(emb)
    build = time.time() - start
    exact_ids, _ = mips_index.BruteForceIndex(emb).search(queries, 10)
    ids, _ = index.search(queries, 10)
    recall = mips_index.recall_at_k(ids, exact_ids)
    print(f"ScaNN default settings on {n} x 128 random: recall@10 {recall:.4f}, "
          f"build {build:.1f}s, settings {index.settings()}")
    self.assertGreaterEqual(recall, 0.95)


if __name__ == "__main__":
  tf.test.main()
