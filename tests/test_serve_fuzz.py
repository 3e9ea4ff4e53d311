"""realm-serve's whole API under generated input (slow tier): schemathesis reads the served
OpenAPI description and generates requests for every operation, valid and invalid, against a
live server on 127.0.0.1 (the random-init model of test_serve.py, its index with a BM25 part).

Every response must be a status the description documents for that operation, never a 5xx,
with a body valid against the described schema; afterwards the server still answers a question
as ``OpenQA`` does. The run is bounded: ``MAX_EXAMPLES`` generated requests per operation and
kind (schema-valid, schema-invalid), ``REQUEST_SECONDS`` per request, and once ``BUDGET_SECONDS`` are spent
the remaining examples are not sent. The number of requests sent is printed (``-rP``).
"""

import os
import time

from hypothesis import errors
from hypothesis import given
from hypothesis import HealthCheck
from hypothesis import settings
import pytest
import schemathesis
from schemathesis.specs.openapi import checks

from realm_tf import tokenization
from realm_tf.data import articles
from realm_tf.openqa import predict
from realm_tf.serving import app as app_lib
from realm_tf.serving import service as service_lib

from test_serve import request  # pylint: disable=g-bad-import-order
from test_serve import serve_dirs  # pylint: disable=g-bad-import-order
from test_serve import TOKEN  # pylint: disable=g-bad-import-order

pytestmark = pytest.mark.slow

MAX_EXAMPLES = 40
REQUEST_SECONDS = 60
BUDGET_SECONDS = 300


@pytest.fixture(scope="module")
def live(tmp_path_factory):
  dirs = serve_dirs(tmp_path_factory.mktemp("fuzz"))
  model, index = dirs["model"], dirs["index"]
  app = app_lib.create_app(
      lambda: service_lib.QAService(model, index, poll_seconds=0.1, max_in_flight=8),
      token=TOKEN, max_question_chars=200, max_body_bytes=4096)
  with app_lib.BackgroundServer(app) as server:
    yield dict(dirs, url=server.url, vocab=os.path.join(os.path.dirname(dirs["blocks"]),
                                                        "vocab.txt"))


def indexable(documents, tokenizer) -> bool:
  """Whether ``data_prep``'s block rules cut every document into at least one block, with the
  served corpus's vocabulary and block length (test_serve.serve_dirs: 32)."""
  try:
    return all(articles.articles_to_blocks([(d["title"], d["text"]) for d in documents],
                                           tokenizer, 32))
  except ValueError:
    return False


def test_every_operation_under_generated_requests_then_an_answer(live):
  """Each operation's generated requests, schema-valid and not (hypothesis strategies from
  schemathesis, ``as_strategy``), sent with the token (so that the update routes run their
  bodies), each checked by schemathesis' checks (a documented status, a body and headers valid
  against the schema, invalid data refused) and for a 5xx; then the server answers as usual."""
  api = schemathesis.openapi.from_url(live["url"] + "/openapi.json", timeout=REQUEST_SECONDS)
  operations = [result.ok() for result in api.get_all_operations()]
  assert {f"{o.method.upper()} {o.path}" for o in operations} == {
      "POST /answer", "GET /healthz", "POST /documents", "DELETE /documents/{uid}"}
  tokenizer = tokenization.RealmTokenizer(live["vocab"])
  sent = {"requests": 0, "statuses": {}, "skipped": 0}
  started = time.monotonic()
  for operation in operations:
    for mode in schemathesis.GenerationMode:

      @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))
      @given(case=operation.as_strategy(generation_mode=mode))
      def send(case):
        if time.monotonic() - started > BUDGET_SECONDS:
          sent["skipped"] += 1
          return
        upsert = (case.method, case.path) == ("POST", "/documents")
        headers = {"Authorization": f"Bearer {TOKEN}"}
        response = case.call(base_url=live["url"], headers=headers, timeout=REQUEST_SECONDS)
        excluded = []
        if response.status_code == 413:
          # A body over max_body_bytes, refused before it is read: a rejection whatever its
          # content (schemathesis' lists of rejections do not hold 413; no schema says size).
          excluded = [checks.positive_data_acceptance, checks.negative_data_rejection]
        elif upsert:
          excluded = [checks.positive_data_acceptance]  # Checked below, against the rules.
        case.validate_response(response, headers=headers, excluded_checks=excluded)
        if upsert and mode.is_positive and response.status_code != 413:
          # A schema-valid upsert is refused exactly when the block rules cannot cut one of
          # its documents (no text left once tokenized, a title with no room for a body):
          # what no schema can say.
          assert (response.status_code == 422) == (not indexable(case.body["documents"],
                                                                 tokenizer)), (
              case.body, response.status_code, response.text[:300])
        sent["requests"] += 1
        key = f"{case.method} {case.path} {response.status_code}"
        sent["statuses"][key] = sent["statuses"].get(key, 0) + 1
        assert response.status_code < 500, (case.method, case.path, response.text[:300])

      try:
        send()  # pylint: disable=no-value-for-parameter
      except errors.Unsatisfiable:  # No schema-invalid request exists: no input to violate.
        assert (operation.method, operation.path, mode) == (
            "get", "/healthz", schemathesis.GenerationMode.NEGATIVE)

  # Afterwards (it added and deleted documents through the routes), a question gets a 200
  # with the answer OpenQA gives over the index served now.
  print(f"schemathesis: {sent['requests']} requests sent, {sent['skipped']} generated past "
        f"the {BUDGET_SECONDS} s budget and not sent; by operation and status: "
        f"{dict(sorted(sent['statuses'].items()))}")
  assert sent["requests"] >= 20
  question = live["questions"][0]
  status, got = request(live["url"] + "/answer", {"question": question, "top_k": 2})
  assert status == 200, got
  want = predict.OpenQA.load(live["model"], live["index"]).answer([question])[0]
  best = got["answers"][0]
  assert (best["answer"], best["evidence"]["block_id"]) == (
      want.answer, want.evidence[want.block_rank].block_id)
  status, health = request(live["url"] + "/healthz")
  assert status == 200 and health["status"] == "ok"
