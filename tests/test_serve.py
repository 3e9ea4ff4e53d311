"""realm-serve on a random-init Open-QA model (the plumbing; the answers themselves are the
slow test's, test_serve_e2e.py): answers against ``OpenQA.answer``, every bad input's
4xx with the server still answering, 429 past the admission bound, hot swaps of indexes
published by another writer and by ``POST /documents`` without a failed request, deletions
never retrieved again, the token, the page and the OpenAPI description."""

import concurrent.futures
import json
import os
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from data_prep import synthetic_world
from realm_tf import tokenization
from realm_tf.data import features
from realm_tf.data import manifests
from realm_tf.openqa import predict
from realm_tf.retrieval import errors
from realm_tf.retrieval.index import mips_index
from realm_tf.retrieval.publication import index_io
from realm_tf.retrieval.publication import publish
from realm_tf.retrieval.publication import refresher
from realm_tf.retrieval.publication import testing
from realm_tf.retrieval.publication import updates
from realm_tf.serving import app as app_lib
from realm_tf.serving import service as service_lib

import helpers

TOKEN = "s3cret-token"


def request(url, body=None, method=None, token=None, raw=None, headers=None):
  """``(status, parsed JSON or text)`` of one HTTP request."""
  data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
  req = urllib.request.Request(url, data=data, method=method or ("POST" if data is not None
                                                                 else "GET"))
  if data is not None:
    req.add_header("Content-Type", "application/json")
  if token:
    req.add_header("Authorization", f"Bearer {token}")
  for k, v in (headers or {}).items():
    req.add_header(k, v)
  try:
    with urllib.request.urlopen(req, timeout=60) as r:
      status, text = r.status, r.read().decode()
  except urllib.error.HTTPError as e:
    status, text = e.code, e.read().decode()
  try:
    return status, json.loads(text)
  except ValueError:
    return status, text


def serve_dirs(root):
  """A random-init Open-QA model over a tiny world's blocks and its brute-force index:
  ``{"model", "index", "blocks", "titles", "bodies", "questions"}``."""
  w = synthetic_world.generate_world(seed=1, num_regions=1, num_cities=4, num_people=8,
                                     num_organizations=2, num_works=3)
  titles, bodies = [], []
  for article in w.articles:
    for paragraph in article["text"].split("\n\n"):
      if len(paragraph.split()) >= 5:
        titles.append(article["title"])
        bodies.append(paragraph.strip())
  vocab = testing.write_vocab(str(root / "vocab.txt"), titles + bodies)
  blocks = str(root / "blocks")
  manifests.write_blocks(blocks, titles, bodies, tokenization.RealmTokenizer(vocab),
                         block_seq_length=32)
  model, index = str(root / "model"), str(root / "index")
  testing.make_openqa_model(model, vocab)
  refresher.build_index_for_checkpoint(None, model, blocks, index, refresher.BuildOptions(
      index_type="brute_force", recall_queries=0, progress=False, tensorboard_dir=""))
  questions = [q["question"] for q in w.qa][:12]
  return dict(model=model, index=index, blocks=blocks, titles=titles, bodies=bodies,
              questions=questions)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
  root = tmp_path_factory.mktemp("serve")
  dirs = serve_dirs(root)
  model, index = dirs["model"], dirs["index"]
  app = app_lib.create_app(
      lambda: service_lib.QAService(model, index, poll_seconds=0.1, max_in_flight=8),
      token=TOKEN, max_question_chars=200, max_body_bytes=4096)
  with app_lib.BackgroundServer(app) as server:  # Its lifespan opens and closes the service.
    yield dict(dirs, root=root, url=server.url, service=app.state.service)


def _reference(world, questions):
  """``OpenQA.answer`` over the index ``LATEST`` names now (what the server must say), one
  question at a time as the requests come."""
  qa = predict.OpenQA.load(world["model"], world["index"])
  return [qa.answer([question])[0] for question in questions]


