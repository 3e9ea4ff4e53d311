r"""Real text: BM25, MiniLM untrained and ICT-trained, and Open-QA, on Wikipedia and SQuAD.

  python -m experiments.real_text --output_dir=real_text_out            # the real size
  python -m experiments.real_text --output_dir=tiny --max_articles=4 --max_paragraphs=4 \
      --max_pages=2 --nosalient_spans                                    # a quick look

The corpus is the enwiki dump slice (``assets/wikipedia``, 106 articles) and every paragraph of
SQuAD v1.1 dev (``assets/squad``, 2,067 paragraphs of 48 articles; a document per paragraph,
titled by its article), made into 288-wordpiece blocks with BERT's uncased vocabulary by the
project's own pipelines. The questions are SQuAD dev's, split by article (MD5 of the title:
60/20/20 train/dev/test, ``data_prep.squad``), so no article of a test question has a training
question. Two retrievers are scored on the test questions:

* **BM25** (``bm25s``, Lucene's variant, k1 = 1.5, b = 0.75, English stop words, no stemming)
  over ``title + body`` of every block;
* **MiniLM (untrained)**: all-MiniLM-L6-v2 converted by ``realm-convert --hf_dir``
  (``checkpoint_convert.convert_hf``) into REALM's retriever, as REALM would start from a BERT
  before ICT: its BERT real, its 128-wide projection freshly initialized (seeded by ``--seed``),
  queries ``[CLS] q [SEP]`` and blocks ``[CLS] title [SEP] body [SEP]``, exact inner-product
  search. From the same encoder pass, a third row shows what the weights do with the mean
  pooling and cosine they were trained with (sentence-transformers' recipe, not REALM's tower).

Recall@k: the share of test questions for which one of the top k blocks holds an answer, by
ORQA's ``HasAnswer`` on the block body (``realm_tf.openqa.inputs.has_answer``: the test of
``realm-eval``'s ``top_k_match``), so the numbers compare with ours.

Stages, each skipped when its output exists (delete a stage's directory to redo it):

1. ``corpus/``: the SQuAD paragraphs as JSON lines, with the dump through ``data_prep.blocks``
   into ``blocks/``; then salient spans (``data_prep.salient_spans``, spaCy) into
   ``sentences/`` unless ``--nosalient_spans``;
2. ``qa/``: ``squad-{train,dev,test}.jsonl`` and ``split.json`` (the articles of each split);
3. ``bm25/``: the top 20 blocks of each test question and its recall;
4. ``minilm_model/`` (the converted model directory), ``minilm/``: embeddings, top 20, recall
   (``--nominilm`` leaves them out: the encoder over every block is the slow part on a CPU);
5. ``ict_examples/``, ``ict_model/`` (ICT from the converted MiniLM: ``ict_params``),
   ``ict/`` and ``ict_index/``: the ICT tower's recall and its frozen index (``--noict``: not run);
6. ``minilm_reader_model/``, ``gold_reader/`` (stage A, ``experiments/gold_reader.py``: the
   reader trained on the train articles' questions with their own paragraphs, its dev EM and
   F1, and its EM on the Open-QA test sample read in each question's own paragraph: the
   gold-paragraph row), ``openqa/`` (ORQA's fine-tuning from it, best checkpoint on dev:
   ``openqa_params``), ``openqa_eval/`` (``realm-eval``'s evaluation on the test sample)
   (``--noopenqa``: not run);
7. with ``--realm_seeds``, REALM (``experiments/text_realm.py``): ``pretrain/`` (salient-span
   masked sentences of every block, whole blocks held out), ``minilm_mlm/`` (BERT's masked LM
   for the MiniLM reader, its fresh MLM head tied to the word embeddings), ``mlm_reader/`` (its
   reading warm start) and ``mlm_reader_distract/`` (the distractor phase), each with its
   masked-span accuracy, then per seed ``realm_<seed>/`` (REALM beside ``realm-refresh``),
   ``realm_<seed>_test/`` (its tower's test recall, as ICT's) and, with the Open-QA stages,
   the mixed row (ORQA's model reading the REALM tower's blocks) and REALM's own Open-QA row
   (stage A from REALM's reader, ORQA's fine-tuning from REALM's towers):
   ``realm_<seed>_{mixed_eval,gold_reader,openqa,openqa_eval}/``; ``--norealm_test`` (dev
   runs) stops after pre-training;
8. ``results/real_text_retrieval.{md,csv}`` (one row per retriever, 95% Wilson intervals over
   the questions), ``results/real_text_openqa.{md,csv}``, the per-question records
   ``results/real_text_questions.csv`` (each retriever's first-hit rank) and
   ``results/real_text_openqa_questions.csv`` (each Open-QA row's EM and prediction), and
   ``results/real_text_realm.md`` (REALM's data, reader, curves and the pre-registered
   analysis).

The stages live in ``experiments/text_stages.py`` (and the shared ``experiments/stages.py``:
training, configs, the frozen index); this driver reads the flags, runs the stages in order and
writes the tables. The trained stages' sizes are ``text_stages.Budget``'s (flags ``--ict_*``,
``--openqa_*``, ...): ORQA's recipe cut to fit about 100 minutes on 2 cores
(experiments/NOTES.md section 18); REALM's are ``text_realm.RealmBudget``'s (section 30).
"""

