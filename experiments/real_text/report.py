"""Real text's reports, from the stages' summaries: the retrieval and Open-QA tables (``.md``
and ``.csv``, 95% Wilson intervals), the per-question records, the hybrid's paired page, and
REALM's page with its validation curves and the pre-registered analysis. ``main.py`` runs the
stages and then these; every file goes to ``<output_dir>/results/`` under the names below.
"""

import csv
import json
import os
import re
from typing import Dict, List, Optional, Sequence

import numpy as np

from experiments.pipeline import paired
from experiments.pipeline.common import interval_text
from experiments.pipeline.common import proportion
from experiments.real_text import text_realm
from experiments.real_text import text_stages as ts
from realm_tf.data import manifests
from realm_tf.retrieval.sparse import hybrid

RealTextError, TOP_K = ts.RealTextError, ts.TOP_K
STAGE_NAMES = ("corpus", "spans", "questions", "bm25", "convert", "minilm", "ict_examples",
               "ict_train", "ict")
BM25 = "BM25"
MINILM = "MiniLM (untrained REALM tower)"
MINILM_MEAN = "MiniLM (mean-pooled, as trained)"
MINILM_ICT = "MiniLM + ICT (REALM tower)"
# A row label, frozen: the committed real_text_retrieval.{csv,md} key their rows by it (merge.py).
HYBRID = "Hybrid: BM25 + MiniLM + ICT (retrieval/hybrid.py)"
RESULTS_NAME = "real_text_retrieval"
OPENQA_NAME = "real_text_openqa"
REALM_NAME = "real_text_realm"
QUESTIONS_NAME = "real_text_questions"                # per test question: each retriever's rank
OPENQA_QUESTIONS_NAME = "real_text_openqa_questions"  # per Open-QA question: EM, prediction
HYBRID_NAME = "real_text_hybrid"
CSV_FIELDS = ("retriever", "recall@1", "recall@1_lo", "recall@1_hi", "recall@5", "recall@5_lo",
              "recall@5_hi", "recall@20", "recall@20_lo", "recall@20_hi", "test_questions",
              "blocks", "seconds")



# -------------------------------------------------------------------------------------- results --


def realm_seeds_of(stages: Dict[str, Dict]) -> List[int]:
  """The REALM seeds whose tower was scored on the test questions, in order."""
  return sorted(int(k.split("_")[1]) for k in stages if re.fullmatch(r"realm_\d+", k))


def realm_label(seed: int) -> str:
  return f"MiniLM + ICT + REALM, seed {seed} (REALM tower)"


def retrieval_rows(work: str, stages: Dict[str, Dict], max_questions: int) -> List[Dict]:
  """One row per retriever: its recall@k (from its stage) and their 95% Wilson intervals over
  the test questions, from the per-question ranks of its saved top 20 (``top_ids.npy``); each
  row's ``first``: those ranks (the number of top blocks where none holds an answer)."""
  bodies = [b["body"] for b in manifests.read_blocks(os.path.join(work, "blocks"))]
  records = ts.test_questions(work, max_questions)
  rows = [(dict(stages["bm25"], retriever=BM25, key="bm25"),
           os.path.join("bm25", "top_ids.npy"))]
  if "minilm" in stages:
    minilm, seconds = stages["minilm"], stages["minilm"]["seconds"] + stages["convert"]["seconds"]
    for key, label in (("realm", MINILM), ("mean", MINILM_MEAN)):
      rows.append((dict(minilm[key], retriever=label, test_questions=minilm["test_questions"],
                        blocks=minilm["blocks"], seconds=seconds,
                        key="minilm" if key == "realm" else "minilm_mean"),
                   os.path.join("minilm", f"{key}_top_ids.npy")))
  if "ict" in stages:
    ict = stages["ict"]
    seconds = ict["seconds"] + stages["ict_examples"]["seconds"] + stages["ict_train"]["seconds"]
    rows.append((dict(ict, retriever=MINILM_ICT, seconds=seconds, key="ict"),
                 os.path.join("ict", "top_ids.npy")))
  if "hybrid" in stages:
    rows.append((dict(stages["hybrid"], retriever=HYBRID, key="hybrid"),
                 os.path.join("hybrid", "top_ids.npy")))
  for seed in realm_seeds_of(stages):
    realm = stages[f"realm_{seed}"]
    seconds = realm["seconds"] + stages[f"realm_{seed}_train"]["seconds"]
    rows.append((dict(realm, retriever=realm_label(seed), seconds=seconds,
                       key=f"realm_{seed}"),
                 os.path.join(f"realm_{seed}_test", "top_ids.npy")))
  out = []
  for row, top_file in rows:
    first = ts.first_hits(np.load(os.path.join(work, top_file)), bodies, records)
    row["first"] = first
    for k in TOP_K:
      p = proportion(first < k)
      if abs(p["value"] - row[f"recall@{k}"]) > 1e-9:
        raise RealTextError(f"{os.path.join(work, top_file)}: recall@{k} {p['value']} is not "
                            f"the stage's {row[f'recall@{k}']} (a stage's outputs were changed)")
      row[f"recall@{k}_lo"], row[f"recall@{k}_hi"] = p["lo"], p["hi"]
    out.append(row)
  return out


