"""The tables' report, from the seed files alone: Tables 1-3 (``table{1,2,3}.md`` and ``.csv``,
every cell the mean over seeds +- the 95% half-width), the pre-registered paired analysis, the
curves (``staleness.png``) and the paper-scale command sequence (``--scale=paper``).
``tables.py`` (the driver) calls :func:`render` with ``--render`` and :func:`paper_scale`."""

import csv
import glob
import json
import os
import statistics
from typing import Dict, List, Sequence

import numpy as np

from experiments.pipeline import paired
# The statistics live in experiments.pipeline.paired; these names are the tables' (and their
# tests').
from experiments.pipeline.paired import analysis_line, fmt, holm, mean_ci, p_values  # noqa: F401
from experiments.pipeline.paired import paired_difference, t_interval  # noqa: F401
from experiments.synthetic import table_seed

NEWS_ROW = table_seed.NEWS_ROW
ROWS = table_seed.ROWS
# The paper's numbers (EM on test; Table 2 on NQ dev: EM / zero-shot recall@5).
PAPER_TABLE1 = {"REALM (Wikipedia)": (39.2, 40.2, 46.8), "REALM (CC-News)": (40.4, 40.7, 42.9),
                "ORQA": (33.3, 36.4, 30.1)}
PAPER_TABLE2 = {
    "REALM": (38.2, 38.5), "REALM retriever + baseline encoder": (37.4, 38.5),
    "baseline retriever + REALM encoder": (35.3, 13.9), "baseline (ORQA)": (31.3, 13.9),
    "random uniform masks": (32.3, 24.2), "random span masks": (35.3, 26.1),
    "30x staler index": (28.7, 15.1), NEWS_ROW: None}
# Table 1's rows: label -> (Table 2's row, the paper's row).
TABLE1_ROWS = {"ORQA (baseline)": ("baseline (ORQA)", "ORQA"),
               "REALM, X = Z (the encyclopedia)": ("REALM", "REALM (Wikipedia)"),
               "REALM, X = news, Z = the encyclopedia": (NEWS_ROW, "REALM (CC-News)")}


# The pre-registered comparisons (experiments/NOTES.md, section 22), in the paper's direction:
# (label, outcome, row a, row b); the outcome is "recall" (zero-shot recall@5 of the row's
# retriever) or "em" (the fine-tuned row's exact match).
PRIMARY = (
    ("(a) REALM - ICT, zero-shot recall@5", "recall", "REALM", "baseline (ORQA)"),
    ("(b) REALM - ORQA, EM", "em", "REALM", "baseline (ORQA)"),
    ("(c) news REALM - ICT, zero-shot recall@5", "recall", NEWS_ROW, "baseline (ORQA)"),
    ("(d) news REALM - ORQA, EM", "em", NEWS_ROW, "baseline (ORQA)"),
)
SECONDARY = (
    ("salient - random span masks, EM", "em", "REALM", "random span masks"),
    ("salient - random span masks, zero-shot recall@5", "recall", "REALM", "random span masks"),
    ("random span - uniform masks, EM", "em", "random span masks", "random uniform masks"),
    ("random span - uniform masks, zero-shot recall@5", "recall", "random span masks",
     "random uniform masks"),
    ("fresh - 30x staler index, EM", "em", "REALM", "30x staler index"),
    ("fresh - 30x staler index, zero-shot recall@5", "recall", "REALM", "30x staler index"),
    ("REALM retriever + baseline encoder - ORQA, EM", "em",
     "REALM retriever + baseline encoder", "baseline (ORQA)"),
    ("baseline retriever + REALM encoder - ORQA, EM", "em",
     "baseline retriever + REALM encoder", "baseline (ORQA)"),
    ("REALM - REALM retriever + baseline encoder, EM", "em", "REALM",
     "REALM retriever + baseline encoder"),
    ("news - X = Z, EM", "em", NEWS_ROW, "REALM"),
    ("news - X = Z, zero-shot recall@5", "recall", NEWS_ROW, "REALM"),
)


