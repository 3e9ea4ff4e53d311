"""TPU readiness of every experiment family's real steps, without a TPU (issue 25).

For ICT, REALM pre-training (host and device retrieval), Open-QA and the reader's reading warm
start, on tiny configs over a tiny prepared world, each test takes a batch of the task's own
training (and validation) inputs as Model Garden's trainer does
(``strategy.distribute_datasets_from_function`` over ``MirroredStrategy`` on two logical CPU
devices) and checks:

* every input feature has a fully static shape and a TPU dtype (``tpu_readiness``), checked
  as each input pipeline's dataset is built and again as each step is traced;
* the real ``train_step`` and ``validation_step`` compiled whole with XLA (``jit_compile``:
  forward, gradients, the optimizer's update, the metrics) give the loss, the metrics and
  the updated weights of the uncompiled step (``tpu_readiness``'s tolerances);
* the steps replicated over the two devices (their collectives: ICT's all-gather of the
  blocks, device retrieval's sharded search and token-row all-reduce, the gradient
  all-reduce) give those of one replica over the same global batch. TensorFlow cannot
  compile collectives with XLA on CPU devices, so the replicated step runs uncompiled
  (``tpu_readiness.step_function``).

The models start from the same weights with dropout off, the towers' and the projection's
(its random draws differ between XLA and TensorFlow's kernels, and between replicas); the
optimizer is ``tpu_readiness.CHECK_OPTIMIZER`` (plain SGD: the updated weights compare the
gradients). A slow variant runs the same in bfloat16.
"""

import os

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from data_prep import pipeline
from data_prep import synthetic_world
from realm_tf import configs
from realm_tf import hardware
from realm_tf import tpu_readiness
from realm_tf import train_lib
from realm_tf.data import block_store
from realm_tf.data import loaders
from realm_tf.modeling import models as modeling_models
from realm_tf.retrieval.publication import refresher
from realm_tf.retrieval.publication import testing
from realm_tf.tasks import device_retrieval
from realm_tf.tasks import ict
from realm_tf.tasks import openqa
from realm_tf.tasks import reader_read
from realm_tf.tasks import realm_pretrain
from realm_tf.tokenization import load_vocab

LQ, LB, HIDDEN, DIM, BATCH, WIDTH = 16, 64, 16, 16, 4, 3
# Health signals that are statistics of each replica's own batch (``realm_tf.health``: mean
# pairwise cosines, the share of distinct candidates): two replicas of 2 examples do not give
# one replica's value over 4, by design. Compared compiled against uncompiled on one replica
# (validation), not across replica counts.
PER_REPLICA_BATCH = ("query_cosine", "block_cosine", "distinct_candidates")
@pytest.fixture(scope="module")
def world(tmp_path_factory):
  """A tiny world through data_prep, and an index of random towers over its blocks."""
  root = tmp_path_factory.mktemp("tpu_readiness")
  world = synthetic_world.generate_world(seed=1, num_regions=1, num_cities=3, num_people=5,
                                         num_organizations=2, num_works=2)
  files = synthetic_world.write_world(world, str(root / "world"), vocab_size=300)
  dirs = pipeline.prepare_all(files["articles"], files["vocab"], str(root / "data"),
                              patterns_file=files["patterns"], block_seq_length=LB,
                              query_seq_length=LQ, eval_fraction=0.3)["dirs"]
  towers = str(root / "towers")
  # The index's towers are the tasks' own shape: a strict restore refuses any other.
  shape = dict(files=files, vocab_size=len(load_vocab(files["vocab"])))
  trainer = testing.TinyTrainer(towers, files["vocab"], config=model_config(shape))
  trainer.perturb(0.3)   # untrained towers score every block alike
  trainer.save(0)
  index_dir = str(root / "index")
  refresher.build_index_for_checkpoint(
      None, towers, dirs["blocks"], index_dir,
      refresher.BuildOptions(index_type="brute_force", recall_queries=0, progress=False,
                             tensorboard_dir=""))
  return dict(files=files, index_dir=index_dir, vocab_size=len(load_vocab(files["vocab"])),
              **dirs)


def encoder(w):
  """One layer (XLA's compile time grows with the graph); initial weights large enough for
  the towers to tell inputs apart (untrained ones score every block alike, and ties make
  ranks and argmaxes follow rounding)."""
  config = configs.bert_tiny(w["vocab_size"], HIDDEN, dropout_rate=0.0)
  config.override(dict(num_layers=1, initializer_range=0.5))
  return config