def write_question_records(path: str, records, rows: Sequence[Dict]) -> None:
  """Per test question (in ``squad-test.jsonl`` order): each retriever's rank of its first
  answer-bearing block in its top 20 (20: none), so that any two rows can be paired."""
  with open(path, "w", newline="", encoding="utf-8") as f:
    writer = csv.writer(f)
    writer.writerow(["question_index", "question", "answers"] + [r["key"] for r in rows])
    for i, record in enumerate(records):
      writer.writerow([i, record.question, json.dumps(list(record.answers), ensure_ascii=False)]
                      + [int(r["first"][i]) for r in rows])


def _write_csv(path: str, fields: Sequence[str], rows: Sequence[Dict]) -> None:
  with open(path, "w", newline="", encoding="utf-8") as f:
    writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
      writer.writerow({k: (f"{row[k]:.4f}" if isinstance(row[k], float) and k != "seconds"
                           else row[k]) for k in fields})


def write_results(out: str, stages: Dict[str, Dict], max_questions: int = 0) -> Dict[str, str]:
  """``results/real_text_retrieval.{md,csv}``: one row per retriever with 95% intervals, then
  the stage times; with the Open-QA stages, ``results/real_text_openqa.{md,csv}``; with the
  hybrid, ``results/real_text_hybrid.md``."""
  work = os.path.join(out, "work")
  rows = retrieval_rows(work, stages, max_questions)
  results = os.path.join(out, "results")
  os.makedirs(results, exist_ok=True)
  csv_path = os.path.join(results, RESULTS_NAME + ".csv")
  _write_csv(csv_path, CSV_FIELDS, rows)
  write_question_records(os.path.join(results, QUESTIONS_NAME + ".csv"),
                         ts.test_questions(work, max_questions), rows)
  corpus, questions = stages["corpus"], stages["questions"]
  lines = [
      "# Retrieval on real text: SQuAD v1.1 dev + an enwiki slice",
      "",
      f"{corpus['blocks']} blocks of at most {stages['block_seq_length']} wordpieces from "
      f"{corpus['documents']} documents ({corpus['squad_paragraphs']} SQuAD paragraphs of "
      f"{corpus['squad_articles']} articles, and the dump's articles); "
      f"{rows[0]['test_questions']} test questions (SQuAD dev's questions, split by article: "
      + ", ".join(f"{n} {questions['questions'][n]}" for n in ("train", "dev", "test"))
      + "). Recall@k: a top-k block body holds an answer "
      "(ORQA's HasAnswer); in brackets its 95% Wilson interval over the test questions. "
      "Seconds: the retriever's stages (MiniLM: conversion, embedding and search; ICT: "
      "its examples, training, embedding, search and index).",
      "",
      "| retriever | recall@1 | recall@5 | recall@20 | test questions | seconds |",
      "|---|---|---|---|---|---|"]
  for row in rows:
    cells = [interval_text(row[f"recall@{k}"], row[f"recall@{k}_lo"], row[f"recall@{k}_hi"])
             for k in TOP_K]
    lines.append(f"| {row['retriever']} | {' | '.join(cells)} | {row['test_questions']} | "
                 f"{row['seconds']:.1f} |")
  lines += ["", "| stage | seconds |", "|---|---|"]
  for name in STAGE_NAMES:
    if name in stages:
      lines.append(f"| {name} | {stages[name]['seconds']:.1f} |")
  if "minilm" not in stages:
    lines += ["", "MiniLM not run (--nominilm)."]
  if "ict_train" in stages:
    budget = stages["budget"]
    lines += ["", f"ICT: {budget['ict_steps']} steps of batch {budget['ict_batch_size']}, "
              f"queries of {budget['ict_query_seq_length']} and blocks of "
              f"{budget['ict_block_seq_length']} wordpieces when training, lr "
              f"{budget['ict_learning_rate']} (ORQA: 100k steps of batch 4096, 64 and 288, "
              "lr 1e-4); evaluated on the blocks at their full length."]
  if not realm_seeds_of(stages):
    lines += ["", "No REALM row: run with --realm_seeds (experiments/real_text/text_realm.py)."]
  else:
    lines += ["", "REALM: pre-trained from the ICT tower with the MiniLM reader "
              "(results/real_text_realm.md); its tower is scored as ICT's."]
  lines.append("")
  md_path = os.path.join(results, RESULTS_NAME + ".md")
  with open(md_path, "w", encoding="utf-8") as f:
    f.write("\n".join(lines))
  paths = {"md": md_path, "csv": csv_path}
  if "openqa_eval" in stages:
    paths.update(write_openqa_results(results, stages, work))
  if "hybrid" in stages:
    paths.update(write_hybrid_results(results, stages, rows, work))
  if "pretrain_data" in stages:
    paths.update(write_realm_results(results, stages))
  return paths


