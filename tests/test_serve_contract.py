"""realm-serve's HTTP contract over stand-in services (no model: the module takes seconds):
bodies bounded as they arrive, chunked ones too; every error ``{"error"}`` JSON with its status
(an unexpected exception 500 with a log line, the index's state 409 or 500, an unknown uid
404); the token checked before the body is read; the service opened and closed by the app's
lifespan and injected with ``Depends``. The real service's side is tests/test_serve.py's."""

import asyncio
import concurrent.futures
import http.client
import json
import logging
import socket

import pytest

from realm_tf.retrieval import errors
from realm_tf.serving import app as app_lib
from realm_tf.serving import service as service_lib

TOKEN = "s3cret-token"
LIMIT = 4096
SECRET_PATH = "/srv/realm/secret-host-path/index"
ANSWER = {"answers": [], "model_step": 1, "index_step": 1, "index_update": 0,
          "corpus_fingerprint": None,
          "timings": {"retrieval_ms": 1.0, "reading_ms": 1.0, "queue_ms": 0.0, "total_ms": 2.0}}
UPDATED = {"corpus_fingerprint": "f", "added": [], "deleted": [], "skipped": [],
           "maintenance": None, "seconds": {}}


class FakeService:
  """What the app uses of a ``QAService``: answers at once, or raises ``error()`` (a new
  exception each time) from the answer and the updates."""
  reader_beam_size = 5
  timeout_seconds = 5.0

  def __init__(self, name="fake"):
    self.name, self.error, self.closed, self.updates = name, None, False, []

  def supports(self, retriever):
    del retriever
    return True

  def submit(self, question, top_k, retriever="dense"):
    del top_k, retriever
    future = concurrent.futures.Future()
    if self.error is not None:
      future.set_exception(self.error())
    else:
      future.set_result(dict(ANSWER, question=question, index=self.name))
    return future

  def health(self):
    return {"status": "ok", "index": self.name}

  def _update(self, what):
    if self.error is not None:
      raise self.error()
    self.updates.append(what)
    return dict(UPDATED, index=self.name)

  def upsert(self, documents):
    return self._update(documents)

  def delete(self, uids=(), titles=()):
    return self._update((uids, titles))

  def close(self):
    self.closed = True


def request(url, path, body=None, method=None, headers=None):
  """``(status, headers, parsed JSON or text)`` of one request on a connection of its own."""
  host, port = url.removeprefix("http://").split(":")
  conn = http.client.HTTPConnection(host, int(port), timeout=30)
  data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
  conn.request(method or ("GET" if data is None else "POST"), path, body=data,
               headers=dict({"Content-Type": "application/json"}, **(headers or {})))
  response = conn.getresponse()
  text = response.read().decode()
  conn.close()
  try:
    return response.status, response.headers, json.loads(text)
  except ValueError:
    return response.status, response.headers, text


@pytest.fixture(name="server")
def fixture_server():
  fake = FakeService()
  app = app_lib.create_app(lambda: fake, token=TOKEN, max_body_bytes=LIMIT)
  with app_lib.BackgroundServer(app) as server:
    yield server, fake


def _chunked(url, path, total, chunk=1024, headers=""):
  """Sends ``POST path`` with a chunked body of ``total`` bytes (a JSON question, when it is
  read whole) on a raw socket; the response's status line and body."""
  host, port = url.removeprefix("http://").split(":")
  body = (b'{"question": "' + b"x" * (total - 17) + b'"}')[:total]
  with socket.create_connection((host, int(port)), timeout=30) as s:
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
              f"{headers}Transfer-Encoding: chunked\r\n\r\n".encode())
    try:
      for i in range(0, len(body), chunk):
        piece = body[i:i + chunk]
        s.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
      s.sendall(b"0\r\n\r\n")
    except OSError:  # The server may stop reading once it has answered.
      pass
    response = b""
    while b"\r\n\r\n" not in response or not response.endswith(b"}"):
      data = s.recv(65536)
      if not data:
        break
      response += data
  head, _, text = response.partition(b"\r\n\r\n")
  return head.split(b"\r\n")[0].decode(), json.loads(text.decode().split("\r\n")[-1])


