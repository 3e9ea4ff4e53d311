r"""realm-serve: answer questions over HTTP with a fine-tuned Open-QA model and its index.

    echo "$(openssl rand -hex 16)" > token.txt
    realm-serve --model_dir=demo_out/openqa_orqa --index_dir=demo_out/openqa_index_ict \
        --port=8000 --token_file=token.txt
    # http://127.0.0.1:8000/ : the page; /docs: the API
    curl -s localhost:8000/answer -H 'Content-Type: application/json' \
        -d '{"question": "Where was Nyny Ostgorbel born?", "top_k": 3}'
    curl -s localhost:8000/documents -H "Authorization: Bearer $(cat token.txt)" \
        -H 'Content-Type: application/json' \
        -d '{"documents": [{"title": "Nyny Ostgorbel", "text": "Nyny Ostgorbel was born in ..."}]}'

Newer indexes published in ``--index_dir`` (by ``realm-refresh`` or ``realm-index
upsert|delete``) are picked up between requests. ``POST /documents`` and ``DELETE
/documents/{uid}`` need the token of ``--token_file`` (or ``$REALM_SERVE_TOKEN``); without
one they are disabled. Listens on 127.0.0.1 unless ``--host`` says otherwise.

The service (the model, the index) is opened when the server starts and closed when it stops
(the app's lifespan); an error opening it is reported as ``error: <message>``, status 2.
"""

import logging
import os

from absl import app
from absl import flags
import uvicorn

from realm_tf import configs
from realm_tf import errors
from realm_tf.binaries import cli
from realm_tf.binaries import openqa_flags
from realm_tf.serving import app as app_lib
from realm_tf.serving import service as service_lib

openqa_flags.define_model_flags("Blocks read per question (the most answers a request gets).")
flags.DEFINE_string("host", "127.0.0.1", "Address to listen on.")
flags.DEFINE_integer("port", 8000, "Port to listen on.", lower_bound=0)
flags.DEFINE_string("token_file", None, "A file holding the token of the /documents "
                    "endpoints (default: $REALM_SERVE_TOKEN; neither: updates disabled).")
flags.DEFINE_integer("max_batch", 8, "Questions answered together.", lower_bound=1)
flags.DEFINE_integer("max_in_flight", 16, "Requests admitted at once; more get 429.",
                     lower_bound=1)
flags.DEFINE_float("timeout_seconds", 30.0, "Longest a question waits; then 503.")
flags.DEFINE_integer("max_question_chars", 1000, "Longer questions get 422.", lower_bound=1)
flags.DEFINE_integer("max_body_bytes", 1 << 20, "Longer request bodies get 413 (counted as they "
                     "arrive: chunked ones too).", lower_bound=1)
flags.DEFINE_float("poll_seconds", 1.0, "How often to look for a newer index.")
flags.DEFINE_integer("keep", 3, "Indexes kept in --index_dir by updates.", lower_bound=1)
flags.mark_flags_as_required(["model_dir", "index_dir"])

FLAGS = flags.FLAGS


def _token(token_file: str):
  if token_file:
    with open(token_file) as f:
      token = f.read().strip()
    if not token:
      raise configs.ConfigError(f"--token_file {token_file} is empty")
    return token
  return os.environ.get("REALM_SERVE_TOKEN") or None


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  token = _token(FLAGS.token_file)
  openqa_flags.check_model_dir(FLAGS.flag_values_dict())

  def open_service():
    service = service_lib.QAService(
        FLAGS.model_dir, FLAGS.index_dir, checkpoint=FLAGS.checkpoint,
        reader_beam_size=FLAGS.reader_beam_size, max_batch=FLAGS.max_batch,
        max_in_flight=FLAGS.max_in_flight, timeout_seconds=FLAGS.timeout_seconds,
        poll_seconds=FLAGS.poll_seconds, keep=FLAGS.keep)
    health = service.health()
    print(f"[realm-serve] model step {health['model_step']}, index {health['index']} "
          f"({health['num_blocks']} blocks); updates {'on' if token else 'off (no token)'}; "
          f"serving on http://{FLAGS.host}:{FLAGS.port}/", flush=True)
    return service

  web_app = app_lib.create_app(open_service, token=token,
                               max_question_chars=FLAGS.max_question_chars,
                               max_body_bytes=FLAGS.max_body_bytes)
  # An expected error opening the service is reported on one line below, not as uvicorn's
  # start-up traceback.
  logging.getLogger("uvicorn.error").addFilter(
      lambda record: not isinstance(getattr(web_app.state, "startup_error", None),
                                    errors.RealmError))
  server = uvicorn.Server(uvicorn.Config(web_app, host=FLAGS.host, port=FLAGS.port,
                                         log_level="warning"))
  try:
    server.run()
  except SystemExit:  # uvicorn's exit when the start-up failed.
    if getattr(web_app.state, "startup_error", None) is not None:
      raise web_app.state.startup_error from None
    raise


def run():
  cli.run_main(main)


if __name__ == "__main__":
  run()
