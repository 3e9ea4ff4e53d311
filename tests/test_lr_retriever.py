"""``task.lr_retriever``: the towers' optimizer step, and only theirs, scaled by a multiplier;
``task.freeze_block_tower``: the block tower not trained at all."""

import types

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from realm_tf import configs
from realm_tf import model_dir as model_dir_lib
from realm_tf.tasks import realm_pretrain

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


def test_a_frozen_block_tower_keeps_its_weights_and_embeds_as_its_index(monkeypatch):
  """``freeze_block_tower``: two steps move the query tower but leave every block-tower weight
  as it was (they are not the optimizer's to update); in training the candidates embed
  without dropout, as the index did; the corpus is embedded once for validation. Shared towers
  are refused."""
  task, model, batch = _task_and_batch(share_embedders=False, freeze_block_tower=True)
  assert not model.block_embedder.trainable_variables
  blocks = [v.numpy().copy() for v in model.block_embedder.variables]
  query = [v.numpy().copy() for v in model.query_embedder.trainable_variables]
  optimizer = tf_keras.optimizers.legacy.Adam(1e-2)
  for _ in range(2):
    task.train_step(batch, model, optimizer)
  assert all((a == b.numpy()).all() for a, b in zip(blocks, model.block_embedder.variables))
  assert sum((a != b.numpy()).any() for a, b in zip(
      query, model.query_embedder.trainable_variables)) > 10
  # Dropout on, in the towers' encoders: training embeds the candidates as inference does.
  task, model, batch = _task_and_batch(share_embedders=False, freeze_block_tower=True)
  for layer in model.block_embedder.submodules:
    if isinstance(layer, tf_keras.layers.Dropout):
      layer.rate = 0.5
  train = model(batch, training=True)["candidate_embeddings"]
  np.testing.assert_allclose(train, model(batch, training=False)["candidate_embeddings"],
                             rtol=1e-5, atol=1e-6)
  model.block_embedder.trainable = True
  assert np.abs(model(batch, training=True)["candidate_embeddings"] - train).max() > 1e-3
  # Validation's corpus: embedded once (a frozen tower cannot change it), every pass before.
  calls = []
  def embed_corpus(tower, *args, **kwargs):
    del args, kwargs
    calls.append(tower)
    return np.arange(3), np.eye(3, 8, dtype=np.float32)
  monkeypatch.setattr(realm_pretrain.corpus_embedding, "embed_corpus", embed_corpus)
  task._eval_builder = types.SimpleNamespace(  # pylint: disable=protected-access
      null_row=3, store=types.SimpleNamespace(deleted=None))
  first = task.corpus_index(model)
  assert task.corpus_index(model) is first and calls == [model.block_embedder]
  task.task_config.freeze_block_tower = False
  assert task.corpus_index(model) is not first and len(calls) == 2
  shared = configs.RealmPretrainTaskConfig(freeze_block_tower=True)
  shared.model.retriever.share_embedders = True
  with pytest.raises(configs.ConfigError, match="share_embedders"):
    realm_pretrain.RealmPretrainTask(shared).build_model()


def test_untied_towers_start_from_a_shared_towers_checkpoint(tmp_path):
  """A frozen block tower unties the towers; both start from the one tower of a shared
  checkpoint (the ICT model's), which one restore could not bind to two objects."""
  shared_task, shared, _ = _task_and_batch()
  assert shared.query_embedder is shared.block_embedder
  path = model_dir_lib.make_checkpoint(**shared.checkpoint_items).save(str(tmp_path / "ckpt"))
  task, model, _ = _task_and_batch(share_embedders=False, freeze_block_tower=True,
                                   initializer_range=0.3, retriever_init_checkpoint=path)
  before = [v.numpy().copy() for v in model.block_embedder.variables]
  task.initialize(model)
  for tower in (model.query_embedder, model.block_embedder):
    for got, want in zip(tower.variables, shared.query_embedder.variables):
      np.testing.assert_array_equal(got.numpy(), want.numpy())
  assert any((a != b.numpy()).any() for a, b in zip(before, model.block_embedder.variables))
  del shared_task
