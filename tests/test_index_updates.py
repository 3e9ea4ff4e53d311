"""Index updates (``MipsIndex.append``/``delete``) against exact search over the live rows.

After a random sequence of appends and deletes, each index type's results equal NumPy's exact
search over the resulting live rows (ScaNN's approximate modes: recall@10 at their tuned
target), deleted rows never appear, and the ids survive a save and a load, after which the
updates go on. The rebalance/rebuild rule is checked on updates made to trigger it.
"""

import os

import numpy as np
import pytest

from realm_tf.retrieval import errors
from realm_tf.retrieval.index import mips_index
from realm_tf.retrieval.publication import index_io


def _clustered(n, d, rng, num_clusters=50):
  centres = rng.standard_normal((num_clusters, d)).astype(np.float32)
  labels = rng.integers(0, num_clusters, n)
  return centres[labels] + 0.4 * rng.standard_normal((n, d)).astype(np.float32)


def _near(table, m, seed):
  """Queries near rows of ``table`` (fresh: not rows themselves)."""
  rng = np.random.default_rng(seed)
  rows = table[rng.integers(0, len(table), m)]
  return rows + 0.2 * rng.standard_normal(rows.shape).astype(np.float32)


def _live(table, deleted):
  live = np.setdiff1d(np.arange(len(table)), deleted)
  return live, table[live]


def _exact(queries, table, deleted, k):
  """NumPy's top k over the live rows: (ids, scores)."""
  live, rows = _live(table, deleted)
  scores = queries @ rows.T
  order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
  return live[order], np.take_along_axis(scores, order, 1)


def _tie_recall(queries, table, deleted, ids, k=10):
  """Recall@k against exact search over the live rows, ties counted (as the index's own)."""
  _, exact_scores = _exact(queries, table, deleted, k)
  kth = exact_scores[:, -1:]
  got = np.einsum("bd,bkd->bk", queries, table[np.where(ids >= 0, ids, 0)])
  return float(((got >= kth - 1e-5 * np.maximum(1, np.abs(kth))) & (ids >= 0)).mean())


def _random_updates(index, table, rng, rounds, fraction):
  """``rounds`` rounds of appending and deleting ``fraction`` of the rows; returns the table
  of every row (for the reference) and yields nothing: checks are the caller's."""
  for _ in range(rounds):
    m = max(1, int(fraction * index.num_live))
    new = _clustered(m, table.shape[1], rng)
    rows = index.append(new)
    np.testing.assert_array_equal(rows, np.arange(len(table), len(table) + m))
    table = np.concatenate([table, new])
    live = np.setdiff1d(np.arange(len(table)), index.deleted)
    index.delete(rng.choice(live, m, replace=False))
  return table


@pytest.mark.parametrize("kind", ["brute_force", "scann_exact"])
def test_exact_indexes_equal_numpy_after_updates(kind, tmp_path):
  rng = np.random.default_rng(0)
  table = _clustered(600, 16, rng)
  index = (mips_index.BruteForceIndex(table, rows_per_block=128) if kind == "brute_force"
           else mips_index.ScannIndex.build(table))
  if kind == "scann_exact":
    assert index.settings()["mode"] == "brute_force"
  queries = rng.standard_normal((20, 16)).astype(np.float32)
  table = _random_updates(index, table, rng, rounds=4, fraction=0.05)
  assert index.num_blocks == len(table) and len(index.deleted) == index.num_blocks - 600
  ids, scores = index.search(queries, 10)
  want_ids, want_scores = _exact(queries, table, index.deleted, 10)
  np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(ids, want_ids)
  assert not np.isin(ids, index.deleted).any()
  # Every live row can still be returned: k = num_live, none deleted, all distinct.
  all_ids, _ = index.search(queries[:1], index.num_live)
  assert sorted(all_ids[0].tolist()) == np.setdiff1d(np.arange(len(table)),
                                                     index.deleted).tolist()
  with pytest.raises(ValueError, match="k must lie"):
    index.search(queries, index.num_live + 1)

  # Saved and loaded: the same rows, the same results; then more updates on the loaded one.
  index.save(str(tmp_path / "a"), {"corpus_fingerprint": "f"})
  loaded = index_io.load_index(str(tmp_path / "a"), expected_dim=16, load_embeddings=True)
  np.testing.assert_array_equal(loaded.deleted, index.deleted)
  np.testing.assert_array_equal(loaded.search(queries, 10)[0], ids)
  table = _random_updates(loaded, table, rng, rounds=2, fraction=0.05)
  ids, scores = loaded.search(queries, 10)
  want_ids, want_scores = _exact(queries, table, loaded.deleted, 10)
  np.testing.assert_array_equal(ids, want_ids)
  np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-5)
  loaded.save(str(tmp_path / "b"))
  again = index_io.load_index(str(tmp_path / "b"))
  np.testing.assert_array_equal(again.search(queries, 10)[0], ids)
  np.testing.assert_array_equal(np.load(str(tmp_path / "b" / "embeddings.npy")), table)


