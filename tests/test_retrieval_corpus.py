"""Corpus embedding: packing, agreement with the Keras towers, sharding, strategies, errors."""

import json
import os
import shutil
import tempfile

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from realm_tf import tokenization
from realm_tf.data import features
from realm_tf.data import manifests
from realm_tf.retrieval import errors
from realm_tf.retrieval.index import mips_index
from realm_tf.retrieval.publication import corpus_embedding
from realm_tf.retrieval.publication import refresher
from realm_tf.retrieval.publication import testing


class PackTest(tf.test.TestCase):

  def test_pack_pads_trims_and_sets_segments(self):
    sep = 3
    ids = tf.ragged.constant([[2, 7, 3, 9, 3], [2, 7, 8, 3, 9, 9, 9, 3], [2, 3, 3]])
    got = features.pack_block_ids(ids, 6, sep)
    self.assertAllEqual(got["input_word_ids"], [[2, 7, 3, 9, 3, 0],
                                                [2, 7, 8, 3, 9, 3],
                                                [2, 3, 3, 0, 0, 0]])
    self.assertAllEqual(got["input_mask"], [[1, 1, 1, 1, 1, 0],
                                            [1, 1, 1, 1, 1, 1],
                                            [1, 1, 1, 0, 0, 0]])
    self.assertAllEqual(got["input_type_ids"], [[0, 0, 0, 1, 1, 0],
                                                [0, 0, 0, 0, 1, 1],
                                                [0, 0, 1, 0, 0, 0]])
    query = features.pack_block_ids(ids, 4, sep, segment_ids=False)
    self.assertAllEqual(query["input_word_ids"][1], [2, 7, 8, 3])
    self.assertAllEqual(query["input_type_ids"], tf.zeros([3, 4], tf.int32))


class CorpusTest(tf.test.TestCase, parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = tempfile.mkdtemp()
    cls.vocab = testing.write_vocab(os.path.join(cls.root, "vocab.txt"))
    cls.blocks_dir = os.path.join(cls.root, "blocks")
    # Written with longer blocks (48) than the model reads (32): the embedder trims.
    cls.manifest = testing.make_corpus(cls.blocks_dir, cls.vocab, 150, block_seq_length=48,
                                       num_shards=3)
    cls.trainer = testing.TinyTrainer(os.path.join(cls.root, "model"), cls.vocab)
    cls.trainer.perturb(0.2)
    cls.config = cls.trainer.config
    cls.embedder = cls.trainer.block_embedder
    titles, bodies = testing.random_texts(150)
    inputs = tokenization.RealmTokenizer(cls.vocab).block_inputs(titles, bodies, 32)
    cls.want = cls.embedder(inputs, training=False).numpy()

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.root, ignore_errors=True)
    super().tearDownClass()

  def _embed(self, **kwargs):
    kwargs.setdefault("batch_size", 64)
    return corpus_embedding.embed_corpus(self.embedder, self.blocks_dir, 32, self.vocab,
                                         progress=False, **kwargs)

  def test_fixture_follows_the_contract(self):
    blocks = manifests.read_blocks(self.blocks_dir, check_manifest=True)  # Checks the fingerprint.
    self.assertEqual([b["block_id"] for b in blocks], list(range(150)))
    self.assertEqual(blocks[3]["uid"], features.block_uid(blocks[3]["title"], blocks[3]["body"]))

  def test_matches_keras_forward_pass(self):
    ids, emb = self._embed()
    table = corpus_embedding.assemble_rows(ids, emb, 150)
    self.assertAllClose(table, self.want, atol=1e-5)

  def test_mirrored_strategy(self):
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    ids, emb = self._embed(strategy=strategy, batch_size=50)
    self.assertAllClose(corpus_embedding.assemble_rows(ids, emb, 150), self.want, atol=1e-5)

  def test_shards_merge_to_the_whole(self):
    out = os.path.join(self.root, "emb_shards")
    for shard in range(4):
      ids, emb = self._embed(shard_index=shard, num_shards=4)
      self.assertLen(ids, corpus_embedding.shard_size(150, shard, 4))
      corpus_embedding.save_embedding_shard(out, ids, emb, shard, 4)
    self.assertAllClose(corpus_embedding.merge_embedding_shards(out, 150), self.want, atol=1e-5)
    os.remove(os.path.join(out, "embeddings-shard-00002-of-00004.npy"))
    with self.assertRaisesRegex(errors.CorpusFormatError, r"shards \[2\] of 4 are missing"):
      corpus_embedding.merge_embedding_shards(out, 150)

  def test_other_vocabulary_is_tokenized_again(self):
    other_vocab = os.path.join(self.root, "other_vocab.txt")
    words = tokenization.load_vocab(self.vocab)
    with open(other_vocab, "w") as f:  # Same tokens, another file: ids must not be trusted.
      f.write("\n".join(words + ["zzzextra"]) + "\n")
    ids, emb = corpus_embedding.embed_corpus(self.embedder, self.blocks_dir, 32, other_vocab,
                                             batch_size=64, progress=False)
    self.assertAllClose(corpus_embedding.assemble_rows(ids, emb, 150), self.want, atol=1e-5)

  def test_assemble_rows_checks_ids(self):
    emb = np.zeros([3, 2], np.float32)
    with self.assertRaisesRegex(errors.CorpusFormatError, "block id 1 occurs 2 times"):
      corpus_embedding.assemble_rows(np.array([0, 1, 1]), emb, 3)
    with self.assertRaisesRegex(errors.CorpusFormatError, r"must lie in \[0, 3\)"):
      corpus_embedding.assemble_rows(np.array([0, 1, 3]), emb, 3)

  def test_empty_and_missing_corpus(self):
    empty = os.path.join(self.root, "empty_blocks")
    os.makedirs(empty, exist_ok=True)
    with open(os.path.join(empty, "manifest.json"), "w") as f:
      json.dump({"num_blocks": 0, "fingerprint": "x", "num_shards": 0}, f)
    with self.assertRaisesRegex(errors.EmptyCorpusError, "is empty"):
      self._embed_dir(empty)
    with self.assertRaisesRegex(errors.CorpusFormatError, "blocks directory not found"):
      self._embed_dir(os.path.join(self.root, "nope"))
    with self.assertRaisesRegex(errors.EmptyCorpusError, "shard 170 of 200"):
      self._embed(shard_index=170, num_shards=200)

  def _embed_dir(self, blocks_dir):
    return corpus_embedding.embed_corpus(self.embedder, blocks_dir, 32, self.vocab, progress=False)

  def test_recall_on_real_block_embeddings(self):
    """Acceptance: default ScaNN settings keep recall@10 >= 0.95 on embeddings of blocks."""
    root = os.path.join(self.root, "recall")
    blocks_dir = os.path.join(root, "blocks")
    testing.make_corpus(blocks_dir, self.vocab, 3000, num_shards=2, seed=3)
    trainer = testing.TinyTrainer(os.path.join(root, "model"), self.vocab, projection_size=128,
                                  seed=3)
    trainer.perturb(0.3)
    trainer.save(7)
    path = refresher.build_index_for_checkpoint(
        None, trainer.model_dir, blocks_dir, os.path.join(root, "index"),
        refresher.BuildOptions(progress=False, recall_queries=200))
    manifest = mips_index.read_manifest(path)
    self.assertEqual(manifest["settings"]["mode"], "ah")  # 3000 blocks: hashing, not exact.
    print("recall@10 on 3000 block embeddings:", manifest["recall_at_10"])
    self.assertGreaterEqual(manifest["recall_at_10"], 0.95)


if __name__ == "__main__":
  tf.test.main()