def paired_text(a: Sequence[bool], b: Sequence[bool]) -> str:
  """Row a minus row b on the same questions, in points: the mean difference and its 95%
  question-level bootstrap interval (``paired.paired_difference``, one run)."""
  d = paired.paired_difference(["".join(str(int(x)) for x in a)],
                               ["".join(str(int(x)) for x in b)])
  lo, hi = d["questions_ci"]
  return f"{100 * d['mean']:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]"


def write_hybrid_results(results: str, stages: Dict[str, Dict], rows: Sequence[Dict],
                         work: str) -> Dict[str, str]:
  """``results/real_text_hybrid.md``: the fusion rule, the dev table that chose it, and the
  hybrid's rows paired against BM25's and ICT's on the same questions: recall@k on the test
  questions and, with the Open-QA stages, the fine-tuned model's EM with each retriever on the
  Open-QA sample."""
  h = stages["hybrid"]
  fusion = h["fusion"]
  first = {r["key"]: r["first"] for r in rows}
  row = next(r for r in rows if r["key"] == "hybrid")
  lines = [
      "# Hybrid retrieval on real text: BM25 and the ICT tower fused", "",
      f"Rule (`realm_tf/retrieval/sparse/hybrid.py`, recorded in each index's manifest): "
      f"{fusion['rule']}, BM25 weight {fusion['bm25_weight']}, over each retriever's top "
      f"{fusion['depth']}. Chosen on the {h['dev_questions']} dev questions (recall@k; the "
      "test questions were scored once, with the chosen rule):", "",
      "| dev | recall@1 | recall@5 | recall@20 |", "|---|---|---|---|"]
  for name, r in h["dev_recall"].items():
    lines.append(f"| {name} | " + " | ".join(f"{r[f'recall@{k}']:.3f}" for k in TOP_K) + " |")
  lines += ["", f"Test, paired on the same {h['test_questions']} questions (points; in brackets "
            "the 95% question-level bootstrap interval):", "",
            "| test | recall@1 | recall@5 | recall@20 |", "|---|---|---|---|",
            "| hybrid | " + " | ".join(f"{row[f'recall@{k}']:.3f}" for k in TOP_K) + " |"]
  for other, label in (("bm25", "BM25"), ("ict", "ICT")):
    lines.append(f"| hybrid - {label} | " + " | ".join(
        paired_text(first["hybrid"] < k, first[other] < k) for k in TOP_K) + " |")
  if "hybrid_reader" in stages:
    test_file = stages["openqa_eval"]["test_file"]
    sources = openqa_sources(stages)
    em = {k: [e for e, _ in openqa_answers(work, sources[k], test_file)]
          for k in ("hybrid", "bm25", "orqa", "hybrid_ft") if k in sources}
    lines += ["", f"Open-QA exact match, paired on the same {len(em['hybrid'])} test "
              f"questions ({OPENQA_NAME}.md). `hybrid`: the ORQA model (fine-tuned with dense "
              "beams) answering with --retriever=hybrid (its query tower's list fused with "
              "BM25's), each read block's span scores plus its block prior "
              f"`{stages['hybrid_reader'].get('block_prior', 'retriever')}` "
              "(`hybrid.BLOCK_PRIORS`); BM25: the same model reading BM25's top blocks; ICT: "
              "its own dense retrieval (the ORQA row)"
              + ("; `hybrid fine-tune`: ORQA's fine-tuning with hybrid beams, answering with "
                 "the hybrid" if "hybrid_ft" in em else "") + ":", "",
              "| test | exact match |", "|---|---|"]
    for key, label in (("hybrid", "hybrid"), ("hybrid_ft", "hybrid fine-tune")):
      if key in em:
        lines += [f"| {label} | {np.mean(em[key]):.3f} |",
                  f"| {label} - BM25 | {paired_text(em[key], em['bm25'])} |",
                  f"| {label} - ICT | {paired_text(em[key], em['orqa'])} |"]
    if "hybrid_ft" in em:
      lines.append(f"| hybrid fine-tune - hybrid | {paired_text(em['hybrid_ft'], em['hybrid'])} |")
  path = os.path.join(results, HYBRID_NAME + ".md")
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  return {"hybrid_md": path}


