"""REALM on real text (``experiments/real_text/text_realm.py``): the pre-training files are made of
the corpus's text alone, and the pre-registered analysis on constructed records."""

import collections
import csv
import dataclasses
import glob
import gzip
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from experiments import assets
from experiments.pipeline import paired
from experiments.real_text import text_realm
from experiments.real_text import text_stages as ts
from realm_tf.data import features as features_lib
from realm_tf.tokenization import RealmTokenizer

# -------------------------------------------------------------------------------- analysis --


def constructed_runs(gains, n=400, base=0.5, seed=0):
  """Seeds whose REALM recall@5 differs from ICT's by ``gains[s]`` (a share of the questions
  turned from miss to hit), with EM rows equal to ORQA's (no difference)."""
  rng = np.random.default_rng(seed)
  ict = (rng.random(n) < base)
  orqa = "".join("1" if x else "0" for x in rng.random(n) < 0.3)
  runs = []
  for g in gains:
    realm = ict.copy()
    # A gain turns misses into hits; a loss, hits into misses.
    turned = np.flatnonzero(~realm if g > 0 else realm)[:int(round(abs(g) * n))]
    realm[turned] = g > 0
    first = {text_realm.ICT: np.where(ict, 0, 20), text_realm.REALM: np.where(realm, 3, 20),
             text_realm.BM25: np.where(rng.random(n) < 0.8, 1, 20)}
    em = {text_realm.ORQA: [c == "1" for c in orqa], text_realm.REALM: [c == "1" for c in orqa],
          text_realm.MIXED: [c == "1" for c in orqa]}
    runs.append(text_realm.seed_outcomes(first, em))
  return runs, ict


def test_seed_outcomes_hits_by_rank():
  out = text_realm.seed_outcomes({"A": [0, 4, 5, 19, 20]}, {"B": [True, False]})
  assert out["recall@5"]["A"] == "11000"
  assert out["recall@20"]["A"] == "11110"
  assert out["em"]["B"] == "10"


def test_a_steady_gain_holds_and_no_difference_does_not():
  runs, ict = constructed_runs([0.08, 0.10, 0.09])
  result = text_realm.analysis(runs)
  (a, b), (mixed, bm25) = result["primary"], result["secondary"]
  # (a): the mean of the per-seed differences, computed directly.
  expected = np.mean([np.mean([c == "1" for c in r["recall@5"]["REALM"]]) - ict.mean()
                      for r in runs])
  assert a["mean"] == pytest.approx(expected)
  assert a["per_seed"] == pytest.approx([0.08, 0.10, 0.09])
  assert a["verdict"] == "holds"
  assert a["seeds_adjusted"][0] > 0 and a["questions_adjusted"][0] > 0
  # (b): REALM's EM equals ORQA's question by question: a difference of exactly 0.
  assert b["mean"] == 0 and b["verdict"] == "not established"
  assert mixed["verdict"].startswith("not established")
  assert bm25["label"] == "REALM - BM25, zero-shot recall@5"


def test_a_gain_that_depends_on_the_seed_is_not_established():
  runs, _ = constructed_runs([0.12, -0.02, 0.01])
  a = text_realm.analysis(runs)["primary"][0]
  assert a["mean"] == pytest.approx(np.mean([0.12, -0.02, 0.01]))
  assert a["seeds_ci"][0] < 0 < a["seeds_ci"][1]
  assert a["verdict"] == "not established"
  assert "not established" in paired.analysis_line(a)


# ---------------------------------------------------------------------- pre-training data --


def squad_slice(path, articles, questions_from=None):
  """The first ``articles`` articles of SQuAD dev (two paragraphs each), with their questions
  and answers as given, or every question and answer replaced by other text."""
  with gzip.open(assets.SQUAD_DEV, "rt", encoding="utf-8") as f:
    data = json.load(f)
  data["data"] = data["data"][:articles]
  for article in data["data"]:
    article["paragraphs"] = article["paragraphs"][:2]
    if questions_from == "replaced":
      for paragraph in article["paragraphs"]:
        for i, qa in enumerate(paragraph["qas"]):
          qa["question"] = f"Which zebra number {i} ate the quince?"
          qa["answers"] = [{"text": paragraph["context"][:7], "answer_start": 0}]
  with open(path, "w", encoding="utf-8") as f:
    json.dump(data, f)
  return data


def pretraining_files(work, squad_file):
  vocab = str(assets.BERT_VOCAB)
  ts.make_corpus(work, squad_file, "", vocab, 288, 0, 0, 0)
  ts.annotate(work)
  budget = text_realm.RealmBudget(held_out_fraction=0.3)
  summary = text_realm.make_pretrain_examples(work, vocab, budget)
  records = sorted(r for path in sorted(glob.glob(os.path.join(work, "pretrain", "*-*")))
                   for r in tf.data.TFRecordDataset(path).as_numpy_iterator())
  return summary, records


