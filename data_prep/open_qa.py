"""Open-QA sets -> ``<dataset>-<split>.jsonl`` with ``{"question", "answers", "answer_type"}``.

Datasets and splits (as ORQA made them):

* ``nq``: NQ-open. The official dev file (3,610 questions) is the **test** set (ORQA and REALM
  report it as NQ test); if a train file is given, it is split into train and dev.
* ``wq``: WebQuestions, DrQA format. ``WebQuestions-test.txt`` (2,032) is test; the train file is
  split into train and dev.
* ``ct``: CuratedTrec, DrQA format. Answers are **regular expressions** (``answer_type:
  "regex"``, match with ``re.match(pattern, answer, re.IGNORECASE)``) and are copied untouched.
  ``CuratedTrec-test.txt`` (694) is test; train is split into train and dev.

Dev rule, ORQA's (``language/orqa/preprocessing/create_data_splits.py``): a training question
goes to dev when ``tf.strings.to_hash_bucket_fast(question, 100000) % 10 == 0``, else to train.
On the released files this gives ORQA's counts: WebQuestions 3,417 / 361 / 2,032 and
CuratedTrec 1,353 / 133 / 694 (train / dev / test).

Malformed input is a hard error naming the file and line: a QA set is small and every question
counts. These converters are plain Python (a few thousand lines each, order preserved), not Beam.

Command line::

  python -m data_prep.open_qa --output_dir /data/qa \\
      --nq_dev ../shared/data/nq_open/NQ-open.dev.jsonl \\
      --wq_train .../WebQuestions-train.txt --wq_test .../WebQuestions-test.txt \\
      --ct_train .../CuratedTrec-train.txt --ct_test .../CuratedTrec-test.txt
"""

import json
import logging
import os
import re
from typing import Dict, Iterable, List, Optional

from absl import app
from absl import flags
import tensorflow as tf

from data_prep import beam_utils
from data_prep import cli
from realm_tf.data import contract

DEV_BUCKETS = 100000
DEV_MODULUS = 10
SOURCE_FLAGS = ("nq_train", "nq_dev", "wq_train", "wq_test", "ct_train", "ct_test")


class QAFormatError(contract.DataError):
  """A QA file has a malformed record; the message names the file and line."""


def dev_mask(questions: List[str]) -> List[bool]:
  """ORQA's train/dev rule (above) for each question, in one TF call."""
  if not questions:
    return []
  buckets = tf.strings.to_hash_bucket_fast(tf.constant(questions, tf.string), DEV_BUCKETS)
  return [bool(b % DEV_MODULUS == 0) for b in buckets.numpy()]


def is_dev_question(question: str) -> bool:
  return dev_mask([question])[0]


def read_qa_file(path: str, answer_type: str = "text") -> List[Dict]:
  """Reads NQ-open / DrQA JSON lines -> ``[{"question", "answers", "answer_type"}]``.

  Accepts ``answer`` or ``answers`` (a list of strings, or one string). Regex answers are kept
  exactly as written; one that Python's ``re`` cannot compile is logged, not changed.
  """
  if not tf.io.gfile.exists(path):
    raise FileNotFoundError(f"QA file not found: {path}")
  out = []
  with tf.io.gfile.GFile(path, "rb") as f:
    for i, raw in enumerate(f, start=1):
      where = f"{path}:{i}"
      try:
        line = raw.decode("utf-8")
      except UnicodeDecodeError as e:
        raise QAFormatError(f"{where}: not UTF-8: {e}") from e
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        raise QAFormatError(f"{where}: malformed JSON: {e}") from e
      question = record.get("question") if isinstance(record, dict) else None
      answers = None
      if isinstance(record, dict):
        answers = record.get("answers", record.get("answer"))
      if isinstance(answers, str):
        answers = [answers]
      if not isinstance(question, str) or not question.strip() or not isinstance(
          answers, list) or not answers or not all(isinstance(a, str) for a in answers):
        raise QAFormatError(f"{where}: expected {{'question': str, 'answer': [str, ...]}}")
      if answer_type == "regex":
        for a in answers:
          try:
            re.compile(a)
          except re.error as e:
            # Kept exactly as written (the released data has a few such patterns); evaluation
            # must cope, e.g. by falling back to a literal comparison.
            logging.warning("%s: answer %r is not a valid Python regex (%s); kept unchanged",
                            where, a, e)
      out.append({"question": question, "answers": answers, "answer_type": answer_type})
  return out