import csv
import dataclasses
import json
import os
import re
from typing import Callable, Dict, List, Optional, Sequence

from absl import flags
import numpy as np

from experiments import assets
from experiments import paired
from experiments import text_realm
from experiments import text_stages as ts
from experiments.common import Clock
from experiments.common import interval_text
from experiments.common import proportion
from experiments.common import read_json
from experiments.common import write_json
from realm_tf.binaries import cli
from realm_tf.data import manifests
from realm_tf.retrieval.sparse import hybrid

FLAGS = flags.FLAGS

# Names the tests and callers use, from the stages.
Budget, RealTextError, TOP_K = ts.Budget, ts.RealTextError, ts.TOP_K
RealmBudget = text_realm.RealmBudget
BM25 = "BM25"
MINILM = "MiniLM (untrained REALM tower)"
MINILM_MEAN = "MiniLM (mean-pooled, as trained)"
MINILM_ICT = "MiniLM + ICT (REALM tower)"
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
    lines += ["", "No REALM row: run with --realm_seeds (experiments/text_realm.py)."]
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


STAGE_NAMES = ("corpus", "spans", "questions", "bm25", "convert", "minilm", "ict_examples",
               "ict_train", "ict")


def check_options(clock: Clock, work: str, options: Dict) -> None:
  """Records the options of a work directory, or checks that they are the recorded ones: a
  stage is skipped when its output exists, so outputs of other options must not be reused.
  A recorded option this run does not pass (``realm.*`` in a run without ``--realm_seeds``)
  governs no stage of this run, so it is no conflict."""
  path = os.path.join(work, "options.json")
  if os.path.exists(path):
    recorded = read_json(path)
    changed = sorted(k for k in set(recorded) & set(options) if recorded[k] != options[k])
    if changed:
      raise RealTextError(
          f"{path} was made with other options ({', '.join(changed)}: "
          f"{[recorded.get(k) for k in changed]}, now {[options.get(k) for k in changed]}); "
          "pass another --output_dir, or delete that one to start again")
    added = sorted(set(options) - set(recorded))
    if added:
      # Options that did not exist when the directory was made: the stages they govern were
      # not run then, so they are recorded now and govern the stages still to run.
      clock.say(f"{path}: recording options it did not have: {', '.join(added)}")
      write_json(path, dict(recorded, **{k: options[k] for k in added}))
  else:
    write_json(path, options)


