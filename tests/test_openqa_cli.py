"""realm-eval and realm-answer end to end, on tiny random-init Open-QA models.

Two fixtures, built once: the synthetic world's paragraphs as blocks with a vocabulary of its
words, and 300 SQuAD paragraphs with BERT's uncased vocabulary (for NQ-open's questions: all
3,610 in the slow tier, the first 400 by default). Each has a random-init ``OpenQaModel`` (its
checkpoint has a span scorer) and a brute-force index of its block tower. The answers are
random: these tests check the plumbing. Each binary runs once as a process of its own (its smoke
test); the other runs are in this process.
"""

import json
import os

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from experiments import assets
from data_prep import synthetic_world
from realm_tf import model_dir as model_dir_lib
from realm_tf import modeling
from realm_tf import tokenization
from realm_tf.data import manifests
from realm_tf.data import qa as qa_lib
from realm_tf.openqa import evaluation
from realm_tf.openqa import predict
from realm_tf.retrieval.publication import refresher
from realm_tf.retrieval.publication import testing

import helpers

NQ_DEV = assets.NQ_DEV
BERT_VOCAB = assets.BERT_VOCAB


def _make_model(model_dir: str, vocab_file: str, openqa_seq_length: int = 64) -> None:
  """A random-init Open-QA model dir (shared towers + reader with span scorer), ckpt-1."""
  config = testing.tiny_model_config(vocab_file, hidden_size=16, projection_size=16)
  config.override({"reader": {"openqa_seq_length": openqa_seq_length, "span_hidden_size": 8}})
  model_dir_lib.write_metadata(model_dir, config, vocab_file)
  tf_keras.utils.set_random_seed(0)
  embedder, _ = modeling.build_embedders(config.retriever)
  reader = modeling.build_reader(config.reader, with_span_scorer=True)
  model_dir_lib.make_checkpoint(query_embedder=embedder, block_embedder=embedder,
                                reader=reader).save(os.path.join(model_dir, "ckpt"))


def _make_index(model_dir: str, blocks_dir: str, index_dir: str) -> None:
  options = refresher.BuildOptions(index_type="brute_force", recall_queries=0, progress=False,
                                   tensorboard_dir="")
  refresher.build_index_for_checkpoint(None, model_dir, blocks_dir, index_dir, options=options)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
  root = tmp_path_factory.mktemp("openqa_cli")
  w = synthetic_world.generate_world(seed=1, num_regions=2, num_cities=6, num_people=14,
                                     num_organizations=4, num_works=6)
  files = synthetic_world.write_world(w, str(root / "world"))
  titles, bodies = [], []
  for article in w.articles:
    for paragraph in article["text"].split("\n\n"):
      if len(paragraph.split()) >= 5:  # not a section heading
        titles.append(article["title"])
        bodies.append(paragraph.strip())
  vocab = testing.write_vocab(str(root / "vocab.txt"), titles + bodies)
  with open(vocab, "a") as f:  # so years and numbers are wordpieces, not [UNK]
    f.write("".join(f"##{d}\n" for d in range(10)))
  tokenizer = tokenization.RealmTokenizer(vocab)
  blocks = str(root / "blocks")
  manifests.write_blocks(blocks, titles, bodies, tokenizer, block_seq_length=32)
  model, index = str(root / "model"), str(root / "index")
  _make_model(model, vocab)
  _make_index(model, blocks, index)
  # The world's test questions and one malformed line (skipped, counted).
  test_lines = open(files["qa_test"], encoding="utf-8").read().splitlines()
  qa_file = helpers.write_lines(root / "qa-test.jsonl", test_lines + ['{"question": "no answers"}'])
  return dict(root=root, vocab=vocab, blocks=blocks, model=model, index=index, qa=qa_file,
              questions=len(test_lines), titles=titles, bodies=bodies)


