"""One retriever choice (retrieval/sparse/hybrid.py): reciprocal-rank fusion, BM25 beams, the
checks, and the Open-QA builder's beams over a published index with its BM25 part."""

import numpy as np
import pytest

from realm_tf import model_dir as model_dir_lib
from realm_tf.openqa import host
from realm_tf.openqa import inputs as inputs_lib
from realm_tf.openqa import predict
from realm_tf.openqa import report
from realm_tf.retrieval import errors
from realm_tf.retrieval.publication import index_io
from realm_tf.retrieval.publication import publish
from realm_tf.retrieval.sparse import hybrid

from test_realm_index_updates import _setup


def brute_force_fusion(dense, dense_scores, sparse, sparse_scores, k, w=0.7, scores=False):
  def normalized(ids, scores):
    pairs = [(b, s) for b, s in zip(ids, scores) if b >= 0]
    lo, hi = min(s for _, s in pairs), max(s for _, s in pairs)
    return {b: (s - lo) / (hi - lo) if hi > lo else 1.0 for b, s in pairs}
  d, b = normalized(dense, dense_scores), normalized(sparse, sparse_scores)
  fused = {x: w * b.get(x, 0) + (1 - w) * d.get(x, 0) for x in set(d) | set(b)}
  if scores:
    return fused
  dense = list(dense)
  order = sorted(fused, key=lambda x: (-fused[x], dense.index(x) if x in dense else 1e9, x))
  return (order + [-1] * k)[:k]


def test_fusion_is_the_weighted_sum_of_normalized_scores_with_each_blocks_ranks():
  rng = np.random.default_rng(0)
  dense = np.stack([rng.permutation(30)[:6] for _ in range(40)])
  sparse = np.stack([rng.permutation(30)[:6] for _ in range(40)])
  dense_scores = -np.sort(-rng.normal(size=dense.shape), axis=1)
  sparse_scores = -np.sort(-rng.gamma(2.0, size=sparse.shape), axis=1)
  sparse[::3, 4:] = -1                                   # BM25 found fewer blocks
  sparse_scores[::3, 4:] = 0
  beam = hybrid.fuse(dense, dense_scores, sparse, sparse_scores, 6)
  for i in range(len(dense)):
    assert beam.ids[i].tolist() == brute_force_fusion(dense[i], dense_scores[i], sparse[i],
                                                      sparse_scores[i], 6)
    # Its fused score on the dense scores' range: the dense list's own best and worst ends.
    lo, hi = dense_scores[i].min(), dense_scores[i].max()
    fused = brute_force_fusion(dense[i], dense_scores[i], sparse[i], sparse_scores[i], 6,
                               scores=True)
    np.testing.assert_allclose(beam.fused[i], [lo + fused[b] * (hi - lo) for b in beam.ids[i]],
                               rtol=1e-5)
    for j, b in enumerate(beam.ids[i]):
      for ranks, ranked in ((beam.dense_rank, dense[i]), (beam.bm25_rank, sparse[i])):
        want = list(ranked).index(b) if b in ranked else -1
        assert ranks[i, j] == want
  # A block first in both lists is first; BM25's weight decides between the two seconds.
  beam = hybrid.fuse(np.array([[7, 1, 2]]), np.array([[3.0, 2.0, 1.0]]),
                     np.array([[7, 2, 5]]), np.array([[9.0, 8.0, 1.0]]), 3)
  assert beam.ids.tolist() == [[7, 2, 1]]


def test_a_short_bm25_list_is_filled_by_the_dense_list():
  filled = hybrid.fill(np.array([[4, -1, -1], [1, 2, 3]]), np.array([[4, 9, 8], [5, 6, 7]]))
  np.testing.assert_array_equal(filled, [[4, 9, 8], [1, 2, 3]])


def test_bad_choices_are_refused_with_the_reason():
  class NoSparse:
    sparse = None
  with pytest.raises(errors.RetrievalError, match="unknown retriever 'bm42': one of dense"):
    hybrid.check("bm42")
  with pytest.raises(errors.RetrievalError, match="published without one"):
    hybrid.check("hybrid", NoSparse())
  assert hybrid.check("dense", NoSparse()) == "dense"


