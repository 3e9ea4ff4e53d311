"""BERT's masked LM for the reader (``tasks/reader_mlm.py``): windows, masking, loss, data."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from realm_tf import configs
from realm_tf.data import loaders
from realm_tf.data import manifests
from realm_tf.tasks import reader_mlm

CLS, SEP, MASK, VOCAB = 1, 2, 3, 40


def block(uid, title, body):
  return dict(uid=uid, token_ids=[CLS, *title, SEP, *body, SEP])


def test_windows_cut_the_bodies_of_one_split_only():
  """Bodies (title and separators left out) cut in order; a last piece under 16 wordpieces is
  dropped; the blocks of the other split never appear."""
  uids = [f"u{i}" for i in range(40)]
  held = [u for u in uids if manifests.split_of(u, 0.3) == "eval"]
  assert 0 < len(held) < len(uids)
  bodies = {u: list(range(100 + 50 * i, 100 + 50 * i + 20 + i)) for i, u in enumerate(uids)}
  blocks = [block(u, [7, 8], bodies[u]) for u in uids]
  for split in ("train", "eval"):
    windows = reader_mlm.block_windows(blocks, SEP, 18, split, 0.3)
    want = []
    for u in uids:
      if (u in held) == (split == "eval"):
        pieces = [bodies[u][i:i + 18] for i in range(0, len(bodies[u]), 18)]
        want += [p for p in pieces if len(p) >= 16]
    assert [list(w[w > 0]) for w in windows] == want
    assert windows.shape[1] == 18


def draw(window, seed, max_predictions=8):
  out = reader_mlm.bert_mask(tf.constant(window, tf.int32), tf.constant([seed, 7], tf.int64),
                             CLS, SEP, MASK, VOCAB, 0.15, max_predictions)
  return {k: v.numpy() for k, v in out.items()}


def test_bert_masking_rule():
  """15% of the real wordpieces (rounded, at least 1, at most max_predictions), never [CLS],
  [SEP] or padding, each once; the targets are the originals; 80% become [MASK], 10% a random
  wordpiece, 10% stay (binomial bounds over 2,000 draws); the same seed, the same draw."""
  window = list(range(10, 30)) + [0] * 6                 # 20 real wordpieces of 26
  ids = np.array([CLS, *range(10, 30), SEP, *[0] * 6])
  kinds = collections.Counter()
  for seed in range(2000):
    d = draw(window, seed)
    n = int(d["mlm_weights"].sum())
    assert n == 3                                         # round(0.15 * 20)
    positions = d["masked_lm_positions"][:n]
    assert len(set(positions)) == n and all(1 <= p <= 20 for p in positions)
    np.testing.assert_array_equal(d["mlm_ids"][:n], ids[positions])
    assert not d["mlm_ids"][n:].any() and not d["masked_lm_positions"][n:].any()
    np.testing.assert_array_equal(d["input_mask"], ids > 0)
    unmasked = np.setdiff1d(np.arange(len(ids)), positions)
    np.testing.assert_array_equal(d["input_word_ids"][unmasked], ids[unmasked])
    for p in positions:
      got = d["input_word_ids"][p]
      kinds["mask" if got == MASK else "same" if got == ids[p] else "random"] += 1
  total = sum(kinds.values())
  # A random draw equal to the original counts as "same" (1 in 40 of 10%).
  assert abs(kinds["mask"] / total - 0.8) < 0.03
  assert abs(kinds["random"] / total - 0.1 * 39 / 40) < 0.02
  assert abs(kinds["same"] / total - (0.1 + 0.1 / 40)) < 0.02
  a, b = draw(window, 3), draw(window, 3)
  for k in a:
    np.testing.assert_array_equal(a[k], b[k])
  assert draw([11] * 4 + [0] * 4, 0)["mlm_weights"].sum() == 1          # at least one
  assert draw(list(range(10, 110)), 0, 8)["mlm_weights"].sum() == 8     # at most max


def task_and_model(seq_length=12):
  enc = configs.bert_tiny(VOCAB, 16, dropout_rate=0.0)
  config = configs.ReaderMlmTaskConfig(model=configs.RealmModelConfig(
      reader=configs.ReaderConfig(encoder=enc, seq_length=seq_length)))
  task = reader_mlm.ReaderMlmTask(config)
  return task, task.build_model()


def test_loss_is_the_mean_cross_entropy_of_the_masked_wordpieces():
  task, model = task_and_model()
  rng = np.random.default_rng(0)
  lengths = (10, 7, 4)
  batch = [draw(list(rng.integers(5, VOCAB, n)) + [0] * (10 - n), seed, 4)
           for seed, n in enumerate(lengths)]
  inputs = {k: tf.constant(np.stack([d[k] for d in batch])) for k in batch[0]}
  logits = model.reader({k: inputs[k] for k in ("input_word_ids", "input_mask",
                                                "input_type_ids", "masked_lm_positions")}
                        )["mlm_logits"].numpy().astype(np.float64)
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  labels, weights = inputs["mlm_ids"].numpy(), inputs["mlm_weights"].numpy()
  token = np.take_along_axis(logp, labels[..., None], -1)[..., 0]
  want = -(token * weights).sum() / weights.sum()
  metrics = task.build_metrics(training=True)
  logs = task.train_step(inputs, model, tf_keras.optimizers.SGD(0.0), metrics)
  np.testing.assert_allclose(logs["loss"], want, rtol=1e-5)
  right = ((logits.argmax(-1) == labels) * weights).sum() / weights.sum()
  np.testing.assert_allclose(metrics[0].result(), right, rtol=1e-6)


def test_inputs_train_never_read_held_out_blocks_and_validation_masks_are_fixed(monkeypatch,
                                                                                tmp_path):
  uids = [f"u{i}" for i in range(30)]
  held = {u for u in uids if manifests.split_of(u, 0.2) == "eval"}
  blocks = [block(u, [5], [10 + i] * 20) for i, u in enumerate(uids)]   # one word per block
  monkeypatch.setattr(manifests, "read_blocks", lambda _: blocks)
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("\n".join(["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"] +
                             [f"w{i}" for i in range(VOCAB - 5)]) + "\n")
  task, _ = task_and_model(seq_length=22)
  task.task_config.model.vocab_file = str(vocab)
  words = lambda batch: set(np.unique(batch["mlm_ids"][batch["mlm_weights"] > 0]))
  train = configs.BlockMlmDataConfig(blocks_dir="b", held_out_fraction=0.2,
                                     global_batch_size=4, seed=1)
  seen = set()
  for batch in task.build_inputs(train).take(30).as_numpy_iterator():
    seen |= words(batch)
  assert seen == {10 + i for i, u in enumerate(uids) if u not in held}
  valid = train.replace(is_training=False, global_batch_size=2, drop_remainder=False)
  reads = [list(task.build_inputs(valid).as_numpy_iterator()) for _ in range(2)]
  assert set().union(*map(words, reads[0])) == {10 + i for i, u in enumerate(uids) if u in held}
  for a, b in zip(*reads):
    np.testing.assert_array_equal(a["input_word_ids"], b["input_word_ids"])
  with pytest.raises(loaders.InputError, match="no eval block"):
    task.build_inputs(valid.replace(held_out_fraction=0.0))
