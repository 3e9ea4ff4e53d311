"""pytest options: slow tests run only with --runslow."""
import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


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