def outcomes(run: Dict, outcome: str, row: str) -> str:
  """A row's per-question 0/1 string in one seed file: zero-shot hits of its retriever, or
  its fine-tuned exact matches."""
  if outcome == "recall":
    return run["zero_shot"][ROWS[row][0]]["hits"]
  return run["openqa"][row]["em_by_question"]


def comparison(runs: Sequence[Dict], outcome: str, a: str, b: str) -> Dict:
  return paired.comparison(runs, outcome, a, b, outcomes)


def analysis(runs: Sequence[Dict]) -> Dict[str, List]:
  """The six seeds' pre-registered analysis (NOTES section 22): ``paired.analysis`` of
  :data:`PRIMARY` and :data:`SECONDARY` over the seed files."""
  return paired.analysis(runs, PRIMARY, SECONDARY, outcomes)


def question_form(question: str) -> str:
  """A question with its names blanked: "In what year was X born?". A name is a run of
  capitalized words after the first word."""
  words = question.split()
  out, in_name = words[:1], False
  for w in words[1:]:
    name = w[:1].isupper()
    if name and in_name:  # The name goes on: keep one X, with the last word's punctuation.
      out[-1] = "X" + w[len(w.rstrip("?.,")):]
    else:
      out.append(("X" + w[len(w.rstrip("?.,")):]) if name else w)
    in_name = name
  return " ".join(out)


def turnover(runs: Sequence[Dict], outcome: str, a: str, b: str, min_form: int = 10) -> Dict:
  """What a paired comparison's per-question records say beneath its mean: per seed, the
  questions ``a`` gets right and ``b`` wrong (``gained``) and the reverse (``lost``); over
  seeds, how many questions are gained in more seeds than lost (``mostly_gained``) and the
  reverse (``mostly_lost``); and the mean difference by question form (forms of at least
  ``min_form`` questions; ``by_form``: form -> (questions, difference))."""
  gained, lost, net = [], [], None
  for r in runs:
    x = [c == "1" for c in outcomes(r, outcome, a)]
    y = [c == "1" for c in outcomes(r, outcome, b)]
    d = [int(u) - int(v) for u, v in zip(x, y)]
    gained.append(d.count(1))
    lost.append(d.count(-1))
    net = d if net is None else [n + e for n, e in zip(net, d)]
  forms: Dict[str, List[int]] = {}
  for i, q in enumerate(runs[0]["test_questions"]):
    forms.setdefault(question_form(q), []).append(i)
  by_form = {f: (len(ix), sum(net[i] for i in ix) / (len(ix) * len(runs)))
             for f, ix in forms.items() if len(ix) >= min_form}
  return dict(gained=gained, lost=lost, mostly_gained=sum(n > 0 for n in net),
              mostly_lost=sum(n < 0 for n in net), questions=len(net),
              by_form=dict(sorted(by_form.items(), key=lambda kv: -kv[1][0])))


def turnover_line(label: str, t: Dict) -> str:
  """One comparison's :func:`turnover` as a Markdown list line."""
  seeds = ", ".join(f"+{g}/-{l}" for g, l in zip(t["gained"], t["lost"]))
  forms = "; ".join(f"{f} ({n}) {100 * d:+.1f}" for f, (n, d) in t["by_form"].items())
  return (f"- {label}: questions gained/lost per seed {seeds}; over the seeds "
          f"{t['mostly_gained']} of {t['questions']} questions are gained more often than "
          f"lost, {t['mostly_lost']} lost more often; by question form (points): {forms}")


def record_cells(run: Dict) -> Dict[str, Dict[str, float]]:
  """Each row's EM and zero-shot recall@5 recomputed from one seed file's per-question
  records; raises ValueError when a record disagrees with the seed's own summary (its count of
  questions or its mean)."""
  cells = {}
  for label in ROWS:
    em_str, hits = outcomes(run, "em", label), outcomes(run, "recall", label)
    row = run["openqa"][label]
    for name, s, stored in (("EM", em_str, row["em"]),
                            ("zero-shot recall@5", hits, row["zero_shot_recall_at_5"])):
      # The summaries are float32 means (Keras metrics): equal to the count to ~1e-7.
      if len(s) != row["questions"] or abs(s.count("1") / len(s) - stored) > 1e-6:
        raise ValueError(f"seed {run['seed']} row {label!r}: {name} of its {len(s)} "
                         f"per-question records is {s.count('1') / max(1, len(s)):.6f}, the "
                         f"seed file says {stored:.6f} over {row['questions']:g} questions")
    cells[label] = {"em": em_str.count("1") / len(em_str),
                    "zero_shot_recall_at_5": hits.count("1") / len(hits)}
  return cells


