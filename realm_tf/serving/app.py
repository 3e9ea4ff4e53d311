"""``realm-serve``'s HTTP API (FastAPI) over a :class:`~realm_tf.serving.service.QAService`.

======  ======================  =========================================================
method  path                    what
======  ======================  =========================================================
POST    ``/answer``             ``{"question": str, "top_k": int, "retriever": "dense" |
                                "bm25" | "hybrid"}`` -> the best ``top_k``
                                answers, each with its score, character offsets and
                                evidence block (id, uid, title, text, retrieval score);
                                the model and index steps; the time retrieving and reading
GET     ``/healthz``            the model and index being served, requests in flight
POST    ``/documents``          ``{"documents": [{"title", "text"}, ...]}``: add or replace
                                documents (``Authorization: Bearer <token>``)
DELETE  ``/documents/{uid}``    delete the block(s) with this uid (the token too)
GET     ``/``                   the page: a question box, the answer highlighted in its
                                evidence, the alternatives
GET     ``/openapi.json``       the OpenAPI description (``/docs`` renders it)
======  ======================  =========================================================

Every error is ``{"error": "<one line>"}`` JSON: 400 (a body that is not UTF-8 or not JSON),
401 (no token, or not ``Authorization: Bearer <token>``: checked before the body is read), 403
(updates disabled: no token was given at start-up), 404 (no such path; a uid with no live
block), 409 (the served index cannot take an update: another corpus or block tower; or
``LATEST`` names an index of another block tower than the served model's), 413 (a
body over ``max_body_bytes``, counted as it arrives: chunked bodies too), 422 (missing fields,
wrong types, an empty question or one over ``max_question_chars``, ``top_k`` out of range,
documents that cannot be indexed), 429 (more than ``max_in_flight`` requests, or an update
already running), 500 (an unexpected error, or an index or corpus the server cannot read: the
details, with the host's paths, go to the log only), 503 (a question that waited past the
timeout, no index yet, the service stopping; an update that was published but is not answering
yet, which says so). None of them stops the server.

The service is opened when the server starts and closed when it stops (the app's lifespan), held
in ``app.state.service`` and given to the routes by the :func:`get_service` dependency.
"""

import asyncio
import contextlib
import hmac
import importlib.resources
import threading
import time
from typing import Annotated, Callable, Dict, List, Literal, Optional

from absl import logging
import fastapi
from fastapi import exceptions as fastapi_exceptions
from fastapi import responses
from fastapi import routing
from fastapi import security
import pydantic
from starlette import datastructures
from starlette import exceptions as starlette_exceptions
import uvicorn

from realm_tf import errors as project_errors
from realm_tf.data import manifests
from realm_tf.retrieval import errors
from realm_tf.retrieval.publication import updates
from realm_tf.serving import service as service_lib

_STRICT = pydantic.ConfigDict(extra="forbid", strict=True)


class AnswerRequest(pydantic.BaseModel):
  model_config = _STRICT
  question: str = pydantic.Field(description="The question, in plain text.")
  # JSON Schema's integer includes 3.0 (a number with no fraction); strict pydantic does not.
  top_k: Annotated[int, pydantic.BeforeValidator(
      lambda v: int(v) if isinstance(v, float) and v.is_integer() else v)] = pydantic.Field(
          3, ge=1, description="How many answers: the best span of each "
                              "of the best top_k blocks read (at most the reader's beam).")
  retriever: Literal["dense", "bm25", "hybrid"] = pydantic.Field(
      "dense", description="The blocks read: the dense index's top, BM25's (the index's "
      "sparse part) or both fused by the index's rule (its manifest's sparse.fusion). GET "
      "/healthz lists those served.")


class Evidence(pydantic.BaseModel):
  block_id: int = pydantic.Field(description="The block's row in the corpus.")
  uid: str = pydantic.Field(description="The block's uid (SHA1 of title <sep> text).")
  title: str
  text: str
  rank: int = pydantic.Field(description="Its place among the blocks read, best retrieved 0.")
  retrieval_score: float = pydantic.Field(description="Its retriever score q . e(z).")
  dense_rank: int = pydantic.Field(description="Its place in the dense top list (from 0; "
                                   "-1: not there).")
  bm25_rank: int = pydantic.Field(description="Its place in BM25's top list (from 0; -1: not "
                                  "there, or BM25 not asked).")


class Answer(pydantic.BaseModel):
  answer: str
  score: float = pydantic.Field(description="The span's logit: span score + retriever score.")
  start: int = pydantic.Field(description="evidence.text[start:end] == answer.")
  end: int
  evidence: Evidence


class Timings(pydantic.BaseModel):
  retrieval_ms: float
  reading_ms: float
  queue_ms: float
  total_ms: float


