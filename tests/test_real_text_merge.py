"""``experiments/real_text/merge.py``: REALM test seeds from a rebuilt output directory added to
the committed real-text results (NOTES 37), on constructed results."""

import collections
import csv
import json
import os
import shutil

import numpy as np
import pytest

from experiments.pipeline import paired
from experiments.real_text import merge as merge_lib
from experiments.real_text import report
from experiments.real_text import text_realm

N, M = 30, 12  # test questions, Open-QA test questions
ALL_RECORDS = [r for kind in merge_lib.ROWS for r in merge_lib.RUN_RECORDS[kind]]


def write_csv(path, fields, rows):
  with open(path, "w", newline="", encoding="utf-8") as f:
    writer = csv.writer(f)
    writer.writerow(fields)
    writer.writerows(rows)


def results_dir(path, seeds, rng, openqa_seeds=None):
  """A results directory as ``real_text.write_results`` leaves it (its writers where they take
  rows), with REALM ``seeds`` (their Open-QA rows for ``openqa_seeds``, default all) and random
  records; its work directory's run records beside it."""
  openqa_seeds = seeds if openqa_seeds is None else openqa_seeds
  results, work = path / "results", path / "work"
  (results / merge_lib.RUNS).mkdir(parents=True)
  work.mkdir()
  records = [collections.namedtuple("R", "question answers")(f"q{i}?", ["a"]) for i in range(N)]
  report.write_question_records(str(results / "real_text_questions.csv"), records, [
      dict(key=k, first=rng.integers(0, 21, N))
      for k in ["bm25", "ict"] + [f"realm_{s}" for s in seeds]])
  em = ["orqa"] + [f"realm_{s}_{r}" for s in openqa_seeds for r in ("mixed", "openqa")]
  write_csv(results / "real_text_openqa_questions.csv",
            ["question_index", "question"] + [f"{k}_{c}" for k in em for c in ("em", "prediction")],
            [[i, f"o{i}?"] + [x for _ in em for x in (int(rng.random() < 0.5), "x")]
             for i in range(M)])
  labels = ["BM25", "MiniLM + ICT (REALM tower)"] + [report.realm_label(s) for s in seeds]
  models = [report.OPENQA_AFTER] + [label(s) for s in openqa_seeds
                                    for label in (report.mixed_label, report.realm_openqa_label)]
  for name, first, fields, rows in (
      (report.RESULTS_NAME, "retriever", report.CSV_FIELDS, labels),
      (report.OPENQA_NAME, "model", report.OPENQA_FIELDS, models)):
    report._write_csv(str(results / f"{name}.csv"), fields,  # pylint: disable=protected-access
                      [dict({f: "" for f in fields}, **{first: l, fields[2]: rng.random()})
                       for l in rows])
    (results / f"{name}.md").write_text("\n".join(
        ["# title", "", f"| {first} | recall@5 |", "|---|---|"]
        + [f"| {l} | {rng.random():.3f} |" for l in rows] + ["", "| stage | seconds |",
                                                              "|---|---|", "| x | 1.0 |", ""]))
  (results / "real_text_realm.md").write_text(
      "# REALM\n\nreaders\n\n| seed | steps | minutes |\n|---|---|---|\n| old | row | here |\n\n"
      "## The pre-registered analysis\n\nNot computed.\n")
  for s in seeds:
    run = {"steps": 300, "seconds": 60.0 * s, "indexes_built": 4, "index_age": {"mean": 7.0},
           "validation": {"held_out_recall@5": [[0, 0.2], [300, 0.1 * s]]}}
    for name in ALL_RECORDS:
      (work / name.format(s=s)).parent.mkdir(exist_ok=True)
      (work / name.format(s=s)).write_text(json.dumps(run))
    if s not in openqa_seeds:
      (results / merge_lib.RUNS / f"realm_{s}_done.json").write_text(json.dumps(run))
  return results


def rows(path):
  with open(path, newline="", encoding="utf-8") as f:
    return list(csv.DictReader(f))