def test_answers_match_openqa(world):
  questions = world["questions"][:6]
  reference = _reference(world, questions)
  for question, want in zip(questions, reference):
    status, got = request(world["url"] + "/answer", {"question": question, "top_k": 5})
    assert status == 200, got
    best = got["answers"][0]
    assert (best["answer"], best["start"], best["end"]) == (want.answer, want.start, want.end)
    assert best["evidence"]["block_id"] == want.evidence[want.block_rank].block_id
    assert best["score"] == pytest.approx(want.score, rel=1e-5, abs=1e-5)
    scores = [a["score"] for a in got["answers"]]
    assert scores == sorted(scores, reverse=True) and len(got["answers"]) == 5
    for a in got["answers"]:  # Each alternative is read from its own block.
      e = a["evidence"]
      assert e["text"][a["start"]:a["end"]] == a["answer"]
      assert e["uid"] == features.block_uid(e["title"], e["text"])
      assert e["retrieval_score"] == pytest.approx(
          want.evidence[e["rank"]].retrieval_score, rel=1e-5, abs=1e-5)
    assert got["model_step"] == 1 and got["index"] == "step-1" and got["index_step"] == 1
    assert got["timings"]["retrieval_ms"] > 0 and got["timings"]["reading_ms"] > 0
  status, health = request(world["url"] + "/healthz")
  assert status == 200 and health["status"] == "ok" and health["num_blocks"] == len(
      world["bodies"])
  assert health["checkpoint"] == "ckpt-1", health  # No path of the host.
  assert not any(os.sep in str(v) for v in health.values()), health
  status, spec = request(world["url"] + "/openapi.json")
  assert status == 200
  assert {"/answer", "/healthz", "/documents", "/documents/{uid}"} <= set(spec["paths"])
  assert "AnswerResponse" in spec["components"]["schemas"]
  # The description states the limits /answer checks (the fuzz, test_serve_fuzz.py, holds the
  # server to them); a whole number written 2.0 is an integer, as JSON Schema says.
  fields = spec["components"]["schemas"]["AnswerRequest"]["properties"]
  assert (fields["question"]["minLength"], fields["question"]["maxLength"],
          fields["top_k"]["maximum"]) == (1, 200, 5)
  status, got = request(world["url"] + "/answer", {"question": questions[0], "top_k": 2.0})
  assert status == 200 and len(got["answers"]) == 2, got
  status, got = request(world["url"] + "/answer", {"question": questions[0], "top_k": 2.5})
  assert status == 422 and "top_k" in got["error"], got


@pytest.mark.parametrize("retriever", ["bm25", "hybrid"])
def test_each_retriever_answers_as_openqa_does_and_says_who_found_each_block(world, retriever,
                                                                          monkeypatch):
  qa = predict.OpenQA.load(world["model"], world["index"], retriever=retriever)
  for question in world["questions"][:3]:
    want = qa.answer([question])[0]
    status, got = request(world["url"] + "/answer",
                          {"question": question, "top_k": 5, "retriever": retriever})
    assert status == 200, got
    best = got["answers"][0]
    assert (best["answer"], best["start"], best["end"]) == (want.answer, want.start, want.end)
    for a in got["answers"]:
      e, w = a["evidence"], want.evidence[a["evidence"]["rank"]]
      assert (e["block_id"], e["dense_rank"], e["bm25_rank"]) == (
          w.block_id, w.dense_rank, w.bm25_rank)
    assert 0 in [a["evidence"]["bm25_rank"] for a in got["answers"]]   # BM25's first is read
  _, health = request(world["url"] + "/healthz")
  assert health["retrievers"] == ["dense", "bm25", "hybrid"]
  # An index published without its BM25 part serves the dense retriever only.
  monkeypatch.setattr(world["service"]._current.builder.handle.index, "sparse", None)  # pylint: disable=protected-access
  status, got = request(world["url"] + "/answer", {"question": "where?", "retriever": retriever})
  assert status == 422 and "published without one" in got["error"], got
  status, _ = request(world["url"] + "/answer", {"question": "where?"})
  assert status == 200