def test_pretraining_files_hold_the_corpus_text_only(tmp_path):
  """The masked sentences are a function of the paragraphs alone: with every SQuAD question
  and answer annotation replaced, the pre-training files are the same, record for record, and
  no question's text is in any masked sentence."""
  original = squad_slice(tmp_path / "squad.json", 2)
  squad_slice(tmp_path / "replaced.json", 2, questions_from="replaced")
  summary, records = pretraining_files(str(tmp_path / "a"), str(tmp_path / "squad.json"))
  _, again = pretraining_files(str(tmp_path / "b"), str(tmp_path / "replaced.json"))
  assert records and records == again
  assert summary["train_examples"] + summary["eval_examples"] == len(records)
  assert summary["train_examples"] > 0 and summary["eval_examples"] > 0
  assert sum(summary["spans_by_label"].values()) == summary["spans"]

  tokenizer = RealmTokenizer(str(assets.BERT_VOCAB))
  sentences = []
  for r in records:
    example = {k: v.numpy()[0] for k, v in features_lib.parse_pretrain_example(
        tf.constant([r]), 64, 10).items() if k in ("query_ids", "mlm_positions", "mlm_ids",
                                                    "mlm_weights")}
    masked = example["mlm_weights"] > 0
    ids = example["query_ids"]
    ids[example["mlm_positions"][masked]] = example["mlm_ids"][masked]
    sentences.append(" ".join(tokenizer.convert_ids_to_tokens(ids[ids > 0].tolist())))
  text = " | ".join(sentences).replace(" ##", "")

  def decoded(s):
    return " ".join(tokenizer.convert_ids_to_tokens(
        tokenizer.tokenize([s]).to_list()[0])).replace(" ##", "")

  # The decoding finds what is there: the first masked sentence's words are a paragraph's.
  first = sentences[0].replace(" ##", "").replace("[CLS] ", "").split(" [SEP]")[0]
  assert first[:60] in " ".join(decoded(p["context"]) for a in original["data"]
                                for p in a["paragraphs"])
  questions = [qa["question"] for a in original["data"] for p in a["paragraphs"]
               for qa in p["qas"]]
  assert len(questions) > 20
  for q in questions:
    assert decoded(q) not in text, q


def test_the_analysis_reads_the_committed_records(tmp_path):
  """``runs_from_records`` rebuilds each seed's outcomes from the per-question files that the
  results write (``report.write_question_records``; the Open-QA file's columns)."""
  from experiments.real_text import report  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(1)
  ranks = {k: rng.integers(0, 21, size=50) for k in ("bm25", "ict", "realm_0", "realm_7")}
  records = [collections.namedtuple("R", "question answers")(f"q{i}?", ["a"]) for i in range(50)]
  questions = tmp_path / "questions.csv"
  report.write_question_records(str(questions), records,
                                [dict(key=k, first=v) for k, v in ranks.items()])
  em = {k: rng.random(50) < 0.4 for k in ("orqa", "realm_0_openqa", "realm_0_mixed",
                                          "realm_7_openqa", "realm_7_mixed")}
  openqa = tmp_path / "openqa.csv"
  with open(openqa, "w", newline="", encoding="utf-8") as f:
    writer = csv.writer(f)
    writer.writerow(["question_index", "question"] + [f"{k}_{c}" for k in em
                                                      for c in ("em", "prediction")])
    for i in range(50):
      writer.writerow([i, f"q{i}?"] + [x for k in em for x in (int(em[k][i]), "x")])
  runs = text_realm.runs_from_records(str(questions), str(openqa), [0, 7])
  for run, seed in zip(runs, (0, 7)):
    assert run == text_realm.seed_outcomes(
        {text_realm.ICT: ranks["ict"], text_realm.REALM: ranks[f"realm_{seed}"],
         text_realm.BM25: ranks["bm25"]},
        {text_realm.ORQA: em["orqa"], text_realm.REALM: em[f"realm_{seed}_openqa"],
         text_realm.MIXED: em[f"realm_{seed}_mixed"]})


