"""Adds REALM test seeds run in another output directory to the committed real-text results.

    python -m experiments.real_text.merge REBUILT_OUT SEED[,SEED...] [NEW_RESULTS]
        [--rows=zero_shot|openqa]   (default: both)

NOTES 37: issue 53's test directory was lost with its machine after REALM test seed 0 had run. Seed
0 keeps its committed zero-shot records; seeds 1-3 run from a rebuild of the start at fc79c9e into
REBUILT_OUT (``experiments.real_text.main --output_dir=REBUILT_OUT``). This adds each new seed's
per-question columns and table rows (from ``REBUILT_OUT/results``, or NEW_RESULTS: a copy of it kept
from the run that wrote them) and run records (``REBUILT_OUT/work``'s done files) to
``experiments/results/real_text/``, keeping every committed record as it is (the comparators are the
committed ICT, BM25 and ORQA records), and rewrites ``real_text_realm.md``'s seed table, plot and
pre-registered analysis over every seed merged so far (``text_realm.runs_from_records``: a seed
without Open-QA columns counts in the zero-shot comparisons only).

NOTES 39: seeds 1-3 run their zero-shot rows first (``--noopenqa``), merged with
``--rows=zero_shot``, then their Open-QA rows, merged with ``--rows=openqa``, which first checks
that they come from the REALM run whose zero-shot rows are committed.
"""

import csv
import os
import re
import shutil
from typing import Dict, List, Sequence, Tuple

from absl import app
from absl import flags

from experiments.pipeline.common import read_json
from experiments.real_text import report
from experiments.real_text import text_realm

RESULTS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "results", "real_text")
RUNS = "real_text_realm_runs"
# The seeds of NOTES 37's rule: the analysis is computed once all of them are merged.
PRE_REGISTERED = (0, 1, 2, 3)
ZERO_SHOT_ONLY = (0,)


class MergeError(ValueError):
  pass


def read_csv(path: str):
  with open(path, newline="", encoding="utf-8") as f:
    reader = csv.DictReader(f)
    return list(reader.fieldnames), list(reader)


def write_csv(path: str, fields: Sequence[str], rows: Sequence[Dict]) -> None:
  with open(path, "w", newline="", encoding="utf-8") as f:
    writer = csv.DictWriter(f, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)


def add_columns(path: str, new_path: str, keys: Sequence[str],
                columns: Sequence[str]) -> Tuple[List[str], List[Dict]]:
  """``path``'s per-question file with ``columns`` of ``new_path``'s added row by row, after
  checking that both hold the same questions (``keys``) and that none of ``columns`` is there
  already: ``(fields, rows)``."""
  fields, rows = read_csv(path)
  new_fields, new_rows = read_csv(new_path)
  present = [c for c in columns if c in fields]
  missing = [c for c in columns if c not in new_fields]
  if present or missing:
    raise MergeError(f"{path} already has {present}" if present else
                     f"{new_path} has no {missing}")
  if [[r[k] for k in keys] for r in rows] != [[r[k] for k in keys] for r in new_rows]:
    raise MergeError(f"{new_path} is not about the questions of {path} ({', '.join(keys)})")
  return fields + list(columns), [dict(r, **{c: n[c] for c in columns})
                                  for r, n in zip(rows, new_rows)]


def add_table_rows(path: str, new_path: str, first_column: str,
                   labels: Sequence[str]) -> Tuple[Tuple[List[str], List[Dict]], str]:
  """Results table ``path`` (a CSV and its Markdown twin) with the rows labelled ``labels`` of
  ``new_path``'s: in the CSV at its end, in the Markdown after its first table's last row.
  Returns the CSV's ``(fields, rows)`` and the Markdown's text."""
  fields, rows = read_csv(path)
  _, new_rows = read_csv(new_path)
  md, new_md = (os.path.splitext(p)[0] + ".md" for p in (path, new_path))
  with open(new_md, encoding="utf-8") as f:
    new_lines = {l.split(" | ")[0][2:]: l for l in f.read().splitlines() if l.startswith("| ")}
  by_label = {r[first_column]: r for r in new_rows}
  if any(r[first_column] in labels for r in rows) or not all(
      l in by_label and l in new_lines for l in labels):
    raise MergeError(f"{path} already has a row of {labels}, or {new_path} or {new_md} lacks "
                     "one")
  with open(md, encoding="utf-8") as f:
    text = f.read().splitlines()
  start = next(i for i, l in enumerate(text) if l.startswith("|"))
  end = next((i for i in range(start, len(text)) if not text[i].startswith("|")), len(text))
  text[end:end] = [new_lines[l] for l in labels]
  return (fields, rows + [by_label[l] for l in labels]), "\n".join(text) + "\n"


