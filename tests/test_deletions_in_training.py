"""REALM pre-training honours a corpus version's deleted blocks: retrieval on the device masks
them, and gives the host path's candidates over an index that deleted them."""

import numpy as np
import tensorflow as tf

from realm_tf.data import block_store
from realm_tf.retrieval.index import mips_index
from realm_tf.tasks import candidates
from realm_tf.tasks import device_retrieval

# pylint: disable-next=g-bad-import-order
from test_device_retrieval import (COMPARED, duplicate_corpus, host_inputs, perturbed,
                                   random_examples, tiny_config)


class IndexHandle:
  """An exact index with deletions, standing in for the trainer's IndexHandle."""

  def __init__(self, index, step):
    self.index, self.step = index, step

  def search(self, q, k):
    return self.index.search(q, k)


def test_deleted_blocks_are_never_candidates():
  blocks = duplicate_corpus(n=14, seed=1)
  store = block_store.BlockStore.from_blocks(blocks, 2, 3)
  deleted = np.array([1, 4, 7, 12])
  store.deleted = deleted  # As BlockStore.open gives a version with these rows deleted.
  config = tiny_config()
  model = perturbed(config, seed=3)
  emb = np.random.default_rng(6).standard_normal((len(blocks), 8)).astype(np.float32)
  emb[deleted] *= 10  # Deleted rows that would otherwise top many a search.
  retriever = device_retrieval.DeviceRetriever(store, config, 2, 3)
  retriever.load(emb, step=3)
  examples = random_examples(np.random.default_rng(2), 8, 8, 2, 40,
                             [0, 2, 3, 6, 8, 10, 11, 13], 2, 3, 4)
  inputs = host_inputs(retriever, examples)
  got = retriever.features({k: tf.constant(v) for k, v in inputs.items()},
                           model.query_embedder)
  handle = IndexHandle(mips_index.BruteForceIndex(emb, deleted=deleted), step=3)
  builder = candidates.CandidateBuilder(store, config, handle, 2, 3)
  # pylint: disable-next=protected-access
  builder._query_embedder = lambda: (lambda x: model.query_embedder(x, training=False))
  host = builder.features(dict(examples, source_uid=np.array(
      [blocks[s]["uid"] for s in examples["source_block_id"]])))
  for key in COMPARED:
    np.testing.assert_array_equal(np.asarray(got[key]), host[key], err_msg=key)
  assert not np.isin(host["candidate_rows"], deleted).any()
  # Without the deletions the same search does return them: the masking is what keeps them out.
  store.deleted = np.zeros([0], np.int64)
  unmasked = device_retrieval.DeviceRetriever(store, config, 2, 3)
  unmasked.load(emb, step=3)
  rows = unmasked.features({k: tf.constant(v) for k, v in inputs.items()},
                           model.query_embedder)["candidate_rows"]
  assert np.isin(np.asarray(rows), deleted).any()