def _run(binary, *args, process=False):
  """``realm-<binary> <args>`` in this process (or, ``process``, as a process of its own); it
  must succeed."""
  module = f"realm_tf.binaries.{binary}"
  proc = helpers.run_process(module, *args) if process else helpers.run_cli(module, *args)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc


# ---------------------------------------------------------------- realm-eval, end to end --

@pytest.fixture(scope="module")
def world_eval(world):
  """realm-eval's smoke test: a process of its own."""
  out = str(world["root"] / "eval_out")
  proc = _run("eval", f"--model_dir={world['model']}", f"--index_dir={world['index']}",
              f"--dataset={world['qa']}", f"--output_dir={out}", "--batch_size=8",
              "--noprogress", process=True)
  return out, proc


def test_eval_writes_predictions_and_metrics(world, world_eval):
  out, proc = world_eval
  metrics = json.load(open(os.path.join(out, "metrics.json")))
  n = world["questions"]
  assert metrics["questions"] == n
  assert metrics["skipped_lines"] == 1          # the malformed line: skipped, counted
  assert 0.0 <= metrics["exact_match"] <= 1.0
  assert 0.0 <= metrics["span_match"] <= metrics["reader_oracle"] <= 1.0
  # The beam is capped at the corpus (46 blocks): top-5 and top-10 only, and monotone.
  num_blocks = len(world["bodies"])
  assert metrics["retriever_beam_size"] == num_blocks and metrics["reader_beam_size"] == 5
  assert {k for k in metrics if k.startswith("top_")} == {"top_5_match", "top_10_match"}
  assert metrics["reader_oracle"] == metrics["top_5_match"] <= metrics["top_10_match"]
  assert metrics["retrieval_seconds"] > 0 and metrics["reading_seconds"] > 0
  for label in ("exact match", "span match", "top-10 match", "questions", "skipped lines",
                "seconds / question"):
    assert label in proc.stdout

  predictions = [json.loads(l) for l in open(os.path.join(out, "predictions.jsonl"))]
  assert len(predictions) == n
  assert all(set(p) == {"question", "prediction"} for p in predictions)
  records, _ = qa_lib.read_qa(world["qa"])
  assert [p["question"] for p in predictions] == [r.question for r in records]

  rows = [json.loads(l) for l in open(os.path.join(out, "predictions_with_evidence.jsonl"))]
  assert len(rows) == n
  assert np.mean([r["correct"] for r in rows]) == pytest.approx(metrics["exact_match"])
  for row, p in zip(rows, predictions):
    assert row["prediction"] == p["prediction"]
    assert len(row["blocks"]) == 5 and [b["rank"] for b in row["blocks"]] == list(range(5))
    found = row["blocks"][row["block_rank"]]
    if row["prediction"]:
      assert found["text"][found["answer_start"]:found["answer_end"]] == row["prediction"]
    for b in row["blocks"]:
      assert b["title"] == world["titles"][b["block_id"]]
      assert b["text"] == world["bodies"][b["block_id"]]
      if b is not found:
        assert b["answer_start"] is None


def test_eval_scores_its_predictions_file(world, world_eval):
  out, _ = world_eval
  metrics = json.load(open(os.path.join(out, "metrics.json")))
  proc = _run("eval", f"--predictions_file={os.path.join(out, 'predictions.jsonl')}",
              f"--dataset={world['qa']}")
  table = dict(l.strip().rsplit(None, 1) for l in proc.stdout.splitlines()[1:])
  assert float(table["exact match"]) == pytest.approx(metrics["exact_match"], abs=1e-4)
  assert table["missing"] == "0" and table["skipped lines"] == "1"
  records, _ = qa_lib.read_qa(world["qa"])
  scored = evaluation.score_predictions(os.path.join(out, "predictions.jsonl"), records)
  assert scored["exact_match"] == metrics["exact_match"]
  assert scored["missing"] == 0 and scored["questions"] == metrics["questions"]