def run_experiment(output_dir: str, squad_file: str = str(assets.SQUAD_DEV),
                   wiki_dump: str = str(assets.ENWIKI_DUMP),
                   vocab_file: str = str(assets.BERT_VOCAB),
                   minilm_dir: str = str(assets.MINILM), block_seq_length: int = 288,
                   max_articles: int = 0, max_paragraphs: int = 0, max_pages: int = 0,
                   max_questions: int = 0,
                   split_fractions: Sequence[float] = (0.6, 0.2, 0.2),
                   salient_spans: bool = True, minilm: bool = True, seed: int = 0,
                   batch_size: int = 32, ict: bool = True, openqa: bool = True,
                   budget: Budget = Budget(), realm_seeds: Sequence[int] = (),
                   realm_budget: RealmBudget = RealmBudget(), realm_test: bool = True) -> Dict:
  """Every stage (module docstring); returns their summaries and the results' paths."""
  out = os.path.abspath(output_dir)
  work = os.path.join(out, "work")
  os.makedirs(work, exist_ok=True)
  for path, what in ((squad_file, "--squad_file"), (vocab_file, "--vocab_file")):
    if not os.path.exists(path):
      raise RealTextError(f"{what} not found: {path}")
  if ict and not minilm:
    raise RealTextError("the ICT stages start from the converted MiniLM: drop --nominilm or "
                        "pass --noict")
  if openqa and not ict:
    raise RealTextError("Open-QA fine-tunes from the ICT retriever: drop --noict or pass "
                        "--noopenqa")
  if realm_seeds and not (ict and salient_spans):
    raise RealTextError("REALM pre-trains from the ICT retriever on the salient spans: drop "
                        "--noict and --nosalient_spans, or pass --realm_seeds=''")
  budget.check()
  realm_budget.check()
  options = dict(
      squad_file=os.path.abspath(squad_file), vocab_file=os.path.abspath(vocab_file),
      wiki_dump=os.path.abspath(wiki_dump) if wiki_dump else "",
      minilm_dir=os.path.abspath(minilm_dir), block_seq_length=block_seq_length,
      max_articles=max_articles, max_paragraphs=max_paragraphs, max_pages=max_pages,
      max_questions=max_questions,
      split_fractions=list(split_fractions), seed=seed)
  if ict:
    options.update({k: v for k, v in dataclasses.asdict(budget).items()
                    if k.startswith("ict_")})
  if openqa:
    options.update({k: v for k, v in dataclasses.asdict(budget).items()
                    if not k.startswith("ict_")})
  if realm_seeds:
    # A REALM run's own settings are checked against its done file (run_realm).
    options.update({f"realm.{k}": v for k, v in realm_budget.shared().items()})
  clock = Clock("real_text")
  check_options(clock, work, options)
  once = clock.once
  stages = {"block_seq_length": block_seq_length, "budget": dataclasses.asdict(budget)}
  stages["corpus"] = once("corpus", os.path.join(work, "corpus", "done.json"), lambda: (
      ts.make_corpus(work, squad_file, wiki_dump, vocab_file, block_seq_length, max_articles,
                     max_paragraphs, max_pages)))
  if salient_spans:
    stages["spans"] = once("salient spans", os.path.join(work, "sentences_done.json"),
                           lambda: ts.annotate(work))
  stages["questions"] = once("questions", os.path.join(work, "qa", "split.json"), lambda: (
      ts.make_questions(work, squad_file, max_articles, max_paragraphs, split_fractions)))
  stages["bm25"] = once("BM25", os.path.join(work, "bm25", "done.json"),
                        lambda: ts.run_bm25(work, max_questions))
  if minilm:
    stages["convert"] = once("MiniLM conversion", os.path.join(work, "minilm_model_done.json"),
                             lambda: ts.convert_minilm(minilm_dir, vocab_file,
                                                       os.path.join(work, "minilm_model"), seed))
    stages["minilm"] = once("MiniLM retrieval", os.path.join(work, "minilm", "done.json"),
                            lambda: ts.run_minilm(work, max_questions, batch_size, clock.say))
  if ict:
    stages["ict_examples"] = once("ICT examples", os.path.join(work, "ict_examples_done.json"),
                                  lambda: ts.make_ict_examples(work, vocab_file,
                                                               block_seq_length))
    stages["ict_train"] = once("ICT training", os.path.join(work, "ict_model_done.json"),
                               lambda: ts.train_ict(clock, work, vocab_file, budget, seed))
    stages["ict"] = once("ICT retrieval", os.path.join(work, "ict", "done.json"), lambda: (
        ts.run_ict_retrieval(work, max_questions, batch_size, block_seq_length)))
    stages["hybrid"] = once("Hybrid retrieval (BM25 + ICT)",
                            os.path.join(work, "hybrid", "done.json"),
                            lambda: ts.run_hybrid(work, max_questions, batch_size))
  if openqa or realm_seeds:
    stages["reader_convert"] = once(
        "MiniLM reader conversion", os.path.join(work, "minilm_reader_model_done.json"),
        lambda: ts.convert_reader(minilm_dir, vocab_file,
                                  os.path.join(work, "minilm_reader_model")))
  if realm_seeds:
    stages.update(run_realm(clock, work, vocab_file, realm_seeds, realm_budget,
                            max_questions, batch_size, block_seq_length, seed, realm_test))
  if openqa:
    stages["gold_reader"] = once(
        "Gold-paragraph reader (stage A)", os.path.join(work, "gold_reader_done.json"),
        lambda: ts.train_gold_reader(work, squad_file, budget, seed, max_articles,
                                     max_paragraphs, clock.say))
    stages["gold_test"] = once(
        "Gold-paragraph test", os.path.join(work, "gold_reader", "test_done.json"),
        lambda: ts.evaluate_gold(work, squad_file, budget, seed, max_articles, max_paragraphs,
                                 max_questions))
    stages["openqa_train"] = once(
        "Open-QA training", os.path.join(work, "openqa_done.json"),
        lambda: ts.train_openqa(clock, work, vocab_file, budget, seed, block_seq_length))
    stages["openqa_eval"] = once(
        "Open-QA evaluation", os.path.join(work, "openqa_eval", "done.json"),
        lambda: ts.evaluate_openqa(work, budget, seed, max_questions))
    stages["bm25_reader"] = once(
        "BM25 + the reader", os.path.join(work, "bm25_reader_eval", "done.json"),
        lambda: ts.evaluate_bm25_reader(work, budget, seed, max_questions))
    if "hybrid" in stages:
      stages["hybrid_reader"] = once(
          "Hybrid + the reader", os.path.join(work, "hybrid_reader_eval", "done.json"),
          lambda: ts.evaluate_hybrid_reader(work, budget, seed, max_questions))
      # Dev said the hybrid reads better than the dense fine-tune (NOTES 32): fine-tune with it.
      stages["openqa_hybrid_train"] = once(
          "Open-QA training, hybrid beams", os.path.join(work, "openqa_hybrid_done.json"),
          lambda: ts.train_openqa(clock, work, vocab_file, budget, seed, block_seq_length,
                                  name="openqa_hybrid",
                                  index=os.path.basename(ts.sparse_index_dir(work)),
                                  beam="hybrid"))
      stages["openqa_hybrid_eval"] = once(
          "Open-QA evaluation, hybrid beams",
          os.path.join(work, "openqa_hybrid_eval", "done.json"),
          lambda: ts.evaluate_hybrid_reader(work, budget, seed, max_questions,
                                            name="openqa_hybrid", out="openqa_hybrid_eval"))
    if realm_seeds and realm_test:
      stages.update(run_realm_openqa(clock, work, vocab_file, squad_file, realm_seeds, budget,
                                     seed, max_articles, max_paragraphs, max_questions,
                                     block_seq_length))
  stages["results"] = write_results(out, stages, max_questions)
  labels = [(BM25, stages["bm25"])]
  if "minilm" in stages:
    labels += [(MINILM, stages["minilm"]["realm"]), (MINILM_MEAN, stages["minilm"]["mean"])]
  if "ict" in stages:
    labels.append((MINILM_ICT, stages["ict"]))
  for label, r in labels:
    clock.say(f"{label}: recall@1 {r['recall@1']:.3f}, @5 {r['recall@5']:.3f}, "
              f"@20 {r['recall@20']:.3f}")
  if "openqa_eval" in stages:
    e = stages["openqa_eval"]
    clock.say(f"Open-QA: EM {interval_text(**e['after']['exact_match'])}, top-5 match before "
              f"{e['before']['top_5_match']['value']:.3f}, after "
              f"{e['after']['top_5_match']['value']:.3f} ({e['test_questions']} test questions)")
  clock.say(f"finished in {clock.minutes() * 60:.1f} s; tables in {stages['results']['md']}")
  return stages