@pytest.mark.parametrize("use_tree", [False, True])
def test_scann_updates_keep_the_tuned_recall(use_tree, tmp_path):
  """Approximate ScaNN: the built index meets its tuned target on queries it was not tuned on
  (within 0.02: the target is measured on another 500 queries, and the partitioner's k-means is
  not deterministic across threads, so the two estimates differ by up to ~3 standard errors of
  ~0.006; 0.939 against 0.95 was seen once in a fresh clone); after updates of 1% a round,
  recall@10 against exact search over the live rows stays at the build's (within 0.01), and
  deleted rows never come back."""
  rng = np.random.default_rng(1)
  n, d = (20_000, 32) if use_tree else (4_000, 16)
  table = _clustered(n, d, rng, num_clusters=200)
  settings = mips_index.ScannSettings(use_tree=use_tree, tuning_queries=500)
  index = mips_index.ScannIndex.build(table, settings)
  target = index.settings()["tuning"]["target_recall"]
  queries = _near(table, 500, seed=2)
  before = _tie_recall(queries, table, [], index.search(queries, 10)[0])
  table = _random_updates(index, table, rng, rounds=3, fraction=0.01)
  ids, _ = index.search(queries, 10)
  after = _tie_recall(queries, table, index.deleted, ids)
  print(f"use_tree={use_tree}: recall@10 {before:.4f} at build, {after:.4f} after 3 rounds "
        f"of 1% updates; maintenance: {index.maintenance()}; health {index.health()}")
  assert before >= target - 0.02
  assert after >= before - 0.01
  assert not np.isin(ids, index.deleted).any()
  assert index.maintenance() is None  # 6% changed, spread over the clusters: nothing to do.
  index.save(str(tmp_path / "s"))
  loaded = index_io.load_index(str(tmp_path / "s"))
  np.testing.assert_array_equal(loaded.search(queries, 10)[0], ids)
  assert os.path.exists(tmp_path / "s" / "scann" / "row_ids.npy")


def test_rebalance_and_rebuild_rules():
  rng = np.random.default_rng(3)
  table = _clustered(20_000, 16, rng, num_clusters=100)
  settings = mips_index.ScannSettings(use_tree=True, tuning_queries=300)
  index = mips_index.ScannIndex.build(table, settings)
  baseline = index.settings()["updates"]["imbalance"]
  # 15% new points on two new topics: they crowd a few partitions (and fewer than 25%
  # of the points changed: the imbalance rule is the one that fires).
  crowd = _clustered(3000, 16, rng, num_clusters=2)
  index.append(crowd)
  table = np.concatenate([table, crowd])
  imbalance = index.health()["partition_weighted_avg_relative_imbalance"]
  assert imbalance - baseline > settings.rebalance_imbalance
  assert index.maintenance() == "rebalance"
  crowd_queries = _near(crowd, 100, seed=5)
  crowd_before = _tie_recall(crowd_queries, table, [], index.search(crowd_queries, 10)[0])
  same, action = index.maintained()
  assert same is index and action == "rebalance"
  assert (index.health()["partition_weighted_avg_relative_imbalance"] - baseline <
          settings.rebalance_imbalance)
  assert index.settings()["updates"]["appended"] == 0  # Counted from the rebalance on.
  queries = _near(table, 300, seed=4)
  ids, _ = index.search(queries, 10)
  assert _tie_recall(queries, table, [], ids) >= index.settings()["tuning"]["target_recall"] - 0.01
  crowd_after = _tie_recall(crowd_queries, table, [], index.search(crowd_queries, 10)[0])
  print(f"imbalance {baseline:.3f} -> {imbalance:.3f} -> rebalanced "
        f"{index.health()['partition_weighted_avg_relative_imbalance']:.3f}; recall@10 of "
        f"queries on the new topics {crowd_before:.3f} -> {crowd_after:.3f}")
  # Appended into partitions trained without them, the new topics were poorly found.
  assert crowd_after > crowd_before + 0.3

  # More than a quarter of the points changed: rebalance, whatever the balance.
  small = mips_index.ScannIndex.build(_clustered(3000, 16, rng), mips_index.ScannSettings(
      tuning_queries=200))
  assert small.settings()["mode"] == "ah"
  small.append(_clustered(800, 16, rng))
  assert small.maintenance() == "rebalance"
  # Below 2,000 live blocks the settings call for exact scoring: rebuild.
  small.delete(np.arange(1900))
  assert small.maintenance() == "rebuild"
  rebuilt, action = small.maintained()
  assert action == "rebuild" and rebuilt.settings()["mode"] == "brute_force"
  assert rebuilt.num_blocks == 3800 and len(rebuilt.deleted) == 1900
  full = np.asarray(small.embeddings[np.arange(3800)])
  want, _ = _exact(queries, full, rebuilt.deleted, 5)
  np.testing.assert_array_equal(rebuilt.search(queries, 5)[0], want)