OPENQA_FIELDS = ("model", "checkpoint_step", "exact_match", "exact_match_lo", "exact_match_hi",
                 "read_match", "read_match_lo", "read_match_hi", "top_1_match",
                 "top_1_match_lo", "top_1_match_hi", "top_5_match", "top_5_match_lo",
                 "top_5_match_hi", "top_20_match", "top_20_match_lo", "top_20_match_hi",
                 "test_questions")
OPENQA_BEFORE = "before fine-tuning (ICT retriever)"
OPENQA_AFTER = "after fine-tuning (ICT retriever + MiniLM reader)"
OPENQA_GOLD = "gold paragraph (stage A reader, no retrieval)"
OPENQA_BM25 = "BM25 top blocks + the same fine-tuned reader"
OPENQA_HYBRID = "Hybrid top blocks + the same fine-tuned reader"
OPENQA_HYBRID_FT = "fine-tuned with hybrid beams, answering with the hybrid"


def mixed_label(seed: int) -> str:
  return f"REALM tower (seed {seed}) top blocks + the same fine-tuned reader (mixed row)"


def realm_openqa_label(seed: int) -> str:
  return f"REALM, seed {seed}: its towers + its reader through stage A, fine-tuned"


def openqa_sources(stages: Dict[str, Dict]) -> Dict[str, str]:
  """Per Open-QA row with per-question outputs: its key and its predictions file."""
  sources = {"gold": os.path.join("gold_reader", "test_predictions.jsonl"),
             "orqa": os.path.join("openqa_eval", "predictions_with_evidence.jsonl"),
             "bm25": os.path.join("bm25_reader_eval", "predictions_with_evidence.jsonl")}
  if "hybrid_reader" in stages:
    sources["hybrid"] = os.path.join("hybrid_reader_eval", "predictions_with_evidence.jsonl")
  if "openqa_hybrid_eval" in stages:
    sources["hybrid_ft"] = os.path.join("openqa_hybrid_eval", "predictions_with_evidence.jsonl")
  for seed in realm_seeds_of(stages):
    if f"realm_{seed}_openqa_eval" in stages:
      for key in (f"realm_{seed}_mixed", f"realm_{seed}_openqa"):
        sources[key] = os.path.join(f"{key}_eval", "predictions_with_evidence.jsonl")
  return {k: v for k, v in sources.items()
          if k != "gold" or "gold_test" in stages}