BAD = [  # (what, body bytes, headers, status, words of the message)
    ("empty question", b'{"question": ""}', {}, 422, "empty"),
    ("whitespace question", b'{"question": "  \\t\\n "}', {}, 422, "empty"),
    ("question too long", json.dumps({"question": "why " * 60}).encode(), {}, 422, "limit"),
    ("invalid JSON", b'{"question": "where', {}, 400, "not valid JSON"),
    ("not UTF-8", b'{"question": "caf\xe9?"}', {}, 400, "UTF-8"),
    ("not an object", b'["where?"]', {}, 422, "dictionary"),
    ("question a number", b'{"question": 3}', {}, 422, "question"),
    ("question missing", b'{"top_k": 2}', {}, 422, "question"),
    ("top_k a string", b'{"question": "where?", "top_k": "2"}', {}, 422, "top_k"),
    ("top_k zero", b'{"question": "where?", "top_k": 0}', {}, 422, "top_k"),
    ("top_k over the beam", b'{"question": "where?", "top_k": 6}', {}, 422, "top_k"),
    ("unknown field", b'{"question": "where?", "k": 1}', {}, 422, "k"),
    ("unknown retriever", b'{"question": "where?", "retriever": "bm42"}', {}, 422,
     "retriever"),
    ("no body", b"", {}, 422, "body"),
    ("body too large", json.dumps({"question": "x" * 5000}).encode(), {}, 413, "bytes"),
]


@pytest.mark.parametrize("what,raw,headers,status,words", BAD, ids=[b[0] for b in BAD])
def test_bad_input_gets_its_4xx_and_the_server_keeps_answering(world, what, raw, headers,
                                                               status, words):
  got_status, got = request(world["url"] + "/answer", raw=raw, headers=headers)
  assert got_status == status, (what, got)
  assert isinstance(got, dict) and set(got) == {"error"} and "\n" not in got["error"], got
  assert words.lower() in got["error"].lower(), got
  ok, answer = request(world["url"] + "/answer", {"question": world["questions"][0]})
  assert ok == 200 and answer["answers"], answer


def test_documents_need_the_token(world, tmp_path):
  doc = {"documents": [{"title": "T", "text": "the king was born in paris."}]}
  for token, status in ((None, 401), ("wrong", 401)):
    got_status, got = request(world["url"] + "/documents", doc, token=token)
    assert got_status == status and "token" in got["error"], got
  assert request(world["url"] + "/documents/abc", method="DELETE")[0] == 401
  bad = [({"documents": []}, 422), ({"documents": [{"title": "T"}]}, 422),
         ({"documents": [{"title": 1, "text": "x"}]}, 422)]
  for body, status in bad:
    assert request(world["url"] + "/documents", body, token=TOKEN)[0] == status
  # A server started without a token takes no updates at all (this app opens no service: the
  # module's is injected).
  plain_app = app_lib.create_app(None)
  plain_app.dependency_overrides[app_lib.get_service] = lambda: world["service"]
  with app_lib.BackgroundServer(plain_app) as plain:
    got_status, got = request(plain.url + "/documents", doc, token="anything")
    assert got_status == 403 and "disabled" in got["error"]
    assert request(plain.url + "/answer", {"question": "where?"})[0] == 200
  assert not world["service"]._stop.is_set()  # pylint: disable=protected-access
  assert publish.read_latest(world["index"]).endswith("step-1")  # Nothing was updated.


def test_update_errors_of_the_request_and_of_the_index(world, monkeypatch):
  """A document with no text is the request's fault (422); an index whose block tower cannot
  be restored is the server's state (409, its paths in the log only). Nothing is published."""
  url = world["url"]
  status, got = request(url + "/documents", {"documents": [{"title": "T", "text": " "}]},
                        token=TOKEN)
  assert status == 422 and "no text" in got["error"], got

  def other_tower(unused_self, path, unused_manifest):
    raise errors.IndexUpdateError(f"the index {path} was embedded with another block tower")

  monkeypatch.setattr(updates.Updater, "_tower", other_tower)
  doc = {"documents": [{"title": "T", "text": "the king was born in paris."}]}
  status, got = request(url + "/documents", doc, token=TOKEN)
  assert status == 409 and "cannot take" in got["error"], got
  assert world["index"] not in got["error"], got
  monkeypatch.undo()
  assert publish.read_latest(world["index"]).endswith("step-1")
  assert request(url + "/answer", {"question": "where?"})[0] == 200