# ------------------------------------------------------------------------------- output --
def write_table(out: str, name: str, header: Sequence[str], rows: Sequence[Sequence],
                note: str = "") -> str:
  md = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  md += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
  text = "\n".join(md) + ("\n\n" + note if note else "") + "\n"
  with open(os.path.join(out, f"{name}.md"), "w") as f:
    f.write(text)
  with open(os.path.join(out, f"{name}.csv"), "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(header)
    writer.writerows(rows)
  return text


class MixedSeedsError(ValueError):
  """Seed files whose code or config fingerprints differ."""


def load_seeds(results_dir: str) -> Dict[int, Dict]:
  """Every ``seed*.json`` of ``results_dir``, by seed; refuses to mix fingerprints."""
  seeds = {}
  for path in sorted(glob.glob(os.path.join(results_dir, "seed*.json"))):
    with open(path) as f:
      result = json.load(f)
    seeds[int(result["seed"])] = result
  if not seeds:
    raise FileNotFoundError(f"no seed*.json in {results_dir}: run python -m "
                            "experiments.synthetic.tables --seed=N first")
  check_same_fingerprints(seeds)
  return dict(sorted(seeds.items()))


def check_same_fingerprints(seeds: Dict[int, Dict]) -> None:
  """Raises ``MixedSeedsError`` naming the seeds and the fingerprints (and, for the config,
  the settings) that differ from the first seed's."""
  first, *rest = sorted(seeds)
  problems = []
  for seed in rest:
    for kind in ("code", "config"):
      a, b = seeds[first]["fingerprints"][kind], seeds[seed]["fingerprints"][kind]
      if a != b:
        line = f"seed {seed}'s {kind} fingerprint {b} differs from seed {first}'s {a}"
        if kind == "config":
          keys = sorted(k for k in set(seeds[first]["settings"]) | set(seeds[seed]["settings"])
                        if seeds[first]["settings"].get(k) != seeds[seed]["settings"].get(k))
          line += f" (settings: {', '.join(keys) or 'the YAML files'})"
        else:
          line += (f" (commits {seeds[first].get('git_commit', '?')[:10]} and "
                   f"{seeds[seed].get('git_commit', '?')[:10]}: table_seed.CODE_FILES changed)")
        problems.append(line)
  if problems:
    raise MixedSeedsError("refusing to mix seeds run with other code or settings; rerun them "
                          "at one commit:\n" + "\n".join(problems))


def plot_curves(out: str, seeds: Sequence[Dict], tags: Sequence[str]) -> str:
  """Mean over seeds (band: 95% CI) of each validation tag over pre-training steps, for the
  refreshed, stale and news runs (one panel per tag)."""
  # Inside: matplotlib's backend is chosen before pyplot is imported, and only for the plot.
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, len(tags), figsize=(4.5 * len(tags), 3.6), squeeze=False)
  every = seeds[0]["settings"]["refresh_every"]
  labels = {"realm": f"X = Z, refreshed every {every} steps",
            "stale": f"X = Z, {seeds[0]['settings']['staleness']}x staler", "news": "X = news"}
  for ax, tag in zip(axes[0], tags):
    for name, label in labels.items():
      series = [dict((int(s), v) for s, v in r["curves"].get(name, {}).get(tag, []))
                for r in seeds]
      steps = sorted(set.intersection(*[set(s) for s in series])) if series else []
      if not steps:
        continue
      values = np.array([[s[t] for t in steps] for s in series])
      mean = values.mean(0)
      ax.plot(steps, mean, marker="o", label=label)
      if len(series) > 1:
        half = np.array([mean_ci(values[:, j])[1] for j in range(len(steps))])
        ax.fill_between(steps, mean - half, mean + half, alpha=0.2)
    ax.set_title(tag)
    ax.set_xlabel("pre-training step")
    ax.grid(alpha=0.3)
  axes[0][0].legend(fontsize=8)
  fig.suptitle(f"REALM pre-training (validation), mean and 95% CI over {len(seeds)} seeds")
  fig.tight_layout()
  path = os.path.join(out, "staleness.png")
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


