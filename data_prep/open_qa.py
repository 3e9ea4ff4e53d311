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

Reading is :func:`realm_tf.data.qa.read_qa`'s: a malformed line (not UTF-8, bad JSON, no
question, no answers) is skipped with a warning naming the file and line, and listed under
``"skipped"`` in ``qa_manifest.json``; a missing file, or one without a single valid record, is
an error, and nothing is written. These converters are plain Python (a few thousand lines each,
order preserved), not Beam.

Command line::

  python -m data_prep.open_qa --output_dir /data/qa \\
      --nq_dev assets/nq_open/NQ-open.dev.jsonl \\
      --wq_train .../WebQuestions-train.txt --wq_test .../WebQuestions-test.txt \\
      --ct_train .../CuratedTrec-train.txt --ct_test .../CuratedTrec-test.txt
"""

import json
import logging
import os
from typing import Dict, Iterable, List, Optional, Tuple

from absl import app
from absl import flags
import tensorflow as tf

from data_prep import beam_utils
from data_prep import cli
from realm_tf.data import manifests
from realm_tf.data import qa

DEV_BUCKETS = 100000
DEV_MODULUS = 10
SOURCE_FLAGS = ("nq_train", "nq_dev", "wq_train", "wq_test", "ct_train", "ct_test")


# A QA file without a valid record (a manifests.DataError naming the file and its first problem).
QAFormatError = qa.QAFormatError


def dev_mask(questions: List[str]) -> List[bool]:
  """ORQA's train/dev rule (above) for each question, in one TF call."""
  if not questions:
    return []
  buckets = tf.strings.to_hash_bucket_fast(tf.constant(questions, tf.string), DEV_BUCKETS)
  return [bool(b % DEV_MODULUS == 0) for b in buckets.numpy()]


def read_qa_file(path: str, answer_type: str = "text") -> Tuple[List[Dict], List[str]]:
  """Reads NQ-open / DrQA JSON lines -> ``([{"question", "answers", "answer_type"}], skipped)``.

  Accepts ``answer`` or ``answers`` (a list of strings, or one string); every record gets
  ``answer_type``. Regex answers are kept exactly as written; one that Python's ``re`` cannot
  compile is logged, not changed. ``skipped``: ``"<path>:<line>: <why>"`` per malformed line
  (see :func:`realm_tf.data.qa.read_qa`, which raises when no line is valid).
  """
  records, skipped = qa.read_qa(path, answer_type)
  return [r.to_json() for r in records], skipped


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

  All inputs are read (and validated) before anything is written. Malformed lines are skipped
  (logged) and listed per input in ``qa_manifest.json``: ``"skipped": {"wq_train": ["<path>:12:
  malformed JSON: ..."], ...}`` (``nq_dev`` is NQ's test input).
  """
  plan, skipped = {}, {}
  for name, train, test, kind in (("nq", nq_train, nq_dev, "text"),
                                  ("wq", wq_train, wq_test, "text"),
                                  ("ct", ct_train, ct_test, "regex")):
    if train:
      records, skipped[f"{name}_train"] = read_qa_file(train, kind)
      tr, dv = split_train_dev(records)
      plan[f"{name}-train"], plan[f"{name}-dev"] = tr, dv
    if test:
      test_input = "nq_dev" if name == "nq" else f"{name}_test"
      plan[f"{name}-test"], skipped[test_input] = read_qa_file(test, kind)
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
                  "wq_test": wq_test, "ct_train": ct_train, "ct_test": ct_test},
      "skipped": skipped})
  num_skipped = sum(len(v) for v in skipped.values())
  logging.info("open_qa: %s -> %s (%d malformed lines skipped)", counts, output_dir,
               num_skipped)
  return counts


def default_sources(data_dir: str) -> Dict[str, str]:
  """The files of ``assets/`` (or any directory laid out the same way) that exist."""
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
                      "Take every known file found under this directory (e.g. assets).")
  for name in SOURCE_FLAGS:
    flags.DEFINE_string(name, None, f"The {name} file (overrides --data_dir's).")
  flags.mark_flag_as_required("output_dir")


def main(argv):
  del argv  # No positional arguments (checked by cli.run).
  f = flags.FLAGS
  sources = {}
  if f.data_dir:
    if not tf.io.gfile.isdir(f.data_dir):
      raise manifests.MissingDataError(f"directory not found: {f.data_dir}")
    sources = default_sources(f.data_dir)
  sources.update({name: getattr(f, name) for name in SOURCE_FLAGS if getattr(f, name)})
  if not sources:
    raise app.UsageError("no QA input files: give --data_dir or some of "
                         + ", ".join(f"--{name}" for name in SOURCE_FLAGS))
  print(json.dumps(convert(f.output_dir, **sources), sort_keys=True))


if __name__ == "__main__":
  cli.run(main, define_flags, beam=False)
