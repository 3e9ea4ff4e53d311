"""Retrieval health: the signals against NumPy, the duplicate-uid skip, and the alarms on a
collapsed and on a healthy retriever."""

import json
import math

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from realm_tf import configs
from realm_tf import health
from realm_tf import train_lib
from realm_tf.modeling.models import RealmPretrainer
from realm_tf.tasks import candidates
from realm_tf.tasks import realm_pretrain

from helpers import CLS, LB, SEP, ExactHandle, make_blocks, make_examples, tiny_config


def numpy_signals(logits, token_lp, weights, q, c, rows, holds):
  """Every signal from first principles, as a weighted mean over the batch."""
  b, k = logits.shape
  p = np.exp(logits - logits.max(1, keepdims=True))
  p /= p.sum(1, keepdims=True)
  out = {"retrieval_entropy_ratio": np.mean(-(p * np.log(p)).sum(1) / math.log(k)),
         "p_null": p[:, 0].mean()}
  margins = [row.max() - (row.sum() - row.max()) / (k - 1) for row in logits]
  out["retrieval_margin"] = np.mean(margins)
  out["candidates_with_answer"] = holds[:, 1:].mean()
  out["any_candidate_with_answer"] = holds[:, 1:].max(1).mean()
  answer, other = [], []
  for i in range(b):
    n = weights[i].sum()
    if n == 0:
      continue
    span = (token_lp[i] * weights[i]).sum(-1) / n                       # [k]
    for z in range(1, k):
      (answer if holds[i, z] else other).append(span[z] - span[0])
  out["reader_gain_answer"], out["reader_gain_other"] = np.mean(answer), np.mean(other)

  def cosine(v):
    v = v / np.linalg.norm(v, axis=1, keepdims=True)
    return np.mean([v[i] @ v[j] for i in range(len(v)) for j in range(len(v)) if i != j])
  out["query_cosine"] = cosine(q)
  out["block_cosine"] = cosine(c[:, 1:].reshape(-1, c.shape[-1]))
  out["distinct_candidates"] = len(set(rows[:, 1:].ravel())) / rows[:, 1:].size
  return out


def test_signals_match_numpy():
  rng = np.random.default_rng(0)
  b, k, m, d = 5, 4, 3, 6
  logits = rng.normal(size=[b, k]) * 2
  token_lp = -rng.exponential(size=[b, k, m]) * 3
  weights = (rng.random([b, m]) < 0.7).astype(np.float32)
  weights[2] = 0.0                                  # an example without a real mask token
  q, c = rng.normal(size=[b, d]), rng.normal(size=[b, k, d])
  rows = rng.integers(0, 6, [b, k])
  holds = (rng.random([b, k]) < 0.4).astype(np.float32)
  holds[:, 0] = 0.0
  got = health.retrieval_signals(*(tf.constant(x, tf.float32) for x in (logits, token_lp,
                                                                         weights, q, c)),
                                 candidate_rows=tf.constant(rows),
                                 holds_answer=tf.constant(holds))
  want = numpy_signals(logits, token_lp, weights, q, c, rows, holds)
  assert set(got) == set(want)
  for name, (values, w) in got.items():
    w = tf.broadcast_to(w, tf.shape(values)).numpy()
    mean = (values.numpy() * w).sum() / w.sum()
    np.testing.assert_allclose(mean, want[name], rtol=1e-5, atol=1e-6, err_msg=name)
  # Without the answer marks, one gain over every retrieved block.
  got = health.retrieval_signals(*(tf.constant(x, tf.float32) for x in (logits, token_lp,
                                                                         weights, q, c)))
  assert "reader_gain" in got and "reader_gain_answer" not in got


def test_one_candidate_has_no_entropy_ratio():
  """k = 1 (the null block alone): the entropy is 0 and log k is 0, so the ratio is undefined:
  weight 0 (a Keras Mean over it stays 0, not nan), while p_null is 1."""
  b, m, d = 3, 2, 4
  got = health.retrieval_signals(tf.constant([[0.5], [-1.0], [2.0]]), -tf.ones([b, 1, m]),
                                 tf.ones([b, m]), tf.random.normal([b, d]),
                                 tf.random.normal([b, 1, d]))
  values, weights = got["retrieval_entropy_ratio"]
  assert np.isfinite(values.numpy()).all() and not weights.numpy().any()
  mean = tf_keras.metrics.Mean()
  mean.update_state(values, tf.broadcast_to(weights, tf.shape(values)))
  assert float(mean.result()) == 0.0
  np.testing.assert_allclose(got["p_null"][0].numpy(), 1.0)