def setting_line(seeds: Dict[int, Dict], source: str = "") -> str:
  """The seeds' settings in a line (``source``: the folder of their files, named first)."""
  first = next(iter(seeds.values()))
  s, w = first["settings"], first["world"]
  minutes = [r["minutes"] for r in seeds.values()]
  cpus = sorted({r["cpu"] for r in seeds.values() if "cpu" in r})
  return (f"{f'Seed files {source}: ' if source else ''}"
          f"{len(seeds)} seed(s) ({', '.join(str(k) for k in seeds)}); synthetic world "
          f"{s['world_seed']} x{s['world_scale']:g} ({w['num_blocks']} blocks, "
          f"{w['test_questions']} test questions, {w['held_out_sentences']} held-out masked "
          f"sentences, {w['news_sentences']} news sentences); ICT {s['ict_steps']} steps; "
          f"REALM {s['realm_steps']} steps at "
          f"lr {s['realm_learning_rate']:g} (lr_retriever {s['lr_retriever']:g}), Open-QA "
          f"{s['openqa_steps']} steps; index refreshed every {s['refresh_every']} steps; "
          f"{min(minutes):.0f}-{max(minutes):.0f} min a seed on 2 CPU cores"
          f"{' (' + '; '.join(cpus) + ')' if cpus else ''}; code "
          f"{first['fingerprints']['code']}, config {first['fingerprints']['config']}")


def render(out: str, seeds: Dict[int, Dict], tables: Sequence[str], source: str = "") -> str:
  """Writes the requested tables (Markdown + CSV) and the curves' plot from the seed files
  (of the folder ``source``, which the tables name); returns the Markdown."""
  runs = list(seeds.values())
  setting = setting_line(seeds, source)
  printed = []
  # Every cell from the per-question records (record_cells checks them against the summary).
  cells = [record_cells(r) for r in runs]
  em = {label: [c[label]["em"] for c in cells] for label in ROWS}
  r5 = {label: [c[label]["zero_shot_recall_at_5"] for c in cells] for label in ROWS}
  if "1" in tables:
    body = [[label, fmt(em[row]), " / ".join(f"{v:.1f}" for v in PAPER_TABLE1[paper])]
            for label, (row, paper) in TABLE1_ROWS.items()]
    printed.append(write_table(out, "table1", ["model", "EM, synthetic world (%)",
                                               "paper EM NQ / WQ / CT"], body, setting))
  if "2" in tables:
    body = [[label, fmt(em[label]), fmt(r5[label]),
             f"{PAPER_TABLE2[label][0]:.1f} / {PAPER_TABLE2[label][1]:.1f}"
             if PAPER_TABLE2[label] else "not in Table 2 (Table 1's CC-News)"]
            for label in ROWS]
    found = analysis(runs)
    note = (setting + "\n\nPaired comparisons, as pre-registered (experiments/NOTES.md, "
            "section 22): a primary ordering **holds** when its interval over seeds (Student t) "
            "and its question-clustered bootstrap interval both exclude 0 in the paper's "
            "direction at Holm's level over the four primary comparisons.\n\nPrimary:\n"
            + "\n".join(analysis_line(c) for c in found["primary"])
            + "\n\nSecondary (95%, unadjusted):\n"
            + "\n".join(analysis_line(c) for c in found["secondary"])
            + "\n\nBeneath the primary means, the per-question records (a question is "
            "gained when the first row gets it and the second does not):\n"
            + "\n".join(turnover_line(label, turnover(runs, outcome, a, b))
                         for label, outcome, a, b in PRIMARY))
    z0 = runs[0]["zero_shot"]["ict"]
    if z0["never_covered_questions"]:
      split_rows = []
      for label in ("baseline (ORQA)", "REALM", NEWS_ROW, "30x staler index"):
        z = [r["zero_shot"][ROWS[label][0]] for r in runs]
        split_rows.append(f"| {label} | {fmt([x['overall'] for x in z])} | "
                          f"{fmt([x['covered'] for x in z])} | "
                          f"{fmt([x['never_covered'] for x in z])} |")
      note += ("\n\nZero-shot recall@5 (%) by whether the news covers the question's subject "
               f"({z0['covered_questions']} covered, {z0['never_covered_questions']} never "
               "covered; exact retrieval, per question):\n\n| retriever of | all | covered | "
               "never covered |\n|---|---|---|---|\n" + "\n".join(split_rows))
    printed.append(write_table(out, "table2", ["row", "EM (%)", "zero-shot recall@5 (%)",
                                               "paper EM / R@5"], body, note))
    plot_curves(out, runs, ["qa_recall@5", "recall@5", "retrieval_utility"])
  if "3" in tables:
    cols = table_seed.TABLE3_COLUMNS
    medians = {k: [r["table3"]["medians"][k] for r in runs] for k, _ in cols}
    body = [[label, f"{statistics.fmean(medians[k]):.3g}",
             " / ".join(f"{v:.3g}" for v in medians[k])] for k, label in cols]
    lines = [f"- \"{e['sentence']}\" -> {e['answer']!r}: " + ", ".join(
        f"{k} {e[k]:.3g}" for k, _ in cols) for e in runs[0]["table3"]["examples"]]
    note = (f"{setting}\n\nMedian over the held-out sentences whose answer another block "
            f"holds ({runs[0]['table3']['count']} in seed {runs[0]['seed']}). Its first "
            "examples:\n" + "\n".join(lines))
    printed.append(write_table(out, "table3", ["p(answer | x)", "median (mean over seeds)",
                                               "per seed"], body, note))
  return "\n\n".join(printed)