def merged_seeds(fields: Sequence[str], suffix: str = "") -> List[int]:
  """The REALM seeds with a column ``realm_<seed><suffix>`` among the per-question records'
  ``fields`` (``suffix`` "": the zero-shot column; "_openqa_em": the Open-QA rows)."""
  pattern = re.compile(rf"realm_(\d+){re.escape(suffix)}$")
  return sorted(int(m.group(1)) for m in map(pattern.match, fields) if m)


def realm_md(results: str, seeds: Sequence[int], openqa: Sequence[int], note: str) -> str:
  """``real_text_realm.md`` with its seed table's rows for ``seeds`` (their committed run
  records) and, after the curves, ``note`` and the analysis over :data:`PRE_REGISTERED` once
  ``seeds`` are all of them (computed from the committed per-question records; (b) and the
  mixed row over the seeds with Open-QA rows, ``openqa``, or not measured without any)."""
  with open(os.path.join(results, report.REALM_NAME + ".md"), encoding="utf-8") as f:
    text = f.read().splitlines()
  top = next(i for i, l in enumerate(text) if l.startswith("| seed |")) + 2
  runs = {s: read_json(os.path.join(results, RUNS, f"realm_{s}_done.json")) for s in seeds}
  plot = report.plot_realm_curves(os.path.join(results, report.REALM_NAME + ".png"), runs)
  lines = text[:top] + [report.realm_seed_row(s, r) for s, r in runs.items()]
  lines += ["", f"![curves]({os.path.basename(plot)})", "",
            "## The pre-registered analysis (experiments/NOTES.md sections 30 and 37)", "", note,
            ""]
  if tuple(seeds) == PRE_REGISTERED:
    pending = [s for s in PRE_REGISTERED if s not in ZERO_SHOT_ONLY and s not in openqa]
    if not openqa:
      lines += ["No seed's Open-QA rows are merged (NOTES 40: none of their REALM runs outlived "
                "its session), so (b) and the mixed row are not measured; Holm's family still "
                "holds (b), with p = 1.", ""]
    elif pending:
      lines += [f"(b) and the mixed row are over seeds {', '.join(map(str, openqa))}; "
                f"the Open-QA rows of seeds {', '.join(map(str, pending))} are not merged.",
                ""]
    lines += report.analysis_lines(text_realm.analysis(text_realm.runs_from_records(
        os.path.join(results, report.QUESTIONS_NAME + ".csv"),
        os.path.join(results, report.OPENQA_QUESTIONS_NAME + ".csv"), seeds)))
  else:
    lines.append(f"Not computed: the zero-shot rows of seeds {', '.join(map(str, seeds))} of "
                 f"{', '.join(map(str, PRE_REGISTERED))} are merged.")
  return "\n".join(lines) + "\n"


NOTE = ("Seed 0 has its zero-shot rows only: its model was lost with its machine before its "
        "Open-QA rows ran. Seeds 1-3 run from a rebuild of the start by the same recipe at "
        "fc79c9e, their zero-shot rows first (NOTES 39); a seed's Open-QA rows must come from the "
        "REALM run that gave its zero-shot rows, within one session here (NOTES 40); "
        "`real_text_realm_runs/rebuild_check.json` compares the rebuild with the committed "
        "records (the reader accuracies above are seed 0's readers'). (a) and REALM - BM25 are "
        "over seeds 0-3, (b) and the mixed row over seeds 1-3; the comparators are the "
        "committed ICT, BM25 and ORQA records. Merged: zero-shot rows of seeds {zero_shot}; "
        "Open-QA rows of seeds {openqa}.")
# A seed's run records kept in RUNS (its work directory's done files, "/" as "_"), by rows.
RUN_RECORDS = {"zero_shot": ("realm_{s}_done.json", "realm_{s}_test/done.json"),
               "openqa": ("realm_{s}_mixed_eval/done.json", "realm_{s}_gold_done.json",
                          "realm_{s}_openqa_done.json", "realm_{s}_openqa_eval/done.json")}
ROWS = tuple(RUN_RECORDS)