def test_the_recall_baseline_survives_a_restart(tmp_path):
  """The step-0 recalls are kept in the model directory: a resumed run (a new task and
  monitor, as after a restart) compares its validations against them and alarms on a drop,
  instead of taking its first validation after the restart as the baseline. A step-0
  validation replaces a file left by an earlier run."""
  model_dir = str(tmp_path)
  path = tmp_path / health.BASELINE_FILE
  task, _, _ = _task_and_batch()
  train_lib.persist_health_baselines(task, model_dir)
  assert task.check_health("validation", 0, {"recall@5": 0.4}) == {"health_alarms": 0.0}
  assert json.loads(path.read_text()) == {"recall@5": 0.4}
  # The restart: at step 300, recall@5 below half its step-0 value; qa_recall@5 first seen.
  resumed, _, _ = _task_and_batch()
  train_lib.persist_health_baselines(resumed, model_dir)
  out = resumed.check_health("validation", 300, {"recall@5": 0.15, "qa_recall@5": 0.3})
  assert out == {"health_alarms": 1.0, "alarm/recall@5": 1.0}
  assert json.loads(path.read_text()) == {"recall@5": 0.4, "qa_recall@5": 0.3}
  assert resumed.check_health("validation", 400, {"recall@5": 0.3})["health_alarms"] == 0
  # A new run from step 0 in the same directory sets its own baseline.
  fresh = health.HealthMonitor(configs.HealthConfig(), ("recall@5",))
  fresh.persist_to(str(path))
  assert fresh.check("validation", 0, {"recall@5": 0.1}) == {"health_alarms": 0.0}
  assert json.loads(path.read_text()) == {"recall@5": 0.1}


def _builder(model, config, blocks):
  emb = model.block_embedder(dict(
      zip(["input_word_ids", "input_mask", "input_type_ids"],
          candidates.pack_blocks(blocks, LB, CLS, SEP)[:3]))).numpy()[:-1]
  builder = candidates.CandidateBuilder(blocks, config, ExactHandle(emb), CLS, SEP)
  builder._query_embedder = lambda: (lambda x: model.query_embedder(x))  # pylint: disable=protected-access
  return builder


def test_repeated_uids_are_skipped_and_counted():
  """REALM's example generator skips an example whose retrieved blocks repeat a uid; here its
  mask weights are zeroed (it adds nothing to the loss) and it is counted."""
  rng = np.random.default_rng(1)
  blocks = make_blocks(12, rng)                      # blocks 10 and 11 share a uid
  config = tiny_config()
  builder = _builder(RealmPretrainer.from_config_dataclass(config), config, blocks)
  examples = make_examples(3, rng, blocks)
  examples["source_uid"] = np.array([blocks[0]["uid"]] * 3)
  examples["source_block_id"] = np.zeros(3, np.int64)   # the block whose uid they name
  ranked = np.array([[10, 11, 3, 4, 5], [1, 2, 3, 4, 5], [11, 2, 3, 10, 5]])
  cands = builder.select_candidates(ranked, examples["source_uid"])
  assert builder.repeated_uids(cands).tolist() == [True, False, False]   # 10 cut from row 3
  f = builder.features(examples, candidates=cands)
  assert f["skipped_duplicates"].tolist() == [1.0, 0.0, 0.0]
  np.testing.assert_array_equal(f["mlm_weights"][0], 0.0)
  np.testing.assert_array_equal(f["mlm_weights"][1:], examples["mlm_weights"][1:])


def _task_and_batch(initializer_range=1.0, patience=2, share_embedders=True,
                    **task_settings):
  """A tiny REALM task (``task_settings``: more fields of its config), its model (random
  towers, seeded: at this init their embeddings differ, as a trained retriever's do; one
  tower for both unless ``share_embedders`` is False) and a batch of host-path features."""
  tf_keras.utils.set_random_seed(1)
  rng = np.random.default_rng(2)
  blocks = make_blocks(12, rng)
  config = tiny_config()
  config.retriever.encoder.initializer_range = initializer_range
  config.retriever.projection_dropout = 0.0     # deterministic signals
  config.retriever.share_embedders = share_embedders
  task = realm_pretrain.RealmPretrainTask(configs.RealmPretrainTaskConfig(
      model=config, health=configs.HealthConfig(patience=patience), **task_settings))
  model = task.build_model()
  examples = make_examples(8, rng, blocks)
  examples["answer"] = np.array([b"x"] * 8)
  f = _builder(model, config, blocks).features(examples)
  return task, model, {k: tf.constant(f[k]) for k in realm_pretrain.HOST_PATH_FEATURES}