def write_openqa_records(path: str, work: str, test_file: str, sources: Dict[str, str]) -> None:
  """Per Open-QA test question (in ``test_file`` order): each row's exact match (0/1) and
  predicted answer."""
  with open(test_file, encoding="utf-8") as f:
    questions = [json.loads(line) for line in f if line.strip()]
  columns = {key: openqa_answers(work, source, test_file) for key, source in sources.items()}
  with open(path, "w", newline="", encoding="utf-8") as f:
    writer = csv.writer(f)
    writer.writerow(["question_index", "question"]
                    + [f"{k}_{c}" for k in columns for c in ("em", "prediction")])
    for i, q in enumerate(questions):
      writer.writerow([i, q["question"]] + [x for k in columns for x in columns[k][i]])


def openqa_answers(work: str, source: str, test_file: str) -> List[tuple]:
  """One Open-QA row's ``(exact match 0/1, predicted answer)`` per question of ``test_file``,
  from its predictions file ``work/source``."""
  with open(test_file, encoding="utf-8") as f:
    questions = [json.loads(line)["question"] for line in f if line.strip()]
  with open(os.path.join(work, source), encoding="utf-8") as f:
    rows = [json.loads(line) for line in f if line.strip()]
  if [r["question"] for r in rows] != questions:
    raise RealTextError(f"{os.path.join(work, source)}: not the questions of {test_file}")
  return [(int(bool(r["correct"] if "correct" in r else r["em"])), r["prediction"])
          for r in rows]


def openqa_rows(evaluation: Dict, training: Dict, gold: Optional[Dict] = None,
                gold_step: int = 0, bm25: Optional[Dict] = None,
                more: Sequence[tuple] = ()) -> List[Dict]:
  """The table's rows: the gold paragraph (``gold``: stage A's reader after ``gold_step``
  steps), before and after fine-tuning, BM25's blocks read by the same reader, then ``more``:
  ``(label, evaluation stage, checkpoint step)`` rows (REALM's) on the same questions."""
  rows = []
  runs = [(OPENQA_BEFORE, evaluation["before"], 0),
          (OPENQA_AFTER, evaluation["after"], training["best_step"])]
  if bm25 is not None:
    if bm25["test_file"] != evaluation["test_file"]:
      raise RealTextError(f"the BM25 row read {bm25['test_file']}, the Open-QA evaluation "
                          f"{evaluation['test_file']}: not the same questions")
    runs.append((OPENQA_BM25, bm25["after"], training["best_step"]))
  for label, other, step in more:
    if other["test_file"] != evaluation["test_file"]:
      raise RealTextError(f"the row {label!r} read {other['test_file']}, the Open-QA "
                          f"evaluation {evaluation['test_file']}: not the same questions")
    runs.append((label, other["after"], step))
  if gold is not None:
    if gold["test_file"] != evaluation["test_file"]:
      raise RealTextError(f"the gold-paragraph row read {gold['test_file']}, the Open-QA "
                          f"evaluation {evaluation['test_file']}: not the same questions")
    runs.insert(0, (OPENQA_GOLD, {"exact_match": gold["exact_match"]}, gold_step))
  for label, values, step in runs:
    row = {"model": label, "checkpoint_step": step,
           "test_questions": evaluation["test_questions"]}
    for name, p in values.items():
      row[name], row[f"{name}_lo"], row[f"{name}_hi"] = p["value"], p["lo"], p["hi"]
    for name in OPENQA_FIELDS:
      row.setdefault(name, "")
    rows.append(row)
  return rows


