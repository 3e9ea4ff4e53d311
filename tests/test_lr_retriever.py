"""``task.lr_retriever``: the towers' optimizer step, and only theirs, scaled by a multiplier."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from realm_tf import configs

from test_health import _task_and_batch


def _one_step(lr_retriever, strategy=None):
  """The weights before and after one AdamW step of the tiny REALM task at ``lr_retriever``."""
  task, model, batch = _task_and_batch()
  task.task_config.lr_retriever = lr_retriever
  optimizer = tf_keras.optimizers.legacy.Adam(1e-2)
  groups = {"towers": model.query_embedder.trainable_variables +
                      model.block_embedder.trainable_variables,
            "reader": model.reader.trainable_variables}
  before = {k: [v.numpy().copy() for v in vs] for k, vs in groups.items()}
  if strategy is None:
    task.train_step(batch, model, optimizer)
  else:
    strategy.run(tf.function(lambda b: task.train_step(b, model, optimizer)), args=(batch,))
  after = {k: [v.numpy().copy() for v in vs] for k, vs in groups.items()}
  return before, after


def _steps(before, after, group):
  return [a - b for a, b in zip(after[group], before[group])]


def test_the_towers_step_is_scaled_and_the_readers_is_not():
  """Against the same step at 1.0 (the same seeded model and batch): the towers move by
  exactly 0.25 of it, the reader by all of it; at 0 the towers do not move."""
  full = _one_step(1.0)
  quarter = _one_step(0.25)
  frozen = _one_step(0.0)
  for b in (quarter[0], frozen[0]):   # the same starting weights
    for x, y in zip(b["towers"], full[0]["towers"]):
      np.testing.assert_array_equal(x, y)
  moved = _steps(*full, "towers")
  assert sum(np.abs(m).max() > 1e-4 for m in moved) > 10
  for want, got in zip(moved, _steps(*quarter, "towers")):
    np.testing.assert_allclose(got, 0.25 * want, rtol=1e-4, atol=1e-7)
  for want, got in zip(_steps(*full, "reader"), _steps(*quarter, "reader")):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-7)
  assert all((m == 0).all() for m in _steps(*frozen, "towers"))


def test_under_a_strategy_in_a_replica_context():
  """Inside ``strategy.run`` (a replica context, as Model Garden's trainer calls the step) with
  mirrored variables the scaled step is the same rule: half of the step at 1.0."""
  strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
  with strategy.scope():
    full = _one_step(1.0, strategy)
    half = _one_step(0.5, strategy)
  moved = _steps(*full, "towers")
  assert sum(np.abs(m).max() > 1e-4 for m in moved) > 10
  for want, got in zip(moved, _steps(*half, "towers")):
    np.testing.assert_allclose(got, 0.5 * want, rtol=1e-4, atol=1e-7)


def test_a_negative_multiplier_is_refused():
  task, model, _ = _task_and_batch()
  task.task_config.lr_retriever = -1.0
  with pytest.raises(configs.ConfigError, match="lr_retriever must be >= 0"):
    task.update_scales(model)