def test_closing_drops_the_questions_that_timed_out(world, monkeypatch):
  """Questions queued behind a stuck batch time out (503); closing the service then drops
  them without raising and fails the one still waiting."""
  service = service_lib.QAService(world["model"], world["index"], max_batch=1,
                                  timeout_seconds=1.0)
  stuck = threading.Event()
  answer_batch = service._answer_batch  # pylint: disable=protected-access

  def stuck_batch(*args):
    stuck.wait(60)
    return answer_batch(*args)

  monkeypatch.setattr(service, "_answer_batch", stuck_batch)
  app = app_lib.create_app(None)
  app.dependency_overrides[app_lib.get_service] = lambda: service
  with app_lib.BackgroundServer(app) as server:
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
      statuses = list(pool.map(lambda q: request(server.url + "/answer", {"question": q})[0],
                               ["first", "second", "third"]))
  assert statuses == [503] * 3, statuses
  waiting = service.submit("fourth", 1)  # Queued; its request has not given up.
  threading.Timer(0.5, stuck.set).start()
  service.close()  # Before the fix: InvalidStateError on the first cancelled question.
  assert isinstance(waiting.exception(timeout=1), service_lib.Unavailable)
  assert service._queue.empty() and service._in_flight == 0  # pylint: disable=protected-access
  service.close()


def test_overload_gets_429_never_an_error(world, monkeypatch):
  """With the worker slowed down, more concurrent requests than max_in_flight: the excess get
  429 at once, the admitted ones their answer; then the server answers as before."""
  service = world["service"]
  slow = threading.Event()
  answer_batch = service._answer_batch  # pylint: disable=protected-access

  def slow_batch(*args):
    slow.wait(10)
    return answer_batch(*args)

  monkeypatch.setattr(service, "_answer_batch", slow_batch)
  with concurrent.futures.ThreadPoolExecutor(20) as pool:
    futures = [pool.submit(request, world["url"] + "/answer", {"question": "where?"})
               for _ in range(20)]
    deadline = time.time() + 60  # The refused ones return at once; the others wait.
    while sum(f.done() for f in futures) < 20 - service.max_in_flight:
      assert time.time() < deadline
      time.sleep(0.05)
    time.sleep(0.5)
    slow.set()
    statuses = [f.result()[0] for f in futures]
  assert statuses.count(200) == service.max_in_flight, statuses
  assert statuses.count(429) == 20 - service.max_in_flight, statuses
  monkeypatch.undo()
  assert request(world["url"] + "/answer", {"question": "where?"})[0] == 200


class Asker(threading.Thread):
  """Asks a question over and over; records every status and which index answered."""

  def __init__(self, url, question):
    super().__init__(daemon=True)
    self.url, self.question = url, question
    self.statuses, self.indexes = [], []
    self.stop = threading.Event()

  def run(self):
    while not self.stop.is_set():
      status, got = request(self.url + "/answer", {"question": self.question, "top_k": 5})
      self.statuses.append(status)
      if status == 200:
        self.indexes.append(got["index"])