def test_score_hand_written_predictions(tmp_path):
  references = helpers.write_lines(tmp_path / "refs.jsonl", [
      {"question": "who wrote hamlet", "answers": ["William Shakespeare", "Shakespeare"]},
      {"question": "capital of france", "answer": ["Paris"]},
      {"question": "when", "answers": ["19[0-9]{2}"], "answer_type": "regex"},
      {"question": "tallest mountain", "answers": ["Everest"]},
      {"question": "largest ocean", "answers": ["Pacific"]},     # no prediction: wrong
  ])
  predictions = helpers.write_lines(tmp_path / "pred.jsonl", [
      {"question": "who wrote hamlet", "prediction": "the  shakespeare."},  # normalized: right
      {"question": "capital of france", "prediction": "Lyon"},
      {"question": "when", "prediction": "1969, in July"},              # re.match: right
      "not json",                                                         # skipped, counted
      {"question": "tallest mountain"},                                   # skipped, counted
      {"question": "tallest mountain", "prediction": "Mount Everest"},    # wrong
      {"question": "not asked", "prediction": "x"},
  ])
  records, _ = qa_lib.read_qa(references)
  metrics = evaluation.score_predictions(predictions, records)
  assert metrics == dict(exact_match=2 / 5, questions=5, correct=2, missing=1,
                         unmatched_predictions=1, skipped_prediction_lines=2)


# ------------------------------------------------------ realm-eval on NQ-open's 3,610 ----

@pytest.fixture(scope="module")
def squad_world(tmp_path_factory):
  root = tmp_path_factory.mktemp("openqa_nq")
  data = assets.squad_dev()["data"]
  titles, bodies = [], []
  for article in data:
    for paragraph in article["paragraphs"]:
      titles.append(article["title"].replace("_", " "))
      bodies.append(paragraph["context"])
  titles, bodies = titles[:300], bodies[:300]
  vocab = str(BERT_VOCAB)
  blocks = str(root / "blocks")
  manifests.write_blocks(blocks, titles, bodies, tokenization.RealmTokenizer(vocab),
                         block_seq_length=64)
  model, index = str(root / "model"), str(root / "index")
  _make_model(model, vocab)
  _make_index(model, blocks, index)
  return dict(root=root, model=model, index=index, blocks=blocks)


def _eval_on_nq_open(squad_world, n):
  """realm-eval's path (load, evaluate, write, score) on NQ-open's first ``n`` questions."""
  path, answer_type = qa_lib.resolve_dataset(str(NQ_DEV), None)
  records, skipped = qa_lib.read_qa(path, answer_type)
  assert len(records) == 3610 and not skipped
  records = records[:n]
  qa = predict.OpenQA.load(squad_world["model"], squad_world["index"],
                           retriever_beam_size=100)
  metrics, rows = evaluation.evaluate(qa, records, batch_size=128, progress=False)
  assert metrics["questions"] == n and len(rows) == n
  assert metrics["retriever_beam_size"] == 100
  assert {k for k in metrics if k.startswith("top_")} == {
      "top_5_match", "top_10_match", "top_50_match", "top_100_match"}
  assert 0.0 <= metrics["exact_match"] <= 1.0
  tops = [metrics[f"top_{k}_match"] for k in (5, 10, 50, 100)]
  assert tops == sorted(tops) and tops[-1] > 0               # some blocks hold answers
  paths = evaluation.write_outputs(str(squad_world["root"] / f"eval_nq_{n}"), metrics, rows)
  assert sum(1 for _ in open(paths["predictions"])) == n
  scored = evaluation.score_predictions(paths["predictions"], records)
  assert scored["exact_match"] == metrics["exact_match"] and scored["missing"] == 0


@pytest.mark.slow
def test_eval_on_nq_open_3610_questions(squad_world):
  _eval_on_nq_open(squad_world, 3610)


def test_eval_on_nq_open_first_400_questions(squad_world):
  """The slow test's path and checks on 400 questions (three batches and a partial one)."""
  _eval_on_nq_open(squad_world, 400)


# ------------------------------------------------------------------------ realm-answer ---