class AnswerResponse(pydantic.BaseModel):
  question: str
  answers: List[Answer]
  model_step: int = pydantic.Field(description="Step of the Open-QA checkpoint answering.")
  index: str = pydantic.Field(description="The index directory answering (step-N[-uK]).")
  index_step: int = pydantic.Field(description="Model step of the index's block tower.")
  index_update: int = pydantic.Field(description="Updates made on top of that build.")
  corpus_fingerprint: Optional[str]
  timings: Timings


class DocumentIn(pydantic.BaseModel):
  model_config = _STRICT
  title: str
  text: str


class DocumentsRequest(pydantic.BaseModel):
  model_config = _STRICT
  documents: List[DocumentIn] = pydantic.Field(min_length=1, max_length=100)


class Error(pydantic.BaseModel):
  error: str


def _error(status: int, message: str, headers: Optional[Dict] = None) -> responses.JSONResponse:
  return responses.JSONResponse({"error": " ".join(str(message).split())}, status_code=status,
                                headers=headers)


_ERRORS = {code: {"model": Error}
           for code in (400, 401, 403, 404, 409, 413, 422, 429, 500, 503)}

_CONFLICT = ("the served index cannot take this update: it does not match its corpus or its block "
             "tower (the server's log says how); rebuild it with realm-index build")
_INTERNAL = "internal error: the server's log has the details"

# The service's and the index's errors, first match: (class, status, message). A message of
# None is the error's own (it is about the request); the others are about the server's state:
# the client gets a fixed line, the log the error (its paths are the host's).
_STATUSES = (
    (service_lib.Overloaded, 429, None),
    (service_lib.Unavailable, 503, None),
    (service_lib.NotFound, 404, None),
    (service_lib.InvalidUpdate, 422, None),
    (service_lib.Conflict, 409, None),
    (errors.IndexNotReadyError, 503, "no index is published yet: retry later"),
    (errors.FingerprintMismatchError, 409, _CONFLICT),
    (errors.IndexUpdateError, 409, _CONFLICT),
    (manifests.DataError, 500, "the index or the corpus on the server is unusable (the "
                               "server's log says why)"),
)


class _BodyTooLarge(starlette_exceptions.HTTPException, project_errors.RealmError):
  """Raised from ``receive`` once a body is over the limit (FastAPI passes HTTP exceptions
  on while it reads a body: the app's handler answers it)."""


class _WatchedSend:
  """An ASGI ``send`` that notes whether the response has started: after that, an error can
  no longer be answered with a response of its own."""

  def __init__(self, send):
    self.send, self.started = send, False

  async def __call__(self, event):
    self.started = self.started or event["type"] == "http.response.start"
    await self.send(event)


class _LimitBody:
  """Pure ASGI middleware: a request whose body is over ``max_bytes`` gets 413. A
  ``Content-Length`` over it is refused before the body is read; otherwise the bytes are
  counted as they arrive (a chunked body has no ``Content-Length``), so no more than
  ``max_bytes`` of a body, and the chunk that crosses the limit, are ever held."""

  def __init__(self, app, max_bytes: int):
    self.app, self.max_bytes = app, max_bytes

  async def __call__(self, scope, receive, send):
    if scope["type"] != "http":
      return await self.app(scope, receive, send)
    message = f"the body is over {self.max_bytes} bytes"
    length = datastructures.Headers(scope=scope).get("content-length")
    if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
      return await _error(413, message)(scope, receive, send)
    received, watched = 0, _WatchedSend(send)

    async def counted():
      nonlocal received
      event = await receive()
      if event["type"] == "http.request":
        received += len(event.get("body", b""))
        if received > self.max_bytes:
          raise _BodyTooLarge(413, message)
      return event

    try:
      await self.app(scope, counted, watched)
    except _BodyTooLarge:  # Read outside FastAPI's body parsing (which answers it itself).
      if watched.started:
        raise
      await _error(413, message)(scope, receive, send)


class _InternalErrors:
  """Pure ASGI middleware: an exception no handler took is a 500 ``{"error"}`` with a fixed
  message, and its traceback goes to the log (Starlette's answer is text/plain)."""

  def __init__(self, app):
    self.app = app

  async def __call__(self, scope, receive, send):
    if scope["type"] != "http":
      return await self.app(scope, receive, send)
    watched = _WatchedSend(send)
    try:
      await self.app(scope, receive, watched)
    except Exception:  # pylint: disable=broad-except
      logging.exception("realm-serve: %s %s failed", scope["method"], scope["path"])
      if watched.started:  # Too late for a response: the server closes the connection.
        raise
      await _error(500, _INTERNAL)(scope, receive, send)