def test_hot_swaps_updates_and_deletions(world):
  url, question = world["url"], world["questions"][1]
  asker = Asker(url, question)
  asker.start()
  # 1. Another process publishes (an update by realm-index upsert, here its library call):
  # picked up between requests.
  text = question.replace("?", ".") + " The answer is in this new document."
  other = updates.Updater(world["index"]).upsert([updates.Document("Elsewhere", text)])
  deadline = time.time() + 60
  while request(url + "/healthz")[1]["index"] != "step-1-u1":
    assert time.time() < deadline, "the server never swapped in step-1-u1"
    time.sleep(0.1)
  got = request(url + "/answer", {"question": question, "top_k": 5})[1]
  want = _reference(world, [question])[0]
  assert got["index"] == "step-1-u1"
  assert got["answers"][0]["answer"] == want.answer
  new_row = other.added[0]["row"]
  # 2. POST /documents: answerable as soon as it returns.
  status, result = request(url + "/documents", {"documents": [
      {"title": "Fresh", "text": "Fresh news about the museum and the bridge."}]}, token=TOKEN)
  assert status == 200, result
  assert result["index"].endswith("step-1-u2") and len(result["added"]) == 1
  got = request(url + "/answer", {"question": question, "top_k": 5})[1]
  assert got["index"] == "step-1-u2"
  assert got["answers"][0]["answer"] == _reference(world, [question])[0].answer
  # 3. DELETE: the block is never retrieved again, whatever the question.
  uid = other.added[0]["uid"]
  status, result = request(url + f"/documents/{uid}", method="DELETE", token=TOKEN)
  assert status == 200 and [d["uid"] for d in result["deleted"]] == [uid], result
  asked = [question, text] + world["questions"]
  for q in asked:
    got = request(url + "/answer", {"question": q, "top_k": 5})[1]
    assert got["index"] == "step-1-u3"
    assert uid not in [a["evidence"]["uid"] for a in got["answers"]]
  index = index_io.load_index(publish.read_latest(world["index"]))
  every = index.search(np.ones([1, index.dim], np.float32), index.num_live)[0]
  assert new_row not in every and index.num_live == index.num_blocks - 1
  status, again = request(url + f"/documents/{uid}", method="DELETE", token=TOKEN)
  assert status == 404 and "no live block" in again["error"], again
  asker.stop.set()
  asker.join()
  # No request failed while the indexes changed under it, and it saw them change.
  assert set(asker.statuses) == {200}, asker.statuses
  assert {"step-1", "step-1-u1"} <= set(asker.indexes), set(asker.indexes)


def test_the_page(world):
  """The page (the browser drives it in test_serve_browser.py, slow): a question box, a
  script that posts to /answer and puts each answer in a <mark> inside its evidence, as text."""
  with urllib.request.urlopen(world["url"] + "/") as r:
    assert r.status == 200 and r.headers["content-type"].startswith("text/html")
    page = r.read().decode()
  for needed in ('id="question"', 'id="ask"', 'fetch("/answer"', 'el("mark"',
                 "textContent", "Alternatives"):
    assert needed in page, needed
  assert "innerHTML" not in page  # Server texts never go in as HTML.