def test_comparisons_no_seed_measures_are_not_measured_and_stay_in_holms_family():
  """NOTES 40: no seed has Open-QA rows. (a) and REALM - BM25 are the numbers they are with
  those rows; (b) and the mixed row are "not measured"; Holm judges (a) at 1 - 0.05 / 2, as if
  (b)'s p were 1."""
  runs, _ = constructed_runs([0.08, 0.10, 0.09])
  full = text_realm.analysis(runs)
  for r in runs:
    r["em"] = {k: v for k, v in r["em"].items() if k == text_realm.ORQA}
  result = text_realm.analysis(runs)
  (a, b), (mixed, bm25) = result["primary"], result["secondary"]
  for got, want in ((a, full["primary"][0]), (bm25, full["secondary"][1])):
    assert got["per_seed"] == pytest.approx(want["per_seed"])
    assert got["questions_ci"] == pytest.approx(want["questions_ci"])
    assert got["verdict"] == want["verdict"]
  assert a["holm"]["level"] == pytest.approx(0.975) and a["verdict"] == "holds"
  assert a["seeds_adjusted"] == pytest.approx(paired.t_interval(a["per_seed"], 0.975))
  for c in (b, mixed):
    assert c["verdict"].startswith("not measured") and "holm" not in c
    assert paired.analysis_line(c) == f"- {c['label']}: **{c['verdict']}**"
  assert paired.holm([0.01, 1.0])[0]["level"] == pytest.approx(0.975)


def test_a_seed_without_openqa_rows_counts_in_the_zero_shot_comparisons_only(tmp_path):
  """NOTES 37: REALM test seed 0 has zero-shot records and no Open-QA ones. ``analysis`` then
  takes (a) and REALM - BM25 over every seed and (b) and the mixed row over the seeds with
  Open-QA rows, each equal to ``paired_difference`` over those seeds alone; a seed with one
  Open-QA column of its two is refused."""
  from experiments.real_text import report  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(2)
  n, seeds, full = 40, (0, 1, 2, 3), (1, 2, 3)
  ranks = {k: rng.integers(0, 21, size=n) for k in ("bm25", "ict")}
  ranks.update({f"realm_{s}": rng.integers(0, 21, size=n) for s in seeds})
  records = [collections.namedtuple("R", "question answers")(f"q{i}?", ["a"]) for i in range(n)]
  questions = tmp_path / "questions.csv"
  report.write_question_records(str(questions), records,
                                [dict(key=k, first=v) for k, v in ranks.items()])
  em = {"orqa": rng.random(n) < 0.4}
  em.update({f"realm_{s}_{row}": rng.random(n) < 0.5 for s in full for row in ("openqa", "mixed")})

  def write(path, columns):
    with open(path, "w", newline="", encoding="utf-8") as f:
      writer = csv.writer(f)
      writer.writerow(["question_index", "question"] + [f"{k}_em" for k in columns])
      for i in range(n):
        writer.writerow([i, f"q{i}?"] + [int(em[k][i]) for k in columns])

  openqa = tmp_path / "openqa.csv"
  write(openqa, list(em))
  runs = text_realm.runs_from_records(str(questions), str(openqa), seeds)
  assert set(runs[0]["em"]) == {text_realm.ORQA}
  assert set(runs[1]["em"]) == {text_realm.ORQA, text_realm.REALM, text_realm.MIXED}
  result = text_realm.analysis(runs)
  hit5 = lambda key: text_realm.hits(ranks[key], 5)
  as_string = lambda values: "".join("1" if x else "0" for x in values)
  expected = {
      "(a)": ([hit5(f"realm_{s}") for s in seeds], [hit5("ict")] * 4),
      "(b)": ([as_string(em[f"realm_{s}_openqa"]) for s in full], [as_string(em["orqa"])] * 3),
      "REALM retriever": ([as_string(em[f"realm_{s}_mixed"]) for s in full],
                          [as_string(em["orqa"])] * 3),
      "REALM - BM25": ([hit5(f"realm_{s}") for s in seeds], [hit5("bm25")] * 4)}
  for c in result["primary"] + result["secondary"]:
    (a, b), = [v for k, v in expected.items() if c["label"].startswith(k)]
    d = paired.paired_difference(a, b)
    assert c["per_seed"] == pytest.approx(d["per_seed"]) and len(c["per_seed"]) == len(a)
    assert c["questions_ci"] == pytest.approx(d["questions_ci"])
  write(openqa, [k for k in em if k != "realm_2_mixed"])
  with pytest.raises(ValueError, match="REALM seed 2 has one of"):
    text_realm.runs_from_records(str(questions), str(openqa), seeds)