def test_new_seeds_are_added_beside_the_committed_records(tmp_path):
  rng = np.random.default_rng(0)
  committed = results_dir(tmp_path / "committed", [0], rng, openqa_seeds=[])
  before = rows(committed / "real_text_questions.csv")
  rebuilt = tmp_path / "rebuilt"
  new = results_dir(rebuilt, [1], rng)
  merge_lib.merge(str(rebuilt), [1], str(committed), note="NOTE")
  after = rows(committed / "real_text_questions.csv")
  # The committed columns stay as they were (the rebuild's ICT differs here); seed 1's is added.
  assert [{k: r[k] for k in before[0]} for r in after] == before
  assert [r["realm_1"] for r in after] == [
      r["realm_1"] for r in rows(new / "real_text_questions.csv")]
  openqa = rows(committed / "real_text_openqa_questions.csv")
  assert "realm_0_openqa_em" not in openqa[0]
  rebuilt_openqa = rows(new / "real_text_openqa_questions.csv")
  for column in ("realm_1_mixed_em", "realm_1_openqa_em", "realm_1_openqa_prediction"):
    assert [r[column] for r in openqa] == [r[column] for r in rebuilt_openqa]
  # The table rows: in the CSV at its end, in the Markdown after the first table's last row.
  md = (committed / "real_text_retrieval.md").read_text().splitlines()
  at = md.index(next(l for l in md if l.startswith(f"| {report.realm_label(1)} |")))
  assert md[at - 1].startswith(f"| {report.realm_label(0)} |") and md[at + 1] == ""
  assert [r["retriever"] for r in rows(committed / "real_text_retrieval.csv")][-2:] == [
      report.realm_label(0), report.realm_label(1)]
  assert [r["model"] for r in rows(committed / "real_text_openqa.csv")][-2:] == [
      report.mixed_label(1), report.realm_openqa_label(1)]
  assert sorted(os.listdir(committed / merge_lib.RUNS)) == sorted(
      ["realm_0_done.json"] + [r.format(s=1).replace("/", "_") for r in ALL_RECORDS])
  realm = (committed / "real_text_realm.md").read_text()
  assert "| old | row | here |" not in realm and "| 0 | 300 | 0.0 | 4 | 7.0 |" in realm
  assert "| 1 | 300 | 1.0 | 4 | 7.0 | 0.200 -> 0.100 (step 300) |" in realm
  assert "NOTE" in realm and "Not computed: the zero-shot rows of seeds 0, 1 of 0, 1, 2, 3 are merged." in realm
  assert (committed / "real_text_realm.png").exists()
  with pytest.raises(merge_lib.MergeError, match="already has"):
    merge_lib.merge(str(rebuilt), [1], str(committed))
  # Once every pre-registered seed is in, the analysis is the records' (NOTES 37's rule).
  # Seeds 2 and 3's results kept elsewhere (a later run overwrites results/ with its own seeds).
  rebuilt23 = tmp_path / "rebuilt23"
  results_dir(rebuilt23, [2, 3], rng)
  (rebuilt23 / "results").rename(tmp_path / "kept")
  merge_lib.merge(str(rebuilt23), [2, 3], str(committed), new_results=str(tmp_path / "kept"))
  realm = (committed / "real_text_realm.md").read_text()
  result = text_realm.analysis(text_realm.runs_from_records(
      str(committed / "real_text_questions.csv"),
      str(committed / "real_text_openqa_questions.csv"), [0, 1, 2, 3]))
  assert [len(c["per_seed"]) for c in result["primary"]] == [4, 3]
  for c in result["primary"] + result["secondary"]:
    assert paired.analysis_line(c) in realm


def test_records_of_other_questions_are_refused(tmp_path):
  rng = np.random.default_rng(1)
  committed = results_dir(tmp_path / "committed", [0], rng, openqa_seeds=[])
  rebuilt = tmp_path / "rebuilt"
  new = results_dir(rebuilt, [1], rng)
  fields = list(rows(new / "real_text_questions.csv")[0])
  changed = rows(new / "real_text_questions.csv")
  changed[3]["question"] = "another?"
  write_csv(new / "real_text_questions.csv", fields, [list(r.values()) for r in changed])
  with pytest.raises(merge_lib.MergeError, match="not about the questions"):
    merge_lib.merge(str(rebuilt), [1], str(committed))


def test_a_failed_merge_writes_nothing(tmp_path):
  """Every check runs before the first write: a run record missing leaves the committed
  files as they were."""
  rng = np.random.default_rng(2)
  committed = results_dir(tmp_path / "committed", [0], rng, openqa_seeds=[])
  rebuilt = tmp_path / "rebuilt"
  results_dir(rebuilt, [1], rng)
  (rebuilt / "work" / "realm_1_gold_done.json").unlink()
  before = {p: p.read_bytes() for p in committed.rglob("*") if p.is_file()}
  with pytest.raises(merge_lib.MergeError, match="realm_1_gold_done.json"):
    merge_lib.merge(str(rebuilt), [1], str(committed))
  assert {p: p.read_bytes() for p in committed.rglob("*") if p.is_file()} == before