def test_realm_serve_reports_bad_flags_on_one_line(tmp_path):
  """A missing model directory, and one that holds no model (found by the service the app's
  lifespan opens): ``error: <message>`` on one line, status 2, no traceback."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  for model_dir, words in ((tmp_path / "nothing", "model directory not found"),
                           (tmp_path, str(tmp_path))):
    proc = subprocess.run([sys.executable, "-m", "realm_tf.binaries.serve",
                           f"--model_dir={model_dir}", f"--index_dir={tmp_path}", "--port=0"],
                          capture_output=True, text=True, timeout=300, cwd=repo,
                          env=dict(os.environ, PYTHONPATH=repo, TF_CPP_MIN_LOG_LEVEL="3"))
    lines = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert words in lines[0], lines


def test_realm_serve_refuses_extra_arguments(tmp_path):
  """A stray positional argument is a usage error on one line naming it, status 2 (it once hit
  the local ``app`` of ``main`` instead: UnboundLocalError)."""
  proc = helpers.run_cli("realm_tf.binaries.serve", f"--model_dir={tmp_path}",
                         f"--index_dir={tmp_path}", "stray")
  assert proc.returncode == 2 and proc.stderr == "error: unexpected arguments: stray\n", proc.stderr

def test_an_index_of_another_block_tower_is_never_swapped_in(world):
  """An index published with another block tower (``realm-refresh`` over another checkpoint)
  is refused, whatever its step: the served query tower was fine-tuned against the tower of the
  index the server started with. The server keeps answering with its current index; an index
  of the right tower published after it is swapped in."""
  current = publish.read_latest(world["index"])
  manifest = mips_index.read_manifest(current)
  index = index_io.load_index(current)
  step = int(manifest["model_step"]) + 100
  other = dict(manifest, block_tower=dict(manifest["block_tower"], fingerprint="0" * 40))
  with publish.lock(world["index"]):
    wrong = publish.publish(index, world["index"], step, other, keep=10)
  assert publish.read_latest(world["index"]) == wrong
  service = world["service"]
  # What the watcher does each poll, here once more (after any of its loads in flight).
  assert service._load_newer() is None  # pylint: disable=protected-access
  service._swap()  # pylint: disable=protected-access
  assert service._pending is None  # pylint: disable=protected-access
  question = world["questions"][0]
  status, got = request(world["url"] + "/answer", {"question": question, "top_k": 1})
  assert status == 200 and got["index"] == os.path.basename(current), got
  assert request(world["url"] + "/healthz")[1]["index"] == os.path.basename(current)
  with publish.lock(world["index"]):
    right = publish.publish(index, world["index"], step + 1, manifest, keep=10)
  deadline = time.time() + 60
  while request(world["url"] + "/healthz")[1]["index"] != os.path.basename(right):
    assert time.time() < deadline, "the index of the right tower was not swapped in"
    time.sleep(0.1)
  status, got = request(world["url"] + "/answer", {"question": question, "top_k": 1})
  assert status == 200 and got["index"] == os.path.basename(right)
  assert (got["index_step"], got["index_update"]) == (step + 1, 0)


def test_no_update_on_top_of_an_index_of_another_block_tower(world, tmp_path):
  """``LATEST`` names an index of another block tower (another model's, complete: an update
  could restore its tower): ``POST /documents`` answers 409 at once and says why, nothing is
  published, and the server keeps answering with its index."""
  served = request(world["url"] + "/healthz")[1]["index"]
  right = publish.read_latest(world["index"])
  assert os.path.basename(right) == served
  other_model, built = str(tmp_path / "other_model"), str(tmp_path / "other_index")
  testing.make_openqa_model(other_model, str(world["root"] / "vocab.txt"), seed=1)
  refresher.build_index_for_checkpoint(None, other_model, world["blocks"], built,
                                       refresher.BuildOptions(
                                           index_type="brute_force", recall_queries=0,
                                           progress=False, tensorboard_dir=""))
  other = publish.read_latest(built)
  with publish.lock(world["index"]):
    wrong = publish.publish(index_io.load_index(other), world["index"], 1000,
                            mips_index.read_manifest(other), keep=10)
  assert publish.read_latest(world["index"]) == wrong
  before = publish.publications(world["index"])
  start = time.time()
  status, got = request(world["url"] + "/documents", {"documents": [
      {"title": "Refused", "text": "A document for an index that is not served."}]},
                        token=TOKEN)
  assert status == 409 and "another block tower" in got["error"], got
  assert served in got["error"] and world["index"] not in got["error"], got
  assert time.time() - start < 20  # Not the service's timeout (30 s).
  assert publish.publications(world["index"]) == before
  assert request(world["url"] + "/healthz")[1]["index"] == served
  # An index of the served tower published again: updates go on.
  with publish.lock(world["index"]):
    again = publish.publish(index_io.load_index(right), world["index"], 1001,
                            mips_index.read_manifest(right), keep=10)
  deadline = time.time() + 60
  while request(world["url"] + "/healthz")[1]["index"] != os.path.basename(again):
    assert time.time() < deadline, "the index of the right tower was not swapped in"
    time.sleep(0.1)


@pytest.mark.parametrize("error", [errors.IndexNotReadyError("LATEST went away"),
                                   OSError("no space left on device")],
                         ids=["IndexNotReadyError", "OSError"])
def test_an_update_published_but_not_served_says_it_was_published(world, monkeypatch, error):
  """The update is published, then loading it fails: the client is told that it was
  published, as what, and not to send it again (503), not "no index is published yet" or an
  internal error; the server serves it once it can load it."""
  service = world["service"]

  def failing():
    raise error

  monkeypatch.setattr(service, "_load_newer", failing)
  status, got = request(world["url"] + "/documents", {"documents": [
      {"title": "Late " + ("disk" if isinstance(error, OSError) else "load"),
       "text": "Published while loading failed."}]},
                        token=TOKEN)
  latest = os.path.basename(publish.read_latest(world["index"]))
  assert status == 503, got
  assert f"the update was published as {latest}" in got["error"], got
  assert "do not send the update again" in got["error"], got
  monkeypatch.undo()
  deadline = time.time() + 60
  while request(world["url"] + "/healthz")[1]["index"] != latest:
    assert time.time() < deadline, "the published update was never served"
    time.sleep(0.1)
