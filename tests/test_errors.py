"""One base for the project's expected errors (``realm_tf.errors.RealmError``): every error class
of the project derives from it, and a command line reports it on one line with exit status 2
while a bug (a bare ``ValueError``) keeps its traceback."""

import importlib
import inspect
import os
import pkgutil
import subprocess
import sys
import time
from unittest import mock

import pytest

import data_prep
import realm_tf
from experiments import assets
from realm_tf import errors
from realm_tf.binaries import cli


def _project_modules():
  for package in (realm_tf, data_prep):
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
      if ".binaries." not in info.name:   # each binary defines its flags at import
        yield importlib.import_module(info.name)
  yield assets


def test_every_project_error_is_a_realm_error():
  classes = {cls for module in _project_modules()
             for _, cls in inspect.getmembers(module, inspect.isclass)
             if issubclass(cls, Exception) and cls.__module__.split(".")[0] in (
                 "realm_tf", "data_prep", "experiments")}
  assert len(classes) >= 15, sorted(c.__name__ for c in classes)
  assert [c for c in classes if not issubclass(c, errors.RealmError)] == []
  # One class per name: no two different errors called alike.
  names = [c.__name__ for c in classes]
  assert len(names) == len(set(names)), sorted(names)


def _run_main(exception):
  def main(argv):
    del argv
    raise exception

  with mock.patch.object(sys, "argv", ["prog"]):
    cli.run_main(main)


def test_run_main_reports_expected_errors_on_one_line(capsys):
  from realm_tf.data import manifests  # pylint: disable=g-import-not-at-top
  for error in (manifests.MissingDataError("no manifest.json in /x"),
                errors.RealmError("a bad corpus"), FileNotFoundError("/y: not found")):
    with pytest.raises(SystemExit) as done:
      _run_main(error)
    assert done.value.code == 2
    assert capsys.readouterr().err == f"error: {error}\n"


def test_run_main_keeps_the_traceback_of_a_bug():
  with pytest.raises(ValueError, match="a bug"):
    _run_main(ValueError("a bug"))


def test_tf_keras_is_keras_2_in_a_process_that_imports_realm_tf_first():
  """realm_tf sets TF_USE_LEGACY_KERAS before TensorFlow loads: tf.keras is tf_keras (Keras 2),
  the project's Keras, and Keras 3 is never imported; a setting given by the user is kept."""
  check = ("import sys, realm_tf, tensorflow as tf, tf_keras; "
           "print(tf.keras.layers.Dense is tf_keras.layers.Dense, 'keras.src' in sys.modules)")
  env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
  out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, env=env,
                       check=True).stdout.split()
  assert out == ["True", "False"], out
  out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                       env=dict(env, TF_USE_LEGACY_KERAS="0"), check=True).stdout.split()
  assert out[0] == "False", out  # The user's setting wins.


def test_a_binary_that_returns_exits_at_once_with_its_output():
  """cli.exit_now: the output is flushed, the status kept, and the process does not wait for
  the interpreter's teardown (a finalizer that would block for a minute never runs)."""
  script = ("import sys, time, weakref\n"
            "from realm_tf.binaries import cli\n"
            "class Slow:\n"
            "  def __del__(self): time.sleep(60)\n"
            "keep = Slow()\n"
            "def main(argv):\n"
            "  print('done', flush=False)\n"
            "  return 3\n"
            "sys.argv = ['prog']\n"
            "cli.run_main(main)\n")
  start = time.time()
  proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                        timeout=120, check=False)
  assert time.time() - start < 45
  assert proc.returncode == 3 and proc.stdout == "done\n", proc.stderr[-2000:]
