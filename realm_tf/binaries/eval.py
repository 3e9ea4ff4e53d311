r"""realm-eval: answer a QA test set with a fine-tuned Open-QA model, or score predictions.

    # Answer NaturalQuestions-Open's test questions; writes <output_dir>/predictions.jsonl
    # (ORQA's {"question", "prediction"}), predictions_with_evidence.jsonl and metrics.json.
    realm-eval --model_dir=runs/openqa_nq --index_dir=runs/index --dataset=nq --qa_dir=data/qa

    # Any QA file (ours or NQ-open/DrQA's JSON lines):
    realm-eval --model_dir=... --index_dir=... --dataset=data/qa/nq-dev.jsonl

    # Score a predictions file against the references (ORQA's evaluate_predictions; no model):
    realm-eval --predictions_file=predictions.jsonl --dataset=nq --qa_dir=data/qa

``exact_match`` is ORQA's official exact match of the predicted text; the other metrics are
described in ``realm_tf/openqa/evaluation.py``. The output directory defaults to
``<model_dir>/eval_<dataset>_<split>`` for a named dataset and ``<model_dir>/eval_<file name>``
for a file.
"""

import os

from absl import app
from absl import flags

from realm_tf.binaries import cli
from realm_tf.binaries import openqa_flags
from realm_tf.data import qa as qa_lib
from realm_tf.openqa import evaluation

openqa_flags.define_model_flags()
openqa_flags.define_retrieval_flags(
    5000, "Blocks retrieved per question, for top-k match (capped at the corpus size).")
flags.DEFINE_string("dataset", None,
                    f"{', '.join(qa_lib.DATASETS)} (in --qa_dir) or the path of a QA file.")
flags.DEFINE_string("qa_dir", None, "Where `python -m data_prep.open_qa` wrote the QA files.")
flags.DEFINE_enum("split", "test", list(qa_lib.SPLITS), "The split of a named --dataset.")
flags.DEFINE_integer("batch_size", 32, "Questions per batch.", lower_bound=1)
flags.DEFINE_string("output_dir", None,
                    "Where the predictions and metrics go (default: <model_dir>/eval_<dataset>"
                    "_<split>, or <model_dir>/eval_<file name> for a file).")
flags.DEFINE_string("predictions_file", None,
                    "Only score this predictions file ({\"question\", \"prediction\"} lines) "
                    "against --dataset; no model needed.")
flags.DEFINE_bool("progress", True, "Show a progress bar.")

FLAGS = flags.FLAGS


def _default_output_dir(values: flags.FlagValues) -> str:
  if values.dataset in qa_lib.DATASETS:
    name = f"{values.dataset}_{values.split}"
  else:
    name = os.path.splitext(os.path.basename(values.dataset.rstrip("/")))[0] or "dataset"
  return os.path.join(values.model_dir, f"eval_{name}")


def _score(predictions_file: str, dataset: str, records, skipped_lines: int) -> None:
  metrics = evaluation.score_predictions(predictions_file, records)
  metrics["skipped_lines"] = skipped_lines
  print(f"{predictions_file} against {dataset}:")
  print(f"  {'exact match':<28} {metrics['exact_match']:.4f}")
  for key in ("questions", "correct", "missing", "unmatched_predictions",
              "skipped_prediction_lines", "skipped_lines"):
    print(f"  {key.replace('_', ' '):<28} {metrics[key]}")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  if not FLAGS.dataset:
    raise app.UsageError("--dataset is required (nq, wq, ct or the path of a QA file)")
  path, answer_type = qa_lib.resolve_dataset(FLAGS.dataset, FLAGS.qa_dir, FLAGS.split)
  records, skipped = qa_lib.read_qa(path, answer_type)
  if FLAGS.predictions_file:
    _score(FLAGS.predictions_file, FLAGS.dataset, records, len(skipped))
    return
  qa = openqa_flags.load_openqa(FLAGS.flag_values_dict(), hint=" (or give --predictions_file)")
  metrics, rows = evaluation.evaluate(qa, records, batch_size=FLAGS.batch_size,
                                      progress=FLAGS.progress, skipped_lines=len(skipped))
  metrics.update(dataset=FLAGS.dataset, qa_file=path)
  paths = evaluation.write_outputs(FLAGS.output_dir or _default_output_dir(FLAGS), metrics, rows)
  print(f"{path} with {qa.checkpoint} (read {metrics['reader_beam_size']} of "
        f"{metrics['retriever_beam_size']} retrieved):")
  print(evaluation.format_metrics(metrics))
  for kind in ("predictions", "evidence", "metrics"):
    print(f"wrote {paths[kind]}")


def run():
  cli.run_main(main)


if __name__ == "__main__":
  run()
