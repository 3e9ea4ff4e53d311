"""A crash during a live update never leaves a document stored but unsearchable (issue 42).

``realm-index upsert|delete`` is killed with SIGKILL at each phase of ``updates.CRASH_PHASES``
(the process kills itself there: ``publish.testonly_crash_point``); then a restart
(``updates.reconcile_if_behind``, what ``realm-serve`` runs at start-up) and a retry. After the
restart, in every case: the document is in the corpus and the index or in neither; the index's
live blocks are the corpus's; no temporary directory is left or loaded; the retry reaches the
promised state (answerable, or gone). A delete killed after its corpus write and the reported
case (an upsert's retry after the same crash) run in ``make test``; the other phases and two
racing writers in the slow tier.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from realm_tf import model_dir as model_dir_lib
from realm_tf.data import block_store
from realm_tf.data import corpus_updates
from realm_tf.data import manifests
from realm_tf.retrieval import errors
from realm_tf.retrieval.index import base as index_base
from realm_tf.retrieval.index import mips_index
from realm_tf.retrieval.publication import index_io
from realm_tf.retrieval.publication import publish
from realm_tf.retrieval.publication import refresher
from realm_tf.retrieval.publication import updates

from test_realm_index_updates import ENV
from test_realm_index_updates import REPO
from test_realm_index_updates import _realm_index
from test_realm_index_updates import _setup
from test_serve import TOKEN
from test_serve import request
from test_serve import serve_dirs

TITLE = "Victim"
DOC = {"title": TITLE, "text": "the king was born in paris."}
INDEX_PHASES = ("plan", "corpus", "embedding", "index_write", "publish")
FAST = {("delete", "corpus")}   # The upsert's: test_a_retry_without_a_restart_...
CASES = [pytest.param(op, phase, marks=() if (op, phase) in FAST else pytest.mark.slow)
         for op in ("upsert", "delete") for phase in INDEX_PHASES]


def _state(setup):
  """(rows of TITLE live in the corpus, those rows live in the index LATEST names, the index's
  live blocks, the corpus's live blocks, the index's path, those rows live in its sparse part,
  the sparse part's best block for the document's words)."""
  store = block_store.BlockStore.open(setup["blocks"])
  path = publish.read_latest(setup["index"])
  index = index_io.load_index(path, expected_fingerprint=store.fingerprints)
  rows = [r for r in range(len(store)) if store.titles[r] == TITLE]
  in_corpus = [r for r in rows if store.is_live([r])[0]]
  in_index = [r for r in rows if r < index.num_blocks and r not in set(index.deleted.tolist())]
  in_sparse = [r for r in rows if r < index.sparse.num_rows and index.sparse.live[r]]
  best = index.sparse.search([f"{TITLE} {DOC['text']}"], 1)[0][0, 0]
  return (in_corpus, in_index, index.num_live, len(store) - len(store.deleted), path,
          in_sparse, best)


def _check_consistent(setup):
  in_corpus, in_index, index_live, corpus_live, path, in_sparse, best = _state(setup)
  assert in_corpus == in_index == in_sparse, (in_corpus, in_index, in_sparse)  # All or none.
  assert (best in in_corpus) == bool(in_corpus)   # BM25 finds it exactly when it is live.
  assert index_live == corpus_live
  names = os.listdir(setup["index"])
  assert not [n for n in names if n.startswith(publish.TMP_PREFIX)], names
  assert publish.parse_name(path) is not None
  return bool(in_corpus)


def _killed(setup, tmp_path, op, phase):
  docs = tmp_path / "docs.jsonl"
  docs.write_text(json.dumps(DOC) + "\n")
  args = ([f"--input={docs}"] if op == "upsert" else [f"--title={TITLE}"])
  proc = _realm_index(op, f"--index_dir={setup['index']}", f"--model_dir={setup['model']}",
                      *args, env=dict(ENV, **{publish.TESTONLY_CRASH_ENV: phase}))
  _, err = proc.communicate(timeout=300)
  assert proc.returncode == -signal.SIGKILL, err[-3000:]


@pytest.mark.parametrize("op,phase", CASES)
def test_a_crash_at_each_phase_then_restart_and_retry(op, phase, tmp_path):
  setup = _setup(tmp_path, num_blocks=60)
  updater = updates.Updater(setup["index"], setup["model"])
  if op == "delete":
    updater.upsert([updates.Document(**DOC)])
  before = _state(setup)
  _killed(setup, tmp_path, op, phase)
  # The previous publication is still what LATEST names until the crash's own publication.
  if phase != "publish":
    assert publish.read_latest(setup["index"]) == before[4]

  restarted = updates.reconcile_if_behind(setup["index"])
  rolled = phase in ("corpus", "embedding", "index_write")
  assert (restarted is not None) == rolled, restarted
  present = _check_consistent(setup)
  assert present == ((op == "upsert") == (phase != "plan")), present

  # The retry gives the state the first request promised.
  if op == "upsert":
    result = updates.Updater(setup["index"], setup["model"]).upsert([updates.Document(**DOC)])
    assert result.skipped == ([] if phase == "plan" else [TITLE])
    assert _check_consistent(setup)
    # Answerable: the document's own embedding finds it first.
    in_index = _state(setup)[1]
    index = index_io.load_index(publish.read_latest(setup["index"]), load_embeddings=True)
    query = np.asarray(index.embeddings[in_index[0]])[None]
    assert index.search(query, 1)[0][0, 0] == in_index[0]
  else:
    if phase == "plan":
      updates.Updater(setup["index"], setup["model"]).delete(titles=[TITLE])
    else:
      with pytest.raises(errors.IndexUpdateError, match="no live block"):
        updates.Updater(setup["index"], setup["model"]).delete(titles=[TITLE])
    assert not _check_consistent(setup)


def test_a_retry_without_a_restart_rolls_forward_first(tmp_path):
  """The reported case, with no start-up reconcile between: upsert killed after the corpus
  write, then the same upsert again. It used to answer "skipped" and leave the document out of
  the index until an unrelated update; now the retry publishes an index that serves it."""
  setup = _setup(tmp_path, num_blocks=60)
  _killed(setup, tmp_path, "upsert", "corpus")
  assert publish.index_behind_corpus(setup["index"])["corpus_version"] == 1
  result = updates.Updater(setup["index"], setup["model"]).upsert([updates.Document(**DOC)])
  assert result.skipped == [TITLE] and result.index.endswith("step-10-u1")
  assert _check_consistent(setup) and publish.index_behind_corpus(setup["index"]) is None


@pytest.mark.slow
def test_two_writers_racing_on_the_same_directories(tmp_path):
  """Two realm-index upserts at once, each of its own document: both land, one after the
  other (the index directory's lock), and the index's live blocks are the corpus's."""
  setup = _setup(tmp_path, num_blocks=60)
  procs = []
  for i in range(2):
    docs = tmp_path / f"docs{i}.jsonl"
    docs.write_text(json.dumps({"title": f"Racer {i}", "text": f"a band from london {i}."})
                    + "\n")
    procs.append(_realm_index("upsert", f"--index_dir={setup['index']}",
                              f"--model_dir={setup['model']}", f"--input={docs}"))
  outs = []
  for proc in procs:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    outs.append(json.loads(out.strip().splitlines()[-1]))
  assert sorted(o["index"].rsplit("-", 1)[1] for o in outs) == ["u1", "u2"]
  store = block_store.BlockStore.open(setup["blocks"])
  index = index_io.load_index(publish.read_latest(setup["index"]),
                                expected_fingerprint=store.fingerprints)
  assert index.num_live == len(store) - len(store.deleted) == 62
  for i in range(2):
    assert len(store.rows_with_title(f"Racer {i}")) == 1


def test_a_reader_refuses_an_index_without_a_block_tower_behind_its_corpus(tmp_path):
  """An index that cannot embed what it lacks (built from precomputed embeddings) behind its
  corpus: the start-up refuses it with the command that rebuilds it."""
  setup = _setup(tmp_path, num_blocks=60)
  corpus_updates.apply(setup["blocks"], [updates._block(TITLE, DOC["text"], [1, 5, 6, 2])], [])
  path = publish.read_latest(setup["index"])
  manifest = mips_index.read_manifest(path)
  del manifest["block_tower"]
  with open(os.path.join(path, index_base.MANIFEST_NAME), "w") as f:
    json.dump(manifest, f)
  with pytest.raises(errors.IndexNotReadyError,
                     match=r"covers version 0 of the corpus .* at version 1 .*realm-index build"):
    updates.reconcile_if_behind(setup["index"])


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _serve(dirs, port, log, crash_at=None):
  env = dict(ENV, REALM_SERVE_TOKEN=TOKEN)
  if crash_at:
    env[publish.TESTONLY_CRASH_ENV] = crash_at
  return subprocess.Popen(
      [sys.executable, "-m", "realm_tf.binaries.serve", f"--model_dir={dirs['model']}",
       f"--index_dir={dirs['index']}", "--host=127.0.0.1", f"--port={port}",
       "--poll_seconds=0.2"], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)


def _health(url, proc, timeout=300):
  deadline = time.time() + timeout
  while True:
    assert proc.poll() is None, "realm-serve exited"
    try:
      status, body = request(url + "/healthz")
      if status == 200:
        return body
    except OSError:
      pass
    assert time.time() < deadline, "realm-serve did not start"
    time.sleep(0.5)


@pytest.mark.slow
@pytest.mark.parametrize("kill", ["swap", 0.1, 0.25])
def test_realm_serve_killed_mid_update_then_restarted_and_retried(kill, tmp_path):
  """As an operator meets it: POST /documents, the server killed (by itself right after the
  publication, "swap"; or kill -9 from outside 0.1 s / 0.25 s after the request), started
  again over the same directories, the same document sent again: the retry answers 200 and
  the document is served; /healthz's blocks are the corpus's live blocks and its corpus
  version the corpus's."""
  dirs = serve_dirs(tmp_path)
  setup = dict(dirs)
  port = _free_port()
  url = f"http://127.0.0.1:{port}"
  body = {"documents": [DOC]}
  with open(tmp_path / "serve1.log", "w") as log:
    proc = _serve(dirs, port, log, crash_at=kill if kill == "swap" else None)
    before = _health(url, proc)
    def send():
      try:
        request(url + "/documents", body, token=TOKEN)
      except OSError:  # The server died under the request: what this test does.
        pass
    sender = threading.Thread(target=send)
    sender.daemon = True
    sender.start()
    if kill == "swap":
      proc.wait(timeout=300)
      assert proc.returncode == -signal.SIGKILL
    else:
      time.sleep(kill)
      proc.kill()
      proc.wait()
  with open(tmp_path / "serve2.log", "w") as log:
    proc = _serve(dirs, port, log)
    try:
      health = _health(url, proc)
      present = _check_consistent(setup)
      store = block_store.BlockStore.open(dirs["blocks"])
      assert health["num_blocks"] == len(store) - len(store.deleted)
      assert health["corpus_version"] == corpus_updates.version(
          manifests.load_blocks_manifest(dirs["blocks"]))
      assert health["num_blocks"] == before["num_blocks"] + (1 if present else 0)
      status, result = request(url + "/documents", body, token=TOKEN)
      assert status == 200, result
      assert result["skipped"] == ([TITLE] if present else [])
      health = request(url + "/healthz")[1]
      assert _check_consistent(setup) and health["index"] == os.path.basename(
          publish.read_latest(dirs["index"]))
      assert health["num_blocks"] == before["num_blocks"] + 1
    finally:
      proc.terminate()
      proc.wait(timeout=60)


def test_the_refresher_indexes_the_whole_corpus_at_once_when_latest_is_behind(tmp_path):
  """The corpus went a version ahead of LATEST (an update cut short) and no newer checkpoint
  will come: realm-refresh builds the newest checkpoint's index over the whole corpus at start
  instead of saying the index of step 10 is final."""
  setup = _setup(tmp_path, num_blocks=60)
  corpus_updates.apply(setup["blocks"], [updates._block(TITLE, DOC["text"], [1, 5, 6, 2])], [])
  model_dir_lib.mark_training_done(setup["model"])
  builds = refresher.refresh_loop(setup["model"], setup["index"], setup["blocks"],
                                  exit_when_done=True, poll_seconds=0.01,
                                  options=setup["options"])
  assert builds == 1 and publish.index_behind_corpus(setup["index"]) is None
  assert _check_consistent(setup)
