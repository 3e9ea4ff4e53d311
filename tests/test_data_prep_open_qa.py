"""Tests of data_prep.open_qa on the real files in ../shared/data."""

import json
import pathlib

import pytest

from data_prep import open_qa

SHARED = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data"


def test_convert_shared_data(tmp_path):
  counts = open_qa.convert(str(tmp_path), **open_qa.default_sources(str(SHARED)))
  assert counts["nq-test"] == 3610
  assert counts["wq-test"] == 2032
  assert counts["ct-test"] == 694
  # ORQA's splits (its README): train / dev / test.
  assert (counts["wq-train"], counts["wq-dev"], counts["wq-test"]) == (3417, 361, 2032)
  assert (counts["ct-train"], counts["ct-dev"], counts["ct-test"]) == (1353, 133, 694)
  ct = [json.loads(l) for l in open(tmp_path / "ct-test.jsonl", encoding="utf-8")]
  raw = [json.loads(l) for l in open(SHARED / "drqa" / "CuratedTrec-test.txt", encoding="utf-8")]
  assert [r["answers"] for r in ct] == [r["answer"] for r in raw]  # Patterns intact.
  assert ct[0]["answer_type"] == "regex" and "\\s?" in ct[0]["answers"][0]
  nq = json.loads(open(tmp_path / "nq-test.jsonl", encoding="utf-8").readline())
  assert nq["answer_type"] == "text" and isinstance(nq["answers"], list)
  dev = [json.loads(l)["question"] for l in open(tmp_path / "wq-dev.jsonl", encoding="utf-8")]
  assert all(open_qa.is_dev_question(q) for q in dev)


def test_dev_rule_is_orqas_hash_bucket():
  """ORQA: dev when tf.strings.to_hash_bucket_fast(question, 100000) % 10 == 0 (a
  fingerprint hash, not Python's): checked against TF called directly, one by one."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  questions = [json.loads(l)["question"] for l in open(
      SHARED / "drqa" / "WebQuestions-train.txt", encoding="utf-8")][:300]
  want = [int(tf.strings.to_hash_bucket_fast(q, 100000)) % 10 == 0 for q in questions]
  assert open_qa.dev_mask(questions) == want and 10 < sum(want) < 50


def test_bad_qa_input(tmp_path):
  bad = tmp_path / "bad.txt"
  bad.write_text('{"question": "q", "answer": ["a"]}\n{oops\n', encoding="utf-8")
  with pytest.raises(open_qa.QAFormatError, match="bad.txt:2"):
    open_qa.read_qa_file(str(bad))
  bad.write_bytes(b'{"question": "q", "answer": ["a"]}\n\xff\xfe\n')
  with pytest.raises(open_qa.QAFormatError, match="not UTF-8"):
    open_qa.read_qa_file(str(bad))
  bad.write_text('{"question": "q", "answer": []}\n', encoding="utf-8")
  with pytest.raises(open_qa.QAFormatError, match="bad.txt:1"):
    open_qa.read_qa_file(str(bad))
  with pytest.raises(FileNotFoundError):
    open_qa.read_qa_file(str(tmp_path / "missing.txt"))
  with pytest.raises(FileNotFoundError):
    open_qa.convert(str(tmp_path / "out"), wq_test=str(tmp_path / "missing.txt"))
  assert not (tmp_path / "out").exists()  # Nothing written when an input fails.
