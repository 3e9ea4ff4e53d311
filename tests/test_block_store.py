"""The compact block store against the dicts of manifests.read_blocks and candidates.pack_blocks."""

import json
import os
import tempfile
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from realm_tf.data import block_store
from realm_tf.data import features
from realm_tf.data import manifests
from realm_tf.tasks import candidates
from realm_tf.retrieval.publication import testing
from realm_tf import tokenization

N = 60


@pytest.fixture(scope="module")
def corpus():
  root = tempfile.mkdtemp()
  vocab = testing.write_vocab(os.path.join(root, "vocab.txt"))
  blocks_dir = os.path.join(root, "blocks")
  # Long bodies: many blocks are trimmed to block_seq_length by the tokenizer.
  testing.make_corpus(blocks_dir, vocab, N, block_seq_length=24, num_shards=3, max_words=40)
  tokenizer = tokenization.RealmTokenizer(vocab)
  return dict(root=root, vocab=vocab, blocks_dir=blocks_dir, cls=tokenizer.cls_id,
              sep=tokenizer.sep_id, blocks=manifests.read_blocks(blocks_dir))


def write_raw_blocks(blocks_dir, token_lists, uids=None, order=None, num_shards=2):
  """A blocks directory of the given token ids, shards holding the blocks in ``order``."""
  os.makedirs(blocks_dir, exist_ok=True)
  n = len(token_lists)
  uids = uids or [features.block_uid(f"t{i}", f"b{i}") for i in range(n)]
  order = list(range(n)) if order is None else list(order)
  for shard in range(num_shards):
    path = os.path.join(blocks_dir, manifests.shard_name(manifests.BLOCKS_PREFIX, shard,
                                                         num_shards))
    with tf.io.TFRecordWriter(path) as writer:
      for i in order[shard::num_shards]:
        writer.write(features.serialize_block(i, uids[i], f"t{i}", f"body {i} é",
                                              token_lists[i]))
  manifest = dict(num_blocks=n, fingerprint=manifests.corpus_fingerprint(uids),
                  num_shards=num_shards)
  with open(os.path.join(blocks_dir, manifests.MANIFEST), "w") as f:
    json.dump(manifest, f)
  return manifest


def reference(blocks, seq_length, cls_id, sep_id):
  return candidates.pack_blocks(blocks, seq_length, cls_id, sep_id)


@pytest.mark.parametrize("seq_length", [24, 10, 2])
def test_store_equals_read_blocks_and_pack_blocks(corpus, tmp_path, seq_length):
  store = block_store.BlockStore.open(corpus["blocks_dir"], store_dir=str(tmp_path))
  blocks, cls_id, sep_id = corpus["blocks"], corpus["cls"], corpus["sep"]
  assert len(store) == N and store.token_dtype == np.uint16
  assert (store.cls_id, store.sep_id) == (cls_id, sep_id)
  words, mask, types, bodies = reference(blocks, seq_length, cls_id, sep_id)
  rows = np.arange(N + 1)
  got = store.gather_packed(rows, seq_length, cls_id, sep_id)
  np.testing.assert_array_equal(got["input_word_ids"], words)
  np.testing.assert_array_equal(got["input_mask"], mask)
  np.testing.assert_array_equal(got["input_type_ids"], types)
  for name in got:
    assert got[name].dtype == np.int32
  # Any shape of rows, repeats and the null row included.
  rng = np.random.default_rng(0)
  batch = rng.integers(0, N + 1, [5, 4])
  got = store.gather_packed(batch, seq_length)
  np.testing.assert_array_equal(got["input_word_ids"], words[batch])
  np.testing.assert_array_equal(got["input_type_ids"], types[batch])
  for i, block in enumerate(blocks):
    np.testing.assert_array_equal(store.tokens(i), block["token_ids"])
    np.testing.assert_array_equal(store.body(i), bodies[i])
    assert store.text(i) == block["body"]
    assert store.titles[i] == block["title"] and store.titles.blocks()[i] == block["title"]
    assert store.uid_digest(i) == block_store.uid_digest(block["uid"])
  np.testing.assert_array_equal(store.tokens(N), [cls_id, sep_id, sep_id])
  np.testing.assert_array_equal(store.body(N), bodies[N])
  assert store.text(N) == "" and store.uid_digest(N) == block_store.NULL_DIGEST
  assert store.titles[N] == "" and len(store.titles.blocks()) == len(store.texts.blocks()) == N
  assert store.texts.blocks()[-1] == blocks[-1]["body"]
  with pytest.raises(IndexError):
    store.texts.blocks()[N]
  padded, lengths = store.gather_bodies(batch, 6)
  for (i, j), row in np.ndenumerate(batch):
    assert lengths[i, j] == len(bodies[row])
    np.testing.assert_array_equal(padded[i, j, :min(6, len(bodies[row]))], bodies[row][:6])
  with pytest.raises(IndexError):
    store.gather_packed([N + 1], seq_length)
  # Another id as [SEP] than the store's: found in the gathered rows, same packing.
  other = int(blocks[0]["token_ids"][1])
  words, mask, types, bodies = reference(blocks, seq_length, cls_id, other)
  got = store.gather_packed(batch, seq_length, cls_id, other)
  np.testing.assert_array_equal(got["input_word_ids"], words[batch])
  np.testing.assert_array_equal(got["input_type_ids"], types[batch])
  for i in (0, 1, N):
    np.testing.assert_array_equal(store.body(i, sep_id=other), bodies[i])