def test_a_chunked_body_over_the_limit_gets_413_and_the_server_keeps_answering(server):
  server, fake = server
  status, got = _chunked(server.url, "/answer", 16 * LIMIT)
  assert " 413 " in status, (status, got)
  assert set(got) == {"error"} and str(LIMIT) in got["error"], got
  status, _, got = request(server.url, "/answer", {"question": "where?"})
  assert status == 200 and got["index"] == "fake", got
  status, _, got = request(server.url, "/answer", b'{"question": "' + b"x" * LIMIT + b'"}')
  assert status == 413 and set(got) == {"error"}, got  # With a Content-Length: refused unread.
  assert not fake.updates


def _call(app, path, total, chunk=1024, headers=()):
  """Runs ``POST path`` through ``app`` as ASGI with a chunked body of ``total`` bytes: (the
  status, the bytes the app took from ``receive``)."""
  taken, sent = [0], []
  scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
           "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
           "root_path": "", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
           "headers": [(b"content-type", b"application/json"),
                       (b"transfer-encoding", b"chunked")] + list(headers)}

  async def receive():
    if taken[0] >= total:
      return {"type": "http.disconnect"}
    taken[0] += chunk
    return {"type": "http.request", "body": b"x" * chunk, "more_body": taken[0] < total}

  async def send(message):
    sent.append(message)

  asyncio.run(app(scope, receive, send))
  return sent[0]["status"], taken[0]


def test_the_body_is_never_read_past_the_limit():
  """Through the app as ASGI: a body of 100 times the limit is read up to the chunk that
  crosses the limit, then 413; a /documents request without the token is refused before any
  of its body is read."""
  app = app_lib.create_app(None, token=TOKEN, max_body_bytes=LIMIT)
  app.dependency_overrides[app_lib.get_service] = FakeService
  status, taken = _call(app, "/answer", 100 * LIMIT)
  assert status == 413 and taken <= LIMIT + 1024, (status, taken)
  status, taken = _call(app, "/documents", 100 * LIMIT)
  assert status == 401 and taken == 0, (status, taken)
  status, taken = _call(app, "/documents", 100 * LIMIT,
                        headers=[(b"authorization", f"Bearer {TOKEN}".encode())])
  assert status == 413 and taken <= LIMIT + 1024, (status, taken)


ERRORS = [  # (the error the service raises, its arguments, status, words of the message)
    (RuntimeError, (f"a batch failed in {SECRET_PATH}",), 500, "internal error"),
    (OSError, (28, "No space left on device", SECRET_PATH), 500, "internal error"),
    (errors.FingerprintMismatchError, (f"the index {SECRET_PATH} is over another corpus",),
     409, "cannot take"),
    (errors.IndexUpdateError, (f"the index {SECRET_PATH} has another block tower",), 409,
     "cannot take"),
    (errors.IndexFormatError, (f"{SECRET_PATH}: not an index",), 500, "unusable"),
    (errors.IndexNotReadyError, (f"no index in {SECRET_PATH}",), 503, "no index"),
    (service_lib.Overloaded, ("another update is in progress",), 429, "in progress"),
    (service_lib.Unavailable, ("the service is stopping",), 503, "stopping"),
]


@pytest.mark.parametrize("error,args,status,words", ERRORS, ids=[e[0].__name__ for e in ERRORS])
def test_every_error_is_json_with_its_status(server, caplog, error, args, status, words):
  """The same error from an answer and from an update: its status, ``{"error"}`` JSON, no path
  of the host in it; a 5xx leaves a log line. The server answers afterwards."""
  server, fake = server
  fake.error = lambda: error(*args)
  auth = {"Authorization": f"Bearer {TOKEN}"}
  doc = {"documents": [{"title": "T", "text": "some text"}]}
  with caplog.at_level(logging.INFO):
    for path, body, method in (("/answer", {"question": "where?"}, None),
                               ("/documents", doc, None),
                               ("/documents/abc", None, "DELETE")):
      if path == "/answer" and issubclass(error, errors.RetrievalError):
        continue  # The index's errors come from the updates.
      got_status, headers, got = request(server.url, path, doc if body is doc else body,
                                         method, auth)
      assert got_status == status, (path, got)
      assert headers["content-type"] == "application/json", (path, headers)
      assert set(got) == {"error"} and words in got["error"], (path, got)
      assert SECRET_PATH not in got["error"] and "/srv" not in got["error"], got
  if status >= 500 and status != 503:
    assert SECRET_PATH in caplog.text, caplog.text  # The log says what happened.
  fake.error = None
  assert request(server.url, "/answer", {"question": "where?"})[0] == 200


