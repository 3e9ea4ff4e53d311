"""ICT pairs drawn at read time, as ORQA does: one random sentence per block, a fresh coin."""

import collections
import json
import os
import pathlib

import numpy as np
import pytest
import tensorflow as tf

from experiments import assets
from data_prep import ict_examples
from realm_tf import configs
from realm_tf.data import features
from realm_tf.data import loaders
from realm_tf.data import manifests
from realm_tf.tokenization import RealmTokenizer

VOCAB = str(assets.BERT_VOCAB)
TITLE = "Velo Quintrell"
SENTENCES = ["Velo Quintrell was born in the old port of Marseille in 1843.",
             "He wrote three novels about the sea.", "He died in London."]
OTHER_TITLE = "Harbor"
OTHER = ["The harbor is deep.", "Ships from many countries dock there every day.",
         "It froze in 1901."]


@pytest.fixture(scope="module")
def tok():
  return RealmTokenizer(VOCAB)


def ids(tok, texts):
  return [tok.tokenize([t])[0].numpy().tolist() for t in texts]


def write_ict_dir(directory, records, remove_prob=0.9, **manifest):
  """An ICT examples directory in the sampled format, with ``records`` in its train split."""
  os.makedirs(directory)
  path = manifests.shard_name(os.path.join(directory, manifests.TRAIN_SPLIT), 0, 1)
  with tf.io.TFRecordWriter(path) as writer:
    for record in records:
      writer.write(record)
  manifest = dict({"kind": "ict", "sampling": manifests.ICT_SAMPLING, "num_train": len(records),
                   "remove_prob": remove_prob, "cls_id": 101, "sep_id": 102}, **manifest)
  with open(os.path.join(directory, manifests.MANIFEST), "w") as f:
    json.dump(manifest, f)
  return os.path.join(directory, "train-*")


def expected_pair(cls, sep, title, sentences, index, removed, query_len, block_len):
  """Query and block of one draw, in plain Python (padded lists)."""
  def pad(values, n):
    return values + [0] * (n - len(values))

  query = [cls] + sentences[index][:query_len - 2] + [sep]
  context = [t for j, s in enumerate(sentences) if j != index or not removed for t in s]
  head = [cls] + title[:block_len - 3] + [sep]
  block = head + context + [sep]
  if len(block) > block_len:
    block = block[:block_len - 1] + [sep]
  types = [0] * len(head) + [1] * (len(block) - len(head))
  return dict(query_ids=pad(query, query_len), query_mask=pad([1] * len(query), query_len),
              block_ids=pad(block, block_len), block_mask=pad([1] * len(block), block_len),
              block_type_ids=pad(types, block_len), sentence_removed=int(removed))


def draws(seed, batch_number, batch_size, num_sentences, remove_prob):
  """The test's own recomputation of the loader's stateless draws for one batch."""
  u = tf.random.stateless_uniform([batch_size, 2], seed=[seed, batch_number]).numpy()
  index = np.minimum((u[:, 0] * np.float32(num_sentences)).astype(np.int32),
                     num_sentences - 1)
  return index, u[:, 1] < np.float32(remove_prob)


def ict_data(path, batch_size, is_training, seed=None):
  return configs.IctDataConfig(input_path=path, global_batch_size=batch_size,
                               is_training=is_training, shuffle_buffer_size=8, seed=seed,
                               drop_remainder=is_training)


def test_sampled_pairs_match_a_direct_construction(tok, tmp_path):
  blocks = {3: (ids(tok, [TITLE])[0], ids(tok, SENTENCES)),
            8: (ids(tok, [OTHER_TITLE])[0], ids(tok, OTHER))}
  path = write_ict_dir(str(tmp_path / "ict"), [
      features.serialize_ict_block(i, t, s) for i, (t, s) in blocks.items()])
  qlen, blen, batch, seed = 8, 24, 4, 7
  loader = loaders.get_loader(ict_data(path, batch, True, seed), query_seq_length=qlen,
                              block_seq_length=blen)
  assert (loader.cls_id, loader.sep_id, loader.remove_prob) == (101, 102, 0.9)
  seen = set()
  for t, got in enumerate(loader.load().take(6)):
    got = {k: v.numpy() for k, v in got.items()}
    assert got["query_ids"].shape == (batch, qlen) and got["block_ids"].shape == (batch, blen)
    assert all(v.dtype == np.int32 for v in got.values())
    index, removed = draws(seed, t, batch, 3, 0.9)
    for row in range(batch):
      title, sentences = blocks[int(got["block_id"][row])]
      want = expected_pair(101, 102, title, sentences, index[row], removed[row], qlen, blen)
      for key, value in want.items():
        np.testing.assert_array_equal(got[key][row], value, err_msg=f"{key}, batch {t}")
      seen.add((int(got["block_id"][row]), int(index[row]), bool(removed[row])))
  # The reads drew several sentences of both blocks, with both outcomes of the coin.
  assert len({s[1] for s in seen}) == 3 and {s[0] for s in seen} == {3, 8}
  assert {s[2] for s in seen} == {True, False}