def test_the_distractor_phase_feeds_realm(tmp_path, monkeypatch):
  """With ``distractor_steps`` the reader's second phase starts from the reading warm start's
  reader with ``distractor_blocks`` distractors, and REALM starts from it, its towers at
  ``realm_lr_retriever`` times the reader's rate; without it REALM starts from the reading
  warm start's reader. A phase without distractors is refused."""
  empty = tmp_path / "encoder.yaml"
  empty.write_text("{}\n")
  monkeypatch.setattr(text_realm, "model_yaml", lambda work: str(empty))
  work, vocab = str(tmp_path), str(assets.BERT_VOCAB)
  budget = text_realm.RealmBudget(distractor_steps=7, distractor_blocks=3,
                                  realm_lr_retriever=2.5)
  budget.check()
  first = text_realm.reading_params(work, vocab, budget, 0)
  phase = text_realm.reading_params(work, vocab, budget, 0, distractor_phase=True)
  assert first.task.init_checkpoint == os.path.join(work, text_realm.MLM_DIR)
  assert first.task.distractors == budget.reading_distractors == 0
  assert phase.task.init_checkpoint == os.path.join(work, text_realm.READER_DIR)
  assert phase.task.distractors == 3 and phase.trainer.train_steps == 7
  assert phase.trainer.optimizer_config.learning_rate.polynomial.initial_learning_rate == (
      budget.reading_learning_rate)
  realm = text_realm.realm_params(work, vocab, budget, 0, "dev.jsonl")
  assert realm.task.reader_init_checkpoint == os.path.join(work, text_realm.DISTRACT_DIR)
  assert realm.task.lr_retriever == 2.5
  without = dataclasses.replace(budget, distractor_steps=0)
  without.check()
  assert text_realm.realm_params(work, vocab, without, 0, "dev.jsonl").task.\
      reader_init_checkpoint == os.path.join(work, text_realm.READER_DIR)
  with pytest.raises(ts.RealTextError, match="--distractor_blocks"):
    dataclasses.replace(budget, distractor_blocks=0).check()


def test_two_realm_phases(tmp_path, monkeypatch):
  """With ``realm_reader_steps`` REALM's first phase runs that many steps at the one rate from
  the ICT tower and the reader's start into ``realm_<seed>_first/``; the second starts towers
  and reader from it, for ``realm_steps`` at ``realm_lr_retriever``, over another sentence
  order. Without it, one phase from the ICT tower."""
  empty = tmp_path / "encoder.yaml"
  empty.write_text("{}\n")
  monkeypatch.setattr(text_realm, "model_yaml", lambda work: str(empty))
  work, vocab = str(tmp_path), str(assets.BERT_VOCAB)
  budget = text_realm.RealmBudget(realm_reader_steps=30, realm_steps=20, realm_lr_retriever=3.0)
  budget.check()
  first = text_realm.realm_params(work, vocab, budget, 5, "dev.jsonl", first=True)
  second = text_realm.realm_params(work, vocab, budget, 5, "dev.jsonl")
  assert first.trainer.train_steps == 30 and first.task.lr_retriever == 1.0
  assert first.task.retriever_init_checkpoint == os.path.join(work, "ict_model")
  assert first.task.reader_init_checkpoint == os.path.join(work, text_realm.DISTRACT_DIR)
  assert first.task.index_dir == os.path.join(work, "realm_5_first_index")
  assert second.trainer.train_steps == 20 and second.task.lr_retriever == 3.0
  assert second.task.retriever_init_checkpoint == second.task.reader_init_checkpoint == (
      os.path.join(work, "realm_5_first"))
  assert second.task.index_dir == os.path.join(work, "realm_5_index")
  assert first.task.train_data.seed == 5 != second.task.train_data.seed
  one = text_realm.realm_params(work, vocab, dataclasses.replace(budget, realm_reader_steps=0),
                                5, "dev.jsonl")
  assert one.task.retriever_init_checkpoint == os.path.join(work, "ict_model")
  assert one.trainer.train_steps == 20 and one.task.train_data.seed == 5
  with pytest.raises(ts.RealTextError, match="task.lr_retriever"):
    text_realm.realm_params(work, vocab, budget, 5, "dev.jsonl", {"task.lr_retriever": 2.0})
  assert not second.task.freeze_block_tower and second.task.model.retriever.share_embedders
  frozen = text_realm.realm_params(work, vocab, dataclasses.replace(
      budget, realm_freeze_blocks=True), 5, "dev.jsonl")
  assert frozen.task.freeze_block_tower and not frozen.task.model.retriever.share_embedders