def check_seed_budget(done: str, seed: int, budget: RealmBudget) -> None:
  """Refuses to reuse REALM seed ``seed``'s run (its done file ``done``) made with other
  per-run settings than ``budget``'s; a field added since it ran was then at its default."""
  if not os.path.exists(done):
    return
  recorded = dict(dataclasses.asdict(RealmBudget()), **read_json(done)["budget"])
  recorded = {k: recorded[k] for k in budget.per_run()}
  if recorded != budget.per_run():
    changed = sorted(k for k, v in budget.per_run().items() if recorded[k] != v)
    raise RealTextError(f"{done}: REALM seed {seed} ran with "
                        f"{ {k: recorded[k] for k in changed} }, not "
                        f"{ {k: budget.per_run()[k] for k in changed} }; use another seed, or "
                        f"delete it, realm_{seed}/, realm_{seed}_first/ and their _index/ to run "
                        "it again")


def run_realm(clock: Clock, work: str, vocab_file: str, seeds: Sequence[int],
              budget: RealmBudget, max_questions: int, batch_size: int,
              block_seq_length: int, seed: int, test: bool = True) -> Dict[str, Dict]:
  """REALM's stages (``experiments/text_realm.py``): the pre-training sentences, the MiniLM
  reader's masked LM (``mlm_steps``), reading warm start and distractor phase
  (``distractor_steps``), each with its masked-span accuracy, then for each pre-training seed
  REALM beside its refresher and (``test``) its tower's test recall. Dev runs pass
  ``test=False``: their choices see dev questions and held-out sentences only."""
  once, out = clock.once, {}
  out["pretrain_data"] = once(
      "REALM pre-training sentences", os.path.join(work, "pretrain_done.json"),
      lambda: text_realm.make_pretrain_examples(work, vocab_file, budget))
  out["reader_start_accuracy"] = once(
      "Masked-span accuracy of the converted reader",
      os.path.join(work, "minilm_reader_accuracy.json"),
      lambda: text_realm.masked_span_accuracy(work, os.path.join(work, "minilm_reader_model"),
                                              budget))

  def reader_phase(key: str, name: str, label: str, train: Callable[[], Dict]) -> None:
    """A reader phase into ``<name>/`` (``<name>_done.json``), then its masked-span accuracy
    (``<name>_accuracy.json``), as ``out[key]`` and ``out[key + "_accuracy"]``."""
    out[key] = once(label, os.path.join(work, f"{name}_done.json"), train)
    out[f"{key}_accuracy"] = once(
        f"Masked-span accuracy after {label}", os.path.join(work, f"{name}_accuracy.json"),
        lambda: text_realm.masked_span_accuracy(work, os.path.join(work, name), budget))

  if budget.mlm_steps:
    reader_phase("reader_mlm", text_realm.MLM_DIR, "BERT's masked LM for the MiniLM reader",
                 lambda: text_realm.train_mlm(clock, work, vocab_file, budget, seed))
  reader_phase("mlm_reader", text_realm.READER_DIR, "the MLM reader's reading warm start",
               lambda: text_realm.train_reader(clock, work, vocab_file, budget, seed))
  if budget.distractor_steps:
    reader_phase("distract_reader", text_realm.DISTRACT_DIR,
                 "the MLM reader's distractor phase",
                 lambda: text_realm.train_reader(clock, work, vocab_file, budget, seed,
                                                 distractor_phase=True))
  for s in seeds:
    done = os.path.join(work, f"realm_{s}_done.json")
    check_seed_budget(done, s, budget)
    out[f"realm_{s}_train"] = once(
        f"REALM pre-training, seed {s}", done,
        lambda s=s: text_realm.pretrain_realm(clock, work, vocab_file, budget, s))
    if not test:
      continue
    out[f"realm_{s}"] = once(
        f"REALM retrieval, seed {s}", os.path.join(work, f"realm_{s}_test", "done.json"),
        lambda s=s: ts.run_tower_retrieval(work, text_realm.realm_dir(work, s),
                                           f"realm_{s}_test", max_questions, batch_size,
                                           block_seq_length))
  return out


