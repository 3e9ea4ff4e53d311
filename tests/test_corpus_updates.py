"""Versions of a blocks directory (``corpus_updates``) and the block store that follows them.

References: the manifest's fingerprints recomputed by hand; the store extended in place
against an in-memory store of the same blocks (``BlockStore.from_blocks``) and against a store
built from scratch; an interrupted append, a tampered update and older versions.
"""

import hashlib
import json
import os

import numpy as np
import pytest

from realm_tf import tokenization
from realm_tf.data import block_store
from realm_tf.data import corpus_updates
from realm_tf.data import features
from realm_tf.data import manifests
from realm_tf.retrieval.publication import testing


@pytest.fixture()
def corpus(tmp_path):
  vocab = testing.write_vocab(str(tmp_path / "vocab.txt"))
  blocks_dir = str(tmp_path / "blocks")
  testing.make_corpus(blocks_dir, vocab, 40, num_shards=2)
  return dict(vocab=vocab, blocks_dir=blocks_dir, tokenizer=tokenization.RealmTokenizer(vocab),
              store_dir=str(tmp_path / "stores"))


def _blocks(tokenizer, titles, bodies):
  inputs = tokenizer.block_inputs(list(titles), list(bodies), 32)
  ids, mask = inputs["input_word_ids"].numpy(), inputs["input_mask"].numpy()
  return [{"uid": features.block_uid(t, b), "title": t, "body": b,
           "token_ids": row[:m.sum()].tolist()} for t, b, row, m in zip(titles, bodies, ids, mask)]


def _check_store(store, blocks, deleted):
  """The store's rows against an in-memory store of ``blocks`` (row = position)."""
  reference = block_store.BlockStore.from_blocks(blocks)
  assert len(store) == len(blocks)
  rows = np.arange(len(blocks) + 1)
  for key, value in reference.gather_packed(rows, 24).items():
    np.testing.assert_array_equal(store.gather_packed(rows, 24)[key], value)
  for i, block in enumerate(blocks):
    np.testing.assert_array_equal(store.tokens(i), block["token_ids"])
    assert store.text(i) == block["body"] and store.titles[i] == block["title"]
    assert store.uid_digest(i) == hashlib.sha1(block["uid"].encode()).digest()
  np.testing.assert_array_equal(store.deleted, sorted(deleted))
  live = store.is_live(rows)
  assert not live[-1] and live[:-1].sum() == len(blocks) - len(deleted)


def test_versions_fingerprints_and_the_store(corpus, monkeypatch):
  blocks_dir, tokenizer, store_dir = corpus["blocks_dir"], corpus["tokenizer"], corpus["store_dir"]
  v0 = manifests.load_blocks_manifest(blocks_dir)
  base = manifests.read_blocks(blocks_dir)
  first = block_store.BlockStore.open(blocks_dir, store_dir=store_dir)
  assert first.fingerprints == [v0["fingerprint"]] and not len(first.deleted)

  added1 = _blocks(tokenizer, ["river city 1", "river city 2"], ["the king was born in paris",
                                                                  "a band from london"])
  with corpus_updates.lock(blocks_dir):
    v1 = corpus_updates.apply(blocks_dir, added1, [3, 7])
  added2 = _blocks(tokenizer, ["island"], ["the island and the ocean"])
  v2 = corpus_updates.apply(blocks_dir, added2, [40])
  # The manifest: rows, versions, and each fingerprint by its rule.
  assert v2["num_blocks"] == 43 and v2["num_deleted"] == 3
  assert v2["base"] == {"num_blocks": 40, "fingerprint": v0["fingerprint"]}
  expect1 = hashlib.sha1((v0["fingerprint"] + "\n" + "".join(
      f"+{b['uid']}\n" for b in added1) + "-3\n-7\n").encode()).hexdigest()
  expect2 = hashlib.sha1((expect1 + "\n" + f"+{added2[0]['uid']}\n-40\n").encode()).hexdigest()
  assert corpus_updates.fingerprints(v2) == [v0["fingerprint"], expect1, expect2]
  assert v1["fingerprint"] == expect1 == corpus_updates.manifest_at(v2, expect1)["fingerprint"]
  assert corpus_updates.manifest_at(v2, expect1)["num_blocks"] == 42
  assert corpus_updates.base_manifest(v2) == v0
  np.testing.assert_array_equal(corpus_updates.deleted_rows(v2), [3, 7, 40])
  with pytest.raises(manifests.CorpusFormatError, match="not live"):
    corpus_updates.apply(blocks_dir, [], [3])
  with pytest.raises(manifests.CorpusFormatError, match="no version"):
    corpus_updates.manifest_at(v2, "0" * 40)

  # The store grows in place: nothing rebuilt, the same directory.
  monkeypatch.setattr(block_store, "_build", lambda *a: pytest.fail("rebuilt the store"))
  store = block_store.BlockStore.open(blocks_dir, store_dir=store_dir)
  assert store.path == first.path and store.fingerprint == expect2
  everything = base + added1 + added2
  _check_store(store, everything, [3, 7, 40])
  assert len(first) == 40 and first.text(39) == base[39]["body"]  # The old view still reads.
  # An older version: its rows, its deletions.
  older = block_store.BlockStore.open(blocks_dir, store_dir=store_dir, fingerprint=expect1)
  _check_store(older, base + added1, [3, 7])
  original = block_store.BlockStore.open(blocks_dir, store_dir=store_dir,
                                         fingerprint=v0["fingerprint"])
  _check_store(original, base, [])
  # Rows by title and uid: live ones only.
  np.testing.assert_array_equal(store.rows_with_title("river city 2"), [41])
  np.testing.assert_array_equal(store.rows_with_uid(added1[0]["uid"]), [])  # deleted
  np.testing.assert_array_equal(store.rows_with_uid(added2[0]["uid"]), [42])
  np.testing.assert_array_equal(store.rows_with_uid(base[5]["uid"]), [5])
  np.testing.assert_array_equal(store.rows_with_title(base[3]["title"]), [])
  titles = [store.titles[r] for r in range(len(store))]  # Many at once, against a scan.
  asked = sorted(set(titles))[::3] + ["", "no such title", base[3]["title"], "island",
                                      "a title longer than any of the corpus"]
  for title, rows in zip(asked, store.rows_with_titles(asked)):
    assert rows.tolist() == [r for r, t in enumerate(titles)
                             if t == title and r not in (3, 7, 40)], title
  monkeypatch.undo()

  # Built from scratch over the updated corpus: the same store.
  fresh = block_store.BlockStore.open(blocks_dir, store_dir=corpus["store_dir"] + "_fresh")
  _check_store(fresh, everything, [3, 7, 40])


