r"""Benchmark: realm-serve under hostile input and concurrent updates, bounded (issue 31).

    nice -n 10 python -m experiments.benchmarks.bench_serve_abuse \
        --requests=600 --max_seconds=60

Starts ``realm-serve`` as ``bench_serve_load`` does (``make_world``, ``serving``: a corpus of
``--num_blocks`` random-word blocks, an untrained Open-QA model of the demo's size, an exact
index; the server a process of its own on 127.0.0.1, with a token). Then, first the chunked
client alone, then all these clients together, each kind until its share of ``--requests`` (a
fifth) was sent or ``--max_seconds`` passed:

* **chunked**: ``POST /answer`` with a chunked body (no ``Content-Length``) of
  ``--chunked_mib`` MiB, ``--chunked_mib`` times the server's 1 MiB limit (413 expected);
* **malformed**: bodies that are not JSON, not UTF-8, of the wrong shape, an oversized
  ``Content-Length``, to ``/answer`` and (with the token) ``/documents`` (400, 413, 422);
* **tokens**: ``POST /documents`` and ``DELETE /documents/{uid}`` with no token, a wrong one,
  the bare token, another scheme (401);
* **updates**: two clients posting a new document each time with the right token (200, or
  429 while another update runs) and deleting uids that do not exist (404);
* **questions**: two clients asking (200, or 429/503 past the bounds).

Then it checks that nothing answered 500 (or broke a connection), that every accepted
``POST /documents`` is visible (its uid a live block of the corpus the served index covers, and
the served index's block count grown by the accepted documents' blocks), and prints the
requests and statuses of each client and the server's peak memory (VmHWM, the resident set's
high-water mark: at start, after the warm-up, after the chunked bodies alone, at the end).
Exit status 1 when a check fails.
"""

import collections
import http.client
import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import time

from absl import flags
import numpy as np

from experiments.benchmarks import bench_serve_load as load
from realm_tf.binaries import cli
from realm_tf.data import block_store
from realm_tf.retrieval.index import mips_index
from realm_tf.retrieval.publication import publish
from realm_tf.retrieval.publication import testing

flags.DEFINE_integer("chunked_mib", 16, "Size of each chunked body, MiB (the limit is 1 MiB).")

FLAGS = flags.FLAGS
# bench_serve_load's flags (--num_blocks, --requests: here in all, --max_seconds), with this
# benchmark's defaults (main sets them; one given on the command line wins).
DEFAULTS = (("num_blocks", 500), ("requests", 600), ("max_seconds", 60.0))
TOKEN = "bench-abuse-token"
LIMIT = 1 << 20  # realm-serve's body limit.


def _peak_rss_mib(pid: int) -> float:
  """The process's resident set high-water mark (Linux's VmHWM), MiB; nan elsewhere."""
  try:
    with open(f"/proc/{pid}/status") as f:
      for line in f:
        if line.startswith("VmHWM:"):
          return int(line.split()[1]) / 1024
  except OSError:
    pass
  return float("nan")


KINDS = ("chunked", "malformed", "tokens", "updates", "questions")


class _Clients:
  """The deadline and each kind of client's share of the requests; records the statuses (and
  one error message of each)."""

  def __init__(self, port: int, total: int, seconds: float):
    self.port, self.share, self.deadline = port, total // len(KINDS), time.time() + seconds
    self.lock = threading.Lock()
    self.sent = collections.Counter()
    self.statuses = collections.defaultdict(collections.Counter)
    self.messages = {}
    self.accepted = []  # The accepted upserts' results.

  def more(self, kind: str) -> bool:
    with self.lock:
      if self.sent[kind] >= self.share or time.time() > self.deadline:
        return False
      self.sent[kind] += 1
      return True

  def record(self, kind: str, status: int, got=None) -> None:
    with self.lock:
      self.statuses[kind][status] += 1
      if isinstance(got, dict) and "error" in got:
        self.messages.setdefault((kind, status), got["error"])

  def request(self, method, path, body=None, headers=None):
    """``(status, parsed JSON or None)``; status -1: the connection broke."""
    conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
    try:
      conn.request(method, path, body=body, headers=headers or {})
      response = conn.getresponse()
      text = response.read()
      try:
        return response.status, json.loads(text)
      except ValueError:
        return response.status, None
    except (OSError, http.client.HTTPException):
      return -1, None
    finally:
      conn.close()

  def chunked(self, path: str, mib: int) -> int:
    """``POST path`` with a chunked body of ``mib`` MiB (64 KiB chunks) on a raw socket; the
    response's status (-1: none)."""
    piece = b"%x\r\n%s\r\n" % (65536, b"x" * 65536)
    try:
      with socket.create_connection(("127.0.0.1", self.port), timeout=120) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                  "\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
        try:
          for _ in range(mib * 16):
            s.sendall(piece)
          s.sendall(b"0\r\n\r\n")
        except OSError:  # The server may stop reading once it has answered.
          pass
        head = s.recv(65536)
      return int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/1.1 ") else -1
    except (OSError, ValueError, IndexError):
      return -1


