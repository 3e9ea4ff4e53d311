"""Open-QA evaluation: answering a QA file with a fine-tuned model, and scoring predictions.

:func:`evaluate` answers every question of a QA file (``realm_tf.data.qa.read_qa``) with an
:class:`~realm_tf.openqa.predict.OpenQA` model and measures, per question (means):

* ``exact_match``: ORQA's official exact match of the predicted text (``eval_utils``: SQuAD
  normalization, or ``re.match`` for CuratedTrec's patterns) -- the number ORQA and REALM
  report;
* ``span_match``: the predicted span is one of the gold spans of its block (the training
  task's ``exact_match``, by which the best checkpoint is picked);
* ``top_{k}_match``: one of the top ``k`` retrieved blocks holds an answer (ORQA's
  ``HasAnswer``), for each ``k`` of ``top_k`` up to the retriever beam;
* ``reader_oracle``: one of the blocks read holds an answer, by the same ``HasAnswer`` test on
  the beam (``retriever_correct`` of the read blocks, what :meth:`OpenQA.predict` returns).
  The training task's ``reader_oracle`` asks for a gold span of at most ``max_span_width``
  wordpieces inside the reader's cut of the block, so it can be lower than this one.

and the answering time, split into retrieval (question embedding, search, reader inputs) and
reading (the device step), from ``OpenQA.timings``.

:func:`score_predictions` is ORQA's ``evaluate_predictions``: a predictions file of JSON lines
``{"question", "prediction"}`` scored against reference records by question text.
"""

import json
import logging
import os
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
import tqdm

from realm_tf.data import answers as answers_lib
from realm_tf.data import manifests
from realm_tf.data import qa as qa_lib
from realm_tf.openqa import inputs as inputs_lib

DEFAULT_TOP_K = (5, 10, 50, 100, 500, 1000, 5000)
PREDICTIONS_NAME = "predictions.jsonl"
EVIDENCE_NAME = "predictions_with_evidence.jsonl"
METRICS_NAME = "metrics.json"
# Malformed prediction lines logged one by one; the rest are only counted.
MAX_LOGGED_PROBLEMS = 20


def _evidence_row(qa, result: Dict) -> Dict:
  """The rich row of one answered question: its answers, prediction and the blocks read."""
  question = result["question"]
  correct = inputs_lib.official_match(result["answer"], question)
  blocks = []
  for rank, (block_id, score, has_answer, block) in enumerate(zip(
      result["beam_ids"], result["retriever_logits"], result["retriever_correct"],
      result["blocks"])):
    found = rank == result["block_rank"] and bool(result["answer"])
    blocks.append(dict(
        rank=rank, block_id=int(block_id), title=qa.titles[int(block_id)],
        retrieval_score=float(score), has_answer=bool(has_answer), text=block.text,
        dense_rank=int(result["dense_rank"][rank]), bm25_rank=int(result["bm25_rank"][rank]),
        answer_start=result["start"] if found else None,
        answer_end=result["end"] if found else None))
  hits = np.flatnonzero(result["retriever_correct"])
  return dict(
      question=question.question, answers=list(question.answers),
      answer_type=qa_lib.REGEX if question.is_regex else qa_lib.TEXT,
      prediction=result["answer"], correct=bool(correct),
      span_match=bool(result["span_match"]), score=float(result["score"]),
      block_rank=int(result["block_rank"]),
      first_correct_rank=int(hits[0]) if len(hits) else None, blocks=blocks)


