"""The sparse (BM25) index: bm25s' scores, after any updates, and saved without pickles."""

import os

import bm25s
import numpy as np
import pytest

from realm_tf.retrieval import errors
from realm_tf.retrieval.sparse import sparse_index

WORDS = ("paris france capital river seine tower the of and is city bridge louvre museum art "
         "king queen war peace treaty year").split()
QUERIES = ["capital of France", "the river Seine in Paris", "war and peace treaty treaty",
           "museum", "nothing matches zzz", "king", "number 3 1", "update 4 2"]


def texts(rng, n):
  return [" ".join(rng.choice(WORDS, rng.integers(3, 25))) for _ in range(n)]


def bm25s_scores(live_texts, query):
  """bm25s' Lucene scores over ``live_texts`` indexed afresh (the reference)."""
  reference = bm25s.BM25(method="lucene", k1=1.5, b=0.75)
  reference.index(sparse_index.tokens(live_texts), show_progress=False)
  return reference.get_scores(sparse_index.tokens([query])[0])


def check_against_fresh_bm25s(index, live):
  """``live``: {row: text}. Every live row scores as bm25s over the live texts alone; the
  others score 0 and never come back."""
  rows = sorted(live)
  for query in QUERIES:
    got = index.scores(query)
    np.testing.assert_allclose(got[rows], bm25s_scores([live[r] for r in rows], query),
                               rtol=1e-5, atol=1e-6)
    dead = np.setdiff1d(np.arange(index.num_rows), rows)
    assert not got[dead].any()
    top, _ = index.search([query], k=index.num_rows)
    assert set(top[top >= 0].tolist()) <= set(rows)


def test_a_build_scores_as_bm25s():
  rng = np.random.default_rng(0)
  corpus = texts(rng, 60)
  index = sparse_index.SparseIndex.build(iter(corpus))
  assert index.num_rows == index.num_live == 60 and len(index.segments) == 1
  check_against_fresh_bm25s(index, dict(enumerate(corpus)))


def test_after_adds_and_deletes_scores_are_a_fresh_index_of_the_live_blocks():
  rng = np.random.default_rng(1)
  corpus = texts(rng, 40)
  index = sparse_index.SparseIndex.build(corpus)
  live = dict(enumerate(corpus))
  new = texts(rng, 5) + ["a brand new word: zeppelin zeppelin"]
  index.add(range(40, 46), new)
  live.update(zip(range(40, 46), new))
  index.delete([3, 17, 41])
  for r in (3, 17, 41):
    del live[r]
  index.add([47], ["paris replaced"])           # row 46 never given
  live[47] = "paris replaced"
  assert len(index.segments) == 3
  check_against_fresh_bm25s(index, live)
  rows, _ = index.search(["zeppelin"], k=3)
  np.testing.assert_array_equal(rows, [[45, -1, -1]])   # an acknowledged add is found
  merged = index.merged()
  assert len(merged.segments) == 1
  assert len(merged.segments[0].rows) < sum(len(s.rows) for s in index.segments)
  for query in QUERIES:
    np.testing.assert_array_equal(merged.scores(query), index.scores(query))
  check_against_fresh_bm25s(merged, live)


def test_search_is_the_top_of_the_scores():
  rng = np.random.default_rng(2)
  index = sparse_index.SparseIndex.build(texts(rng, 30) + ["museum"] * 3)
  rows, scores = index.search(QUERIES, k=5)
  for query, got_rows, got_scores in zip(QUERIES, rows, scores):
    s = index.scores(query)
    positive = [r for r in sorted(range(len(s)), key=lambda r: (-s[r], r)) if s[r] > 0][:5]
    want = positive + [-1] * (5 - len(positive))
    np.testing.assert_array_equal(got_rows, want)
    np.testing.assert_array_equal(got_scores, [s[r] if r >= 0 else 0 for r in want])
  assert (rows[QUERIES.index("nothing matches zzz")] == -1).all()


def test_bad_updates_are_refused():
  index = sparse_index.SparseIndex.build(["a river", "a tower"])
  index.delete([1])
  for rows in ([1], [0], [5, 5]):       # deleted, live, twice
    with pytest.raises(ValueError, match="distinct and new"):
      index.add(rows, ["x"] * len(rows))
  with pytest.raises(ValueError, match="not live"):
    index.delete([7])


def test_save_and_load_without_pickles(tmp_path):
  rng = np.random.default_rng(3)
  index = sparse_index.SparseIndex.build(texts(rng, 20))
  index.add([20, 21], ["zeppelin river", "tower"])
  index.delete([4])
  path = str(tmp_path / "sparse")
  index.save(path)
  again = sparse_index.SparseIndex.load(path)
  for query in QUERIES + ["zeppelin"]:
    np.testing.assert_array_equal(again.scores(query), index.scores(query))
  # Something that only a pickle could hold is refused, never unpickled.
  np.save(os.path.join(path, "df.npy"), np.array([{"x": 1}], dtype=object), allow_pickle=True)
  with pytest.raises(errors.IndexFormatError, match="df.npy"):
    sparse_index.SparseIndex.load(path)
  with pytest.raises(errors.IndexFormatError, match="not a sparse index"):
    sparse_index.SparseIndex.load(str(tmp_path / "missing"))


def test_a_dense_index_carries_its_sparse_part_through_updates_and_publication(tmp_path):
  """append and delete keep the two parts on the same rows; save writes ``sparse/`` and the
  manifest's summary; load_index reads it back, and refuses a sparse part of other rows."""
  # pylint: disable=g-import-not-at-top
  import shutil
  from realm_tf.retrieval.index import mips_index
  from realm_tf.retrieval.publication import index_io
  # pylint: enable=g-import-not-at-top
  rng = np.random.default_rng(4)
  corpus = texts(rng, 12)
  index = mips_index.BruteForceIndex(rng.normal(size=[12, 4]).astype(np.float32), 8)
  index.sparse = sparse_index.SparseIndex.build(corpus)
  with pytest.raises(ValueError, match="give the 2 appended blocks' texts"):
    index.append(rng.normal(size=[2, 4]))
  assert index.num_blocks == 12 and index.sparse.num_rows == 12     # nothing half-done
  np.testing.assert_array_equal(index.append(rng.normal(size=[2, 4]), ["zeppelin", "tower"]),
                                [12, 13])
  index.delete([2, 12])
  live = {r: t for r, t in enumerate(corpus + ["zeppelin", "tower"]) if r not in (2, 12)}
  check_against_fresh_bm25s(index.sparse, live)
  path = str(tmp_path / "step-1")
  manifest = index.save(path)
  assert manifest["sparse"]["num_rows"] == 14 and manifest["sparse"]["num_live"] == 12
  again = index_io.load_index(path)
  check_against_fresh_bm25s(again.sparse, live)
  again.append(rng.normal(size=[1, 4]), ["zeppelin"])      # the loaded part updates too
  assert again.sparse.search(["zeppelin"], 2)[0].tolist() == [[14, -1]]
  # A sparse part over other rows than the dense part's is refused.
  other = sparse_index.SparseIndex.build(corpus)
  shutil.rmtree(os.path.join(path, "sparse"))
  other.save(os.path.join(path, "sparse"))
  with pytest.raises(errors.IndexFormatError, match="not the dense index's 14"):
    index_io.load_index(path)