def run_clients(values, clients: _Clients, questions, kinds=KINDS, seed: int = 0) -> None:
  """The ``kinds`` of clients together (two each for updates and questions), until their
  shares of the requests are sent or the deadline passes."""
  auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
  plain = {"Content-Type": "application/json"}
  malformed = [  # (path, body, headers); None: a Content-Length over the limit.
      ("/answer", b'{"question": "where', plain), ("/answer", b'{"question": "caf\xe9"}', plain),
      ("/answer", b'["where?"]', plain), ("/answer", b'{"question": 3}', plain),
      ("/answer", b'{"question": "where?", "top_k": 99}', plain), ("/answer", b"", plain),
      ("/answer", None, plain), ("/documents", b'{"documents": [', auth),
      ("/documents", b'{"documents": []}', auth),
      ("/documents", b'{"documents": [{"title": 1, "text": "x"}]}', auth)]
  wrong = [{}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN},
           {"Authorization": f"Basic {TOKEN}"}, {"Authorization": f"Bearer {TOKEN}x"}]
  doc = json.dumps({"documents": [{"title": "T", "text": "a document."}]}).encode()

  def chunked():
    while clients.more("chunked"):
      clients.record("chunked", clients.chunked("/answer", values.chunked_mib))

  def malformed_bodies():
    i = 0
    while clients.more("malformed"):
      path, body, headers = malformed[i % len(malformed)]
      if body is None:  # http.client sets its own Content-Length: a raw request instead.
        status, got = _oversized(clients.port), None
      else:
        status, got = clients.request("POST", path, body, headers)
      clients.record("malformed", status, got)
      i += 1

  def tokens():
    i = 0
    while clients.more("tokens"):
      headers = dict(wrong[i % len(wrong)], **plain)
      if i % 2:
        status, got = clients.request("DELETE", "/documents/" + "0" * 40, None, headers)
      else:
        status, got = clients.request("POST", "/documents", doc, headers)
      clients.record("tokens", status, got)
      i += 1

  def updates(worker: int):
    rng = np.random.default_rng(seed + 10 + worker)
    i = 0
    while clients.more("updates"):
      if i % 4 == 3:  # A uid that names no block.
        status, got = clients.request("DELETE", f"/documents/{worker:02d}{i:038d}", None, auth)
      else:  # A new title each time, in the corpus's words.
        title = " ".join(rng.choice(testing.WORDS, 2)) + f" {worker} {i}"
        text = " ".join(rng.choice(testing.WORDS, 12))
        body = json.dumps({"documents": [{"title": title, "text": text}]})
        status, got = clients.request("POST", "/documents", body.encode(), auth)
        if status == 200:
          with clients.lock:
            clients.accepted.append(got)
      clients.record("updates", status, got)
      if status == 429:  # Another update is running: retry a little later, as told.
        time.sleep(0.2)
      i += 1

  def ask(worker: int):
    rng = np.random.default_rng(seed + worker)
    while clients.more("questions"):
      body = json.dumps({"question": questions[rng.integers(len(questions))], "top_k": 3})
      clients.record("questions", *clients.request("POST", "/answer", body.encode(), plain))

  runs = {"chunked": [(chunked, ())], "malformed": [(malformed_bodies, ())],
          "tokens": [(tokens, ())], "updates": [(updates, (0,)), (updates, (1,))],
          "questions": [(ask, (0,)), (ask, (1,))]}
  threads = [threading.Thread(target=f, args=a) for k in kinds for f, a in runs[k]]
  for t in threads:
    t.start()
  for t in threads:
    t.join()


def _oversized(port: int) -> int:
  """A request announcing a body over the limit (``Content-Length``) and sending a little."""
  try:
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
      s.sendall(f"POST /answer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {LIMIT + 1}\r\nConnection: close\r\n\r\n{{}}".encode())
      head = s.recv(65536)
    return int(head.split(b" ", 2)[1])
  except (OSError, ValueError, IndexError):
    return -1


def check_updates(clients: _Clients, index: str, blocks: str, before: int,
                  health: dict) -> list:
  """What is wrong with the accepted upserts: each added uid must be a live block of the corpus
  version the served index covers, and the served index must count every added block."""
  problems = []
  path = publish.read_latest(index)
  manifest = mips_index.read_manifest(path)
  if health["index"] != os.path.basename(path):
    problems.append(f"the server answers with {health['index']}, LATEST is {path}")
  store = block_store.BlockStore.open(blocks, fingerprint=manifest["corpus_fingerprint"])
  added = [a for result in clients.accepted for a in result["added"]]
  deleted = sum(len(result["deleted"]) for result in clients.accepted)
  for a in added:
    if not len(store.rows_with_uid(a["uid"])):
      problems.append(f"the accepted document {a['title']!r} ({a['uid']}) is not in the corpus")
  if health["num_blocks"] != before + len(added) - deleted:
    problems.append(f"the served index has {health['num_blocks']} blocks, not {before} + "
                    f"{len(added)} added - {deleted} replaced")
  return problems