def run_realm_openqa(clock: Clock, work: str, vocab_file: str, squad_file: str,
                     seeds: Sequence[int], budget: Budget, seed: int, max_articles: int,
                     max_paragraphs: int, max_questions: int,
                     block_seq_length: int) -> Dict[str, Dict]:
  """Open-QA rows of each REALM seed on the Open-QA test sample: the paper's mixed row (ORQA's
  fine-tuned model reading the REALM tower's top blocks), then REALM itself: stage A from
  REALM's pre-trained reader and ORQA's fine-tuning from REALM's towers over their index."""
  once, out = clock.once, {}
  for s in seeds:
    name = f"realm_{s}"
    out[f"{name}_mixed"] = once(
        f"REALM retriever + ORQA's reader, seed {s}",
        os.path.join(work, f"{name}_mixed_eval", "done.json"),
        lambda s=s: ts.evaluate_bm25_reader(work, budget, seed, max_questions,
                                            retriever=f"realm_{s}_test",
                                            out=f"realm_{s}_mixed_eval"))
    out[f"{name}_gold_reader"] = once(
        f"Stage A from REALM's reader, seed {s}", os.path.join(work, f"{name}_gold_done.json"),
        lambda s=s: ts.train_gold_reader(work, squad_file, budget, s, max_articles,
                                         max_paragraphs, clock.say, start=f"realm_{s}",
                                         name=f"realm_{s}_gold_reader"))
    out[f"{name}_openqa_train"] = once(
        f"Open-QA training from REALM, seed {s}", os.path.join(work, f"{name}_openqa_done.json"),
        lambda s=s: ts.train_openqa(clock, work, vocab_file, budget, s, block_seq_length,
                                    name=f"realm_{s}_openqa", retriever=f"realm_{s}",
                                    index=f"realm_{s}_test_index",
                                    reader=f"realm_{s}_gold_reader", sample_seed=seed))
    out[f"{name}_openqa_eval"] = once(
        f"Open-QA evaluation of REALM, seed {s}",
        os.path.join(work, f"{name}_openqa_eval", "done.json"),
        lambda s=s: ts.evaluate_openqa(work, budget, seed, max_questions,
                                       name=f"realm_{s}_openqa", index=f"realm_{s}_test_index",
                                       before=f"realm_{s}_test"))
  return out


