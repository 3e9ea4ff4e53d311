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

from realm_tf.binaries import cli
from realm_tf.binaries import openqa_flags
from realm_tf.openqa.report import format_answer

openqa_flags.define_model_flags()
openqa_flags.define_retrieval_flags(
    None, "Blocks retrieved per question, the read ones the best of them (default: "
    "--reader_beam_size; capped at the corpus size).")
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
  qa = openqa_flags.load_openqa(FLAGS.flag_values_dict())
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
