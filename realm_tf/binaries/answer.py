r"""realm-answer: answer questions with a fine-tuned Open-QA model, showing the evidence read.

    realm-answer --model_dir=runs/openqa_nq --index_dir=runs/index \
        "who wrote hamlet?" "when was the eiffel tower built?"

    # One JSON object per question (realm_tf.openqa.predict.Answer.to_json()):
    realm-answer --model_dir=... --index_dir=... --json "who wrote hamlet?"

For each question: the answer and its score, then the blocks read (best retrieved first) with
their retrieval scores, titles and the retrievers that found them (``--retriever=dense|bm25|
hybrid``); in the block the answer was cut from, the snippet shows it
bracketed, ``... [[answer]] ...``.
"""

import json

from absl import app
from absl import flags
import tensorflow as tf

from realm_tf import model_dir as model_dir_lib
from realm_tf.binaries import cli
from realm_tf.openqa import predict
from realm_tf.openqa.report import format_answer
from realm_tf.retrieval import hybrid

flags.DEFINE_string("model_dir", None, "A fine-tuned Open-QA model directory (span scorer).")
flags.DEFINE_string("index_dir", None, "The index the model was fine-tuned against.")
flags.DEFINE_string("blocks_dir", None, "The index's corpus (default: the one it names).")
flags.DEFINE_string("checkpoint", None,
                    "A checkpoint (default: <model_dir>/best_ckpt's, else the newest).")
flags.DEFINE_integer("reader_beam_size", 5, "Blocks read per question.", lower_bound=1)
flags.DEFINE_integer("retriever_beam_size", None,
                     "Blocks retrieved per question, the read ones the best of them (default: "
                     "--reader_beam_size; capped at the corpus size).", lower_bound=1)
flags.DEFINE_enum("retriever", hybrid.DEFAULT, hybrid.RETRIEVERS,
                  "The blocks read: the dense index's top, BM25's (the index's sparse part) "
                  "or both fused by the index's rule (realm_tf/retrieval/hybrid.py).")
flags.DEFINE_bool("json", False, "Print one JSON object per question instead of text.")
flags.DEFINE_integer("snippet_chars", 160, "Characters of block text shown per block.",
                     lower_bound=20)

FLAGS = flags.FLAGS


def main(argv):
  questions = argv[1:]
  if not questions:
    raise app.UsageError('usage: realm-answer --model_dir=... --index_dir=... "question" ...')
  for i, q in enumerate(questions, 1):
    if not q.strip():
      raise app.UsageError(f"question {i} is empty")
  missing = [f"--{n}" for n in ("model_dir", "index_dir") if not getattr(FLAGS, n)]
  if missing:
    raise app.UsageError(f"missing flags: {', '.join(missing)}")
  if not tf.io.gfile.isdir(FLAGS.model_dir):
    raise model_dir_lib.ModelDirError(f"model directory not found: {FLAGS.model_dir}")
  qa = predict.OpenQA.load(FLAGS.model_dir, FLAGS.index_dir, FLAGS.blocks_dir,
                           checkpoint=FLAGS.checkpoint, reader_beam_size=FLAGS.reader_beam_size,
                           retriever_beam_size=FLAGS.retriever_beam_size,
                           retriever=FLAGS.retriever)
  answers = qa.answer(questions)
  if FLAGS.json:
    for a in answers:
      print(json.dumps(a.to_json(), ensure_ascii=False))
    return
  print("\n\n".join(format_answer(a, FLAGS.snippet_chars) for a in answers))


def run():
  cli.run_main(main)


if __name__ == "__main__":
  run()