def test_interrupted_append_and_tampered_update(corpus):
  blocks_dir, tokenizer, store_dir = corpus["blocks_dir"], corpus["tokenizer"], corpus["store_dir"]
  base = manifests.read_blocks(blocks_dir)
  store = block_store.BlockStore.open(blocks_dir, store_dir=store_dir)
  # A crashed append: bytes past meta.json's sizes in every file.
  for name in block_store._FILES:  # pylint: disable=protected-access
    with open(os.path.join(store.path, name), "ab") as f:
      f.write(b"\x07" * 13)
  again = block_store.BlockStore.open(blocks_dir, store_dir=store_dir)
  _check_store(again, base, [])  # The complete rows read as before.
  added = _blocks(tokenizer, ["war"], ["the war of the king"])
  corpus_updates.apply(blocks_dir, added, [0])
  extended = block_store.BlockStore.open(blocks_dir, store_dir=store_dir)
  assert extended.path == store.path
  _check_store(extended, base + added, [0])  # The garbage was cut off before appending.

  # An update file that does not match its fingerprint is refused.
  more = _blocks(tokenizer, ["film"], ["an actor in a film"])
  manifest = corpus_updates.apply(blocks_dir, more, [])
  update = manifest["updates"][-1]
  evil = _blocks(tokenizer, ["film"], ["an actor in another film"])[0]
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  with tf.io.TFRecordWriter(os.path.join(blocks_dir, update["file"])) as writer:
    writer.write(features.serialize_block(update["first_block_id"], evil["uid"], evil["title"],
                                          evil["body"], evil["token_ids"]))
  with pytest.raises(manifests.CorpusFormatError, match="update 2 do not match"):
    block_store.BlockStore.open(blocks_dir, store_dir=store_dir)
  with open(os.path.join(blocks_dir, manifests.MANIFEST)) as f:
    assert json.load(f)["num_blocks"] == 42


def test_documents_cut_in_one_batch_as_one_by_one(corpus):
  """``realm_tf.data.articles.articles_to_blocks`` (what updates call: two tokenizer calls in
  all) gives each article the blocks ``article_to_blocks`` gives it alone."""
  from realm_tf.data import articles as blocks_pipeline  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  articles = [(f"the river {i}", " ".join(
      " ".join(rng.choice(testing.WORDS, int(rng.integers(3, 25)))) + "." for _ in range(n)))
              for i, n in enumerate([1, 6, 0, 3, 12])]
  batch = blocks_pipeline.articles_to_blocks(articles, corpus["tokenizer"], 24)
  alone = [blocks_pipeline.article_to_blocks(t, x, corpus["tokenizer"], 24) for t, x in articles]
  assert batch == alone and [len(b) for b in batch][2] == 0 and len(batch[4]) > 2