def model_config(w, **kwargs):
  return configs.RealmModelConfig(
      retriever=configs.RetrieverConfig(encoder=encoder(w), projection_size=DIM,
                                        projection_dropout=0.0, query_seq_length=LQ,
                                        block_seq_length=LB),
      reader=configs.ReaderConfig(encoder=encoder(w), seq_length=LQ + LB,
                                  openqa_seq_length=LQ + LB, span_hidden_size=8,
                                  max_span_width=WIDTH),
      vocab_file=w["files"]["vocab"], num_candidates=4, **kwargs)


def masked(w, split, is_training):
  return configs.MaskedLmDataConfig(input_path=os.path.join(w["pretrain"], f"{split}-*"),
                                    blocks_dir=w["blocks"], global_batch_size=BATCH,
                                    is_training=is_training, seed=0)


def ict_config(w):
  # The tiny world holds out too few ICT blocks for a batch: validation reads the train split.
  data = lambda training: configs.IctDataConfig(
      input_path=os.path.join(w["ict"], "train-*"), global_batch_size=BATCH,
      is_training=training, seed=0)
  return configs.IctTaskConfig(
      model=configs.RetrieverConfig(encoder=encoder(w), projection_size=DIM,
                                    projection_dropout=0.0, query_seq_length=LQ,
                                    block_seq_length=LB),
      vocab_file=w["files"]["vocab"], train_data=data(True), validation_data=data(False),
      recall_at=(1, 2))


def realm_config(w, retrieval):
  return configs.RealmPretrainTaskConfig(
      model=model_config(w), train_data=masked(w, "train", True),
      validation_data=masked(w, "eval", False), index_dir=w["index_dir"], index_wait_seconds=0,
      retrieval=retrieval, recall_at=2)


def openqa_config(w):
  data = lambda path, training: configs.OpenQaDataConfig(
      input_path=path, global_batch_size=BATCH, is_training=training, seed=0)
  return configs.OpenQaTaskConfig(
      model=model_config(w), index_dir=w["index_dir"], retriever_beam_size=16,
      reader_beam_size=4, max_gold_spans=4, top_k=(1, 5),
      train_data=data(w["files"]["qa_train"], True),
      validation_data=data(w["files"]["qa_dev"], False))


def reader_read_config(w):
  data = lambda split, training: configs.ReadingDataConfig(
      input_path=[os.path.join(w["pretrain"], f"{split}-*")], blocks_dir=[w["blocks"]],
      global_batch_size=BATCH, is_training=training, seed=0)
  return configs.ReaderReadTaskConfig(model=model_config(w), train_data=data("train", True),
                                      validation_data=data("eval", False))


FAMILIES = {   # name: the task, its config, and the batches it is checked on
    "ict": (ict.IctTask, ict_config, None),
    "realm_host": (realm_pretrain.RealmPretrainTask, lambda w: realm_config(w, "host"), None),
    "realm_device": (realm_pretrain.RealmPretrainTask, lambda w: realm_config(w, "device"),
                     None),
    # A batch with a gold span the reader can score (at most max_span_width wordpieces) in
    # the blocks it reads, or the reader gets no gradient.
    "openqa": (openqa.OpenQaTask, openqa_config, lambda batch: bool(tf.reduce_any(
        (batch["gold_mask"] > 0) & (batch["gold_ends"] - batch["gold_starts"] < WIDTH)))),
    "reader_read": (reader_read.ReaderReadTask, reader_read_config, None),
}


class Side:
  """A task, a model, an optimizer and metrics built under one strategy."""

  def __init__(self, task_cls, config, strategy, weights=None):
    self.task, self.strategy = task_cls(config), strategy
    with strategy.scope():
      self.model = self.task.build_model()
      for variable, value in zip(self.model.variables, weights or ()):
        variable.assign(value)
      self.optimizer = self.task.create_optimizer(tpu_readiness.CHECK_OPTIMIZER)
      self.train_metrics = self.task.build_metrics(training=True)
      self.validation_metrics = self.task.build_metrics(training=False)
      before = getattr(self.task, "before_train_loop", None)
      if before is not None:
        before(self.model)

  def batch(self, data_config, accept=None):
    """The first batch of the task's inputs whose global batch ``accept`` takes (default:
    any), distributed as Model Garden's trainer does, and that global batch."""
    training = data_config.is_training
    dataset_fn = tpu_readiness.checked_dataset_fn(
        lambda ctx: self.task.build_inputs(data_config, ctx),
        f"{type(self.task).__name__} {'train' if training else 'validation'}", training)
    dataset = self.strategy.distribute_datasets_from_function(dataset_fn)
    begin = getattr(self.task, "validation_begin", None)
    if not training and begin is not None:
      begin(self.model)   # as the trainer does after building the inputs
    for _, distributed in zip(range(20), dataset):
      inputs = global_batch(self.strategy, distributed)
      if accept is None or accept(inputs):
        return distributed, inputs
    raise AssertionError(f"no batch of {data_config.input_path} to check")

  def run(self, inputs, training, jit_compile=False):
    return tpu_readiness.run_step(
        self.task, self.model, inputs, self.strategy,
        optimizer=self.optimizer if training else None,
        metrics=self.train_metrics if training else self.validation_metrics,
        jit_compile=jit_compile)


