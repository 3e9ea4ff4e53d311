"""``realm-serve``'s HTTP API (FastAPI) over a :class:`~realm_tf.serving.service.QAService`.

======  ======================  =========================================================
method  path                    what
======  ======================  =========================================================
POST    ``/answer``             ``{"question": str, "top_k": int}`` -> the best ``top_k``
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

Every error is ``{"error": "<one line>"}``: 400 (a body that is not UTF-8 or not JSON), 401
(no or a wrong token), 403 (updates disabled: no token was given at start-up), 404, 413 (a
body over ``max_body_bytes``), 422 (missing fields, wrong types, an empty question or one over
``max_question_chars``, ``top_k`` out of range, an update that names nothing), 429 (more than
``max_in_flight`` requests, or an update already running), 503 (a question that waited past the
timeout). None of them stops the server.
"""

import asyncio
import hmac
import importlib.resources
import threading
import time
from typing import Dict, List, Optional

import fastapi
from fastapi import exceptions as fastapi_exceptions
from fastapi import responses
import pydantic
from starlette import exceptions as starlette_exceptions

from realm_tf.data import manifests
from realm_tf.retrieval import errors
from realm_tf.retrieval import updates
from realm_tf.serving import service as service_lib

_STRICT = pydantic.ConfigDict(extra="forbid", strict=True)


class AnswerRequest(pydantic.BaseModel):
  model_config = _STRICT
  question: str = pydantic.Field(description="The question, in plain text.")
  top_k: int = pydantic.Field(3, ge=1, description="How many answers: the best span of each "
                              "of the best top_k blocks read (at most the reader's beam).")


class Evidence(pydantic.BaseModel):
  block_id: int = pydantic.Field(description="The block's row in the corpus.")
  uid: str = pydantic.Field(description="The block's uid (SHA1 of title <sep> text).")
  title: str
  text: str
  rank: int = pydantic.Field(description="Its place among the blocks read, best retrieved 0.")
  retrieval_score: float = pydantic.Field(description="Its retriever score q . e(z).")


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


class UpdateResponse(pydantic.BaseModel):
  index: str
  corpus_fingerprint: str
  added: List[Dict]
  deleted: List[Dict]
  skipped: List[str]
  maintenance: Optional[str]
  seconds: Dict[str, float]


class Error(pydantic.BaseModel):
  error: str


def _error(status: int, message: str, headers: Optional[Dict] = None) -> responses.JSONResponse:
  return responses.JSONResponse({"error": " ".join(str(message).split())}, status_code=status,
                                headers=headers)


_ERRORS = {code: {"model": Error} for code in (400, 401, 403, 413, 422, 429, 503)}


def create_app(service: service_lib.QAService, token: Optional[str] = None,
               max_question_chars: int = 1000, max_body_bytes: int = 1 << 20) -> fastapi.FastAPI:
  """The FastAPI app over ``service``. ``token``: the bearer token of the ``/documents``
  endpoints (None: updates disabled)."""
  app = fastapi.FastAPI(
      title="realm-serve", version="1",
      description="Answers questions with a fine-tuned REALM/ORQA Open-QA model, with the "
                  "evidence; documents are added and deleted live.")

  @app.middleware("http")
  async def limit_body(request: fastapi.Request, call_next):
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > max_body_bytes):
      return _error(413, f"the body is over {max_body_bytes} bytes")
    return await call_next(request)

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
    return _error(exc.status_code, message)

  async def update(fn, *args):
    """An update on a worker thread; the service's errors as HTTP errors."""
    try:
      return await asyncio.to_thread(fn, *args)
    except service_lib.Overloaded as e:
      return _error(429, e, headers={"Retry-After": "1"})
    except service_lib.Unavailable as e:
      return _error(503, e, headers={"Retry-After": "1"})
    except (errors.IndexUpdateError, manifests.DataError) as e:
      return _error(422, e)

  def authorized(authorization: Optional[str]) -> Optional[responses.JSONResponse]:
    if token is None:
      return _error(403, "updates are disabled: start realm-serve with --token_file")
    given = (authorization or "").removeprefix("Bearer ").strip()
    if not given or not hmac.compare_digest(given.encode(), token.encode()):
      return _error(401, "a valid token is needed: Authorization: Bearer <token>")
    return None

  @app.post("/answer", response_model=AnswerResponse, responses=_ERRORS)
  async def answer(body: AnswerRequest):
    """The best answers to a question, with their evidence."""
    question = body.question.strip()
    if not question:
      return _error(422, "question: it is empty")
    if len(question) > max_question_chars:
      return _error(422, f"question: {len(question)} characters, over the limit of "
                         f"{max_question_chars}")
    if body.top_k > service.reader_beam_size:
      return _error(422, f"top_k: at most {service.reader_beam_size} (the blocks read)")
    try:  # Admitted (or refused) here, on the event loop: no thread waits for a slot.
      future = service.submit(question, body.top_k)
    except service_lib.Overloaded as e:
      return _error(429, e, headers={"Retry-After": "1"})
    except service_lib.Unavailable as e:
      return _error(503, e, headers={"Retry-After": "1"})
    try:
      return await asyncio.wait_for(asyncio.wrap_future(future), service.timeout_seconds)
    except asyncio.TimeoutError:
      return _error(503, f"no answer within {service.timeout_seconds:.0f} s: the server is "
                         "busy; retry later", headers={"Retry-After": "1"})

  @app.get("/healthz")
  async def healthz():
    """The model and index being served."""
    return service.health()

  @app.post("/documents", response_model=UpdateResponse, responses=_ERRORS)
  async def add_documents(body: DocumentsRequest,
                          authorization: Optional[str] = fastapi.Header(None)):
    """Adds documents, or replaces those with the same title; answerable when it returns."""
    refused = authorized(authorization)
    if refused is not None:
      return refused
    return await update(service.upsert, [updates.Document(d.title, d.text)
                                         for d in body.documents])

  @app.delete("/documents/{uid}", response_model=UpdateResponse, responses=_ERRORS)
  async def delete_document(uid: str, authorization: Optional[str] = fastapi.Header(None)):
    """Deletes the block(s) with this uid; never retrieved again once it returns."""
    refused = authorized(authorization)
    if refused is not None:
      return refused
    return await update(service.delete, [uid])

  page = importlib.resources.files("realm_tf.serving").joinpath("page.html").read_text()

  @app.get("/", response_class=responses.HTMLResponse, include_in_schema=False)
  async def index_page():
    return page

  return app


class BackgroundServer:
  """Serves ``app`` with uvicorn on a thread of this process, on ``host`` (127.0.0.1) and a
  free port (for tests and benchmarks)::

      with BackgroundServer(create_app(service)) as server:
        urllib.request.urlopen(server.url + "/healthz")
  """

  def __init__(self, app: fastapi.FastAPI, host: str = "127.0.0.1", port: int = 0):
    import uvicorn  # pylint: disable=g-import-not-at-top
    self._server = uvicorn.Server(uvicorn.Config(app, host=host, port=port,
                                                 log_level="warning"))
    self._thread = threading.Thread(target=self._server.run, name="uvicorn", daemon=True)
    self.url = None

  def __enter__(self) -> "BackgroundServer":
    self._thread.start()
    deadline = time.time() + 60
    while not self._server.started:
      if not self._thread.is_alive() or time.time() > deadline:
        raise RuntimeError("the server did not start")
      time.sleep(0.02)
    host, port = self._server.servers[0].sockets[0].getsockname()[:2]
    self.url = f"http://{host}:{port}"
    return self

  def __exit__(self, *unused):
    self._server.should_exit = True
    self._thread.join(timeout=10)
