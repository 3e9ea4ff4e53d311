"""Adds REALM test seeds run in another output directory to the committed real-text results.

    python -m experiments.real_text_merge REBUILT_OUT SEED[,SEED...]

NOTES 37: issue 53's test directory was lost with its machine after REALM test seed 0 had run.
Seed 0 keeps its committed zero-shot records; seeds 1-3 run from a rebuild of the start at
fc79c9e into REBUILT_OUT (``experiments/real_text.py --output_dir=REBUILT_OUT``). This adds each
new seed's per-question columns, table rows and run records (``REBUILT_OUT/work``'s done files)
to ``experiments/results/``, keeping every committed record as it is (the comparators are the
committed ICT, BM25 and ORQA records), and rewrites ``real_text_realm.md``'s seed table, plot and
pre-registered analysis over every seed merged so far (``text_realm.runs_from_records``: a seed
without Open-QA columns counts in the zero-shot comparisons only).
"""

import csv
import os
import re
import shutil
import sys
from typing import Dict, List, Sequence

from experiments import paired
from experiments import real_text as rt
from experiments import text_realm
from experiments.common import read_json

RESULTS = os.path.join(os.path.dirname(__file__), "results")
RUNS = "real_text_realm_runs"
# The seeds of NOTES 37's rule: the analysis is computed once all of them are merged.
PRE_REGISTERED = (0, 1, 2, 3)


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


def add_columns(path: str, new_path: str, keys: Sequence[str], columns: Sequence[str]) -> None:
  """Adds ``columns`` of the per-question file ``new_path`` to ``path``'s, row by row, after
  checking that both hold the same questions (``keys``) and that none of ``columns`` is there
  already."""
  fields, rows = read_csv(path)
  new_fields, new_rows = read_csv(new_path)
  present = [c for c in columns if c in fields]
  missing = [c for c in columns if c not in new_fields]
  if present or missing:
    raise MergeError(f"{path} already has {present}" if present else
                     f"{new_path} has no {missing}")
  if [[r[k] for k in keys] for r in rows] != [[r[k] for k in keys] for r in new_rows]:
    raise MergeError(f"{new_path} is not about the questions of {path} ({', '.join(keys)})")
  for row, new in zip(rows, new_rows):
    row.update({c: new[c] for c in columns})
  write_csv(path, fields + list(columns), rows)


def add_table_rows(path: str, new_path: str, first_column: str, labels: Sequence[str]) -> None:
  """Appends the rows labelled ``labels`` of results table ``new_path`` (a CSV and its Markdown
  twin) to ``path``'s: in the CSV at its end, in the Markdown after its first table's last
  row."""
  fields, rows = read_csv(path)
  _, new_rows = read_csv(new_path)
  by_label = {r[first_column]: r for r in new_rows}
  if any(r[first_column] in labels for r in rows) or not all(l in by_label for l in labels):
    raise MergeError(f"{path} already has a row of {labels}, or {new_path} lacks one")
  write_csv(path, fields, rows + [by_label[l] for l in labels])
  md, new_md = (p[:-len(".csv")] + ".md" for p in (path, new_path))
  with open(new_md, encoding="utf-8") as f:
    lines = {l.split(" | ")[0][2:]: l for l in f.read().splitlines() if l.startswith("| ")}
  with open(md, encoding="utf-8") as f:
    text = f.read().splitlines()
  start = next(i for i, l in enumerate(text) if l.startswith("|"))
  end = next((i for i in range(start, len(text)) if not text[i].startswith("|")), len(text))
  text[end:end] = [lines[l] for l in labels]
  with open(md, "w", encoding="utf-8") as f:
    f.write("\n".join(text) + "\n")


def merged_seeds(results: str) -> List[int]:
  """The REALM seeds with a zero-shot column in the committed per-question records."""
  fields, _ = read_csv(os.path.join(results, rt.QUESTIONS_NAME + ".csv"))
  return sorted(int(m.group(1)) for m in map(re.compile(r"realm_(\d+)$").match, fields) if m)


