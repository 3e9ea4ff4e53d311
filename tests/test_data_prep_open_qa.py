"""Tests of data_prep.open_qa on the real files in assets/ (assets/SOURCES.md)."""

import json
import logging
import pathlib

import pytest

from experiments import assets
from data_prep import open_qa



def test_convert_shared_data(tmp_path):
  counts = open_qa.convert(str(tmp_path), **open_qa.default_sources(str(assets.ROOT)))
  assert counts["nq-test"] == 3610
  assert counts["wq-test"] == 2032
  assert counts["ct-test"] == 694
  # ORQA's splits (its README): train / dev / test.
  assert (counts["wq-train"], counts["wq-dev"], counts["wq-test"]) == (3417, 361, 2032)
  assert (counts["ct-train"], counts["ct-dev"], counts["ct-test"]) == (1353, 133, 694)
  ct = [json.loads(l) for l in open(tmp_path / "ct-test.jsonl", encoding="utf-8")]
  raw = [json.loads(l) for l in open(assets.CURATED_TREC_TEST, encoding="utf-8")]
  assert [r["answers"] for r in ct] == [r["answer"] for r in raw]  # Patterns intact.
  assert ct[0]["answer_type"] == "regex" and "\\s?" in ct[0]["answers"][0]
  nq = json.loads(open(tmp_path / "nq-test.jsonl", encoding="utf-8").readline())
  assert nq["answer_type"] == "text" and isinstance(nq["answers"], list)
  dev = [json.loads(l)["question"] for l in open(tmp_path / "wq-dev.jsonl", encoding="utf-8")]
  assert all(open_qa.dev_mask(dev))
  manifest = json.loads((tmp_path / "qa_manifest.json").read_text(encoding="utf-8"))
  assert manifest["skipped"] and not any(manifest["skipped"].values())  # Nothing skipped.


def test_dev_rule_is_orqas_hash_bucket():
  """ORQA: dev when tf.strings.to_hash_bucket_fast(question, 100000) % 10 == 0 (a
  fingerprint hash, not Python's): checked against TF called directly, one by one."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  questions = [json.loads(l)["question"] for l in open(
      assets.WEBQUESTIONS_TRAIN, encoding="utf-8")][:300]
  want = [int(tf.strings.to_hash_bucket_fast(q, 100000)) % 10 == 0 for q in questions]
  assert open_qa.dev_mask(questions) == want and 10 < sum(want) < 50


def test_bad_qa_input(tmp_path, caplog):
  """A malformed line is skipped, logged with file:line and listed in the manifest; a file
  without a valid line, or a missing file, is an error and nothing is written."""
  bad = tmp_path / "bad.txt"
  bad.write_text('{"question": "q", "answer": ["a"]}\n{oops\n', encoding="utf-8")
  with caplog.at_level(logging.WARNING):
    records, skipped = open_qa.read_qa_file(str(bad))
  assert records == [{"question": "q", "answers": ["a"], "answer_type": "text"}]
  assert len(skipped) == 1 and skipped[0].startswith(f"{bad}:2: malformed JSON")
  assert f"{bad}:2" in caplog.text
  bad.write_bytes(b'{"question": "q", "answer": ["a"]}\n\xff\xfe\n')
  records, skipped = open_qa.read_qa_file(str(bad))
  assert len(records) == 1 and len(skipped) == 1 and "bad.txt:2: not UTF-8" in skipped[0]
  bad.write_text('{"question": "q", "answer": []}\n', encoding="utf-8")
  with pytest.raises(open_qa.QAFormatError, match="bad.txt:1"):
    open_qa.read_qa_file(str(bad))  # No valid record at all.
  with pytest.raises(FileNotFoundError):
    open_qa.read_qa_file(str(tmp_path / "missing.txt"))
  with pytest.raises(FileNotFoundError):
    open_qa.convert(str(tmp_path / "out"), wq_test=str(tmp_path / "missing.txt"))
  with pytest.raises(open_qa.QAFormatError, match="bad.txt"):
    open_qa.convert(str(tmp_path / "out"), ct_test=str(bad))
  assert not (tmp_path / "out").exists()  # Nothing written when an input fails.

  # Skipped lines are counted in the manifest; the counts are of the records written.
  train = tmp_path / "train.txt"
  train.write_text("".join(json.dumps({"question": f"q{i}", "answer": [f"a{i}"]}) + "\n"
                           for i in range(40)) + '{"question": "q"}\n', encoding="utf-8")
  test = tmp_path / "test.txt"
  test.write_text('{"question": "t", "answer": "x"}\n\n[1]\n{oops\n', encoding="utf-8")
  counts = open_qa.convert(str(tmp_path / "out"), wq_train=str(train), wq_test=str(test))
  assert counts["wq-train"] + counts["wq-dev"] == 40 and counts["wq-test"] == 1
  manifest = json.loads((tmp_path / "out" / "qa_manifest.json").read_text(encoding="utf-8"))
  assert manifest["counts"] == counts
  assert [s.split(": ")[0] for s in manifest["skipped"]["wq_train"]] == [f"{train}:41"]
  assert [s.split(": ")[0] for s in manifest["skipped"]["wq_test"]] == [
      f"{test}:3", f"{test}:4"]
  written = [json.loads(l) for l in open(tmp_path / "out" / "wq-test.jsonl", encoding="utf-8")]
  assert written == [{"question": "t", "answers": ["x"], "answer_type": "text"}]