def report(alone: _Clients, alone_seconds: float, clients: _Clients, seconds: float,
           before: int, status: int, health, memory, problems: list, values) -> list:
  """Prints the requests and statuses of each client, the updates and the server's peak memory
  (``memory``: MiB at start, warm, after the chunked bodies alone, at the end); returns
  ``problems`` and those found here. ``status``, ``health``: the last ``/healthz``'s answer
  (its JSON, or None), reported as it came when it is not a 200."""
  everything = collections.Counter(alone.statuses["chunked"])
  print(f"\nrealm-serve, {values.num_blocks} blocks, 127.0.0.1; chunked bodies of "
        f"{values.chunked_mib} MiB against its 1 MiB limit")
  print(f"alone: {alone.sent['chunked']} chunked requests in {alone_seconds:.1f} s: "
        f"{dict(sorted(alone.statuses['chunked'].items()))}")
  print(f"together: {sum(clients.sent.values())} requests in {seconds:.1f} s (bounds: "
        f"{values.requests} requests, {values.max_seconds:.0f} s)")
  print("| client | requests | statuses |")
  print("|---|---:|---|")
  for client in KINDS:
    counts = clients.statuses[client]
    everything.update(counts)
    print(f"| {client} | {sum(counts.values())} | "
          f"{', '.join(f'{s}: {n}' for s, n in sorted(counts.items()))} |")
  for (client, code), message in sorted(clients.messages.items()):
    print(f"  {client} {code}: {message}")
  if status == 200 and isinstance(health, dict) and "num_blocks" in health:
    served = f"served blocks {before} -> {health['num_blocks']}"
  else:  # The server did not say: no block count to report, and a failure.
    served = f"served blocks unknown (/healthz answered {status}: {health!r})"
    if not any("/healthz" in p for p in problems):
      problems = problems + [f"/healthz answered {status} after the run"]
  print(f"accepted updates: {len(clients.accepted)} (every one visible: "
        f"{'yes' if not problems else 'NO'}); {served}")
  print("server peak RSS (VmHWM): {:.0f} MiB started, {:.0f} MiB warm, {:.0f} MiB after the "
        "chunked bodies alone, {:.0f} MiB at the end".format(*memory))
  if everything[500] or everything[-1]:
    problems = problems + [f"{everything[500]} answered 500, {everything[-1]} broken "
                           "connections"]
  for problem in problems:
    print(f"FAILED: {problem}")
  print("OK: no 500, no broken connection, no lost update" if not problems else "")
  return problems


def main(argv):
  del argv
  for name, value in DEFAULTS:
    FLAGS.set_default(name, value)
  root = tempfile.mkdtemp(prefix="bench_serve_abuse_")
  try:
    model, index, blocks, questions = load.make_world(root, FLAGS.num_blocks)
    token_file = os.path.join(root, "token.txt")
    with open(token_file, "w") as f:
      f.write(TOKEN)
    with load.serving(model, index, os.path.join(root, "serve.log"),
                      [f"--token_file={token_file}"]) as (port, server):
      started = _peak_rss_mib(server.pid)
      clients = _Clients(port, 20, 60)
      for _ in range(10):  # Warm-up: traced functions, tokenized blocks.
        clients.request("POST", "/answer", json.dumps({"question": questions[0]}).encode(),
                        {"Content-Type": "application/json"})
      warm = _peak_rss_mib(server.pid)
      before = clients.request("GET", "/healthz")[1]["num_blocks"]
      alone = _Clients(port, FLAGS.requests, FLAGS.max_seconds)  # The chunked bodies alone.
      start = time.time()
      run_clients(FLAGS, alone, questions, kinds=("chunked",))
      alone_seconds, after_chunked = time.time() - start, _peak_rss_mib(server.pid)
      clients = _Clients(port, FLAGS.requests, FLAGS.max_seconds)  # Everything together.
      start = time.time()
      run_clients(FLAGS, clients, questions)
      seconds = time.time() - start
      status, health = clients.request("GET", "/healthz")
      peak = _peak_rss_mib(server.pid)
      problems = [] if status == 200 else [f"/healthz answered {status} after the run"]
      if status == 200:
        problems += check_updates(clients, index, blocks, before, health)
    problems = report(alone, alone_seconds, clients, seconds, before, status, health,
                      (started, warm, after_chunked, peak), problems, FLAGS)
  finally:
    shutil.rmtree(root, ignore_errors=True)
  if problems:
    sys.exit(1)


if __name__ == "__main__":
  cli.run_main(main)
