r"""Benchmark: realm-serve under a bounded load, at concurrency 1 and 8 (and past its bound).

    nice -n 10 python -m experiments.benchmarks.bench_serve_load \
        --requests=300 --max_seconds=90

Builds in a temporary directory a corpus of ``--num_blocks`` random-word blocks, an untrained
Open-QA model of the demo's size (2-layer, 64-wide towers and reader, projection 128, query 32,
reader 64 wordpieces; weights do not change the time) and an exact index of its block tower;
starts ``realm-serve`` on it as a separate process on 127.0.0.1 (``--max_in_flight`` 8,
``--max_batch`` 8, 5 blocks read); then, for each concurrency in ``--concurrency``, that many
client threads (one keep-alive connection each) send ``POST /answer`` with random questions
until ``--requests`` were sent or ``--max_seconds`` passed; the server is stopped at the end.

Prints per concurrency: requests, answered (200), refused (429/503), failed (anything else:
other statuses, broken connections), p50 and p99 latency of the answered ones, and answered
requests per second. At concurrency up to ``max_in_flight`` none should fail or be refused;
past it the excess gets 429, still none fails.

``make_world`` and ``serving`` (the corpus, model and index; realm-serve as a process on
127.0.0.1, stopped on exit) are ``bench_serve_abuse``'s too; they and ``load_run`` (the
clients) are ``bench_serve_retrievers``'.
"""

import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from absl import flags
import numpy as np

from realm_tf.binaries import cli
from realm_tf.retrieval.publication import refresher
from realm_tf.retrieval.publication import testing

flags.DEFINE_integer("num_blocks", 2000, "Blocks in the corpus.")
flags.DEFINE_list("concurrency", ["1", "8", "32"], "Client threads, one run each.")
flags.DEFINE_integer("requests", 300, "Requests per run (at most).")
flags.DEFINE_float("max_seconds", 90.0, "Longest run.")
flags.DEFINE_integer("max_in_flight", 8, "realm-serve --max_in_flight.")

FLAGS = flags.FLAGS
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def make_world(root: str, num_blocks: int):
  """In ``root``: a corpus of ``num_blocks`` random-word blocks, an untrained Open-QA model of
  the demo's size and an exact index of its block tower; ``(model, index, blocks, questions)``
  (500 questions)."""
  vocab = testing.write_vocab(os.path.join(root, "vocab.txt"))
  blocks, model, index = (os.path.join(root, n) for n in ("blocks", "model", "index"))
  testing.make_corpus(blocks, vocab, num_blocks, min_words=8, max_words=30)
  testing.make_openqa_model(model, vocab, hidden_size=64, projection_size=128,
                            query_seq_length=32, block_seq_length=32)
  refresher.build_index_for_checkpoint(None, model, blocks, index, refresher.BuildOptions(
      index_type="brute_force", recall_queries=0, progress=False, tensorboard_dir=""))
  questions = [f"where was the {t} born?" for t in testing.random_texts(500, seed=7)[0]]
  return model, index, blocks, questions


@contextlib.contextmanager
def serving(model: str, index: str, log_path: str, flags_=()):
  """Runs ``realm-serve`` on ``model`` and ``index`` as a process of its own on 127.0.0.1 and a
  free port (more flags: ``flags_``; its output: ``log_path``); yields ``(port, process)`` once
  it answers ``/healthz`` (at most 300 s); stops it on exit (SIGTERM, then SIGKILL)."""
  port = _free_port()
  with open(log_path, "w") as log:
    server = subprocess.Popen(
        [sys.executable, "-m", "realm_tf.binaries.serve", f"--model_dir={model}",
         f"--index_dir={index}", "--host=127.0.0.1", f"--port={port}", *flags_],
        stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
        env=dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3"))
    try:
      deadline = time.time() + 300
      while True:
        try:
          conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
          conn.request("GET", "/healthz")
          if conn.getresponse().status == 200:
            break
        except OSError:
          pass
        if server.poll() is not None or time.time() > deadline:
          raise RuntimeError(f"realm-serve did not start; see {log_path}")
        time.sleep(0.5)
      yield port, server
    finally:
      server.send_signal(signal.SIGTERM)
      try:
        server.wait(timeout=30)
      except subprocess.TimeoutExpired:
        server.kill()


def _post(conn, body):
  conn.request("POST", "/answer", body=body, headers={"Content-Type": "application/json"})
  response = conn.getresponse()
  response.read()
  return response.status


def load_run(port, threads, total, max_seconds, questions, retriever="dense", seed=0):
  """``threads`` clients until ``total`` requests or ``max_seconds``, each asking with
  ``retriever`` random questions (client i's drawn from seed ``seed + i``): (statuses,
  latencies of the 200s, seconds)."""
  lock, sent = threading.Lock(), [0]
  statuses, latencies = [], []
  deadline = time.time() + max_seconds

  def client(seed):
    rng = np.random.default_rng(seed)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    while time.time() < deadline:
      with lock:
        if sent[0] >= total:
          break
        sent[0] += 1
      body = json.dumps({"question": questions[rng.integers(len(questions))], "top_k": 3,
                         "retriever": retriever})
      start = time.perf_counter()
      try:
        status = _post(conn, body)
      except (OSError, http.client.HTTPException):
        status = -1
        conn.close()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
      took = time.perf_counter() - start
      with lock:
        statuses.append(status)
        if status == 200:
          latencies.append(took)
    conn.close()

  start = time.time()
  workers = [threading.Thread(target=client, args=(seed + i,)) for i in range(threads)]
  for w in workers:
    w.start()
  for w in workers:
    w.join()
  return statuses, latencies, time.time() - start


def main(argv):
  del argv
  root = tempfile.mkdtemp(prefix="bench_serve_load_")
  try:
    model, index, _, questions = make_world(root, FLAGS.num_blocks)
    with serving(model, index, os.path.join(root, "serve.log"),
                 [f"--max_in_flight={FLAGS.max_in_flight}", "--max_batch=8"]) as (port, _):
      load_run(port, 2, 20, 60, questions)  # Warm-up: traced functions, tokenized blocks.
      rows = []
      for threads in [int(c) for c in FLAGS.concurrency]:
        statuses, latencies, seconds = load_run(port, threads, FLAGS.requests,
                                                FLAGS.max_seconds, questions)
        ms = np.asarray(latencies) * 1000
        rows.append((threads, len(statuses), statuses.count(200),
                     sum(s in (429, 503) for s in statuses),
                     sum(s not in (200, 429, 503) for s in statuses),
                     np.percentile(ms, 50) if len(ms) else float("nan"),
                     np.percentile(ms, 99) if len(ms) else float("nan"),
                     statuses.count(200) / seconds))
        print(f"concurrency {threads}: {rows[-1][2]} of {rows[-1][1]} answered in "
              f"{seconds:.1f} s", flush=True)
    print(f"\nrealm-serve, {FLAGS.num_blocks} blocks, --max_in_flight={FLAGS.max_in_flight}, "
          "--max_batch=8, 5 blocks read, top_k 3; a random question each request")
    print("| concurrency | requests | answered | 429/503 | failed | p50 ms | p99 ms | "
          "answered/s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c, n, ok, refused, failed, p50, p99, rate in rows:
      print(f"| {c} | {n} | {ok} | {refused} | {failed} | {p50:.1f} | {p99:.1f} | "
            f"{rate:.1f} |")
  finally:
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
  cli.run_main(main)