def global_batch(strategy, distributed):
  """The replicas' batches of ``distributed``, concatenated in replica order."""
  return {k: tf.concat(strategy.experimental_local_results(v), axis=0)
          for k, v in distributed.items()}


def check_family(world, name, validation=True, precision=None, **tolerances):
  """The checks of the module docstring for one family. Validation runs first, on the
  starting weights: compiled against uncompiled, on one replica. Then training: compiled on
  one replica against uncompiled over two, from the same weights, on the same global batch
  (one comparison for both properties). ``precision``: ``runtime.mixed_precision_dtype``;
  ``tolerances``: of ``tpu_readiness.differences``."""
  task_cls, make_config, accept = FAMILIES[name]
  config = make_config(world)
  tf_keras.utils.set_random_seed(0)
  mirrored = testing.two_cpu_strategy()
  with train_lib.precision_policy(precision):
    replicated = Side(task_cls, config, mirrored)
    start = [v.numpy() for v in replicated.model.variables]
    single = Side(task_cls, config, tf.distribute.OneDeviceStrategy("/cpu:0"), start)
    if validation:
      _, inputs = replicated.batch(config.validation_data)
      want = single.run(inputs, training=False)
      got = single.run(inputs, training=False, jit_compile=True)
      assert not tpu_readiness.differences(want, got, **tolerances), name
      assert np.isfinite(want.loss) and want.loss > 0
    distributed, inputs = replicated.batch(config.train_data, accept)
    assert int(next(iter(inputs.values())).shape[0]) == BATCH
    want = replicated.run(distributed, training=True)
    got = single.run(inputs, training=True, jit_compile=True)
  assert not tpu_readiness.differences(want, got, ignore_metrics=PER_REPLICA_BATCH,
                                       **tolerances), name
  assert np.isfinite(want.loss) and want.loss > 0
  moved = [np.abs(a - b).max() > 1e-6 for a, b in zip(start, want.weights)]
  assert np.mean(moved) > 0.5, name   # the step did change the weights


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_steps_compile_with_xla_and_replicate(world, name):
  # REALM's validation step does not depend on where training retrieves: checked once.
  check_family(world, name, validation=name != "realm_device")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_steps_compile_with_xla_in_bfloat16(world, name):
  """The same in bfloat16 (``runtime.mixed_precision_dtype``, the paper configs' TPU
  runtime), to bfloat16's precision: XLA and TensorFlow's kernels round at other points.
  Measured: losses within 0.7%, metrics within 0.025; a weight within 1.2e-3 after the SGD
  step (gradients within 1.2e-2, where the largest updates are 1e-2 to 3e-2). The span scorer's
  output bias has an exact gradient of 0 (the reader's softmax ignores a common shift): its
  updates are rounding, 3e-5 uncompiled and 6e-5 compiled; 2.5e-3 uncompiled before bias
  gradients accumulated in float32 (``modeling.precision``, issue 44). The uncompiled side
  runs TensorFlow's kernels: where those would not compute bfloat16 as a TPU does (NOTES 42),
  the refusal is checked instead, as in the test below."""
  problem = hardware.cpu_bfloat16_problem()
  if problem:
    with pytest.raises(configs.ConfigError, match="refused"):
      train_lib.check_bfloat16_device(testing.two_cpu_strategy())
    return
  check_family(world, name, validation=name != "realm_device", precision="bfloat16",
               loss_rtol=0.02, metric_atol=0.03, weight_atol=2e-3, update_rtol=0.15)