def test_layout_is_the_tokenizers(tok):
  """Left in place, the block is ``block_inputs`` of the body; the query ``query_inputs``."""
  title, sentences = ids(tok, [TITLE])[0], ids(tok, SENTENCES)
  parsed = features.parse_ict_example(tf.constant(
      [features.serialize_ict_block(0, title, sentences)] * 6))
  for blen in (12, 64):
    got = features.sample_ict_examples(parsed, [1, 2], 10, blen, 0.0, tok.cls_id, tok.sep_id)
    want = tok.block_inputs([TITLE], [" ".join(SENTENCES)], blen)
    index, _ = features.ict_draws(parsed["sentences"].row_lengths(), [1, 2], 0.0)
    for row in range(6):
      assert got["block_ids"][row].numpy().tolist() == want["input_word_ids"][0].numpy().tolist()
      assert got["block_type_ids"][row].numpy().tolist() == (
          want["input_type_ids"][0].numpy().tolist())
      assert got["block_mask"][row].numpy().tolist() == want["input_mask"][0].numpy().tolist()
      query = tok.query_inputs([SENTENCES[int(index[row])]], 10)
      assert got["query_ids"][row].numpy().tolist() == query["input_word_ids"][0].numpy().tolist()
    assert not got["sentence_removed"].numpy().any()


def test_many_reads_draw_each_sentence_and_the_coin(tok, tmp_path):
  sentences = ids(tok, SENTENCES)
  path = write_ict_dir(str(tmp_path / "ict"), [
      features.serialize_ict_block(5, ids(tok, [TITLE])[0], sentences)])
  loader = loaders.get_loader(ict_data(path, 30, True, seed=0), query_seq_length=32,
                              block_seq_length=96)
  by_query = {tuple([101] + s + [102]): i for i, s in enumerate(sentences)}
  drawn, removed, batches = collections.Counter(), [], set()
  for batch in loader.load().take(30):  # 900 reads of the one block.
    batches.add(tuple(batch["query_ids"].numpy()[:, 1]) + tuple(batch["sentence_removed"].numpy()))
    for q, m, b, r in zip(batch["query_ids"].numpy(), batch["query_mask"].numpy(),
                          batch["block_ids"].numpy(), batch["sentence_removed"].numpy()):
      i = by_query[tuple(q[m > 0])]
      drawn[i] += 1
      body = b[b > 0].tolist()
      inside = any(body[k:k + len(sentences[i])] == sentences[i] for k in range(len(body)))
      assert inside == (not r)
      removed.append(r)
  assert sum(drawn.values()) == 900 and len(batches) == 30  # Each batch drew afresh.
  for i in range(3):
    assert 0.27 < drawn[i] / 900 < 0.40, drawn
  assert 0.85 <= np.mean(removed) <= 0.95


def test_long_sentence_is_cut_to_the_query_length(tok):
  long = [2000 + i for i in range(100)]
  parsed = features.parse_ict_example(tf.constant(
      [features.serialize_ict_block(1, [7592], [long, [2003, 1012]])] * 40))
  got = features.sample_ict_examples(parsed, [3, 4], 64, 288, 0.9, tok.cls_id, tok.sep_id)
  index, _ = features.ict_draws(parsed["sentences"].row_lengths(), [3, 4], 0.9)
  rows = np.flatnonzero(index.numpy() == 0)
  assert rows.size  # The long sentence was drawn.
  for row in rows:
    assert got["query_ids"][row].numpy().tolist() == [tok.cls_id] + long[:62] + [tok.sep_id]
    assert got["query_mask"][row].numpy().tolist() == [1] * 64


