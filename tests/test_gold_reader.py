"""Stage A of real-text Open-QA (experiments/real_text/gold_reader.py): windows whose gold spans
read back as the annotators' answers, in the Open-QA reader's row layout; SQuAD's F1; a tiny reader
that learns its questions and restores, head and all, into the Open-QA model."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from experiments import assets
from experiments.real_text import gold_reader
from realm_tf import configs
from realm_tf import model_dir as model_dir_lib
from realm_tf import tokenization
from realm_tf.modeling import factory
from realm_tf.modeling.models import OpenQaModel
from realm_tf.openqa import inputs as inputs_lib
from realm_tf.openqa import predict as predict_lib

PARAGRAPH = ("The Normans were the people who in the 10th and 11th centuries gave their name "
             "to Normandy, a region in France. They were descended from Norse raiders and "
             "pirates from Denmark, Iceland and Norway who, under their leader Rollo, agreed to "
             "swear fealty to King Charles III of West Francia. The distinct cultural and ethnic "
             "identity of the Normans emerged initially in the first half of the 10th century.")
QAS = [("In what country is Normandy located?", "France"),
       ("Who was the Norse leader?", "Rollo"),
       ("What century did the Normans first gain their separate identity?", "10th century")]


def squad_file(path):
  """SQuAD v1.1 with one article in the train split and one in dev (by ``split_of``), the
  same paragraph and questions in both."""
  def article(title):
    qas = [{"id": f"{title}{i}", "question": q,
            "answers": [{"text": a, "answer_start": PARAGRAPH.rindex(a)}]}
           for i, (q, a) in enumerate(QAS)]
    return {"title": title, "paragraphs": [{"context": PARAGRAPH, "qas": qas}]}
  with open(path, "w") as f:
    json.dump({"data": [article("Normans"), article("Super_Bowl_50")], "version": "1.1"}, f)
  return str(path)


@pytest.fixture(scope="module")
def tokenizer():
  return tokenization.RealmTokenizer(str(assets.BERT_VOCAB))


def test_split_and_answer_positions(tmp_path):
  path = squad_file(tmp_path / "squad.json")
  paragraphs, questions = gold_reader.read_split(path, "train")
  assert paragraphs == [PARAGRAPH] and [q.question for q in questions] == [q for q, _ in QAS]
  assert gold_reader.read_split(path, "dev")[1][2].char_spans == [
      (PARAGRAPH.rindex("10th century"), PARAGRAPH.rindex("10th century") + 12)]
  assert gold_reader.read_split(path, "test") == ([], [])
  data = json.load(open(path))
  data["data"][0]["paragraphs"][0]["qas"][0]["answers"][0]["answer_start"] += 1
  json.dump(data, open(path, "w"))
  with pytest.raises(gold_reader.GoldReaderError, match="Normans0.*answer_start"):
    gold_reader.read_split(path, "train")


def test_windows_hold_the_answers_in_the_open_qa_rows(tmp_path, tokenizer):
  _, questions = gold_reader.read_split(squad_file(tmp_path / "squad.json"), "train")
  settings = gold_reader.Settings(seq_length=40, max_query_length=16, stride=10)
  blocks, windows, counts = gold_reader.make_windows(tokenizer, [PARAGRAPH], questions,
                                                     settings, max_span_width=10)
  n = len(blocks[0].token_ids)
  assert n > 40 and counts["windows"] == len(windows) > 3 * len(questions)
  builder = inputs_lib.OpenQaInputBuilder(
      ["x"], np.zeros([1, 4], np.float32), None, tokenizer, query_seq_length=16,
      reader_seq_length=40, retriever_beam_size=1, reader_beam_size=1)
  q_ids = tokenizer.tokenize([q.question for q in questions]).to_list()
  for i, question in enumerate(questions):
    mine = [w for w in windows if w.question == i]
    # Windows tile the paragraph, stride apart, the last one reaching its end.
    covered = np.zeros(n, bool)
    for w in mine:
      covered[w.start:w.start + int(w.type_ids.sum()) - 1] = True
    assert covered.all() and [w.start for w in mine] == list(range(0, 10 * len(mine), 10))
    # The first window is the Open-QA reader's row of the paragraph.
    want = builder.reader_row(np.array(q_ids[i], np.int32), blocks[0])
    for got, ref in zip((mine[0].word_ids, mine[0].mask, mine[0].type_ids, mine[0].offset),
                        (*want[:3], want[3])):
      np.testing.assert_array_equal(got, ref)
    # Every window that holds the answer whole has it as its gold span, read back as text.
    answer = question.answers[0]
    holding = [w for w in mine if w.gold]
    assert holding
    for w in holding:
      (s, e), = w.gold
      text = predict_lib.span_text(blocks[0], w.start + s - w.offset, w.start + e - w.offset)
      assert text == answer
      assert w.type_ids[s] == w.type_ids[e] == 1 and w.mask[e + 1] == 1
  # An answer wider than the scorer's spans is counted, never trained on.
  _, _, narrow = gold_reader.make_windows(tokenizer, [PARAGRAPH], questions, settings,
                                          max_span_width=1)
  assert narrow["answers_too_long"] == 2   # "roll ##o" and "10th century"; "france" fits


def test_f1_is_squads():
  assert gold_reader.f1_score("the Denver Broncos", ["Denver Broncos"]) == 1.0
  assert gold_reader.f1_score("Broncos team", ["Denver Broncos"]) == pytest.approx(0.5)
  assert gold_reader.f1_score("Broncos team", ["Panthers", "Broncos"]) == pytest.approx(2 / 3)
  assert gold_reader.f1_score("", ["Broncos"]) == 0.0
  with pytest.raises(gold_reader.GoldReaderError, match="--warmup"):
    gold_reader.Settings(warmup=1.0).check()


def test_a_tiny_reader_learns_its_questions_and_restores_into_open_qa(tmp_path):
  encoder = configs.bert_tiny(30522, 32, dropout_rate=0.0)
  config = configs.RealmModelConfig(reader=configs.ReaderConfig(encoder=encoder))
  start_dir = str(tmp_path / "start")
  model_dir_lib.write_metadata(start_dir, config, str(assets.BERT_VOCAB))
  tf_keras.utils.set_random_seed(0)
  start = factory.build_reader(config.reader)
  tf.train.CheckpointManager(model_dir_lib.make_checkpoint(reader=start), start_dir, 1,
                             checkpoint_name="ckpt").save(checkpoint_number=0)
  out = str(tmp_path / "gold")
  settings = gold_reader.Settings(learning_rate=3e-3, steps=60, batch_size=8, warmup=0.1,
                                  seq_length=48, max_query_length=16, stride=16)
  summary = gold_reader.train(start_dir, out, squad_file(tmp_path / "squad.json"), settings,
                              say=lambda m: None)
  # Dev holds the training questions (same paragraph): the reader must have learnt them.
  assert summary["steps"] == 60 and summary["dev_questions"] == 3
  assert summary["last_loss"] < 0.2 * np.mean(summary["first_losses"])
  assert summary["dev_exact_match"]["value"] == 1.0
  rows = [json.loads(line) for line in open(os.path.join(out, "dev_predictions.jsonl"))]
  assert [r["prediction"] for r in rows] == [a for _, a in QAS]
  # Stage B restores it whole (span scorer included), strictly, into the Open-QA model.
  trained = model_dir_lib.load_config(out)
  assert trained.reader.span_hidden_size == gold_reader.reader_head()["span_hidden_size"]
  model = OpenQaModel.from_config_dataclass(trained)
  model_dir_lib.restore(model_dir_lib.resolve_checkpoint(out), reader=model.reader)
  _, reloaded = gold_reader.load_reader(out)
  for a, b in zip(model.reader.weights, reloaded.weights):
    np.testing.assert_array_equal(a.numpy(), b.numpy())
  names = tf.train.load_checkpoint(summary["checkpoint"]).get_variable_to_shape_map()
  assert any(n.startswith("reader/span_scorer/") for n in names)
  # The gold-paragraph evaluation of a saved reader gives what training measured.
  again = gold_reader.evaluate(out, squad_file(tmp_path / "squad.json"), "dev", settings,
                               indices=[2, 0])
  assert [r["prediction"] for r in again["rows"]] == [QAS[2][1], QAS[0][1]]
  assert again["exact_match"]["value"] == 1.0 and again["f1"]["value"] == 1.0
  with pytest.raises(gold_reader.GoldReaderError, match="no span scorer"):
    gold_reader.evaluate(start_dir, squad_file(tmp_path / "squad.json"), "dev", settings)


def test_question_loss_is_orqas_over_all_windows_of_a_question():
  rng = np.random.RandomState(0)
  logits = rng.normal(size=[6, 7]).astype(np.float32)
  correct = rng.rand(6, 7) < 0.2
  correct[0, 0] = correct[3, 1] = True
  segment = np.array([0, 0, 1, 1, 1, -1], np.int32)   # two questions and a padding row
  got = gold_reader.question_loss(tf.constant(logits), tf.constant(correct),
                                  tf.constant(segment)).numpy()

  def lse(x):
    return np.log(np.exp(x).sum())
  want = np.mean([lse(logits[segment == q]) - lse(logits[segment == q][correct[segment == q]])
                  for q in (0, 1)])
  assert got == pytest.approx(want, rel=1e-5)


def test_batches_pack_whole_questions_and_every_pass_sees_each_once():
  rng = np.random.RandomState(0)
  sizes = rng.randint(1, 5, size=50).tolist()
  plan = gold_reader.plan_batches(sizes, 8, 2.0, np.random.RandomState(0))
  # Two passes: every question exactly twice; no batch over its rows; a batch is closed only
  # when the next question does not fit.
  assert sorted(q for b in plan for q in b) == sorted(list(range(50)) * 2)
  assert all(sum(sizes[q] for q in b) <= 8 for b in plan)
  assert all(sum(sizes[q] for q in b) + sizes[nxt[0]] > 8 for b, nxt in zip(plan, plan[1:]))
  half = gold_reader.plan_batches(sizes, 8, 0.5, np.random.RandomState(0))
  assert len({q for b in half for q in b}) == 25
  assert len(gold_reader.plan_batches(sizes, 8, 2.0, np.random.RandomState(0), steps=7)) == 7

  def window(q, gold):
    return gold_reader.Window(q, 0, 2, np.full([4], q), np.ones([4]), np.ones([4]), gold)
  groups = [[window(0, [(2, 2)]), window(0, [])], [window(1, [(3, 3)])]]
  b = gold_reader.batch_of(groups, [1, 0], 4)
  assert b["input_word_ids"][:, 0].tolist() == [1, 0, 0, 1]      # the last row is padding
  assert b["segment"].tolist() == [0, 1, 1, -1]
  assert b["gold_mask"].sum(1).tolist() == [1, 1, 0, 1]
  with pytest.raises(gold_reader.GoldReaderError, match="--batch_size"):
    gold_reader.plan_batches([1, 3], 2, 1.0, np.random.RandomState(0))
