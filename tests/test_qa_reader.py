"""Tests of realm_tf.data.qa: reading QA files (skipping malformed lines) and dataset names."""

import json
import logging
import os
import pathlib
import subprocess
import sys

import pytest

from experiments import assets
from realm_tf.data import manifests
from realm_tf.data import qa

REPO = pathlib.Path(__file__).resolve().parents[1]


def _write(path, *lines):
  path.write_bytes(b"".join((l if isinstance(l, bytes) else l.encode("utf-8")) + b"\n"
                            for l in lines))
  return str(path)


def test_both_formats(tmp_path):
  path = _write(
      tmp_path / "qa.jsonl",
      json.dumps({"question": "who wrote it", "answers": ["Ana", "Bo"], "answer_type": "text"}),
      json.dumps({"question": "when", "answer": ["1820"]}),                # NQ-open / DrQA
      json.dumps({"question": "where", "answer": "Paris"}),                # one string
      json.dumps({"question": "what", "answers": ["a+"], "answer_type": "regex"}),
      "",                                                                  # ignored silently
      "   ",
      json.dumps({"question": "caf\u00e9?", "answers": ["\u00e9"]}, ensure_ascii=False))
  records, problems = qa.read_qa(path)
  assert problems == []
  assert records == [qa.QARecord("who wrote it", ["Ana", "Bo"], "text"),
                     qa.QARecord("when", ["1820"], "text"),
                     qa.QARecord("where", ["Paris"], "text"),
                     qa.QARecord("what", ["a+"], "regex"),
                     qa.QARecord("caf\u00e9?", ["\u00e9"], "text")]
  assert records[0].to_json() == {"question": "who wrote it", "answers": ["Ana", "Bo"],
                                  "answer_type": "text"}


def test_answer_type_override(tmp_path):
  path = _write(tmp_path / "ct.txt",
                json.dumps({"question": "q1", "answer": ["Paris|Lyon"]}),
                json.dumps({"question": "q2", "answers": ["x"], "answer_type": "text"}))
  records, _ = qa.read_qa(path, answer_type="regex")
  assert [r.answer_type for r in records] == ["regex", "regex"]
  records, _ = qa.read_qa(path, answer_type="text")
  assert [r.answer_type for r in records] == ["text", "text"]
  with pytest.raises(ValueError, match="answer_type"):
    qa.read_qa(path, answer_type="fuzzy")


MALFORMED = [
    (b"\xff\xfe oops", "not UTF-8"),
    (b"{oops", "malformed JSON"),
    (b'["question", "answer"]', "expected a JSON object"),
    (b'{"answer": ["a"]}', "missing or empty 'question'"),
    (b'{"question": "  ", "answer": ["a"]}', "missing or empty 'question'"),
    (b'{"question": 7, "answer": ["a"]}', "missing or empty 'question'"),
    (b'{"question": "q"}', "non-empty list of strings"),
    (b'{"question": "q", "answer": []}', "non-empty list of strings"),
    (b'{"question": "q", "answer": ["a", 3]}', "non-empty list of strings"),
    (b'{"question": "q", "answers": {"a": 1}}', "non-empty list of strings"),
    (b'{"question": "q", "answers": ["a"], "answer_type": "fuzzy"}', "unknown answer_type"),
]


@pytest.mark.parametrize("line,why", MALFORMED, ids=[w for _, w in MALFORMED])
def test_malformed_line_is_skipped_and_reported(tmp_path, caplog, line, why):
  good = json.dumps({"question": "q", "answer": ["a"]})
  path = _write(tmp_path / "bad.txt", good, "", line, good)
  with caplog.at_level(logging.WARNING):
    records, problems = qa.read_qa(path)
  assert records == [qa.QARecord("q", ["a"], "text")] * 2
  assert len(problems) == 1 and problems[0].startswith(f"{path}:3: "), problems
  assert why in problems[0]
  assert f"{path}:3: " in caplog.text


def test_every_malformed_line_is_reported(tmp_path):
  good = json.dumps({"question": "q", "answer": ["a"]})
  path = _write(tmp_path / "bad.txt", *[l for l, _ in MALFORMED], good)
  records, problems = qa.read_qa(path)
  assert len(records) == 1
  assert [p.split(": ", 1)[0] for p in problems] == [
      f"{path}:{i}" for i in range(1, len(MALFORMED) + 1)]
  for problem, (_, why) in zip(problems, MALFORMED):
    assert why in problem


def test_missing_and_empty_files(tmp_path):
  missing = str(tmp_path / "missing.jsonl")
  with pytest.raises(manifests.MissingDataError, match="missing.jsonl"):
    qa.read_qa(missing)
  bad = _write(tmp_path / "bad.jsonl", "", "{oops", '{"question": "q", "answer": []}')
  with pytest.raises(manifests.DataError) as e:
    qa.read_qa(bad)
  assert bad in str(e.value) and f"{bad}:2: malformed JSON" in str(e.value)
  assert not isinstance(e.value, manifests.MissingDataError)
  empty = _write(tmp_path / "empty.jsonl", "")
  with pytest.raises(manifests.DataError, match="empty.jsonl.*empty"):
    qa.read_qa(empty)


def test_resolve_dataset(tmp_path):
  for name, kind in (("nq", "text"), ("wq", "text"), ("ct", "regex")):
    _write(tmp_path / f"{name}-test.jsonl", json.dumps({"question": "q", "answers": ["a"]}))
    assert qa.resolve_dataset(name, str(tmp_path)) == (str(tmp_path / f"{name}-test.jsonl"),
                                                       kind)
  _write(tmp_path / "wq-dev.jsonl", json.dumps({"question": "q", "answers": ["a"]}))
  assert qa.resolve_dataset("wq", str(tmp_path), "dev") == (str(tmp_path / "wq-dev.jsonl"),
                                                            "text")
  with pytest.raises(manifests.DataError, match="--qa_dir.*data_prep.open_qa"):
    qa.resolve_dataset("nq", None)
  with pytest.raises(manifests.MissingDataError) as e:
    qa.resolve_dataset("ct", str(tmp_path), "train")
  assert str(tmp_path / "ct-train.jsonl") in str(e.value)
  assert "python -m data_prep.open_qa" in str(e.value)
  with pytest.raises(ValueError, match="split"):
    qa.resolve_dataset("nq", str(tmp_path), "validation")
  own = _write(tmp_path / "mine.jsonl", json.dumps({"question": "q", "answers": ["a"]}))
  assert qa.resolve_dataset(own, None) == (own, None)
  assert qa.resolve_dataset(own, str(tmp_path), "dev") == (own, None)
  with pytest.raises(manifests.MissingDataError, match="nqq.*nq, wq, ct"):
    qa.resolve_dataset(str(tmp_path / "nqq"), str(tmp_path))


def test_real_files():
  records, problems = qa.read_qa(str(assets.NQ_DEV))
  assert len(records) == 3610 and problems == []
  assert all(r.answer_type == "text" and r.answers for r in records)
  path, kind = qa.resolve_dataset(str(assets.CURATED_TREC_TEST), None)
  records, problems = qa.read_qa(path, answer_type=kind or "regex")
  assert len(records) == 694 and problems == []
  assert all(r.answer_type == "regex" for r in records)


def test_package_does_not_import_data_prep():
  code = ("import sys; import realm_tf.data.qa; "
          "assert not [m for m in sys.modules if m.split('.')[0] == 'data_prep']")
  subprocess.run([sys.executable, "-c", code], check=True, cwd=str(REPO), timeout=300,
                 env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO)))