def paper_scale() -> None:
  """The paper-scale sequence of commands (TPU; nothing runs here)."""
  print("""Paper scale (Cloud TPU; see README "On Cloud TPU"):
  1. realm-convert --tf1_checkpoint=uncased_L-12_H-768_A-12/bert_model.ckpt \\
       --bert_config=uncased_L-12_H-768_A-12/bert_config.json \\
       --vocab_file=uncased_L-12_H-768_A-12/vocab.txt --output_dir=$B/converted/bert_base
  2. python -m data_prep.pipeline --corpus=enwiki-20181220-pages-articles.xml.bz2 \\
       --vocab_file=$B/converted/bert_base/vocab.txt --output_dir=$B/data --runner=DataflowRunner
     (and --masking=random_span / uniform into other directories for Table 2's ablations)
  3. realm-train --experiment=ict_paper --config_file=experiments/configs/ict_paper__tpu.yaml \\
       --tpu=$TPU --model_dir=$B/ict          (task.init_checkpoint=$B/converted/bert_base)
  4. realm-refresh --model_dir=$B/realm --index_dir=$B/realm_index --blocks_dir=$B/data/blocks \\
       --min_step_interval=500 &   (x30 for the 30x staler index)
     realm-train --experiment=realm_pretrain_paper \\
       --config_file=experiments/configs/realm_pretrain_paper__tpu.yaml --tpu=$TPU \\
       --model_dir=$B/realm   (retriever_init_checkpoint=$B/ict, reader_init_checkpoint=bert)
  5. realm-index build --model_dir=$B/realm --blocks_dir=$B/data/blocks --index_dir=$B/qa_index
     realm-train --experiment=openqa_nq_paper \\
       --config_file=experiments/configs/openqa_nq_paper__tpu.yaml --mode=train_and_eval ...
     (wq, ct alike; Table 2 mixes towers with retriever_/reader_init_checkpoint)
  6. realm-eval --model_dir=$B/openqa_nq --index_dir=$B/qa_index --dataset=nq --qa_dir=$B/qa
Released-model route: realm-convert the orqa_{nq,wq}_model_from_realm checkpoints
(--block_emb_checkpoint), realm-index import / build, realm-eval (README).
Paper (EM, NQ / WQ / CT):""")
  for name, values in PAPER_TABLE1.items():
    print(f"  {name:20s} " + " / ".join(f"{v:.1f}" for v in values))
