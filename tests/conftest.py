"""pytest options (slow tests run only with --runslow) and the session fixtures."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")   # before TensorFlow is imported
# XLA's CPU backend without LLVM's optimizations: the tests check what compiles and what it
# computes, not how fast the compiled code runs; compiles take about half the time.
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")

from absl import flags
import pytest

from data_prep import blocks as blocks_pipeline
from data_prep import pipeline
from data_prep import synthetic_world
from experiments.pipeline import stages
from experiments.synthetic import demo
from realm_tf import configs
from realm_tf import model_dir as model_dir_lib
from realm_tf import train_lib
from realm_tf.retrieval.publication import testing
from realm_tf.tokenization import load_vocab

import helpers


def pytest_addoption(parser):
  parser.addoption("--runslow", action="store_true", default=False, help="run slow tests")


def pytest_configure(config):
  config.addinivalue_line("markers", "slow: slow test, run with --runslow")


# The modules that take longest (make test's --durations), run first: pytest-xdist hands whole
# modules (--dist loadfile) to its two workers in collection order, so the long ones started
# last would leave one worker running alone at the end.
LONG_FIRST = ("test_realm_training", "test_tpu_readiness", "test_openqa_cli", "test_serve",
              "test_refresher_sigkill", "test_openqa", "test_released_route", "test_tables",
              "test_data_prep_cli", "test_realm_index_updates", "test_openqa_trainable_blocks",
              "test_reader_reads")


def pytest_collection_modifyitems(config, items):
  rank = {name: i for i, name in enumerate(LONG_FIRST)}
  items.sort(key=lambda item: rank.get(item.module.__name__.rsplit(".", 1)[-1], len(rank)))
  if config.getoption("--runslow"):
    return
  skip = pytest.mark.skip(reason="slow: run with --runslow")
  for item in items:
    if "slow" in item.keywords:
      item.add_marker(skip)


def _split_cpu():
  """Two logical CPU devices, so MirroredStrategy can be tested on one CPU."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  cpus = tf.config.list_physical_devices("CPU")
  try:
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)
  except RuntimeError:  # already initialized
    pass


_split_cpu()


@pytest.fixture(autouse=True)
def _flags_parsed():
  """Every test sees absl's flags parsed, at their defaults unless a test sets them: a command
  line a test ran before (``helpers.run_cli``) may have left them unparsed, and a binary's
  ``main`` reads them. (Under pytest-xdist the
  tests a worker ran before differ from run to run.)"""
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
  yield


# ------------------------------------------------------------------------ session fixtures --
# The synthetic world and the warm starts several modules share, built once per session (each
# test writes its own runs under its own names or its own tmp_path).

@pytest.fixture(scope="session")
def realm_world(tmp_path_factory):
  """A small synthetic world (2 regions, 6 cities, 14 people, 4 organizations, 6 works; a
  vocabulary of 500) through every corpus pipeline: 64-wordpiece blocks, 32-wordpiece queries,
  30% of the blocks' sentences held out. Keys: ``root``, ``world``, ``files`` (write_world's),
  ``vocab`` and the directories ``blocks``, ``sentences``, ``pretrain``, ``ict``."""
  root = tmp_path_factory.mktemp("realm_world")
  world = synthetic_world.generate_world(seed=1, num_regions=2, num_cities=6, num_people=14,
                                         num_organizations=4, num_works=6)
  files = synthetic_world.write_world(world, str(root / "world"), vocab_size=500)
  out = pipeline.prepare_all(files["articles"], files["vocab"], str(root / "data"),
                             patterns_file=files["patterns"], block_seq_length=64,
                             query_seq_length=32, eval_fraction=0.3)
  return dict(root=root, world=world, files=files, vocab=files["vocab"], **out["dirs"])


@pytest.fixture(scope="session")
def ict_dir(realm_world):
  """A few ICT steps on ``realm_world``: the retriever the REALM runs start from."""
  path, metrics = helpers.train_ict(realm_world, "ict", 4, "task.model.projection_size=16")
  assert set(metrics) >= {"training_loss", "recall@1", "recall@5"}
  assert model_dir_lib.training_done(path)
  return path