def test_validation_draws_the_same_pairs_at_every_pass(tok, tmp_path):
  records = [features.serialize_ict_block(i, ids(tok, [TITLE])[0], ids(tok, SENTENCES))
             for i in range(7)]
  path = write_ict_dir(str(tmp_path / "ict"), records)

  def one_pass():
    loader = loaders.get_loader(ict_data(path, 3, False), query_seq_length=16,
                                block_seq_length=32)
    batches = list(loader.load().as_numpy_iterator())
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}

  first, second = one_pass(), one_pass()
  assert first["block_id"].tolist() == list(range(7))  # In order, the last batch partial.
  for key in first:
    np.testing.assert_array_equal(first[key], second[key], err_msg=key)
  # The rows drew apart although they hold the same block.
  assert len({tuple(q) for q in first["query_ids"]}) > 1


def test_old_format_directories_are_refused(tmp_path):
  old = str(tmp_path / "old_ict")
  path = write_ict_dir(old, [b"x"])
  with open(os.path.join(old, manifests.MANIFEST), "w") as f:  # The fixed pairs' manifest.
    json.dump({"kind": "ict", "num_train": 1, "num_eval": 0, "num_sentence_removed": 1,
               "remove_prob": 0.9, "query_seq_length": 96, "block_seq_length": 288}, f)
  with pytest.raises(loaders.InputError) as error:
    loaders.get_loader(ict_data(path, 2, True), query_seq_length=32, block_seq_length=64)
  message = str(error.value)
  assert old in message and "python -m data_prep.ict_examples" in message
  assert "\n" not in message


def test_remove_prob_comes_from_the_manifest_unless_given(tok, tmp_path):
  record = features.serialize_ict_block(0, [7592], [[2003], [2004], [2005]])
  path = write_ict_dir(str(tmp_path / "ict"), [record], remove_prob=0.0)
  data = ict_data(path, 40, True, seed=1)
  kept = loaders.get_loader(data, query_seq_length=8, block_seq_length=16)
  assert kept.remove_prob == 0.0
  assert not next(iter(kept.load()))["sentence_removed"].numpy().any()
  cut = loaders.get_loader(data, query_seq_length=8, block_seq_length=16, remove_prob=1.0)
  assert next(iter(cut.load()))["sentence_removed"].numpy().all()


def test_block_sentences_keeps_what_the_block_can_show():
  title = [1, 2, 3]  # The body starts at position 5 of [CLS] t t t [SEP] body.
  kept, dropped = ict_examples.block_sentences(title, [[9] * 4, [], [8] * 2, [7], [6]], 12)
  # Positions 5-8 and 9-10 are inside; the next sentence would start at 11 = the last [SEP].
  assert kept == [[9] * 4, [8] * 2] and dropped == 2
  assert ict_examples.block_sentences(title, [[9], [8]], 288) == ([[9], [8]], 0)


def test_query_mask_prob_masks_one_span_of_the_sentence(tok, tmp_path):
  """With query_mask_prob, a share of the queries get one span of 1..query_mask_span
  wordpieces inside the sentence replaced by [MASK] (REALM's query shape); the rest of each
  pair is the unmasked sampler's, and prob 0 is ORQA's ICT unchanged."""
  blocks = {3: (ids(tok, [TITLE])[0], ids(tok, SENTENCES)),
            8: (ids(tok, [OTHER_TITLE])[0], ids(tok, OTHER))}
  path = write_ict_dir(str(tmp_path / "ict"), [
      features.serialize_ict_block(i, t, s) for i, (t, s) in blocks.items()])

  def reads(prob, mask_id=tok.mask_id):
    params = ict_data(path, 4, True, seed=3)
    params.query_mask_prob, params.query_mask_span = prob, 2
    loader = loaders.get_loader(params, query_seq_length=12, block_seq_length=24,
                                mask_id=mask_id)
    return [{k: v.numpy() for k, v in b.items()} for b in loader.load().take(50)]

  plain, masked = reads(0.0), reads(0.5)
  spans = 0
  for a, b in zip(plain, masked):
    for key in ("query_mask", "block_ids", "block_mask", "block_type_ids", "block_id"):
      np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    for q, m, mask in zip(a["query_ids"], b["query_ids"], a["query_mask"]):
      changed = np.flatnonzero(q != m)
      if changed.size:
        spans += 1
        assert (m[changed] == tok.mask_id).all() and changed.size <= 2
        assert (np.diff(changed) == 1).all()                          # one contiguous span
        assert changed[0] >= 1 and changed[-1] <= mask.sum() - 2      # inside the sentence
  assert 0.35 < spans / 200 < 0.65
  with pytest.raises(loaders.InputError, match=r"needs the vocabulary's \[MASK\] id"):
    reads(0.5, mask_id=None)