def test_answer_prints_answer_and_evidence(world):
  questions = ["Where was Skane Skaxafen born?", "What did the institute study?"]
  flags = [f"--model_dir={world['model']}", f"--index_dir={world['index']}"]
  # realm-answer's smoke test as a process of its own; --json in this process. The JSON run
  # retrieves more blocks than the corpus has (the beam is capped at the corpus); it reads the
  # same top 5, so its answers and scores are the text run's.
  procs = {"text": _run("answer", *flags, *questions, process=True),
           "json": _run("answer", *flags, "--json", "--retriever_beam_size=100000",
                        *questions)}
  out = procs["text"].stdout
  assert out.count("question: ") == 2 and out.count("answer:   ") == 2
  assert out.count("evidence (5 blocks read):") == 2
  assert out.count("[[") == 2 and out.count("]]") == 2   # each answer, bracketed in its block

  answers = [json.loads(l) for l in procs["json"].stdout.splitlines()]
  assert [a["question"] for a in answers] == questions
  for a in answers:
    assert set(a) == {"question", "answer", "score", "block_rank", "start", "end", "evidence"}
    assert len(a["evidence"]) == 5
    assert {"block_id", "title", "text", "retrieval_score", "dense_rank",
            "bm25_rank"} == set(a["evidence"][0])
    # The default retriever is the dense one: its beam, in its order, none of it BM25's.
    assert [e["dense_rank"] for e in a["evidence"]] == list(range(5))
    assert {e["bm25_rank"] for e in a["evidence"]} == {-1}
    block = a["evidence"][a["block_rank"]]
    assert block["text"][a["start"]:a["end"]] == a["answer"] != ""
    assert f"[[{' '.join(a['answer'].split())}]]" in out
    assert f"answer:   {a['answer']}   (score {a['score']:.3f})" in out


# ------------------------------------------------------------------------------ errors ---

def test_errors_are_one_line(world):
  root = world["root"]
  no_scorer = str(root / "towers_only")   # a checkpoint without a span scorer: towers only
  testing.TinyTrainer(no_scorer, world["vocab"], hidden_size=16, projection_size=16).save(1)
  model = [f"--model_dir={world['model']}", f"--index_dir={world['index']}"]
  runs = {
      "missing model dir": ("eval", f"--model_dir={root / 'nope'}",
                            f"--index_dir={world['index']}", f"--dataset={world['qa']}"),
      "no span scorer": ("eval", f"--model_dir={no_scorer}", f"--index_dir={world['index']}",
                         f"--dataset={world['qa']}"),
      "empty question": ("answer", *model, "who?", "  "),
  }
  lines = {name: helpers.error_line(helpers.run_cli(f"realm_tf.binaries.{binary}", *args))
           for name, (binary, *args) in runs.items()}
  assert "model directory not found" in lines["missing model dir"]
  assert "no span scorer" in lines["no span scorer"]
  assert "question 2 is empty" in lines["empty question"]


def test_api_errors_the_binaries_report(world):
  """Errors the binaries catch as expected ones (checked in-process: no more subprocesses)."""
  other = str(world["root"] / "other_blocks")
  testing.make_corpus(other, world["vocab"], 10, num_shards=1)
  with pytest.raises(manifests.DataError, match="another corpus"):
    predict.OpenQA.load(world["model"], world["index"], blocks_dir=other)
  with pytest.raises(manifests.MissingDataError, match="QA file not found"):
    qa_lib.resolve_dataset(str(world["root"] / "nope.jsonl"), None)
  with pytest.raises(manifests.MissingDataError, match="predictions file not found"):
    evaluation.score_predictions(str(world["root"] / "nope.jsonl"),
                                 qa_lib.read_qa(world["qa"])[0])
  qa = predict.OpenQA.load(world["model"], world["index"])
  with pytest.raises(ValueError, match="empty question"):
    evaluation.evaluate(qa, [qa_lib.QARecord(" ", ["x"])], progress=False)