def test_the_request_errors_of_an_update(server):
  server, fake = server
  auth = {"Authorization": f"Bearer {TOKEN}"}
  fake.error = lambda: service_lib.NotFound("no live block of the corpus has the uid abc")
  status, _, got = request(server.url, "/documents/abc", method="DELETE", headers=auth)
  assert status == 404 and "no live block" in got["error"], got
  fake.error = lambda: service_lib.InvalidUpdate("document 'T' has no text to index")
  status, _, got = request(server.url, "/documents", {"documents": [{"title": "T", "text": ""}]},
                           headers=auth)
  assert status == 422 and "no text" in got["error"], got
  for path, method in (("/nowhere", None), ("/healthz", "DELETE")):
    status, headers, got = request(server.url, path, method=method)
    assert status in (404, 405) and set(got) == {"error"}, (path, got)


def test_only_bearer_and_the_token_and_before_the_body(server):
  server, fake = server
  doc = {"documents": [{"title": "T", "text": "some text"}]}
  for header in (None, TOKEN, f"Basic {TOKEN}", "Bearer wrong", f"Bearer {TOKEN}x", "Bearer "):
    headers = {} if header is None else {"Authorization": header}
    status, got_headers, got = request(server.url, "/documents", doc, headers=headers)
    assert status == 401 and "token" in got["error"], (header, got)
    assert got_headers["www-authenticate"] == "Bearer", got_headers
  # Authorization before the body: a body that is not JSON, or not a valid update, gets 401.
  for body in (b'{"documents": [', b'{"documents": []}', b"\xff"):
    status, _, got = request(server.url, "/documents", body)
    assert status == 401, (body, got)
  assert not fake.updates
  status, _, got = request(server.url, "/documents", doc,
                           headers={"Authorization": f"Bearer {TOKEN}"})
  assert status == 200 and len(fake.updates) == 1, got
  spec = request(server.url, "/openapi.json")[2]
  assert spec["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
  for path, method in (("/documents", "post"), ("/documents/{uid}", "delete")):
    assert spec["paths"][path][method]["security"] == [{"HTTPBearer": []}], path
  assert "security" not in spec["paths"]["/answer"]["post"]


def test_the_lifespan_opens_and_closes_the_service_and_depends_injects_it():
  opened = []

  def open_service():
    opened.append(FakeService("opened"))
    return opened[-1]

  app = app_lib.create_app(open_service, token=TOKEN)
  assert not opened  # Not before the server starts.
  with app_lib.BackgroundServer(app) as server:
    assert len(opened) == 1 and app.state.service is opened[0] and not opened[0].closed
    assert request(server.url, "/healthz")[2]["index"] == "opened"
    assert request(server.url, "/answer", {"question": "q"})[2]["index"] == "opened"
    app.dependency_overrides[app_lib.get_service] = lambda: FakeService("override")
    assert request(server.url, "/healthz")[2]["index"] == "override"
    assert request(server.url, "/answer", {"question": "q"})[2]["index"] == "override"
    app.dependency_overrides.clear()
  assert opened[0].closed and len(opened) == 1


def test_a_service_that_cannot_open_stops_the_start_with_its_error():
  def open_service():
    raise errors.IndexNotReadyError("no index in idx (no LATEST)")

  with pytest.raises(errors.IndexNotReadyError, match="no LATEST"):
    with app_lib.BackgroundServer(app_lib.create_app(open_service)):
      pass
