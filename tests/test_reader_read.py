"""The reader's reading warm start: the block it reads, and its loss."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import helpers
from realm_tf import configs
from realm_tf import model_dir as model_dir_lib
from realm_tf.data.loaders import InputError
from realm_tf.tasks import reader_read

# Ids: 0 pad, 1 [CLS], 2 [SEP]; words from 5.
BLOCKS = [
    dict(uid="a", body="Vela was born in Kor.", token_ids=[1, 5, 2, 5, 6, 7, 8, 2]),
    dict(uid="b", body="Kor lies in Dun; Vela lived in Kor.", token_ids=[1, 8, 2, 8, 9, 5, 8, 2]),
    dict(uid="c", body="Kor is old.", token_ids=[1, 8, 2, 8, 10, 2]),
    dict(uid="d", body="Vela and Kormo were born.", token_ids=[1, 11, 2, 5, 12, 6, 7, 2]),
]


def brute_force_scores(queries, blocks, ignore):
  df = {}
  for b in blocks:
    for t in set(b["token_ids"]):
      df[t] = df.get(t, 0) + 1
  scores = np.zeros([len(queries), len(blocks)])
  for i, q in enumerate(queries):
    for j, b in enumerate(blocks):
      shared = (set(q) & set(b["token_ids"])) - set(ignore)
      scores[i, j] = sum(np.log(len(blocks) / (1 + df[t])) for t in shared)
  return scores


def test_lexical_scores_against_brute_force():
  queries = [[1, 5, 6, 7, 4, 2, 0], [1, 8, 9, 12, 2, 0, 0]]
  ids = np.array(queries)
  got = reader_read.lexical_scores(ids, (ids > 0).astype(np.int32), BLOCKS, ignore_ids=(0, 1, 2))
  np.testing.assert_allclose(got, brute_force_scores(queries, BLOCKS, (0, 1, 2)), rtol=1e-5)


def test_reading_block_holds_the_answer_and_is_not_the_source():
  # "Vela was born in [MASK]." from block a: blocks b and c hold "Kor"; b shares "vela" with
  # the query, so it is read, and a (the source) never is. "Kormo" does not hold "Kor".
  # The second query's answer is nowhere: it falls back on the best lexical match.
  ids = np.array([[1, 5, 6, 7, 4, 2], [1, 11, 6, 4, 2, 0]])
  examples = dict(query_ids=ids, query_mask=(ids > 0).astype(np.int32),
                  source_uid=np.array([b"a", b"b"]), answer=np.array([b"Kor", b"Zed"]))
  candidates, found = reader_read.answer_block_candidates(BLOCKS, examples, (0, 1, 2, 4))
  np.testing.assert_array_equal(candidates, [[4, 1], [4, 3]])
  np.testing.assert_array_equal(found, [True, False])


def test_distractors_are_the_closest_blocks_without_the_answer():
  """Query 1's answer "Kor" is in b (read) and c; a is its source: d ("Kormo") is the only
  distractor there is. Query 2's answer is nowhere: d is read, a and c distract, closest
  first."""
  ids = np.array([[1, 5, 6, 7, 4, 2], [1, 11, 6, 4, 2, 0]])
  examples = dict(query_ids=ids, query_mask=(ids > 0).astype(np.int32),
                  source_uid=np.array([b"a", b"b"]), answer=np.array([b"Kor", b"Zed"]))
  scores = reader_read.lexical_scores(ids, examples["query_mask"], BLOCKS, (0, 1, 2, 4))
  candidates, _ = reader_read.answer_block_candidates(BLOCKS, examples, (0, 1, 2, 4), 1)
  np.testing.assert_array_equal(candidates[0], [4, 1, 3])
  closest = [0, 2] if scores[1, 0] >= scores[1, 2] else [2, 0]
  np.testing.assert_array_equal(candidates[1], [4, 3, closest[0]])
  with pytest.raises(InputError, match="fewer than 2 blocks without the answer"):
    reader_read.answer_block_candidates(BLOCKS, examples, (0, 1, 2, 4), 2)


@pytest.mark.parametrize("distractors", [0, 2])
def test_loss_is_the_uniform_marginal_over_null_and_reading_block(distractors):
  """REALM's marginal with a uniform p(z|x) over (null, reading block); with distractors,
  plus their mean -log p(y|z,x), both per real mask token."""
  enc = configs.bert_tiny(30, 16, dropout_rate=0.0)
  task = reader_read.ReaderReadTask(configs.ReaderReadTaskConfig(
      model=configs.RealmModelConfig(reader=configs.ReaderConfig(encoder=enc, seq_length=10),
                                     max_masks=3), distractors=distractors))
  model = task.build_model()
  rng = np.random.default_rng(5)
  b, k, n = 3, 2 + distractors, 10
  ids = rng.integers(5, 30, [b, k, n]).astype(np.int32)
  positions = np.array([[1, 2, 0], [3, 0, 0], [1, 4, 5]], np.int32)
  weights = np.array([[1, 1, 0], [1, 0, 0], [1, 1, 1]], np.float32)
  labels = rng.integers(5, 30, [b, 3]).astype(np.int32) * (weights > 0)
  inputs = dict(reader_word_ids=ids, reader_mask=np.ones_like(ids),
                reader_type_ids=np.zeros_like(ids), mlm_positions=positions, mlm_ids=labels,
                mlm_weights=weights)
  inputs = {key: tf.constant(v) for key, v in inputs.items()}
  flat = dict(input_word_ids=ids.reshape(b * k, n), input_mask=np.ones([b * k, n], np.int32),
              input_type_ids=np.zeros([b * k, n], np.int32),
              masked_lm_positions=np.repeat(positions, k, axis=0))
  logits = model.reader(flat)["mlm_logits"].numpy().astype(np.float64).reshape(b, k, 3, -1)
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  token = np.take_along_axis(logp, np.repeat(labels[:, None, :, None], k, 1), -1)[..., 0]
  marginal = np.log(0.5 * np.exp(token[:, 0]) + 0.5 * np.exp(token[:, 1]))
  want_loss = -(marginal * weights).sum() / weights.sum()
  if distractors:
    want_loss += -(token[:, 2:].mean(1) * weights).sum() / weights.sum()
  want_gain = ((token[:, 1] - token[:, 0]) * weights).sum()
  metrics = task.build_metrics(training=True)
  logs = task.train_step(inputs, model, tf_keras.optimizers.SGD(0.0), metrics)
  np.testing.assert_allclose(logs["loss"], want_loss, rtol=1e-5)
  by_name = {m.name: m for m in metrics}
  np.testing.assert_allclose(by_name["reading_gain"].result(), want_gain / b, rtol=1e-4,
                             atol=1e-5)  # per span
  assert float(by_name["mlm_accuracy"].count) == 6.0   # the real masked tokens
  if distractors:
    want = (((token[:, 2:] - token[:, :1]) * weights[:, None]).sum(-1).mean(1)).mean()
    np.testing.assert_allclose(by_name["distractor_gain"].result(), want, rtol=1e-4, atol=1e-5)


def test_one_blocks_dir_per_corpus():
  task = reader_read.ReaderReadTask(configs.ReaderReadTaskConfig())
  data = configs.ReadingDataConfig(input_path=["a/train-*", "b/train-*"], blocks_dir=["a/blocks"])
  with pytest.raises(configs.ConfigError, match="2 input paths but 1 blocks dirs"):
    task.build_inputs(data)


def test_the_start_is_restored_strictly_mlm_head_included(tmp_path):
  """The reading warm start trains the MLM head, so a start without one (a BERT checkpoint
  with its encoder only) is refused, naming the head, never silently started afresh."""
  config = configs.ReaderReadTaskConfig(model=helpers.tiny_config())
  tf_keras.utils.set_random_seed(0)
  saved = reader_read.ReaderReadTask(config).build_model().reader
  headless = str(tmp_path / "headless")
  tf.train.Checkpoint(reader=tf.train.Checkpoint(encoder=saved.encoder)).write(headless)
  whole = tf.train.Checkpoint(reader=saved).write(str(tmp_path / "whole"))
  for path, ok in ((headless, False), (whole, True)):
    task = reader_read.ReaderReadTask(config.replace(init_checkpoint=path))
    tf_keras.utils.set_random_seed(1)
    model = task.build_model()
    if not ok:
      with pytest.raises(model_dir_lib.ModelDirError, match="reader/masked_lm"):
        task.initialize(model)
      continue
    task.initialize(model)
    for a, b in zip(saved.weights, model.reader.weights):
      np.testing.assert_array_equal(a.numpy(), b.numpy())