@pytest.fixture(scope="session")
def reader_dir(realm_world):
  """A few steps of the reader's reading warm start on ``realm_world`` (it reads itself)."""
  p = realm_world
  size = len(load_vocab(p["vocab"]))
  params = configs.load_experiment("reader_read_cpu", params_override=",".join([
      f"task.model.vocab_file={p['vocab']}", f"task.model.reader.encoder.vocab_size={size}",
      f"task.model.retriever.encoder.vocab_size={size}", "task.model.reader.seq_length=96",
      "task.model.reader.encoder.hidden_size=32", "task.model.reader.encoder.intermediate_size=64",
      f"task.train_data.input_path=[{os.path.join(p['pretrain'], 'train-*')}]",
      f"task.train_data.blocks_dir=[{p['blocks']}]", "task.train_data.global_batch_size=8",
      "trainer.train_steps=3", "trainer.steps_per_loop=1", "trainer.summary_interval=1"]))
  path = str(p["root"] / "reader_read")
  metrics = train_lib.run_experiment(params, path)
  assert set(metrics) >= {"training_loss", "mlm_accuracy", "reading_gain"}
  assert metrics["training_loss"] > 0
  return path


@pytest.fixture(scope="session")
def demo_world(tmp_path_factory):
  """``realm-demo``'s data as test_demo's run makes it (``demo.prepare_data`` at world scale
  0.3, and ``stages.prepare_reading_worlds``: one reading world). Keys: ``out`` and prepare_data's ``world``, ``files``, ``prepared``
  (the demo world's manifests and ``dirs``) and ``reading`` (the reading worlds' dirs)."""
  out = str(tmp_path_factory.mktemp("demo"))
  recipe = stages.Recipe(world_scale=0.3, reading_worlds=1)
  world, files, prepared = demo.prepare_data(out, 0, recipe)
  reading = stages.prepare_reading_worlds(out, files["vocab"], stages.reading_worlds(0, recipe), 0)
  return dict(out=out, world=world, files=files, prepared=prepared, reading=reading)


@pytest.fixture(scope="session")
def openqa_world(tmp_path_factory):
  """Open-QA's world: a tiny synthetic world (1 region, 3 cities, 5 people, 2 organizations, 2
  works; a vocabulary of 300), its blocks at 48 wordpieces and a REALM model directory of
  perturbed random towers (hidden 16, projection 16, 24-wordpiece queries; ckpt-0, finished)
  to fine-tune from. Keys: ``root``, ``files``, ``vocab``, ``blocks_dir``, ``realm_dir`` and
  ``tiny_trainer`` (its ``testing.TinyTrainer``)."""
  root = tmp_path_factory.mktemp("openqa_world")
  world = synthetic_world.generate_world(seed=1, num_regions=1, num_cities=3, num_people=5,
                                         num_organizations=2, num_works=2)
  files = synthetic_world.write_world(world, str(root / "world"), vocab_size=300)
  blocks_dir = str(root / "blocks")
  blocks_pipeline.run_blocks(files["articles"], files["vocab"], blocks_dir, block_seq_length=48)
  realm_dir = str(root / "realm")
  tiny_trainer = testing.TinyTrainer(realm_dir, files["vocab"], hidden_size=16,
                                     projection_size=16, query_seq_length=24,
                                     block_seq_length=48)
  # Untrained towers embed every text alike (scores tied to 1e-5, ranked by rounding noise):
  # perturbed ones rank blocks apart, so two code paths retrieve the same beam.
  tiny_trainer.perturb(0.3)
  tiny_trainer.save(0)
  tiny_trainer.finish(0)
  return dict(root=root, files=files, vocab=files["vocab"], blocks_dir=blocks_dir,
              realm_dir=realm_dir, tiny_trainer=tiny_trainer)