def test_update_errors():
  index = mips_index.BruteForceIndex(np.ones([4, 3], np.float32))
  with pytest.raises(errors.DimensionMismatchError, match="dimension 2"):
    index.append(np.ones([1, 2], np.float32))
  with pytest.raises(ValueError, match=r"rows must lie in \[0, 4\)"):
    index.delete([4])
  index.delete([1])
  with pytest.raises(ValueError, match="deleted already"):
    index.delete([1, 2])
  with pytest.raises(errors.EmptyCorpusError, match="no block"):
    index.delete([0, 2, 3])
  with pytest.raises(errors.CorpusFormatError, match="NaN"):
    index.append(np.full([1, 3], np.nan, np.float32))


class _Plant:
  """Unpickled, it creates the directory ``path`` (the proof that a pickle ran)."""

  def __init__(self, path):
    self.path = path

  def __reduce__(self):
    return (os.makedirs, (self.path,))


@pytest.mark.parametrize("updated", [False, True])
def test_a_planted_pickle_is_never_unpickled(updated, tmp_path):
  """ScaNN's row ids are saved as ``.npy``; a ``scann_docids.pkl`` planted in an index
  directory (where ScaNN's own loader would unpickle it) is refused with an error naming it,
  another ``.pkl`` is ignored: neither ever runs."""
  import pickle  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(5)
  table = _clustered(600, 16, rng)
  index = mips_index.ScannIndex.build(table)
  if updated:
    table = _random_updates(index, table, rng, rounds=2, fraction=0.05)
  directory = tmp_path / "index"
  index.save(str(directory))
  saved = sorted(os.path.relpath(os.path.join(r, f), directory)
                 for r, _, files in os.walk(directory) for f in files)
  assert not [f for f in saved if f.endswith(".pkl")], saved
  assert ("scann/row_ids.npy" in saved) == updated
  queries = rng.standard_normal((8, 16)).astype(np.float32)
  want, _ = _exact(queries, table, index.deleted, 10)
  np.testing.assert_array_equal(index_io.load_index(str(directory)).search(queries, 10)[0],
                                want)
  ran = tmp_path / "the_pickle_ran"
  with open(directory / "elsewhere.pkl", "wb") as f:  # Never read: ignored.
    pickle.dump(_Plant(str(ran)), f)
  np.testing.assert_array_equal(index_io.load_index(str(directory)).search(queries, 10)[0],
                                want)
  with open(directory / "scann" / "scann_docids.pkl", "wb") as f:
    pickle.dump(_Plant(str(ran)), f)
  with pytest.raises(errors.IndexFormatError, match=r"scann_docids\.pkl.*never.*rebuild"):
    index_io.load_index(str(directory))
  assert not ran.exists()


def test_a_planted_pickle_stops_the_index_handle_with_the_rebuild_message(tmp_path):
  """A published index holding ``scann_docids.pkl`` is refused at once by ``IndexHandle`` (what
  ``realm-serve`` and the trainer open) with the message naming the file and the rebuild, not
  retried until "no index appeared ... start the refresher"."""
  import pickle  # pylint: disable=g-import-not-at-top
  from realm_tf.retrieval.publication import handle as handle_lib  # pylint: disable=g-import-not-at-top
  from realm_tf.retrieval.publication import publish  # pylint: disable=g-import-not-at-top
  index_dir = str(tmp_path / "indexes")
  with publish.lock(index_dir):
    path = publish.publish(mips_index.ScannIndex.build(_clustered(600, 16,
                                                                  np.random.default_rng(6))),
                           index_dir, 1)
  ran = tmp_path / "the_pickle_ran"
  with open(os.path.join(path, "scann", "scann_docids.pkl"), "wb") as f:
    pickle.dump(_Plant(str(ran)), f)
  handle = handle_lib.IndexHandle(index_dir, expected_dim=16, wait_seconds=1.0,
                                  poll_seconds=0.1)
  with pytest.raises(errors.UnsafeIndexError, match=r"scann_docids\.pkl.*never.*rebuild"):
    handle.wait_for_first()
  handle.close()
  assert not ran.exists()