def test_zero_shot_rows_first_then_open_qa_rows_give_the_merge_of_both(tmp_path):
  """NOTES 39's order: each seed's zero-shot rows merged as they finish, their Open-QA rows
  later, from the same REALM runs, end where one merge of both ends."""
  rng = np.random.default_rng(3)
  once = results_dir(tmp_path / "once", [0], rng, openqa_seeds=[])
  twice = tmp_path / "twice"
  shutil.copytree(once, twice)
  rebuilt = tmp_path / "rebuilt"
  results_dir(rebuilt, [1, 2, 3], rng)
  merge_lib.merge(str(rebuilt), [1, 2, 3], str(once), note="{zero_shot} / {openqa}")
  for s in (1, 2, 3):
    merge_lib.merge(str(rebuilt), [s], str(twice), note="{zero_shot} / {openqa}",
                    rows=["zero_shot"])
  realm = (twice / "real_text_realm.md").read_text()
  assert "0, 1, 2, 3 / none" in realm and "No seed's Open-QA rows are merged" in realm
  # With zero-shot rows alone, (a) and REALM - BM25 are computed; (b) and the mixed row are not
  # measured, and (b) stays in Holm's family (NOTES 40).
  assert "- (a) REALM - ICT, zero-shot recall@5: " in realm and "Holm level 97.50%" in realm
  assert "- (b) REALM - ORQA, EM: **not measured" in realm
  assert "- REALM retriever + ORQA's reader - ORQA, EM: **not measured" in realm
  assert "- REALM - BM25, zero-shot recall@5: " in realm
  assert "realm_1_openqa_em" not in rows(twice / "real_text_openqa_questions.csv")[0]
  merge_lib.merge(str(rebuilt), [1], str(twice), note="{zero_shot} / {openqa}", rows=["openqa"])
  realm = (twice / "real_text_realm.md").read_text()
  assert "0, 1, 2, 3 / 1" in realm
  assert "over seeds 1; the Open-QA rows of seeds 2, 3 are not merged" in realm
  with pytest.raises(merge_lib.MergeError, match="already has"):
    merge_lib.merge(str(rebuilt), [1], str(twice), rows=["openqa"])
  merge_lib.merge(str(rebuilt), [2, 3], str(twice), note="{zero_shot} / {openqa}",
                  rows=["openqa"])
  files = sorted(p.relative_to(once) for p in once.rglob("*") if p.is_file())
  assert files == sorted(p.relative_to(twice) for p in twice.rglob("*") if p.is_file())
  for f in files:
    assert (once / f).read_bytes() == (twice / f).read_bytes(), f


def test_open_qa_rows_of_another_run_are_refused(tmp_path):
  """Open-QA rows merged after their seed's zero-shot rows must come from that REALM run."""
  rng = np.random.default_rng(4)
  committed = results_dir(tmp_path / "committed", [0], rng, openqa_seeds=[])
  first = tmp_path / "first"
  results_dir(first, [1], rng)
  merge_lib.merge(str(first), [1], str(committed), rows=["zero_shot"])
  other = tmp_path / "other"
  results_dir(other, [1], rng)  # another run of seed 1: other ranks
  before = {p: p.read_bytes() for p in committed.rglob("*") if p.is_file()}
  with pytest.raises(merge_lib.MergeError, match="not from the run"):
    merge_lib.merge(str(other), [1], str(committed), rows=["openqa"])
  assert {p: p.read_bytes() for p in committed.rglob("*") if p.is_file()} == before
  # The same ranks, but another run record: refused too.
  (other / "results" / "real_text_questions.csv").write_bytes(
      (first / "results" / "real_text_questions.csv").read_bytes())
  (other / "work" / "realm_1_done.json").write_text(json.dumps({"steps": 299}))
  with pytest.raises(merge_lib.MergeError, match="not from the run"):
    merge_lib.merge(str(other), [1], str(committed), rows=["openqa"])
  with pytest.raises(merge_lib.MergeError, match="rows must be"):
    merge_lib.merge(str(first), [1], str(committed), rows=["zero-shot"])