def define_flags() -> None:
  """The command line's flags; defined only when the module runs as a program, so that the
  tests can import it beside the demo (which defines --output_dir and --seed too)."""
  flags.DEFINE_string("output_dir", None, "Where every stage writes (its work and results/).")
  flags.DEFINE_string("squad_file", str(assets.SQUAD_DEV), "SQuAD v1.1 JSON (or .json.gz).")
  flags.DEFINE_string("wiki_dump", str(assets.ENWIKI_DUMP),
                      "A MediaWiki XML dump added to the corpus ('' for none).")
  flags.DEFINE_string("vocab_file", str(assets.BERT_VOCAB), "WordPiece vocabulary (uncased).")
  flags.DEFINE_string("minilm_dir", str(assets.MINILM),
                      "The Hugging Face all-MiniLM-L6-v2 (config.json + model.safetensors).")
  flags.DEFINE_integer("block_seq_length", 288, "Wordpieces per block (the paper's 288).")
  flags.DEFINE_integer("max_articles", 0, "Keep only the first N SQuAD articles (0: all).")
  flags.DEFINE_integer("max_pages", 0, "Keep only the first N pages of the dump (0: all).")
  flags.DEFINE_integer("max_paragraphs", 0, "Keep only the first N paragraphs of each SQuAD "
                       "article, for the corpus and the questions alike (0: all).")
  flags.DEFINE_integer("max_questions", 0, "Score only the first N test questions (0: all).")
  flags.DEFINE_list("split_fractions", ["0.6", "0.2", "0.2"], "Train, dev, test shares of the "
                    "SQuAD articles.")
  flags.DEFINE_bool("salient_spans", True, "Also run the salient-span stage (spaCy NER) on the "
                    "blocks.")
  flags.DEFINE_bool("minilm", True, "Also run the MiniLM stages (the encoder over every block: "
                    "the slow part on a CPU).")
  flags.DEFINE_integer("seed", 0, "Seed of the MiniLM tower's fresh projection, of the data "
                       "order of the trained stages and of the Open-QA dev/test samples.")
  flags.DEFINE_integer("batch_size", 32, "Blocks per encoder call.")
  flags.DEFINE_bool("ict", True, "Also run the ICT stages (examples, training, retrieval).")
  flags.DEFINE_bool("openqa", True, "Also run the Open-QA stages (fine-tuning, test EM).")
  helps = {
      "ict_steps": "ICT training steps (ORQA: 100k).",
      "ict_batch_size": "ICT batch: blocks, and so in-batch negatives (ORQA: 4096).",
      "ict_query_seq_length": "ICT query (sentence) length in training (ORQA: 64).",
      "ict_block_seq_length": "ICT block length in training (ORQA: 288); the retrieval stage "
                              "embeds the blocks at --block_seq_length.",
      "ict_learning_rate": "ICT peak learning rate (ORQA: 1e-4).",
      "gold_learning_rate": "Stage A (the reader on its questions' own paragraphs, "
                            "experiments/gold_reader.py): peak learning rate.",
      "gold_epochs": "Stage A: passes over the training questions' windows.",
      "gold_batch_size": "Stage A: reader rows (paragraph windows) per step.",
      "openqa_steps": "Open-QA fine-tuning steps (ORQA: 100k).",
      "openqa_batch_size": "Questions per Open-QA step (ORQA: 1).",
      "openqa_learning_rate": "Open-QA peak learning rate (ORQA: 1e-5).",
      "reader_seq_length": "Reader input, question + block, in wordpieces (ORQA: 320).",
      "reader_beam_size": "Blocks read per question (ORQA: 5).",
      "retriever_beam_size": "Blocks retrieved per question for the retriever loss and "
                             "top-k match (ORQA: 5000).",
      "openqa_validations": "Dev validations (checkpoints) during fine-tuning; the best by dev "
                            "exact match is evaluated.",
      "openqa_dev_questions": "Dev questions of each validation (a seeded sample).",
      "openqa_test_questions": "Test questions of the Open-QA evaluation (a seeded sample).",
      "eval_batch_size": "Questions per batch when validating and evaluating Open-QA.",
  }
  flags.DEFINE_list("realm_seeds", [], "REALM pre-training seeds (experiments/text_realm.py): "
                    "each a REALM run from the ICT tower beside its refresher, and its tower's "
                    "recall (empty: no REALM stage).")
  flags.DEFINE_bool("realm_test", True, "Score each REALM tower on the test questions (dev "
                    "runs pass --norealm_test: their choices see no test number).")
  helps.update({
      "held_out_fraction": "REALM: share of blocks whose masked sentences are held out "
                           "(validation, masked-span accuracy); never trained on.",
      "realm_query_seq_length": "REALM: masked-sentence (query) length (the paper: 96).",
      "realm_max_masks": "REALM: predicted wordpieces of a salient span at most.",
      "mlm_steps": "BERT's masked LM for the MiniLM reader (its fresh MLM head) on the "
                   "training blocks' text, before the reading warm start: steps (0: none).",
      "mlm_batch_size": "Masked LM: windows per step.",
      "mlm_seq_length": "Masked LM: window length, [CLS] and [SEP] included.",
      "mlm_learning_rate": "Masked LM: peak learning rate (BERT's: 1e-4).",
      "mlm_validations": "Masked LM: validations on the held-out blocks' windows (and "
                         "checkpoints, so resumable points).",
      "reading_steps": "Reading warm start of the MiniLM reader: steps.",
      "reading_batch_size": "Reading warm start: sentences per step.",
      "reading_learning_rate": "Reading warm start: peak learning rate.",
      "reading_distractors": "Reading warm start: close blocks without the answer read beside "
                             "each sentence.",
      "reading_validations": "Reading warm start: validations on held-out sentences (and "
                             "checkpoints, so resumable points).",
      "distractor_steps": "The reading warm start's distractor phase after it (as the "
                          "demo's reader): steps (0: none; REALM then starts from the reading "
                          "warm start's reader).",
      "distractor_blocks": "Distractor phase: close blocks without the answer read beside "
                           "each sentence.",
      "realm_reader_seq_length": "REALM: reader input, query + block body (the paper: 384).",
      "realm_block_seq_length": "REALM: block length of the towers in training and in the "
                                "refresher's index (the test embeds blocks at "
                                "--block_seq_length).",
      "realm_reader_steps": "REALM: a first phase of this many steps at the one rate, so that "
                            "the reader learns REALM's own candidates before the towers' rate "
                            "rises to --realm_lr_retriever (0: one phase; the paper's).",
      "realm_steps": "REALM pre-training steps (after the first phase; the paper: 200k).",
      "realm_batch_size": "REALM: masked sentences per step (the paper: 512).",
      "realm_learning_rate": "REALM: peak learning rate (the paper: 3e-5).",
      "realm_lr_retriever": "REALM: the towers' learning rate over the reader's "
                            "(task.lr_retriever; the paper: 1, one rate).",
      "realm_freeze_blocks": "REALM: the block tower frozen (untied from the query tower) and "
                             "its index built once, as ORQA's fine-tuning does; a deviation "
                             "from the paper, where both towers train and the refresher "
                             "follows them.",
      "num_candidates": "REALM: blocks read per sentence, the null block among them (the "
                        "paper: 8).",
      "refresh_every": "REALM: checkpoint interval, so the refresher's cadence.",
      "validate_every": "REALM: validation interval (held-out sentences, dev questions).",
      "validation_sentences": "Held-out sentences per validation pass (REALM and the reading "
                              "warm start).",
      "qa_dev_questions": "REALM: dev questions of validation's zero-shot recall.",
      "accuracy_sentences": "Held-out sentences of the masked-span accuracy.",
  })
  defaults = dict(dataclasses.asdict(Budget()), **dataclasses.asdict(RealmBudget()))
  for field in dataclasses.fields(Budget) + dataclasses.fields(RealmBudget):
    default = defaults[field.name]
    define = (flags.DEFINE_bool if isinstance(default, bool) else
              flags.DEFINE_float if isinstance(default, float) else flags.DEFINE_integer)
    define(field.name, default, helps[field.name])


def main(argv):
  del argv
  if not FLAGS.output_dir:
    raise RealTextError("--output_dir is required")
  try:
    fractions = [float(x) for x in FLAGS.split_fractions]
  except ValueError as e:
    raise RealTextError(f"--split_fractions={FLAGS.split_fractions}: three numbers") from e
  run_experiment(FLAGS.output_dir, FLAGS.squad_file, FLAGS.wiki_dump, FLAGS.vocab_file,
                 FLAGS.minilm_dir, FLAGS.block_seq_length, FLAGS.max_articles,
                 FLAGS.max_paragraphs, FLAGS.max_pages, FLAGS.max_questions, fractions,
                 FLAGS.salient_spans, FLAGS.minilm, FLAGS.seed, FLAGS.batch_size,
                 FLAGS.ict, FLAGS.openqa,
                 Budget(**{f.name: FLAGS[f.name].value for f in dataclasses.fields(Budget)}),
                 [int(x) for x in FLAGS.realm_seeds],
                 RealmBudget(**{f.name: FLAGS[f.name].value
                                for f in dataclasses.fields(RealmBudget)}),
                 FLAGS.realm_test)


def run():
  define_flags()
  cli.run_main(main)



if __name__ == "__main__":
  run()