def write_openqa_results(results: str, stages: Dict[str, Dict], work: str) -> Dict[str, str]:
  """``results/real_text_openqa.{md,csv}``: EM and top-k match before and after fine-tuning,
  each with its 95% Wilson interval over the test questions."""
  evaluation, training, budget = stages["openqa_eval"], stages["openqa_train"], stages["budget"]
  gold = stages.get("gold_reader")
  more = []
  if "hybrid_reader" in stages:
    more.append((OPENQA_HYBRID, stages["hybrid_reader"], training["best_step"]))
  if "openqa_hybrid_eval" in stages:
    more.append((OPENQA_HYBRID_FT, stages["openqa_hybrid_eval"],
                 stages["openqa_hybrid_train"]["best_step"]))
  for seed in realm_seeds_of(stages):
    if f"realm_{seed}_openqa_eval" in stages:
      more += [(mixed_label(seed), stages[f"realm_{seed}_mixed"], training["best_step"]),
               (realm_openqa_label(seed), stages[f"realm_{seed}_openqa_eval"],
                stages[f"realm_{seed}_openqa_train"]["best_step"])]
  rows = openqa_rows(evaluation, training, stages.get("gold_test"),
                     gold["steps"] if gold else 0, stages.get("bm25_reader"), more)
  write_openqa_records(os.path.join(results, OPENQA_QUESTIONS_NAME + ".csv"),
                       work, evaluation["test_file"], openqa_sources(stages))
  csv_path = os.path.join(results, OPENQA_NAME + ".csv")
  _write_csv(csv_path, OPENQA_FIELDS, rows)
  dev = training["dev"].get("exact_match", [])
  lines = [
      "# Open-QA on real text: SQuAD v1.1 dev questions, split by article",
      "",
      "ORQA's fine-tuning from the ICT-trained MiniLM retriever with a MiniLM reader ("
      + (f"stage A's: the converted encoder and span scorer trained on the training "
         f"questions' own paragraphs, {gold['steps']} steps of {budget['gold_batch_size']} "
         f"windows, lr {budget['gold_learning_rate']}; dev EM "
         f"{interval_text(**gold['dev_exact_match'])}, F1 {gold['dev_f1']['value']:.3f} on "
         f"{gold['dev_questions']} dev questions"
         if gold else "the converted encoder and a fresh span scorer")
      + f") on the {stages['questions']['questions']['train']} "
      f"training questions, {budget['openqa_steps']} steps of batch "
      f"{budget['openqa_batch_size']}, lr {budget['openqa_learning_rate']}, retriever beam "
      f"{budget['retriever_beam_size']}, reader beam {budget['reader_beam_size']}, reader input "
      f"{budget['reader_seq_length']} wordpieces (ORQA: 100k steps of batch 1, beam 5000, "
      f"read 5, 320, lr 1e-5). Checkpoint by span exact match on "
      f"{budget['openqa_dev_questions']} dev questions (at most): "
      + ", ".join(f"step {s}: {v:.3f}" for s, v in dev) + f"; chosen: step "
      f"{training['best_step']}. Test: {evaluation['test_questions']} held-out-article "
      "questions (realm-eval's evaluation; official EM: ORQA's normalization, answers in "
      "whole words). In brackets: 95% Wilson intervals over the questions. Before "
      "fine-tuning the retriever is the ICT tower: its top-k match over the same questions "
      "and index. The gold-paragraph row reads each test question in the paragraph it was "
      "written from (no retrieval): the reader's ceiling. The BM25 row reads BM25's top "
      f"{budget['reader_beam_size']} blocks with the fine-tuned model (its span scores "
      "still add the query tower's score of each block); its top-k match is BM25's. The "
      "hybrid row is the fine-tuned model answering with --retriever=hybrid: its own query "
      "tower's top blocks fused with BM25's by the index's rule, each read block's span "
      "scores plus its block prior "
      f"({stages['hybrid_reader']['block_prior'] if 'hybrid_reader' in stages else '-'}; "
      f"{HYBRID_NAME}.md); its top-k match is the fused list's. The row fine-tuned with "
      "hybrid beams is ORQA's fine-tuning from the same starts with the hybrid as its "
      f"retriever (beam {hybrid.FUSION['depth']}, the rule's depth), answering the same way.",
      "",
      f"Read match: an answer inside the part of the {budget['reader_beam_size']} read blocks "
      f"that the reader's {budget['reader_seq_length']} wordpieces hold beside the question "
      f"(top-k match tests whole blocks of {stages['block_seq_length']}): the most that "
      "reading those blocks can get.",
      "",
      "| model | step | EM | read match | top-1 match | top-5 match | top-20 match | "
      "test questions |",
      "|---|---|---|---|---|---|---|---|"]
  for row in rows:
    cells = [(interval_text(row[n], row[f"{n}_lo"], row[f"{n}_hi"]) if row[n] != "" else "-")
             for n in ("exact_match", "read_match", "top_1_match", "top_5_match",
                       "top_20_match")]
    lines.append(f"| {row['model']} | {row['checkpoint_step']} | {' | '.join(cells)} | "
                 f"{row['test_questions']} |")
  lines += ["", "| stage | seconds |", "|---|---|"]
  for name in ("reader_convert", "gold_reader", "gold_test", "openqa_train", "openqa_eval",
               "bm25_reader", "hybrid_reader", "openqa_hybrid_train", "openqa_hybrid_eval"):
    if name in stages:
      lines.append(f"| {name} | {stages[name]['seconds']:.1f} |")
  lines.append("")
  md_path = os.path.join(results, OPENQA_NAME + ".md")
  with open(md_path, "w", encoding="utf-8") as f:
    f.write("\n".join(lines))
  return {"openqa_md": md_path, "openqa_csv": csv_path}