def evaluate(qa, records: Sequence[qa_lib.QARecord], batch_size: int = 32,
             top_k: Sequence[int] = DEFAULT_TOP_K, progress: bool = True,
             skipped_lines: int = 0) -> Tuple[Dict, List[Dict]]:
  """Answers ``records`` with ``qa`` and scores the answers (see the module docstring).

  Args:
    qa: a loaded ``OpenQA``.
    records: the questions and their answers (``read_qa``'s records).
    batch_size: questions per ``qa.predict`` call (a short last batch is padded).
    top_k: the ``top_{k}_match`` cut-offs; those above the retriever beam are skipped.
    progress: show a progress bar.
    skipped_lines: malformed lines of the QA file (``read_qa``'s problems), reported in the
      metrics as ``skipped_lines``.

  Returns:
    ``(metrics, rows)``: the metrics (a JSON-able dict) and one rich row per record, in order,
    with ``question``, ``answers``, ``answer_type``, ``prediction``, ``correct`` (official
    exact match), ``span_match``, ``score``, ``block_rank``, ``first_correct_rank`` (the beam
    rank of the first block holding an answer, or None) and ``blocks``: the blocks read, each
    ``rank``, ``block_id``, ``title``, ``retrieval_score``, ``has_answer``, ``text`` and, in
    the block of the answer, ``answer_start``/``answer_end`` (character offsets into
    ``text``; None elsewhere). :func:`prediction_line` cuts a row to ORQA's format.

  Raises:
    ValueError: ``batch_size`` < 1 or no records; ``inputs.QuestionError``: an empty question.
  """
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
  if not records:
    raise ValueError("no questions to evaluate")
  beam, read = qa.builder.beam, qa.builder.read
  cutoffs = sorted({int(k) for k in top_k if 0 < int(k) <= beam})
  before = dict(qa.timings)
  start = time.perf_counter()
  rows: List[Dict] = []
  em, span, oracle = [], [], []
  top = {k: [] for k in cutoffs}
  with tqdm.tqdm(total=len(records), unit="question", desc="realm-eval",
                 disable=not progress) as bar:
    for i in range(0, len(records), batch_size):
      batch = [inputs_lib.question_of(r) for r in records[i:i + batch_size]]
      # A short last batch is padded with copies of its last question (their results are
      # dropped), so that every batch has one shape and the model is traced once.
      padded = batch + [batch[-1]] * (min(batch_size, len(records)) - len(batch))
      for result in qa.predict(padded)[:len(batch)]:
        row = _evidence_row(qa, result)
        rows.append(row)
        em.append(row["correct"])
        span.append(row["span_match"])
        correct = result["retriever_correct"]
        oracle.append(bool(np.any(correct[:read])))
        for k in cutoffs:
          top[k].append(bool(np.any(correct[:k])))
      bar.update(len(batch))
  n = len(rows)
  retrieval = qa.timings["retrieval_seconds"] - before["retrieval_seconds"]
  reading = qa.timings["reading_seconds"] - before["reading_seconds"]
  metrics = dict(
      exact_match=float(np.mean(em)), span_match=float(np.mean(span)),
      reader_oracle=float(np.mean(oracle)),
      **{f"top_{k}_match": float(np.mean(v)) for k, v in top.items()},
      questions=n, correct=int(np.sum(em)), skipped_lines=int(skipped_lines),
      # Questions longer than the query tower's input, cut to fit (ORQA never cuts).
      questions_truncated=qa.builder.count_truncated([r.question for r in records]),
      retriever=qa.builder.retriever, retriever_beam_size=int(beam),
      reader_beam_size=int(read),
      retrieval_seconds=float(retrieval), reading_seconds=float(reading),
      retrieval_seconds_per_question=float(retrieval / n),
      reading_seconds_per_question=float(reading / n),
      wall_seconds=float(time.perf_counter() - start), checkpoint=qa.checkpoint)
  return metrics, rows


def prediction_line(row: Dict) -> Dict:
  """A row of :func:`evaluate` in ORQA's predictions format: ``{"question", "prediction"}``."""
  return {"question": row["question"], "prediction": row["prediction"]}


def _write_lines(path: str, rows) -> None:
  tmp = path + ".tmp"
  with tf.io.gfile.GFile(tmp, "w") as f:
    for row in rows:
      f.write(json.dumps(row, ensure_ascii=False) + "\n")
  tf.io.gfile.rename(tmp, path, overwrite=True)


