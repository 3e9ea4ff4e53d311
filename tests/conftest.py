"""pytest options: slow tests run only with --runslow."""
import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# XLA's CPU backend without LLVM's optimizations: the tests check what compiles and what it
# computes, not how fast the compiled code runs; compiles take about half the time.
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")


def pytest_addoption(parser):
  parser.addoption("--runslow", action="store_true", default=False, help="run slow tests")


def pytest_configure(config):
  config.addinivalue_line("markers", "slow: slow test, run with --runslow")


def pytest_collection_modifyitems(config, items):
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