def test_builder_beams_over_a_published_index_and_the_evidence_says_who_found_it(tmp_path):
  setup = _setup(tmp_path, num_blocks=80)
  config = model_dir_lib.load_config(setup["model"])
  index = index_io.load_index(publish.read_latest(setup["index"]))
  questions = [inputs_lib.Question("which river runs through paris?", ["seine"]),
               inputs_lib.Question("the king of france", ["louis"])]
  beams = {}
  for retriever in hybrid.RETRIEVERS:
    builder = host.build_input_builder(config, setup["index"], retriever_beam_size=6,
                                       reader_beam_size=3, retriever=retriever)
    emb = np.random.default_rng(1).normal(size=[2, config.retriever.projection_size])
    features = builder.features(questions, emb, with_ranks=True)
    beams[retriever] = features
    dense_ids = index.search(emb.astype(np.float32), 6)[0]
    bm25_ids = index.sparse.search([q.question for q in questions], 6)[0]
    if retriever == "hybrid":     # each list 20 deep (the recorded rule's depth), then fused
      assert index.manifest["sparse"]["fusion"] == hybrid.FUSION
      deep = index.search(emb.astype(np.float32), 20)
      want = hybrid.fuse(*deep, *index.sparse.search([q.question for q in questions], 20),
                         6).ids
    else:
      want = {"dense": dense_ids, "bm25": hybrid.fill(bm25_ids, dense_ids)}[retriever]
    np.testing.assert_array_equal(features["beam_ids"], want)
    np.testing.assert_array_equal(features["beam_emb"], index.embeddings[want])
  assert (beams["dense"]["beam_bm25_rank"] == -1).all()
  # The block prior: a fused beam's rule (the index's, else the builder's), never a dense or
  # BM25 beam's; the index's record predating it reads as today's rule.
  assert hybrid.fusion_of(index) == hybrid.FUSION
  old = type("Old", (), {"manifest": {"sparse": {"fusion": {"bm25_weight": 0.5}}}})()
  assert hybrid.fusion_of(old) == dict(hybrid.FUSION, bm25_weight=0.5)
  deep = index.search(emb.astype(np.float32), 20)
  deep_bm25 = index.sparse.search([q.question for q in questions], 20)
  fused = hybrid.fuse(*deep, *deep_bm25, 6)
  # A BM25 beam's own score: BM25's min-max normalized score over its top 20, on the range
  # of the dense top 20's scores (0 for a block BM25 did not find).
  bm25_prior = np.zeros([2, 3])
  for i in range(2):
    lo, hi = deep[1][i].min(), deep[1][i].max()
    found = dict(zip(deep_bm25[0][i].tolist(), deep_bm25[1][i].tolist()))
    s = np.array([v for b, v in found.items() if b >= 0])
    for j, b in enumerate(beams["bm25"]["beam_ids"][i, :3]):
      norm = (found[b] - s.min()) / (s.max() - s.min()) if b in found else 0.0
      bm25_prior[i, j] = lo + norm * (hi - lo)
  for prior in hybrid.BLOCK_PRIORS:
    for retriever in hybrid.RETRIEVERS:
      builder = host.build_input_builder(config, setup["index"], retriever_beam_size=6,
                                         reader_beam_size=3, retriever=retriever,
                                         block_prior=prior)
      features = builder.features(questions, emb)
      if retriever == "dense" or prior == "retriever":
        assert "block_prior" not in features and set(host.model_features(features)) == set(
            host.MODEL_FEATURES)
      else:
        want = ({"hybrid": fused.fused[:, :3], "bm25": bm25_prior}[retriever]
                if prior == "fusion" else np.zeros([2, 3]))
        np.testing.assert_allclose(features["block_prior"], want, rtol=1e-5)
        assert "block_prior" in host.model_features(features)
  builder = host.build_input_builder(config, setup["index"], retriever_beam_size=6,
                                     reader_beam_size=3, retriever="hybrid")
  assert builder.block_prior() == hybrid.FUSION["block_prior"]
  assert builder.block_prior("dense") == "retriever"
  assert builder.block_prior("bm25") == hybrid.FUSION["block_prior"]
  with pytest.raises(ValueError, match="unknown block prior 'uniform': one of retriever"):
    host.build_input_builder(config, setup["index"], retriever_beam_size=6,
                             reader_beam_size=3, retriever="hybrid", block_prior="uniform")
  assert (beams["bm25"]["beam_bm25_rank"][:, 0] == 0).all()
  # The report names the retrievers of each block read.
  e = predict.Evidence(3, "Paris", "text", 1.0, dense_rank=2, bm25_rank=0)
  assert report.found_by(e) == "dense #3, bm25 #1"
  assert report.found_by(predict.Evidence(3, "t", "x", 1.0)) == "given beam"