def write_outputs(output_dir: str, metrics: Dict, rows: Sequence[Dict]) -> Dict[str, str]:
  """Writes ``predictions.jsonl`` (ORQA's format), ``predictions_with_evidence.jsonl`` (the
  rich rows) and ``metrics.json`` into ``output_dir``; returns their paths by kind."""
  tf.io.gfile.makedirs(output_dir)
  paths = dict(predictions=os.path.join(output_dir, PREDICTIONS_NAME),
               evidence=os.path.join(output_dir, EVIDENCE_NAME),
               metrics=os.path.join(output_dir, METRICS_NAME))
  _write_lines(paths["predictions"], (prediction_line(r) for r in rows))
  _write_lines(paths["evidence"], rows)
  with tf.io.gfile.GFile(paths["metrics"], "w") as f:
    f.write(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
  return paths


def _parse_prediction(raw: bytes) -> Tuple[Optional[Tuple[str, str]], str]:
  """One predictions line -> ((question, prediction), "") or (None, why); (None, "") if empty."""
  row, why = qa_lib.json_object(raw)
  if row is None:
    return None, why
  question, prediction = row.get("question"), row.get("prediction")
  if not isinstance(question, str):
    return None, "missing or non-string 'question'"
  if not isinstance(prediction, str):
    return None, "missing or non-string 'prediction'"
  return (question, prediction), ""


def read_predictions(path: str) -> Tuple[Dict[str, str], List[str]]:
  """A predictions file -> ``({question: prediction}, problems)``.

  As in ORQA, a question predicted twice keeps its last prediction. A malformed line is
  skipped and reported as ``"<path>:<line>: <why>"`` (also logged); empty lines are ignored.

  Raises:
    manifests.MissingDataError: ``path`` does not exist.
  """
  if not tf.io.gfile.exists(path):
    raise manifests.MissingDataError(f"predictions file not found: {path}")
  predictions, problems = {}, []
  with tf.io.gfile.GFile(path, "rb") as f:
    for i, raw in enumerate(f, start=1):
      parsed, why = _parse_prediction(raw)
      if why:
        problems.append(f"{path}:{i}: {why}")
        if len(problems) <= MAX_LOGGED_PROBLEMS:
          logging.warning("skipped %s", problems[-1])
      if parsed is not None:
        predictions[parsed[0]] = parsed[1]
  if len(problems) > MAX_LOGGED_PROBLEMS:
    logging.warning("skipped %d more malformed lines of %s", len(problems) - MAX_LOGGED_PROBLEMS,
                    path)
  return predictions, problems


def score_predictions(predictions_path: str,
                      references: Sequence[qa_lib.QARecord]) -> Dict:
  """ORQA's ``evaluate_predictions``: exact match of a predictions file against references.

  Each reference is matched to the prediction of the same question text and scored with
  ``answers.is_correct`` (regex references by ``re.match``). A reference without a
  prediction counts as wrong.

  Args:
    predictions_path: JSON lines ``{"question", "prediction"}`` (``realm-eval``'s
      ``predictions.jsonl``, or ORQA's).
    references: the QA records (``read_qa``), duplicates counted as often as they occur.

  Returns:
    ``exact_match`` (over the references), ``questions``, ``correct``, ``missing`` (references
    without a prediction), ``unmatched_predictions`` (predicted questions that are no
    reference's) and ``skipped_prediction_lines`` (malformed lines, skipped).

  Raises:
    manifests.MissingDataError: no predictions file.
    ValueError: no references.
  """
  if not references:
    raise ValueError("no reference questions to score against")
  predictions, problems = read_predictions(predictions_path)
  correct, missing = 0, 0
  for record in references:
    prediction = predictions.get(record.question)
    if prediction is None:
      missing += 1
      continue
    correct += answers_lib.is_correct(prediction, record.answers,
                                      is_regex=record.answer_type == qa_lib.REGEX)
  if missing:
    logging.warning("%s: %d of %d questions have no prediction (counted as wrong)",
                    predictions_path, missing, len(references))
  asked = {r.question for r in references}
  return dict(exact_match=correct / len(references), questions=len(references),
              correct=int(correct), missing=missing,
              unmatched_predictions=sum(q not in asked for q in predictions),
              skipped_prediction_lines=len(problems))


def format_metrics(metrics: Dict) -> str:
  """A short table of :func:`evaluate`'s metrics."""
  lines = [f"  {'exact match':<28} {metrics['exact_match']:.4f}",
           f"  {'span match':<28} {metrics['span_match']:.4f}",
           f"  {'reader oracle':<28} {metrics['reader_oracle']:.4f}"]
  tops = sorted((int(k[4:-6]), v) for k, v in metrics.items()
                if k.startswith("top_") and k.endswith("_match"))
  lines += [f"  {f'top-{k} match':<28} {v:.4f}" for k, v in tops]
  retrieval = metrics["retrieval_seconds_per_question"]
  reading = metrics["reading_seconds_per_question"]
  lines += [f"  {'questions':<28} {metrics['questions']}",
            f"  {'skipped lines':<28} {metrics['skipped_lines']}",
            f"  {'questions truncated':<28} {metrics['questions_truncated']}",
            f"  {'seconds / question':<28} {retrieval + reading:.4f} (retrieval "
            f"{retrieval:.4f}, reading {reading:.4f})"]
  return "\n".join(lines)