def first_last(curve: Sequence) -> str:
  """A validation curve ``[[step, value], ...]`` as "first -> last (at step N)"."""
  if not curve:
    return "-"
  return f"{curve[0][1]:.3f} -> {curve[-1][1]:.3f} (step {curve[-1][0]})"


CURVE_TAGS = ("held_out_recall@5", "qa_recall@5", "retrieval_utility")


def validation_curve(run: Dict, tag: str) -> List:
  """A REALM run's validation curve of ``tag``; for ``held_out_recall@5`` in a run from before
  it, the pass's ``recall@5``."""
  curve = run["validation"].get(tag, [])
  if not curve and tag == "held_out_recall@5":
    curve = run["validation"].get("recall@5", [])
  return curve


def plot_realm_curves(path: str, runs: Dict[int, Dict]) -> str:
  """Each REALM seed's validation curves (``CURVE_TAGS``, one panel each) over its steps."""
  # Inside: matplotlib's backend is chosen before pyplot is imported, and only for the plot.
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  titles = {"held_out_recall@5": "held-out sentences: recall@5",
            "qa_recall@5": "dev questions: recall@5",
            "retrieval_utility": "held-out sentences: retrieval utility (nats)"}
  fig, axes = plt.subplots(1, len(CURVE_TAGS), figsize=(4.5 * len(CURVE_TAGS), 3.6))
  for ax, tag in zip(axes, CURVE_TAGS):
    for seed, run in sorted(runs.items()):
      curve = validation_curve(run, tag)
      if curve:
        ax.plot([s for s, _ in curve], [v for _, v in curve], marker="o", label=f"seed {seed}")
    ax.set_title(titles[tag], fontsize=10)
    ax.set_xlabel("pre-training step")
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=8)
  fig.suptitle("REALM pre-training on real text (validation)")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def realm_seed_row(seed: int, run: Dict) -> str:
  """A REALM run's line in ``real_text_realm.md``'s seed table, from its run record."""
  age = run["index_age"]["mean"]
  return (f"| {seed} | {run['steps']} | {run['seconds'] / 60:.1f} | {run['indexes_built']} | "
          f"{'-' if age is None else f'{age:.1f}'} | "
          + " | ".join(first_last(validation_curve(run, tag)) for tag in
                       ("held_out_recall@5", "retrieval_utility", "qa_recall@5")) + " |")


def analysis_lines(result: Dict[str, List]) -> List[str]:
  """``text_realm.analysis``'s result as Markdown lines."""
  return (["Primary (Holm over both):"]
          + [paired.analysis_line(c) for c in result["primary"]]
          + ["", "Secondary (95%, unadjusted):"]
          + [paired.analysis_line(c) for c in result["secondary"]])