def get_service(request: fastapi.Request) -> service_lib.QAService:
  """The service answering (``app.state.service``, opened by the app's lifespan): every route's
  dependency; tests override it (``app.dependency_overrides[get_service]``)."""
  service = getattr(request.app.state, "service", None)
  if service is None:
    raise service_lib.Unavailable("the service is not running")
  return service


def create_app(open_service: Optional[Callable[[], service_lib.QAService]],
               token: Optional[str] = None, max_question_chars: int = 1000,
               max_body_bytes: int = 1 << 20) -> fastapi.FastAPI:
  """The FastAPI app of ``realm-serve``.

  Args:
    open_service: makes the service (e.g. ``functools.partial(QAService, model_dir,
      index_dir)``); called on a worker thread when the server starts (FastAPI's lifespan), it
      is held in ``app.state.service`` and closed when the server stops. Should it raise, the
      server does not start and the error is ``app.state.startup_error``. None: the app opens
      no service (the routes' :func:`get_service` dependency is overridden).
    token: the bearer token of the ``/documents`` routes (None: updates disabled).
    max_question_chars: longer questions get 422.
    max_body_bytes: longer bodies get 413.
  """

  @contextlib.asynccontextmanager
  async def lifespan(app: fastapi.FastAPI):
    app.state.service, app.state.startup_error = None, None
    if open_service is not None:
      try:
        app.state.service = await asyncio.to_thread(open_service)
      except Exception as e:
        app.state.startup_error = e
        raise
    try:
      yield
    finally:
      if app.state.service is not None:
        await asyncio.to_thread(app.state.service.close)

  app = fastapi.FastAPI(
      title="realm-serve", version="1", lifespan=lifespan,
      description="Answers questions with a fine-tuned REALM/ORQA Open-QA model, with the "
                  "evidence; documents are added and deleted live.")
  app.add_middleware(_LimitBody, max_bytes=max_body_bytes)
  app.add_middleware(_InternalErrors)  # The outer one: it also sees _LimitBody's errors.

  @app.exception_handler(fastapi_exceptions.RequestValidationError)
  async def invalid(unused_request, exc):
    first = exc.errors()[0]
    if first["type"] == "json_invalid":
      return _error(400, f"the body is not valid JSON: "
                         f"{first.get('ctx', {}).get('error', first['msg'])}")
    where = ".".join(str(p) for p in first["loc"][1:]) or "body"
    return _error(422, f"{where}: {first['msg']}")

  @app.exception_handler(starlette_exceptions.HTTPException)
  async def http_error(unused_request, exc):
    message = exc.detail
    if exc.status_code == 400 and "parsing the body" in str(message):
      message = "the body could not be read as UTF-8 JSON"
    return _error(exc.status_code, message, headers=getattr(exc, "headers", None))

  async def service_error(request: fastapi.Request, exc: Exception):
    status, message = next((s, m) for cls, s, m in _STATUSES if isinstance(exc, cls))
    if message is not None:
      log = logging.error if status >= 500 else logging.warning
      log("realm-serve: %s %s: %d (%s: %s)", request.method, request.url.path, status,
          type(exc).__name__, exc)
    return _error(status, message or exc,
                  headers={"Retry-After": "1"} if status in (429, 503) else None)

  for cls in {c for c, _, _ in _STATUSES}:
    app.add_exception_handler(cls, service_error)

  bearer = security.HTTPBearer(auto_error=False, description="The token realm-serve was "
                               "started with (--token_file or $REALM_SERVE_TOKEN).")

  def check_token(credentials: Optional[security.HTTPAuthorizationCredentials]) -> None:
    if token is None:
      raise fastapi.HTTPException(403, "updates are disabled: start realm-serve with "
                                       "--token_file")
    if credentials is None or not hmac.compare_digest(credentials.credentials.encode(),
                                                      token.encode()):
      raise fastapi.HTTPException(401, "a valid token is needed: Authorization: Bearer <token>",
                                  headers={"WWW-Authenticate": "Bearer"})

  async def authorized(credentials=fastapi.Security(bearer)) -> None:
    """The ``/documents`` routes' dependency (it puts the scheme in the OpenAPI description)."""
    check_token(credentials)

  class AuthorizedFirst(routing.APIRoute):
    """A route that checks the token before FastAPI reads the body: without it, a request is
    refused whatever its body, and the body is never read."""

    def get_route_handler(self):
      handle = super().get_route_handler()

      async def checked(request: fastapi.Request):
        check_token(await bearer(request))
        return await handle(request)
      return checked

  @app.post("/answer", response_model=AnswerResponse, responses=_ERRORS)
  async def answer(body: AnswerRequest,
                   service: service_lib.QAService = fastapi.Depends(get_service)):
    """The best answers to a question, with their evidence."""
    question = body.question.strip()
    if not question:
      return _error(422, "question: it is empty")
    if len(body.question) > max_question_chars:
      return _error(422, f"question: {len(body.question)} characters, over the limit of "
                         f"{max_question_chars}")
    if body.top_k > service.reader_beam_size:
      return _error(422, f"top_k: at most {service.reader_beam_size} (the blocks read)")
    if not service.supports(body.retriever):
      return _error(422, f"retriever: {body.retriever!r} needs the index's BM25 part, and the "
                         "index served was published without one (IndexConfig.sparse)")
    # Admitted (or refused: Overloaded, Unavailable) here, on the event loop: no thread waits
    # for a slot.
    future = asyncio.wrap_future(service.submit(question, body.top_k, body.retriever))
    done, _ = await asyncio.wait([future], timeout=service.timeout_seconds)
    if not done:
      future.cancel()  # The service skips the question, or drops it when it closes.
      return _error(503, f"no answer within {service.timeout_seconds:.0f} s: the server is "
                         "busy; retry later", headers={"Retry-After": "1"})
    return future.result()  # A failed batch raises here: a 500.

  @app.get("/healthz", responses=_ERRORS)
  async def healthz(service: service_lib.QAService = fastapi.Depends(get_service)):
    """The model and index being served."""
    return service.health()

  documents = fastapi.APIRouter(route_class=AuthorizedFirst,
                                dependencies=[fastapi.Security(authorized)])

  @documents.post("/documents", response_model=updates.UpdateResult, responses=_ERRORS)
  async def add_documents(body: DocumentsRequest,
                          service: service_lib.QAService = fastapi.Depends(get_service)):
    """Adds documents, or replaces those with the same title; answerable when it returns."""
    return await asyncio.to_thread(service.upsert, [updates.Document(d.title, d.text)
                                                    for d in body.documents])

  @documents.delete("/documents/{uid}", response_model=updates.UpdateResult, responses=_ERRORS)
  async def delete_document(uid: str,
                            service: service_lib.QAService = fastapi.Depends(get_service)):
    """Deletes the block(s) with this uid; never retrieved again once it returns."""
    return await asyncio.to_thread(service.delete, [uid])

  app.include_router(documents)
  described = app.openapi

  def openapi() -> Dict:
    """The OpenAPI description, with the limits ``/answer`` checks itself (its messages are
    friendlier than the model's): a question with a non-blank character and at most
    ``max_question_chars``, and ``top_k`` at most the served reader's beam."""
    spec = described()  # FastAPI's, made once and cached.
    fields = spec["components"]["schemas"]["AnswerRequest"]["properties"]
    fields["question"].update(minLength=1, maxLength=max_question_chars, pattern=r"\S")
    service = getattr(app.state, "service", None)
    if service is not None:
      fields["top_k"]["maximum"] = service.reader_beam_size
    return spec

  app.openapi = openapi
  page = importlib.resources.files("realm_tf.serving").joinpath("page.html").read_text()

  @app.get("/", response_class=responses.HTMLResponse, include_in_schema=False)
  async def index_page():
    return page

  return app