def rewrite_realm_md(results: str, note: str) -> None:
  """``real_text_realm.md`` below its seed table's header: one row per merged seed (from its
  committed run record), the curves of all of them, then the analysis over
  :data:`PRE_REGISTERED` once all are merged, preceded by ``note``."""
  path = os.path.join(results, rt.REALM_NAME + ".md")
  with open(path, encoding="utf-8") as f:
    text = f.read().splitlines()
  top = next(i for i, l in enumerate(text) if l.startswith("| seed |")) + 2
  seeds = merged_seeds(results)
  runs = {s: read_json(os.path.join(results, RUNS, f"realm_{s}_done.json")) for s in seeds}
  lines = text[:top]
  for s, r in runs.items():
    age = r["index_age"]["mean"]
    lines.append(f"| {s} | {r['steps']} | {r['seconds'] / 60:.1f} | {r['indexes_built']} | "
                 f"{'-' if age is None else f'{age:.1f}'} | "
                 + " | ".join(rt.first_last(rt.validation_curve(r, t))
                              for t in ("held_out_recall@5", "retrieval_utility",
                                        "qa_recall@5")) + " |")
  plot = rt.plot_realm_curves(os.path.join(results, rt.REALM_NAME + ".png"), runs)
  lines += ["", f"![curves]({os.path.basename(plot)})", "",
            "## The pre-registered analysis (experiments/NOTES.md sections 30 and 37)", "", note,
            ""]
  if tuple(seeds) == PRE_REGISTERED:
    result = text_realm.analysis(text_realm.runs_from_records(
        os.path.join(results, rt.QUESTIONS_NAME + ".csv"),
        os.path.join(results, rt.OPENQA_QUESTIONS_NAME + ".csv"), seeds))
    lines += ["Primary (Holm over both):"]
    lines += [paired.analysis_line(c) for c in result["primary"]]
    lines += ["", "Secondary (95%, unadjusted):"]
    lines += [paired.analysis_line(c) for c in result["secondary"]]
  else:
    lines.append(f"Not computed: seeds {', '.join(map(str, seeds))} of "
                 f"{', '.join(map(str, PRE_REGISTERED))} are merged.")
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")


NOTE = ("Seed 0 has its zero-shot rows only (its model was lost with its machine before its "
        "Open-QA rows ran); seeds 1-3 ran in full from a rebuild of the start by the same "
        "recipe at fc79c9e (`real_text_realm_runs/rebuild_check.json` compares the rebuild with "
        "the committed records). (a) and REALM - BM25 are over seeds 0-3, (b) and the mixed row "
        "over seeds 1-3; the comparators are the committed ICT, BM25 and ORQA records.")


def merge(rebuilt_out: str, seeds: Sequence[int], results: str = RESULTS,
          note: str = NOTE) -> None:
  new = os.path.join(rebuilt_out, "results")
  work = os.path.join(rebuilt_out, "work")
  add_columns(os.path.join(results, rt.QUESTIONS_NAME + ".csv"),
              os.path.join(new, rt.QUESTIONS_NAME + ".csv"),
              ("question_index", "question", "answers"), [f"realm_{s}" for s in seeds])
  add_columns(os.path.join(results, rt.OPENQA_QUESTIONS_NAME + ".csv"),
              os.path.join(new, rt.OPENQA_QUESTIONS_NAME + ".csv"), ("question_index", "question"),
              [f"realm_{s}_{row}_{c}" for s in seeds for row in ("mixed", "openqa")
               for c in ("em", "prediction")])
  add_table_rows(os.path.join(results, rt.RESULTS_NAME + ".csv"),
                 os.path.join(new, rt.RESULTS_NAME + ".csv"), "retriever",
                 [rt.realm_label(s) for s in seeds])
  add_table_rows(os.path.join(results, rt.OPENQA_NAME + ".csv"),
                 os.path.join(new, rt.OPENQA_NAME + ".csv"), "model",
                 [label(s) for s in seeds for label in (rt.mixed_label, rt.realm_openqa_label)])
  os.makedirs(os.path.join(results, RUNS), exist_ok=True)
  for s in seeds:
    for done in (f"realm_{s}_done.json", os.path.join(f"realm_{s}_test", "done.json"),
                 f"realm_{s}_openqa_done.json"):
      shutil.copyfile(os.path.join(work, done),
                      os.path.join(results, RUNS, done.replace(os.sep, "_")))
  rewrite_realm_md(results, note)


def main(argv: Sequence[str]) -> None:
  if len(argv) != 3:
    raise SystemExit(__doc__)
  merge(argv[1], [int(s) for s in argv[2].split(",")])


if __name__ == "__main__":
  main(sys.argv)
