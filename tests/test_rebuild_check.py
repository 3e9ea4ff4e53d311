"""``experiments/dev/rebuild_check.py``: a rebuilt real-text start against the committed records
(NOTES 37), on constructed records."""

import collections
import json
import os

import numpy as np
import pytest

from experiments.dev import rebuild_check


def test_ranks_are_compared_question_by_question():
  committed = [0, 4, 5, 20, 3, 7]
  rebuilt = [0, 5, 4, 20, 2, 7]
  assert rebuild_check.compare_ranks(committed, rebuilt) == {
      "questions": 6, "equal_ranks": 3, "committed_recall@5": round(3 / 6, 4),
      "rebuilt_recall@5": round(3 / 6, 4), "gained@5": 1, "lost@5": 1}


def test_reader_curves_and_accuracy_are_compared_with_the_dev_run(tmp_path):
  """The pre-training data's counts (not its time) against the dev run's; a rebuilt reader
  phase's validation curve against its dev file's, step by step, and its
  masked-span accuracy; phases the rebuild has not reached are left out."""
  results, work = tmp_path / "results", tmp_path / "work"
  (results / "real_text_dev").mkdir(parents=True)
  work.mkdir()
  (results / "real_text_questions.csv").write_text("question_index,question,answers,ict\n")
  token = lambda v: {"token": {"value": v, "lo": 0, "hi": 1}}
  dev = {"mlm": {"validation": {"mlm_accuracy": [[200, 0.15], [400, 0.23]]}},
         "reading": {"validation": {"mlm_accuracy": [[100, 0.08]]}},
         "accuracy": {"sentences": 5, "null": token(0.1), "own_block": token(0.2)}}
  (results / "real_text_dev" / "minilm_mlm_800_dev.json").write_text(json.dumps(dev))
  (work / "minilm_mlm_done.json").write_text(json.dumps(
      {"validation": {"mlm_accuracy": [[200, 0.15], [400, 0.25]], "loss": [[200, 1.0]]}}))
  (work / "mlm_reader_done.json").write_text(json.dumps(
      {"validation": {"mlm_accuracy": [[100, 0.08]]}}))
  (work / "minilm_mlm_accuracy.json").write_text(json.dumps(
      {"sentences": 5, "null": token(0.03), "own_block": token(0.04)}))
  (work / "mlm_reader_accuracy.json").write_text(json.dumps(
      {"sentences": 5, "null": token(0.1), "own_block": token(0.3)}))
  (results / "real_text_dev" / "pretrain_done.json").write_text(json.dumps(
      {"sentences": 9, "spans_by_label": {"DATE": 2, "ORG": 3}, "seconds": 4.0}))
  (work / "pretrain_done.json").write_text(json.dumps(
      {"sentences": 9, "spans_by_label": {"DATE": 2, "ORG": 4}, "seconds": 5.0}))
  out = rebuild_check.check(str(work), str(results))
  assert set(out) == {"work", "pretrain_counts", "minilm_mlm", "mlm_reader"}
  assert out["pretrain_counts"] == {"same": False, "differing": {"spans_by_label": [
      {"DATE": 2, "ORG": 3}, {"DATE": 2, "ORG": 4}]}}
  mlm = out["minilm_mlm"]["curves"]
  assert list(mlm) == ["mlm_accuracy"] and mlm["mlm_accuracy"]["steps_agree"]
  assert mlm["mlm_accuracy"]["max_abs_difference"] == 0.02
  assert out["mlm_reader"]["curves"]["mlm_accuracy"]["max_abs_difference"] == 0
  assert out["minilm_mlm"]["accuracy"] == {"committed": {},
                                          "rebuilt": {"null": 0.03, "own_block": 0.04}}
  assert out["mlm_reader"]["accuracy"] == {"committed": {"null": 0.1, "own_block": 0.2},
                                           "rebuilt": {"null": 0.1, "own_block": 0.3}}
  assert os.path.basename(out["work"]) == "work"


def test_ranks_and_exact_matches_are_compared_with_the_committed_columns(tmp_path, monkeypatch):
  """The retrievers' ranks (from each one's saved top blocks) against their committed columns,
  on the same questions, and ORQA's exact matches on the committed Open-QA questions; other
  questions are refused."""
  results, work = tmp_path / "results", tmp_path / "work"
  results.mkdir()
  (work / "qa").mkdir(parents=True)
  (work / "qa" / "squad-test.jsonl").write_text("")
  (results / "real_text_questions.csv").write_text(
      "question_index,question,answers,bm25,ict\n0,a?,[],0,3\n1,b?,[],20,7\n2,c?,[],2,1\n")
  record = collections.namedtuple("R", "question")
  monkeypatch.setattr(rebuild_check.ts, "test_questions",
                      lambda w, n: [record("a?"), record("b?"), record("c?")])
  monkeypatch.setattr(rebuild_check.manifests, "read_blocks", lambda d: [])
  # The saved "top blocks" here hold the ranks themselves.
  monkeypatch.setattr(rebuild_check.ts, "first_hits", lambda top, bodies, records: top[:, 0])
  (work / "ict").mkdir()
  np.save(work / "ict" / "top_ids.npy", np.array([[3], [4], [1]]))
  (work / "openqa_eval").mkdir()
  test_file = work / "openqa-test.jsonl"
  test_file.write_text("".join(json.dumps({"question": q}) + "\n" for q in ("x?", "y?")))
  (work / "openqa_eval" / "done.json").write_text(json.dumps({"test_file": str(test_file)}))
  (results / "real_text_openqa_questions.csv").write_text(
      "question_index,question,orqa_em,orqa_prediction\n0,x?,1,p\n1,y?,0,q\n")
  monkeypatch.setattr(rebuild_check.report, "openqa_answers",
                      lambda w, source, f: [(1, "p"), (1, "r")])
  out = rebuild_check.check(str(work), str(results))
  assert out["questions"] == {"committed": 3, "rebuilt": 3, "same": True}
  assert "bm25" not in out  # not rebuilt yet
  assert out["ict"] == {"questions": 3, "equal_ranks": 2, "committed_recall@5": round(2 / 3, 4),
                        "rebuilt_recall@5": 1.0, "gained@5": 1, "lost@5": 0}
  assert out["orqa_em"] == {"questions": 2, "equal": 1, "committed_em": 0.5, "rebuilt_em": 1.0,
                            "gained": 1, "lost": 0}
  test_file.write_text(json.dumps({"question": "x?"}) + "\n" + json.dumps({"question": "z?"}))
  with pytest.raises(ValueError, match="not the committed Open-QA test questions"):
    rebuild_check.check(str(work), str(results))


def test_the_start_is_the_same_only_if_questions_ranks_and_counts_all_are():
  same = {"questions": {"same": True}, "pretrain_counts": {"same": True},
          **{k: {"questions": 5, "equal_ranks": 5} for k in rebuild_check.RETRIEVERS}}
  assert rebuild_check.start_differences(same) == []
  assert rebuild_check.start_differences(dict(same, ict={"questions": 5, "equal_ranks": 4})) == [
      "ict"]
  assert rebuild_check.start_differences(dict(same, pretrain_counts={"same": False})) == [
      "pretrain_counts"]
  missing = {k: v for k, v in same.items() if k not in ("questions", "hybrid")}
  assert rebuild_check.start_differences(missing) == ["questions", "hybrid"]