def test_same_uid_by_digest(corpus, tmp_path):
  store = block_store.BlockStore.open(corpus["blocks_dir"], store_dir=str(tmp_path))
  uids = [b["uid"] for b in corpus["blocks"]]
  rows = np.array([[0, 1, N, -1], [2, 2, 3, 0]])
  got = store.same_uid(rows, [uids[1], uids[2].encode()])
  np.testing.assert_array_equal(got, [[False, True, False, False], [True, True, False, False]])
  np.testing.assert_array_equal(store.same_uid([5, 6], uids[6]), [False, True])


def test_shards_out_of_order_and_uint32_fallback(tmp_path):
  rng = np.random.default_rng(1)
  lists = [[2] + [int(x) for x in rng.integers(5, 60000, rng.integers(1, 9))] + [3]
           + [int(x) for x in rng.integers(5, 100, rng.integers(0, 5))] + [3]
           for i in range(40)]
  lists[7][1] = 69999                                     # needs more than 16 bits
  order = rng.permutation(40)
  blocks_dir = str(tmp_path / "blocks")
  write_raw_blocks(blocks_dir, lists, order=order, num_shards=3)
  store = block_store.BlockStore.open(blocks_dir)
  assert store.path.startswith(os.path.join(blocks_dir, block_store.STORE_DIR))
  assert store.token_dtype == np.uint32
  blocks = manifests.read_blocks(blocks_dir)
  words, mask, types, bodies = reference(blocks, 12, 2, 3)
  got = store.gather_packed(np.arange(41), 12)
  np.testing.assert_array_equal(got["input_word_ids"], words)
  np.testing.assert_array_equal(got["input_type_ids"], types)
  for i in range(40):
    np.testing.assert_array_equal(store.tokens(i), lists[i])
    np.testing.assert_array_equal(store.body(i), bodies[i])
    assert store.text(i) == f"body {i} é"
  # An in-memory store of the same blocks agrees.
  memory = block_store.BlockStore.from_blocks(blocks)
  assert memory.token_dtype == np.uint32
  np.testing.assert_array_equal(memory.gather_packed(np.arange(41), 12)["input_mask"], mask)


def test_bad_fingerprint_is_an_error(tmp_path):
  blocks_dir = str(tmp_path / "blocks")
  write_raw_blocks(blocks_dir, [[2, 5, 3, 6, 3]] * 4)
  manifest = json.load(open(os.path.join(blocks_dir, manifests.MANIFEST)))
  manifest["fingerprint"] = "0" * 40
  json.dump(manifest, open(os.path.join(blocks_dir, manifests.MANIFEST), "w"))
  with pytest.raises(manifests.CorpusFormatError, match="fingerprint"):
    block_store.BlockStore.open(blocks_dir)
  assert not [n for n in os.listdir(os.path.join(blocks_dir, block_store.STORE_DIR))
              if n != block_store.LOCK_NAME]


def test_rebuilt_when_the_corpus_changes(tmp_path):
  blocks_dir = str(tmp_path / "blocks")
  write_raw_blocks(blocks_dir, [[2, 5, 3, 6, 3]] * 4)
  first = block_store.BlockStore.open(blocks_dir)
  again = block_store.BlockStore.open(blocks_dir)
  assert again.path == first.path
  meta = os.path.join(first.path, block_store.META)
  mtime = os.path.getmtime(meta)
  assert block_store.BlockStore.open(blocks_dir).path == first.path and os.path.getmtime(
      meta) == mtime                                    # opened, not rebuilt
  uids = [features.block_uid(f"new {i}", "x") for i in range(5)]
  write_raw_blocks(blocks_dir, [[2, 7, 3, 8, 8, 3]] * 5, uids=uids)
  second = block_store.BlockStore.open(blocks_dir)
  assert second.path != first.path and len(second) == 5
  np.testing.assert_array_equal(second.tokens(4), [2, 7, 3, 8, 8, 3])
  assert second.fingerprint == manifests.corpus_fingerprint(uids)
  # The old store is gone; only the new one is left (no temporary directories).
  assert sorted(os.listdir(os.path.dirname(second.path))) == [block_store.LOCK_NAME,
                                                              os.path.basename(second.path)]
  # A store missing a file is not opened but rebuilt.
  os.remove(os.path.join(second.path, "texts.bin"))
  third = block_store.BlockStore.open(blocks_dir)
  assert third.text(0) == "body 0 é"