def _summaries(task, model, batch, loops=3):
  """``check_health`` over ``loops`` training summaries of one batch; returns the last
  signals and every loop's alarms."""
  alarms = []
  for step in range(loops):
    metrics = task.build_metrics(training=True)
    task.forward(batch, model, metrics, training=True)
    logs = {m.name: m.result() for m in metrics}
    alarms.append(task.check_health("train", step, logs))
  return {k: float(v) for k, v in logs.items()}, alarms


def test_a_collapsed_retriever_trips_the_alarm():
  """Both towers mapping every input to one vector (projection zeroed, LayerNorm's shift
  set): uniform p(z|x), cosine 1 -> alarms once the patience is reached, not before."""
  task, model, batch = _task_and_batch()
  embedder = model.query_embedder
  embedder.projection.kernel.assign(tf.zeros_like(embedder.projection.kernel))
  embedder.projection.bias.assign(tf.zeros_like(embedder.projection.bias))
  embedder.layer_norm.beta.assign(tf.ones_like(embedder.layer_norm.beta))
  logs, alarms = _summaries(task, model, batch)
  assert logs["retrieval_entropy_ratio"] == pytest.approx(1.0, abs=1e-5)
  assert logs["query_cosine"] == pytest.approx(1.0, abs=1e-5)
  assert alarms[0]["health_alarms"] == 0                          # patience 2
  for loop in alarms[1:]:
    assert {"alarm/retrieval_entropy_ratio", "alarm/query_cosine",
            "alarm/block_cosine"} <= set(loop) and loop["health_alarms"] >= 3


def test_a_healthy_retriever_does_not():
  task, model, batch = _task_and_batch()
  logs, alarms = _summaries(task, model, batch)
  bounds = configs.HealthConfig()
  assert logs["retrieval_entropy_ratio"] < 0.85 and logs["p_null"] < bounds.max_p_null
  assert max(logs["query_cosine"], logs["block_cosine"]) < bounds.max_cosine
  assert logs["distinct_candidates"] > bounds.min_distinct_candidates
  assert all(a == {"health_alarms": 0.0} for a in alarms)


def test_validation_recall_alarm_and_the_printed_line(capsys):
  monitor = health.HealthMonitor(configs.HealthConfig(), ("recall@5", "qa_recall@5"))
  assert monitor.check("validation", 0, {"recall@5": 0.2, "qa_recall@5": 0.4}) == {
      "health_alarms": 0.0}                                           # the step-0 baseline
  assert monitor.check("validation", 100, {"recall@5": 0.15, "qa_recall@5": 0.21})[
      "health_alarms"] == 0                                           # 0.21 >= 0.5 x 0.4
  out = monitor.check("validation", 200, {"recall@5": 0.3, "qa_recall@5": 0.19})
  assert out == {"health_alarms": 1.0, "alarm/qa_recall@5": 1.0}
  line = monitor.summary_line(200, {"qa_recall@5": 0.19, "p_null": 0.25}, out)
  assert line.startswith("health @ step 200:") and "qa_recall@5 0.190 (first 0.400)" in line
  assert line.endswith("ALARM: qa_recall@5") and "p(null) 0.25" in line
  # The task prints the line at each validation.
  task, _, _ = _task_and_batch()
  task.check_health("validation", 0, {"recall@5": tf.constant(0.5), "p_null": 0.1})
  assert "health @ step 0:" in capsys.readouterr().out


def test_retriever_freeze_steps():
  """task.retriever_freeze_steps = 2: the towers keep their weights for two steps while the
  reader trains; the third step moves them."""
  task, model, batch = _task_and_batch()
  task.task_config.retriever_freeze_steps = 2
  optimizer = tf_keras.optimizers.legacy.Adam(1e-2)
  towers = lambda: [v.numpy().copy() for v in model.query_embedder.trainable_variables]
  reader = lambda: [v.numpy().copy() for v in model.reader.trainable_variables]
  start_towers, start_reader = towers(), reader()
  for _ in range(2):
    task.train_step(batch, model, optimizer)
  assert all((a == b).all() for a, b in zip(towers(), start_towers))
  assert any((a != b).any() for a, b in zip(reader(), start_reader))
  task.train_step(batch, model, optimizer)
  assert sum((a != b).any() for a, b in zip(towers(), start_towers)) > 10