@pytest.mark.parametrize("name", ["ict", "openqa", "reader_read", "realm_host"])
def test_bfloat16_step_against_the_float32_step(world, name):
  """The step the CPU experiments train with ``--precision=bfloat16`` (uncompiled, one
  device: ``runtime.mixed_precision_dtype``), from the same float32 weights on the same batch
  as the float32 step: the loss, the metrics and every weight after the SGD step agree to
  bfloat16's precision (the slow XLA check's tolerances), and the step computes in bfloat16.
  Where TensorFlow's own kernels would compute it (no avx512_bf16 or amx_bf16, or oneDNN
  off), their Softmax and Einsum lose those tolerances (NOTES 42), and bfloat16 training on
  this CPU is refused instead: that refusal is what is checked."""
  one = tf.distribute.OneDeviceStrategy("/cpu:0")
  problem = hardware.cpu_bfloat16_problem()
  if problem:
    with pytest.raises(configs.ConfigError) as refused:
      train_lib.check_bfloat16_device(one)
    assert str(refused.value) == problem
    return
  task_cls, make_config, accept = FAMILIES[name]
  config = make_config(world)
  tf_keras.utils.set_random_seed(0)
  with train_lib.precision_policy(None):
    float32 = Side(task_cls, config, one)
    start = [v.numpy() for v in float32.model.variables]
    _, inputs = float32.batch(config.train_data, accept)
    want = float32.run(inputs, training=True)
  with train_lib.precision_policy("bfloat16"):
    half = Side(task_cls, config, one, start)
    assert {v.dtype for v in half.model.trainable_variables} == {tf.float32}
    assert any(layer.compute_dtype == "bfloat16" for layer in half.model.submodules
               if isinstance(layer, tf_keras.layers.Layer))
    got = half.run(inputs, training=True)
  problems = tpu_readiness.differences(want, got, loss_rtol=0.02, metric_atol=0.03,
                                       weight_atol=2e-3, update_rtol=0.15)
  assert not problems, (name, problems)
  assert got.loss != want.loss   # it did compute in bfloat16


# ------------------------------------------------------------------------ the check itself --


def test_the_check_catches_dynamic_shapes_strings_and_int64():
  examples = dict(ids=np.zeros([5, 8], np.int32), text=np.array([b"a"] * 5),
                  big=np.zeros([5], np.int64), weight=np.ones([5], np.float32))
  dataset = tf.data.Dataset.from_tensor_slices(examples)
  problems = tpu_readiness.input_problems(dataset.batch(2).element_spec)
  assert [p.split(":")[0] for p in problems] == ["big", "big", "ids", "text", "text", "weight"]
  assert "ids: shape (None, 8) is not fully static" in problems[2]
  assert "big: dtype int64 is not a TPU dtype (int32, float32, bfloat16)" in problems[1]
  assert "text: dtype string is not a TPU dtype" in problems[4]
  fixed = dataset.batch(2, drop_remainder=True).map(lambda x: dict(ids=x["ids"],
                                                                   weight=x["weight"]))
  assert not tpu_readiness.input_problems(fixed.element_spec)
  # A validation batch may be partial: its batch dimension alone may be unknown.
  partial = dataset.batch(2).map(lambda x: dict(ids=x["ids"]))
  assert not tpu_readiness.input_problems(partial.element_spec, static_batch=False)
  assert tpu_readiness.input_problems(partial.element_spec)
  ragged = tf.data.Dataset.from_tensors(dict(r=tf.ragged.constant([[1], [2, 3]]))).element_spec
  assert "r: a ragged or sparse value" in tpu_readiness.input_problems(ragged)[0]
  with pytest.raises(tpu_readiness.NotTpuReadyError, match=r"inputs: not TPU-ready:\n.*big"):
    tpu_readiness.check_inputs(dataset.batch(2).element_spec, "inputs")


