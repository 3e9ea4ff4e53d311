"""``experiments/benchmarks/bench_serve_abuse.py``'s end: a server whose ``/healthz`` does not
answer 200 after the run is reported as a failure (exit status 1), not a ``TypeError``.

The benchmark defines its flags at import (``--num_blocks``, as ``experiments.scale_model``
does), so its test runs in a pytest process of its own: the outer test starts it."""

import contextlib
import os
import subprocess
import sys
import types

import pytest

INNER = os.environ.get("REALM_TF_BENCH_ABUSE_TEST") == "1"


@pytest.mark.skipif(not INNER, reason="run in a process of its own by test_in_its_own_process")
@pytest.mark.parametrize("health", [{"error": "the service stopped"}, None])
def test_a_healthz_that_fails_at_the_end_is_reported(health, monkeypatch, capsys):
  """The world, the server and the clients replaced: the last ``/healthz`` answers 503 (a JSON
  error, or a body that is not JSON)."""
  # pylint: disable-next=g-import-not-at-top
  from experiments.benchmarks import bench_serve_abuse as bench

  @contextlib.contextmanager
  def serving(*unused_args):
    yield 1, types.SimpleNamespace(pid=os.getpid())

  healthz = iter([(200, {"num_blocks": 7}), (503, health)])

  def request(unused_self, method, path, *unused_args):
    return next(healthz) if path == "/healthz" else (200, {"answers": []})

  monkeypatch.setattr(bench.load, "make_world", lambda root, n: ("m", "i", "b", ["where?"]))
  monkeypatch.setattr(bench.load, "serving", serving)
  monkeypatch.setattr(bench, "run_clients", lambda *unused_args, **unused_kwargs: None)
  monkeypatch.setattr(bench._Clients, "request", request)  # pylint: disable=protected-access
  with pytest.raises(SystemExit) as e:
    bench.main([])
  assert e.value.code == 1
  out = capsys.readouterr().out
  assert "FAILED: /healthz answered 503 after the run" in out, out
  assert "served blocks unknown (/healthz answered 503" in out, out


@pytest.mark.skipif(INNER, reason="the inner run")
def test_in_its_own_process():
  proc = subprocess.run(
      [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
       os.path.abspath(__file__), "-k", "healthz"], capture_output=True, text=True,
      env=dict(os.environ, REALM_TF_BENCH_ABUSE_TEST="1"),
      cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), timeout=600, check=False)
  assert proc.returncode == 0 and "2 passed" in proc.stdout, proc.stdout[-3000:]