def merge(rebuilt_out: str, seeds: Sequence[int], results: str = RESULTS,
          note: str = NOTE, new_results: str = "", rows: Sequence[str] = ROWS) -> None:
  """Adds ``seeds``' ``rows`` ("zero_shot": the retrieval column, table row and run records;
  "openqa": the Open-QA columns, table rows and run records) from ``rebuilt_out`` (its
  ``results/``, or ``new_results``, and its ``work/``) to ``results``; everything is checked
  before the first file is written. Open-QA rows merged after their seed's zero-shot rows must
  come from the same REALM run: its zero-shot column and run record are checked against the
  committed ones."""
  if not rows or set(rows) - set(ROWS):
    raise MergeError(f"rows must be some of {ROWS}, not {rows}")
  new = new_results or os.path.join(rebuilt_out, "results")
  work = os.path.join(rebuilt_out, "work")
  questions = os.path.join(results, report.QUESTIONS_NAME + ".csv")
  csvs, mds, tables = {}, {}, []
  if "zero_shot" in rows:
    csvs[report.QUESTIONS_NAME] = add_columns(
        questions, os.path.join(new, report.QUESTIONS_NAME + ".csv"),
        ("question_index", "question", "answers"), [f"realm_{s}" for s in seeds])
    tables.append((report.RESULTS_NAME, "retriever", [report.realm_label(s) for s in seeds]))
  else:
    committed = read_csv(questions)[1]
    rebuilt = read_csv(os.path.join(new, report.QUESTIONS_NAME + ".csv"))[1]
    for s in seeds:
      done = os.path.join(results, RUNS, f"realm_{s}_done.json")
      if (f"realm_{s}" not in committed[0] or
          [r[f"realm_{s}"] for r in committed] != [r.get(f"realm_{s}") for r in rebuilt] or
          read_json(done) != read_json(os.path.join(work, f"realm_{s}_done.json"))):
        raise MergeError(f"REALM seed {s}'s Open-QA rows in {new} are not from the run whose "
                         f"zero-shot rows are committed ({done}, column realm_{s} of "
                         f"{questions})")
  if "openqa" in rows:
    csvs[report.OPENQA_QUESTIONS_NAME] = add_columns(
        os.path.join(results, report.OPENQA_QUESTIONS_NAME + ".csv"),
        os.path.join(new, report.OPENQA_QUESTIONS_NAME + ".csv"),
        ("question_index", "question"),
        [f"realm_{s}_{row}_{c}" for s in seeds for row in ("mixed", "openqa")
         for c in ("em", "prediction")])
    tables.append((report.OPENQA_NAME, "model", [label(s) for s in seeds
                                                 for label in (report.mixed_label,
                                                               report.realm_openqa_label)]))
  for name, first, labels in tables:
    csvs[name], mds[name] = add_table_rows(os.path.join(results, name + ".csv"),
                                           os.path.join(new, name + ".csv"), first, labels)
  records = {os.path.join(work, r.format(s=s)): os.path.join(results, RUNS,
                                                             r.format(s=s).replace("/", "_"))
             for s in seeds for kind in rows for r in RUN_RECORDS[kind]}
  missing = [p for p in records if not os.path.exists(p)]
  if missing:
    raise MergeError(f"run records missing: {missing}")
  for name, (fields, rows_) in csvs.items():
    write_csv(os.path.join(results, name + ".csv"), fields, rows_)
  for name, text in mds.items():
    with open(os.path.join(results, name + ".md"), "w", encoding="utf-8") as f:
      f.write(text)
  for source, target in records.items():
    shutil.copyfile(source, target)
  zero_shot = merged_seeds(read_csv(questions)[0])
  openqa = merged_seeds(
      read_csv(os.path.join(results, report.OPENQA_QUESTIONS_NAME + ".csv"))[0], "_openqa_em")
  text = realm_md(results, zero_shot, openqa, note.format(
      zero_shot=", ".join(map(str, zero_shot)), openqa=", ".join(map(str, openqa)) or "none"))
  with open(os.path.join(results, report.REALM_NAME + ".md"), "w", encoding="utf-8") as f:
    f.write(text)


def define_flags() -> None:
  """The flags (defined only when run as a program: the tests import this module)."""
  flags.DEFINE_list("rows", list(ROWS), "Which rows to merge: zero_shot, openqa or both.")


def main(argv: Sequence[str]) -> None:
  if len(argv) not in (3, 4):
    raise SystemExit(__doc__)
  merge(argv[1], [int(s) for s in argv[2].split(",")],
        new_results=argv[3] if len(argv) == 4 else "", rows=flags.FLAGS.rows)


def run():
  define_flags()
  app.run(main)


if __name__ == "__main__":
  run()