class BackgroundServer:
  """Serves ``app`` with uvicorn on a thread of this process, on ``host`` (127.0.0.1) and a
  free port (for tests and benchmarks); the app's lifespan opens its service on entry (an error
  opening it is raised here) and closes it on exit::

      with BackgroundServer(create_app(lambda: QAService(model_dir, index_dir))) as server:
        urllib.request.urlopen(server.url + "/healthz")
  """

  def __init__(self, app: fastapi.FastAPI, host: str = "127.0.0.1", port: int = 0,
               start_seconds: float = 600.0):
    self._app, self._start_seconds = app, start_seconds
    self._server = uvicorn.Server(uvicorn.Config(app, host=host, port=port,
                                                 log_level="warning"))
    self._thread = threading.Thread(target=self._run, name="uvicorn", daemon=True)
    self.url = None

  def _run(self):
    try:
      self._server.run()
    except SystemExit:  # uvicorn's answer to a failed start-up (the error: startup_error).
      pass

  def __enter__(self) -> "BackgroundServer":
    self._thread.start()
    deadline = time.time() + self._start_seconds  # Opening the service loads a model.
    while not self._server.started:
      if not self._thread.is_alive() or time.time() > deadline:
        error = getattr(self._app.state, "startup_error", None)
        if error is not None:
          raise error
        self.__exit__()
        raise RuntimeError("the server did not start")
      time.sleep(0.02)
    host, port = self._server.servers[0].sockets[0].getsockname()[:2]
    self.url = f"http://{host}:{port}"
    return self

  def __exit__(self, *unused):
    self._server.should_exit = True
    self._thread.join(timeout=60)  # The lifespan closes the service (its threads: seconds).