def split_train_dev(records: Iterable[Dict]):
  """Train records -> (train, dev) by ORQA's rule (:func:`dev_mask`), order preserved."""
  records = list(records)
  train, dev = [], []
  for r, is_dev in zip(records, dev_mask([r["question"] for r in records])):
    (dev if is_dev else train).append(r)
  return train, dev


def write_jsonl(path: str, records: Iterable[Dict]) -> int:
  """Writes JSON lines atomically (temp file + rename); returns the count."""
  tmp = path + ".tmp"
  n = 0
  with tf.io.gfile.GFile(tmp, "w") as f:
    for r in records:
      f.write(json.dumps(r, ensure_ascii=False) + "\n")
      n += 1
  tf.io.gfile.rename(tmp, path, overwrite=True)
  return n


def convert(output_dir: str, nq_train: Optional[str] = None, nq_dev: Optional[str] = None,
            wq_train: Optional[str] = None, wq_test: Optional[str] = None,
            ct_train: Optional[str] = None, ct_test: Optional[str] = None) -> Dict[str, int]:
  """Converts the given files; returns ``{"<dataset>-<split>": count}``.

  All inputs are read (and validated) before anything is written.
  """
  plan = {}
  for name, train, test, kind in (("nq", nq_train, nq_dev, "text"),
                                  ("wq", wq_train, wq_test, "text"),
                                  ("ct", ct_train, ct_test, "regex")):
    if train:
      tr, dv = split_train_dev(read_qa_file(train, kind))
      plan[f"{name}-train"], plan[f"{name}-dev"] = tr, dv
    if test:
      plan[f"{name}-test"] = read_qa_file(test, kind)
  if not plan:
    raise ValueError("no QA input files given")
  tf.io.gfile.makedirs(output_dir)
  counts = {}
  for name, records in plan.items():
    counts[name] = write_jsonl(os.path.join(output_dir, f"{name}.jsonl"), records)
  beam_utils.write_json(os.path.join(output_dir, "qa_manifest.json"), {
      "counts": counts,
      "dev_rule": "tf.strings.to_hash_bucket_fast(question, 100000) % 10 == 0 -> dev (ORQA)",
      "sources": {"nq_train": nq_train, "nq_dev(test)": nq_dev, "wq_train": wq_train,
                  "wq_test": wq_test, "ct_train": ct_train, "ct_test": ct_test}})
  logging.info("open_qa: %s -> %s", counts, output_dir)
  return counts


def default_sources(data_dir: str) -> Dict[str, str]:
  """The files of ``../shared/data`` (or any directory laid out the same way) that exist."""
  paths = {
      "nq_dev": "nq_open/NQ-open.dev.jsonl",
      "nq_train": "nq_open/NQ-open.train.jsonl",
      "wq_train": "drqa/WebQuestions-train.txt",
      "wq_test": "drqa/WebQuestions-test.txt",
      "ct_train": "drqa/CuratedTrec-train.txt",
      "ct_test": "drqa/CuratedTrec-test.txt",
  }
  return {k: os.path.join(data_dir, v) for k, v in paths.items()
          if tf.io.gfile.exists(os.path.join(data_dir, v))}


def define_flags() -> None:
  """The command line's flags (see :mod:`data_prep.cli`)."""
  flags.DEFINE_string("output_dir", None, "Where the <dataset>-<split>.jsonl files go.")
  flags.DEFINE_string("data_dir", None,
                      "Take every known file found under this directory (shared/data).")
  for name in SOURCE_FLAGS:
    flags.DEFINE_string(name, None, f"The {name} file (overrides --data_dir's).")
  flags.mark_flag_as_required("output_dir")


def main(argv):
  del argv  # No positional arguments (checked by cli.run).
  f = flags.FLAGS
  sources = {}
  if f.data_dir:
    if not tf.io.gfile.isdir(f.data_dir):
      raise contract.MissingDataError(f"directory not found: {f.data_dir}")
    sources = default_sources(f.data_dir)
  sources.update({name: getattr(f, name) for name in SOURCE_FLAGS if getattr(f, name)})
  if not sources:
    raise app.UsageError("no QA input files: give --data_dir or some of "
                         + ", ".join(f"--{name}" for name in SOURCE_FLAGS))
  print(json.dumps(convert(f.output_dir, **sources), sort_keys=True))


if __name__ == "__main__":
  cli.run(main, define_flags, beam=False)
