"""Open-QA question files: reading them, and finding a named dataset's file.

A QA file is UTF-8 JSON lines, one question a line, in either format:

* ours (written by ``python -m data_prep.open_qa`` and ``data_prep.synthetic_world``)::

    {"question": "who wrote hamlet", "answers": ["Shakespeare"], "answer_type": "text"}

* the released NQ-open / DrQA files (``answer`` may also be one string)::

    {"question": "who wrote hamlet", "answer": ["Shakespeare"]}

``answer_type`` is ``"text"`` (exact match after normalization) or ``"regex"`` (CuratedTrec: a
pattern for ``re.match(pattern, prediction, re.IGNORECASE)``); it defaults to ``"text"``, and
the ``answer_type`` argument of :func:`read_qa` overrides it.

:func:`read_qa` **skips a malformed line** (not UTF-8, bad JSON, not an object, a missing or
empty question, answers that are not a non-empty list of strings, an unknown answer type) and
reports it as ``"<path>:<line>: <why>"``; empty lines are ignored. A missing file, or one
without a single valid record, is an error.

:func:`resolve_dataset` maps ``nq``, ``wq`` or ``ct`` to ``<qa_dir>/<name>-<split>.jsonl``
(the files ``data_prep.open_qa`` writes) and its answer type.

Nothing here comes from ``data_prep`` (the library never depends on it).
"""

import json
import logging
import os
import re
from typing import Dict, List, NamedTuple, Optional, Tuple

import tensorflow as tf

from realm_tf.data import manifests

TEXT = "text"
REGEX = "regex"
ANSWER_TYPES = (TEXT, REGEX)
# Named datasets: the answer type of each.
DATASETS = {"nq": TEXT, "wq": TEXT, "ct": REGEX}
SPLITS = ("train", "dev", "test")
MAKE_COMMAND = "python -m data_prep.open_qa --output_dir <qa_dir> --data_dir assets"
# Problems of one file logged one by one; the rest are counted in one more warning.
MAX_LOGGED_PROBLEMS = 20


class QAFormatError(manifests.DataError):
  """A QA file without a valid record; the message names the file and its first problem."""


class QARecord(NamedTuple):
  """One question, with its answers (strings or patterns, as ``answer_type`` says)."""
  question: str
  answers: List[str]
  answer_type: str = TEXT

  def to_json(self) -> Dict:
    """The JSON object of this record, in our format (what ``data_prep.open_qa`` writes)."""
    return {"question": self.question, "answers": list(self.answers),
            "answer_type": self.answer_type}


def json_object(raw: bytes) -> Tuple[Optional[Dict], str]:
  """One JSON-lines line -> (object, "") or (None, why); (None, "") for an empty line."""
  try:
    line = raw.decode("utf-8")
  except UnicodeDecodeError as e:
    return None, f"not UTF-8: {e}"
  if not line.strip():
    return None, ""
  try:
    record = json.loads(line)
  except json.JSONDecodeError as e:
    return None, f"malformed JSON: {e}"
  if not isinstance(record, dict):
    return None, f"expected a JSON object, got {type(record).__name__}"
  return record, ""


def _parse_line(raw: bytes, answer_type: Optional[str]) -> Tuple[Optional[QARecord], str]:
  """One line -> (record, "") or (None, why); (None, "") for an empty line."""
  record, why = json_object(raw)
  if record is None:
    return None, why
  question = record.get("question")
  if not isinstance(question, str) or not question.strip():
    return None, "missing or empty 'question'"
  answers = record.get("answers", record.get("answer"))
  if isinstance(answers, str):
    answers = [answers]
  if not isinstance(answers, list) or not answers or not all(
      isinstance(a, str) for a in answers):
    return None, "'answers' (or 'answer') must be a non-empty list of strings"
  kind = answer_type or record.get("answer_type")
  kind = TEXT if kind is None else kind
  if kind not in ANSWER_TYPES:
    return None, f"unknown answer_type {kind!r} (expected one of {', '.join(ANSWER_TYPES)})"
  return QARecord(question, answers, kind), ""


