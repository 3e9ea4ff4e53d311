"""``model_dir.restore``: a strict restore takes every variable of an item back exactly, and
refuses, naming them, a checkpoint that lacks some of the item's variables or holds some the
item does not have (issue 40: a reader that failed to load must never go unnoticed)."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import helpers
from realm_tf import configs
from realm_tf import model_dir as model_dir_lib
from realm_tf.modeling import factory
from realm_tf.tasks import ict as ict_task
from realm_tf.tokenization import load_vocab


def reader(span_head=True, layers=2):
  config = helpers.tiny_config().reader
  config = config.replace(encoder=config.encoder.replace(num_layers=layers))
  return factory.build_reader(config, with_span_scorer=span_head)


def trained_checkpoint(path, model, **items):
  """A checkpoint as a trainer writes it: the model after one Adam step, the optimizer's
  slots beside its variables, a global step."""
  optimizer = tf_keras.optimizers.Adam(1e-2)
  optimizer.apply_gradients([(tf.ones_like(v), v) for v in model.trainable_variables])
  step = tf.Variable(1, dtype=tf.int64)
  return model_dir_lib.make_checkpoint(optimizer=optimizer, global_step=step,
                                       **items).write(str(path))


def test_a_trainer_checkpoint_restores_exactly(tmp_path):
  tf_keras.utils.set_random_seed(0)
  saved = reader()
  path = trained_checkpoint(tmp_path / "ckpt-1", saved, reader=saved)
  tf_keras.utils.set_random_seed(1)
  fresh = reader()
  assert any(not np.array_equal(a.numpy(), b.numpy())
             for a, b in zip(saved.weights, fresh.weights))
  model_dir_lib.restore(path, reader=fresh)
  assert len(saved.weights) == len(fresh.weights)
  for a, b in zip(saved.weights, fresh.weights):
    np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_a_checkpoint_without_the_span_head_is_refused_naming_it(tmp_path):
  headless = reader(span_head=False)
  path = trained_checkpoint(tmp_path / "ckpt-1", headless, reader=headless)
  with pytest.raises(model_dir_lib.ModelDirError, match=r"lacks 6 variable.*reader/span_scorer"):
    model_dir_lib.restore(path, reader=reader())
  # Fine-tuning starts a fresh head on purpose: it says so with allow_missing.
  model_dir_lib.restore(path, allow_missing=True, reader=reader())


@pytest.mark.parametrize("saved,loaded,named", [
    (dict(span_head=True), dict(span_head=False), "reader/span_scorer"),
    (dict(layers=3), dict(layers=2), "_transformer_layers/2/"),
])
def test_variables_the_model_does_not_have_are_refused(tmp_path, saved, loaded, named):
  model = reader(**saved)
  path = trained_checkpoint(tmp_path / "ckpt-1", model, reader=model)
  with pytest.raises(model_dir_lib.ModelDirError, match=f"does not have, e.g. .*{named}"):
    model_dir_lib.restore(path, reader=reader(**loaded))


def test_shared_towers_restore_from_either_name(tmp_path):
  config = helpers.tiny_config(share=True).retriever
  query, block = factory.build_embedders(config)
  assert query is block
  path = trained_checkpoint(tmp_path / "ckpt-1", query, query_embedder=query,
                            block_embedder=block)
  for name in ("query_embedder", "block_embedder"):
    other, _ = factory.build_embedders(config)
    model_dir_lib.restore(path, **{name: other})
    for a, b in zip(query.weights, other.weights):
      np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_checkpoint_keys_are_the_writers(tmp_path):
  model = reader()
  path = trained_checkpoint(tmp_path / "ckpt-1", model, reader=model)
  written = {k for k in tf.train.load_checkpoint(path).get_variable_to_shape_map()
             if k.startswith("reader/") and ".OPTIMIZER_SLOT" not in k}
  keys = model_dir_lib.checkpoint_keys("reader", model)
  assert set(keys) == written and len(keys) == len({id(v) for v in model.weights})


def test_ict_towers_start_from_a_readers_encoder(realm_world, reader_dir):
  """``init_encoders_from_reader``: each tower's encoder holds the reader's encoder, value for
  value, and the projection stays fresh; a reader of another shape is refused, naming what
  does not fit."""
  size = len(load_vocab(realm_world["vocab"]))

  def ict(*overrides):
    params = configs.load_experiment("ict_cpu", params_override=",".join([
        f"task.vocab_file={realm_world['vocab']}", f"task.model.encoder.vocab_size={size}",
        "task.model.encoder.hidden_size=32", "task.model.encoder.intermediate_size=64",
        f"task.init_checkpoint={reader_dir}", "task.init_encoders_from_reader=true",
        *overrides]))
    task = ict_task.IctTask(params.task)
    model = task.build_model()
    fresh = [v.numpy().copy() for v in model.query_embedder.projection.variables]
    task.initialize(model)
    return model, fresh

  model, fresh = ict()
  the_reader = factory.build_reader(model_dir_lib.load_config(reader_dir).reader)
  model_dir_lib.restore(model_dir_lib.latest_checkpoint(reader_dir), reader=the_reader)
  towers, theirs = model.query_embedder.encoder.variables, the_reader.encoder.variables
  assert [v.shape for v in towers] == [v.shape for v in theirs] and len(towers) > 10
  for variable, source in zip(towers, theirs):
    np.testing.assert_array_equal(variable.numpy(), source.numpy())
  for before, variable in zip(fresh, model.query_embedder.projection.variables):
    np.testing.assert_array_equal(variable.numpy(), before)
  with pytest.raises(model_dir_lib.ModelDirError, match="does not fit"):
    ict("task.model.encoder.hidden_size=48")
  with pytest.raises(configs.ConfigError, match="needs task.init_checkpoint"):
    ict("task.init_checkpoint=")