def write_realm_results(results: str, stages: Dict[str, Dict]) -> Dict[str, str]:
  """``results/real_text_realm.md``: the pre-training data's counts, the MLM reader's
  masked-span accuracy, each REALM run's curves and, once every seed has all its rows, the
  pre-registered analysis (``text_realm.analysis``, computed from the per-question records)."""
  data = stages["pretrain_data"]
  labels = ", ".join(f"{k} {v}" for k, v in sorted(data["spans_by_label"].items(),
                                                   key=lambda kv: -kv[1]))
  lines = [
      "# REALM on real text: salient-span pre-training on the corpus's own sentences", "",
      f"Pre-training data: {data['sentences']} sentences of the blocks, "
      f"{data['sentences_with_spans']} with a salient span ({data['annotator']}); "
      f"{data['spans']} spans: {labels}. Examples: {data['train_examples']} training, "
      f"{data['eval_examples']} held out (the sentences of {100 * data['eval_fraction']:.0f}% "
      "of the blocks, never trained on). Only the blocks' text: no question or answer.", "",
      "Masked-span accuracy of the MiniLM reader on held-out sentences (95% Wilson intervals): "
      "per mask token and per whole span, reading the null block (the sentence alone) or the "
      "sentence's own block (the trivial retrieval REALM forbids: the ceiling).", "",
      "| reader | sentences | null: token | null: span | own block: token | own block: span |",
      "|---|---|---|---|---|---|"]
  mlm = stages.get("reader_mlm", {})
  for key, label in (("reader_start_accuracy", "converted MiniLM, fresh MLM head"),
                     ("reader_mlm_accuracy",
                      f"after BERT's masked LM on the training blocks ({mlm.get('steps')} steps)"),
                     ("mlm_reader_accuracy",
                      f"after the reading warm start ({stages['mlm_reader']['steps']} steps)"),
                     ("distract_reader_accuracy",
                      f"after its distractor phase "
                      f"({stages.get('distract_reader', {}).get('steps')} steps)")):
    if key in stages:
      a = stages[key]
      cells = [interval_text(**a[b][u]) for b in ("null", "own_block") for u in ("token", "span")]
      lines.append(f"| {label} | {a['sentences']} | {' | '.join(cells)} |")
  seeds = sorted(int(k.split("_")[1]) for k in stages if re.fullmatch(r"realm_\d+_train", k))
  if seeds:
    lines += ["", "REALM pre-training (validation: held-out sentences' recall@5 over all of "
              "them, retrieval utility over a pass's sentences, dev questions' zero-shot "
              "recall@5; first -> last):", "",
              "| seed | steps | minutes | indexes built | mean index age | held-out recall@5 | "
              "retrieval utility | dev recall@5 |", "|---|---|---|---|---|---|---|---|"]
    lines += [realm_seed_row(seed, stages[f"realm_{seed}_train"]) for seed in seeds]
    plot = plot_realm_curves(os.path.join(results, REALM_NAME + ".png"),
                             {seed: stages[f"realm_{seed}_train"] for seed in seeds})
    lines += ["", f"![curves]({os.path.basename(plot)})"]
  tested = [s for s in realm_seeds_of(stages) if f"realm_{s}_openqa_eval" in stages]
  lines += ["", "## The pre-registered analysis (experiments/NOTES.md section 30)", ""]
  if tested and tested == realm_seeds_of(stages) == seeds:
    runs = text_realm.runs_from_records(os.path.join(results, QUESTIONS_NAME + ".csv"),
                                        os.path.join(results, OPENQA_QUESTIONS_NAME + ".csv"),
                                        tested)
    lines += [f"Seeds {', '.join(map(str, tested))}; every REALM run starts from the one ICT "
              "tower and MiniLM reader, and ORQA is one run: the interval over seeds is "
              "REALM's own spread.", ""] + analysis_lines(text_realm.analysis(runs))
  else:
    lines.append("Not computed: it needs every REALM seed's test recall and Open-QA rows.")
  path = os.path.join(results, REALM_NAME + ".md")
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  return {"realm_md": path}