def read_qa(path: str, answer_type: Optional[str] = None) -> Tuple[List[QARecord], List[str]]:
  """Reads a QA file (either format above), skipping its malformed lines.

  A regex answer that Python's ``re`` cannot compile is kept exactly as written (the released
  CuratedTrec has a few) and logged; evaluation must cope with it.

  Args:
    path: the JSON lines file (any ``tf.io.gfile`` path).
    answer_type: ``"text"`` or ``"regex"`` for every record, overriding the records' own
      (CuratedTrec's released files do not say that their answers are patterns); ``None``: each
      record's ``answer_type``, ``"text"`` when it has none.

  Returns:
    ``(records, problems)``: the valid records in file order, and one message
    ``"<path>:<line>: <why>"`` per skipped line (each also logged as a warning).

  Raises:
    manifests.MissingDataError: ``path`` does not exist.
    QAFormatError: (a ``manifests.DataError``) ``path`` has no valid record.
    ValueError: ``answer_type`` is not one of :data:`ANSWER_TYPES`.
  """
  if answer_type is not None and answer_type not in ANSWER_TYPES:
    raise ValueError(f"answer_type must be one of {ANSWER_TYPES} or None, got {answer_type!r}")
  if not tf.io.gfile.exists(path):
    raise manifests.MissingDataError(f"QA file not found: {path}")
  records, problems = [], []
  with tf.io.gfile.GFile(path, "rb") as f:
    for i, raw in enumerate(f, start=1):
      record, why = _parse_line(raw, answer_type)
      if why:
        problems.append(f"{path}:{i}: {why}")
        if len(problems) <= MAX_LOGGED_PROBLEMS:
          logging.warning("skipped %s", problems[-1])
      if record is None:
        continue
      if record.answer_type == REGEX:
        for a in record.answers:
          try:
            re.compile(a)
          except re.error as e:
            logging.warning("%s:%d: answer %r is not a valid Python regex (%s); kept unchanged",
                            path, i, a, e)
      records.append(record)
  if len(problems) > MAX_LOGGED_PROBLEMS:
    logging.warning("skipped %d more malformed lines of %s", len(problems) - MAX_LOGGED_PROBLEMS,
                    path)
  if not records:
    first = f" (first problem: {problems[0]})" if problems else " (the file is empty)"
    raise QAFormatError(f"no valid QA record in {path}{first}")
  return records, problems


def resolve_dataset(dataset: str, qa_dir: Optional[str],
                    split: str = "test") -> Tuple[str, Optional[str]]:
  """A dataset name or file -> ``(path, answer_type)`` for :func:`read_qa`.

  Args:
    dataset: ``nq``, ``wq`` or ``ct`` (:data:`DATASETS`), or the path of a JSON lines file.
    qa_dir: where ``python -m data_prep.open_qa`` wrote ``<name>-<split>.jsonl``; needed for a
      name only.
    split: ``train``, ``dev`` or ``test`` (for a name).

  Returns:
    For a name, ``(<qa_dir>/<name>-<split>.jsonl, "regex" for ct, else "text")``; for a path,
    ``(path, None)`` (each record's own answer type).

  Raises:
    manifests.DataError: a name without ``qa_dir``.
    manifests.MissingDataError: the named dataset's file, or the path, does not exist.
    ValueError: an unknown ``split``.
  """
  if dataset not in DATASETS:
    if not tf.io.gfile.exists(dataset):
      raise manifests.MissingDataError(
          f"QA file not found: {dataset} (a dataset is one of {', '.join(DATASETS)} or the "
          "path of a JSON lines file)")
    return dataset, None
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
  if not qa_dir:
    raise manifests.DataError(
        f"dataset {dataset!r} needs --qa_dir: the output directory of "
        "`python -m data_prep.open_qa` (or give the path of a QA file instead)")
  path = os.path.join(qa_dir, f"{dataset}-{split}.jsonl")
  if not tf.io.gfile.exists(path):
    raise manifests.MissingDataError(
        f"QA file not found: {path}; make it with `{MAKE_COMMAND.replace('<qa_dir>', qa_dir)}`")
  return path, DATASETS[dataset]