def test_a_step_given_a_dynamic_shape_or_a_string_fails_before_compiling():
  """ICT's real train step, traced for XLA with a batch of unknown size, or with a string
  feature beside its int32 ones: the check refuses it, naming the feature."""
  config = ict.IctTask(configs.IctTaskConfig(model=configs.RetrieverConfig(
      encoder=configs.bert_tiny(30, 8), projection_size=4, query_seq_length=6,
      block_seq_length=8)))
  strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
  with strategy.scope():
    model = config.build_model()
    optimizer = config.create_optimizer(tpu_readiness.CHECK_OPTIMIZER)
  step = tpu_readiness.step_function(
      strategy, tpu_readiness.replica_step(config, model, optimizer), jit_compile=True)
  spec = lambda b, n: tf.TensorSpec([b, n], tf.int32)
  good = dict(query_ids=spec(2, 6), query_mask=spec(2, 6), block_ids=spec(2, 8),
              block_mask=spec(2, 8), block_type_ids=spec(2, 8))
  step.get_concrete_function(good)   # traces
  with pytest.raises(tpu_readiness.NotTpuReadyError,
                     match=r"IctTask.train_step: not TPU-ready:\s+block_ids: shape \(None, 8\)"):
    step.get_concrete_function(dict(good, block_ids=spec(None, 8)))
  with pytest.raises(tpu_readiness.NotTpuReadyError, match="title: dtype string"):
    step.get_concrete_function(dict(good, title=tf.TensorSpec([2], tf.string)))
  with pytest.raises(ValueError, match="XLA cannot compile a step replicated over"):
    tpu_readiness.step_function(testing.two_cpu_strategy(), lambda x: x, jit_compile=True)


# -------------------------------------------------------------------------- input side --


def test_training_inputs_per_input_pipeline(world):
  """As on a TPU pod (one input pipeline per host): every family's training dataset, built
  with an ``InputContext`` of 2 pipelines and 4 replicas, has fully static shapes at the
  per-replica batch size and TPU dtypes; and the pipelines read disjoint shares of the
  examples (the masked sentences, the ICT blocks) that together cover them."""
  contexts = [tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=i,
                                         num_replicas_in_sync=4) for i in range(2)]
  for name, (task_cls, make_config, _) in FAMILIES.items():
    config = make_config(world)
    config.train_data.global_batch_size = 8
    task = task_cls(config)
    task.build_model()   # Open-QA's inputs embed the questions with its query tower
    for ctx in contexts:
      spec = task.build_inputs(config.train_data, ctx).element_spec
      tpu_readiness.check_inputs(spec, f"{name} pipeline {ctx.input_pipeline_id}")
      assert {s.shape[0] for s in spec.values()} == {2}, name

  def seen(make, key):
    return {bytes(row) for batch in make(None).take(40).as_numpy_iterator()
            for row in (batch if key is None else batch[key])}
  ict_loader = loaders.get_loader(ict_config(world).train_data, query_seq_length=LQ,
                                  block_seq_length=LB)
  masked_loader = loaders.get_loader(masked(world, "train", True), query_seq_length=LQ,
                                     max_masks=model_config(world).max_masks)
  # ICT draws a sentence per read: a block is its serialized record; a masked sentence its text.
  for make, key in ((ict_loader.serialized, None), (masked_loader.load, "sentence")):
    everything = seen(make, key)
    shares = [seen(lambda _, c=ctx: make(c), key) for ctx in contexts]
    assert shares[0] and shares[1] and not shares[0] & shares[1], key
    assert shares[0] | shares[1] == everything, key


def test_device_retrieval_builds_static_features_over_two_replicas(world):
  """What ``task.retrieval=device`` builds inside the step (the candidates and the reader's
  inputs, from the all-gathered queries, the merged top-k and the all-reduced token rows)
  has static shapes and TPU dtypes on each of two replicas, as the host's inputs do."""
  strategy = testing.two_cpu_strategy()
  config = model_config(world)
  store = block_store.BlockStore.open(world["blocks"])
  with strategy.scope():
    retriever = device_retrieval.DeviceRetriever(store, config, store.cls_id, store.sep_id)
    model = modeling_models.RealmPretrainer.from_config_dataclass(config)
  retriever.load(np.random.default_rng(0).normal(size=[len(store), DIM]).astype(np.float32), 0)
  task = realm_pretrain.RealmPretrainTask(realm_config(world, "device"))
  dataset = strategy.distribute_datasets_from_function(
      lambda ctx: task.build_inputs(task.task_config.train_data, ctx))
  built = []

  def replica(inputs):
    features = retriever.features(inputs, model.query_embedder)
    built.append(features)
    tpu_readiness.check_inputs(features, "device retrieval's features")
    return features["candidate_rows"]

  rows = tf.function(lambda x: strategy.run(replica, args=(x,)))(next(iter(dataset)))
  assert len(built) == 2 and {tuple(f["reader_word_ids"].shape) for f in built} == {
      (BATCH // 2, config.num_candidates, config.reader.seq_length)}
  for part in strategy.experimental_local_results(rows):
    assert (part.numpy()[:, 0] == len(store)).all()   # the null block first