def test_concurrent_first_use_builds_one_store(tmp_path, monkeypatch):
  """Two first uses at once: the store root's lock lets one build; the other waits for it and
  opens that store."""
  blocks_dir = str(tmp_path / "blocks")
  write_raw_blocks(blocks_dir, [[2, 5 + i, 3, 6, 3] for i in range(30)])
  barrier = threading.Barrier(2, timeout=60)
  build = block_store._build
  builds, results = [], {}

  def slow_build(*args):
    builds.append(args[-2])
    time.sleep(0.5)  # The other opener arrives while this one builds.
    return build(*args)

  monkeypatch.setattr(block_store, "_build", slow_build)

  def open_store(name):
    barrier.wait()
    results[name] = block_store.BlockStore.open(blocks_dir)

  threads = [threading.Thread(target=open_store, args=(n,)) for n in ("a", "b")]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert len(builds) == 1
  assert results["a"].path == results["b"].path
  root = os.path.dirname(results["a"].path)
  assert sorted(os.listdir(root)) == [block_store.LOCK_NAME,
                                      os.path.basename(results["a"].path)]
  for name in ("a", "b"):
    np.testing.assert_array_equal(results[name].tokens(29), [2, 34, 3, 6, 3])


def test_candidate_builder_over_the_store_matches_the_dicts(corpus, tmp_path):
  blocks, cls_id, sep_id = corpus["blocks"], corpus["cls"], corpus["sep"]
  config = testing.tiny_model_config(corpus["vocab"], block_seq_length=20, query_seq_length=8)
  config = config.replace(num_candidates=5,
                          reader=config.reader.replace(seq_length=20))  # bodies cut to fit
  over_dicts = candidates.CandidateBuilder(blocks, config, None, cls_id, sep_id)
  over_store = candidates.CandidateBuilder.from_blocks_dir(
      corpus["blocks_dir"], config, None, cls_id, sep_id, store_dir=str(tmp_path))
  assert isinstance(over_store.store, block_store.BlockStore) and over_store.store.path
  rng = np.random.default_rng(3)
  b, lq = 6, config.retriever.query_seq_length
  lengths = rng.integers(3, lq + 1, b)
  query_ids = np.zeros([b, lq], np.int64)
  query_mask = np.zeros([b, lq], np.int64)
  for i, n in enumerate(lengths):
    query_ids[i, :n] = [cls_id] + list(rng.integers(5, 40, n - 2)) + [sep_id]
    query_mask[i, :n] = 1
  source = rng.integers(0, N, b)
  examples = dict(query_ids=query_ids, query_mask=query_mask,
                  mlm_positions=np.ones([b, config.max_masks], np.int64),
                  mlm_ids=np.ones([b, config.max_masks], np.int64),
                  mlm_weights=np.ones([b, config.max_masks], np.float32),
                  source_uid=np.array([blocks[s]["uid"].encode() for s in source]))
  ranked = np.stack([rng.permutation(N)[:8] for _ in range(b)])
  ranked[:, 2] = source                                   # a trivial hit to drop
  for builder in (over_dicts, over_store):
    assert builder.null_row == N
  rows = over_store.select_candidates(ranked, examples["source_uid"])
  np.testing.assert_array_equal(rows, over_dicts.select_candidates(ranked,
                                                                   examples["source_uid"]))
  for i in range(b):
    assert source[i] not in rows[i]
    assert over_store.non_trivial(ranked[i], examples["source_uid"][i]) == [
        int(r) for r in ranked[i] if blocks[r]["uid"] != blocks[source[i]]["uid"]]
  want = over_dicts.features(examples, candidates=rows)
  got = over_store.features(examples, candidates=rows)
  assert sorted(got) == sorted(want)
  for name in want:
    np.testing.assert_array_equal(got[name], want[name], err_msg=name)
  # The reader inputs against a loop that follows the layout's definition.
  _, _, _, bodies = reference(blocks, 20, cls_id, sep_id)
  r_len = config.reader.seq_length
  for i in range(b):
    q = query_ids[i, :lengths[i]]
    for j, row in enumerate(rows[i]):
      body = list(bodies[row][:r_len - len(q)])
      if body:
        body[-1] = sep_id
      want_ids = np.zeros(r_len, np.int32)
      want_ids[:len(q)] = q
      want_ids[len(q):len(q) + len(body)] = body
      np.testing.assert_array_equal(got["reader_word_ids"][i, j], want_ids)
      assert got["reader_type_ids"][i, j].sum() == len(body)
  packed = reference(blocks, 20, cls_id, sep_id)
  np.testing.assert_array_equal(got["candidate_word_ids"], packed[0][rows])
  assert over_store.bodies_text[int(rows[0, 1])] == blocks[rows[0, 1]]["body"]
  assert over_store.bodies_text[N] == "" and len(over_store.bodies) == N + 1
  np.testing.assert_array_equal(over_store.block_word_ids, packed[0])