def test_phases_join_into_one_run():
  """Two phases' curves as one: the second's steps after the first's, the first's pass where
  both validated the same model; index ages likewise; steps, seconds and indexes summed."""
  def phase(name, steps, curve, ages):
    return {"model_dir": name, "steps": steps, "seconds": 60.0, "indexes_built": 2,
            "index_age": {"by_interval": ages}, "curves": {"recall@5": curve}}
  run = text_realm.join_phases([
      phase("a", 300, [(0, 0.25), (300, 0.26)], [(100, 50.0), (300, 70.0)]),
      phase("b", 200, [(0, 0.27), (200, 0.4)], [(100, 60.0), (200, 80.0)])])
  assert run["validation"]["recall@5"] == [[0, 0.25], [300, 0.26], [500, 0.4]]
  assert run["index_age"]["by_interval"] == [(100, 50.0), (300, 70.0), (400, 60.0),
                                             (500, 80.0)]
  assert run["index_age"]["mean"] == 65.0 and run["index_age"]["max"] == 80.0
  assert (run["steps"], run["seconds"], run["indexes_built"], run["model_dir"]) == (
      500, 120.0, 4, "b")
  alone = text_realm.join_phases([phase("a", 300, [(0, 0.25)], [])])
  assert alone["validation"]["recall@5"] == [[0, 0.25]] and alone["index_age"]["mean"] is None


def test_a_seed_run_with_other_settings_is_not_reused(tmp_path):
  """A REALM seed's done file is reused only with the same per-run settings; one written
  before a field existed counts as that field's default."""
  budget = text_realm.RealmBudget()
  done = tmp_path / "realm_0_done.json"
  text_realm.check_seed_budget(str(done), 0, budget)            # nothing yet: nothing to check
  old = {k: v for k, v in budget.per_run().items() if k != "realm_lr_retriever"}
  done.write_text(json.dumps({"budget": old}))
  text_realm.check_seed_budget(str(done), 0, budget)
  with pytest.raises(ts.RealTextError, match=r"realm_lr_retriever.*1\.0.*3\.0"):
    text_realm.check_seed_budget(str(done), 0,
                                dataclasses.replace(budget, realm_lr_retriever=3.0))
  done.write_text(json.dumps({"budget": dict(old, realm_steps=7)}))
  with pytest.raises(ts.RealTextError, match="realm_steps"):
    text_realm.check_seed_budget(str(done), 0, budget)


def test_dev_tools():
  """The dev scripts' pieces: a budget field's value of its own type (a boolean spelled out),
  a task setting's as a number where it is one; the cone's numbers on constructed queries;
  centred queries against raw ones on constructed hub blocks."""
  # pylint: disable=g-import-not-at-top
  from experiments.dev import query_cone
  from experiments.dev import realm_variant
  # pylint: enable=g-import-not-at-top
  assert realm_variant.value("realm_freeze_blocks", "True") is True
  assert realm_variant.value("realm_freeze_blocks", "False") is False
  with pytest.raises(SystemExit):
    realm_variant.value("realm_freeze_blocks", "1")
  assert realm_variant.value("realm_steps", "300") == 300
  assert realm_variant.value("task.lr_retriever", "3.0") == 3.0
  assert realm_variant.value("task.retriever_init_checkpoint", "/w/r") == "/w/r"
  folded = query_cone.cone(np.array([[2.0, 0.0], [1.0, 0.0]]), np.array([0.0, 1.0]))
  assert folded["mean_pair_cosine"] == pytest.approx(1.0)
  assert folded["mean_share_of_norm2"] == pytest.approx(1.5 ** 2 / 2.5)
  assert folded["cos_mean_beta"] == pytest.approx(0.0)
  spread = query_cone.cone(np.array([[1.0, 0.0], [-1.0, 0.0]]), np.array([1.0, 0.0]))
  assert spread["mean_pair_cosine"] == pytest.approx(-1.0)
  assert spread["mean_share_of_norm2"] == pytest.approx(0.0)
  # Centring the queries removes the prior that hub blocks take from the shared direction.
  from experiments.dev import centred_recall  # pylint: disable=g-import-not-at-top
  from realm_tf.data import qa  # pylint: disable=g-import-not-at-top
  hub = np.zeros([8, 3], np.float32)
  hub[:6, 0] = 1.0                                 # six blocks along the shared direction
  hub[6, 1] = hub[7, 2] = 1.0
  bodies = ["filler text"] * 6 + ["beta here", "gamma here"]
  records = [qa.QARecord("q1", ["beta"]), qa.QARecord("q2", ["gamma"])]
  queries = np.array([[10.0, 1.0, 0.0], [10.0, 0.0, 1.0]], np.float32)
  got = centred_recall.compare(queries, hub, bodies, records)
  assert got["raw"] == {"recall@5": 0.0, "recall@20": 1.0}
  assert got["centred"] == {"recall@5": 1.0, "recall@20": 1.0}
  assert (got["gained@5"], got["lost@5"], got["questions"]) == (2, 0, 2)
