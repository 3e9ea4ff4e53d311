"""``experiments/benchmarks/bench_serve_abuse.py``'s end: a server whose ``/healthz`` does not
answer 200 after the run is reported as a failure (exit status 1), not a ``TypeError``."""

import contextlib
import os
import types

import pytest

from experiments.benchmarks import bench_serve_abuse as bench


@pytest.mark.parametrize("health", [{"error": "the service stopped"}, None])
def test_a_healthz_that_fails_at_the_end_is_reported(health, monkeypatch, capsys):
  """The world, the server and the clients replaced: the last ``/healthz`` answers 503 (a JSON
  error, or a body that is not JSON)."""

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
