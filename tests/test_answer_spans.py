"""Answers in whole words, on real SQuAD text with BERT's real vocabulary (issue 32, item 3).

A predicted span never starts or ends inside a word: ``predict.whole_words`` widens it, and
every answering path (``OpenQA.answer`` and ``realm-answer``, ``realm-eval``'s ``evaluate``,
``realm-serve``'s service) cuts its answer by that rule. The reference for a word's edges is
independent of the code's word ids: BERT's own marker, a wordpiece that continues a word
starts with ``##``.
"""

import numpy as np
import pytest
import tensorflow as tf

from experiments import assets
from realm_tf.openqa import report
from realm_tf.data import qa as qa_lib
from realm_tf.openqa import evaluation
from realm_tf.openqa import inputs as inputs_lib
from realm_tf.openqa import predict
from realm_tf.retrieval.index import mips_index
from realm_tf.serving import service as service_lib
from realm_tf.tokenization import RealmTokenizer

# SQuAD v1.1 dev, article Super_Bowl_50: "... Ward fumbled the ball during the return, but
# Trevathan recovered it ..." ("Trevathan" is tre ##vat ##han) and "... setting up McManus'
# 33-yard field goal ..." ("McManus" is mc ##man ##us, the apostrophe a word of its own).
ARTICLE = "Super_Bowl_50"
EVIDENCE = "but Trevathan recovered it"
QUESTION = "Who recovered Ward's fumble?"     # SQuAD's answers: Trevathan (3 of 3)
LQ, LR = 16, 384


@pytest.fixture(scope="module")
def real():
  """The article's paragraphs, the real BERT tokenizer, and the blocks as the reader sees them."""
  article = next(a for a in assets.squad_dev()["data"] if a["title"] == ARTICLE)
  paragraphs = [p["context"] for p in article["paragraphs"]]
  tokenizer = RealmTokenizer(str(assets.BERT_VOCAB))
  blocks = inputs_lib.tokenize_with_offsets(tokenizer, paragraphs)
  target = next(i for i, p in enumerate(paragraphs) if EVIDENCE in p)
  question = next(q for p in article["paragraphs"] for q in p["qas"]
                  if q["question"] == QUESTION)
  return dict(paragraphs=paragraphs, tokenizer=tokenizer, blocks=blocks, target=target,
              answers=[a["text"] for a in question["answers"]])


def _pieces(real, block):
  return real["tokenizer"].convert_ids_to_tokens(block.token_ids)


def _find(pieces, run):
  return next(i for i in range(len(pieces)) if pieces[i:i + len(run)] == run)


def _reference(pieces, start, end):
  """Widened by BERT's ``##`` markers (DPR's rule)."""
  while start > 0 and pieces[start].startswith("##"):
    start -= 1
  while end + 1 < len(pieces) and pieces[end + 1].startswith("##"):
    end += 1
  return start, end


def test_a_span_inside_a_word_of_several_wordpieces_reads_the_whole_word(real):
  block = real["blocks"][real["target"]]
  pieces = _pieces(real, block)
  t = _find(pieces, ["but", "tre", "##vat", "##han", "recovered"]) + 1
  for s in range(t, t + 3):
    for e in range(s, t + 3):
      assert predict.whole_words(block, s, e) == (t, t + 2)
      assert predict.span_text(block, s, e) == "Trevathan", (pieces[s:e + 1])
  assert predict.span_text(block, t - 1, t + 1) == "but Trevathan"          # ends in the word
  assert predict.span_text(block, t + 2, t + 3) == "Trevathan recovered"    # starts in it
  s, e = predict.answer_chars(block, t, t)
  assert block.text[s:e] == "Trevathan" and block.text[s - 4:e + 10] == EVIDENCE[:23]
  # Whole words already: unchanged, the apostrophe after "McManus" a word of its own.
  m = _find(pieces, ["mc", "##man", "##us", "'", "33"])
  assert predict.span_text(block, m, m + 2) == "McManus"
  assert predict.span_text(block, m, m + 3) == "McManus'"
  assert predict.span_text(block, m + 1, m + 3) == "McManus'"               # starts in it
  assert predict.span_text(block, m + 3, m + 4) == "' 33"
  # Outside the block text: no answer, as before.
  n = len(block.token_ids)
  assert predict.answer_chars(block, n - 1, n) == (0, 0) and predict.span_text(block, -1, 0) == ""


def test_whole_words_matches_the_wordpiece_markers_on_every_span_of_real_text(real):
  """Every span of up to 8 wordpieces of every paragraph of the article: widened as BERT's
  ``##`` markers say, and the characters of a span on word edges are exactly those the
  wordpieces cover (what the answer was before the rule)."""
  spans = widened = multi = 0
  for block in real["blocks"]:
    pieces = _pieces(real, block)
    multi += sum(1 for i in range(len(pieces) - 2)
                 if not pieces[i].startswith("##") and pieces[i + 1].startswith("##")
                 and pieces[i + 2].startswith("##"))
    for s in range(len(pieces)):
      for e in range(s, min(s + 8, len(pieces))):
        want = _reference(pieces, s, e)
        assert predict.whole_words(block, s, e) == want, (pieces[s:e + 1])
        chars = predict.answer_chars(block, s, e)
        assert chars == (block.char_starts[want[0]], block.char_ends[want[1]])
        spans += 1
        if want != (s, e):
          widened += 1
        else:
          assert chars == (block.char_starts[s], block.char_ends[e])
  assert spans > 50000 and widened > 2000 and multi > 50, (spans, widened, multi)


class _FixedSpanModel:
  """Stands in for the fine-tuned ``OpenQaModel``: a fixed query embedding, and a reader whose
  best span in the block of beam rank ``r`` is wordpieces ``spans[r][0]``, then worse ones
  (the block of rank 0 best of all)."""

  def __init__(self, query_embedding, spans):
    self.query = tf.constant(query_embedding[None], tf.float32)
    self.spans = tf.constant(spans, tf.int32)                     # [read, C, 2], best first
    read, candidates = len(spans), len(spans[0])
    self.logits = tf.constant([[10.0 - 3 * c - r for c in range(candidates)]
                               for r in range(read)])            # [read, C]

  def query_embedder(self, inputs, training=False):
    del training
    return tf.tile(self.query, [tf.shape(inputs["input_word_ids"])[0], 1])

  def __call__(self, features, training=False):
    del training
    # The block text starts after [CLS] question [SEP] (its row's type-0 positions).
    offset = tf.reduce_sum(features["reader_mask"] - features["reader_type_ids"], -1)[..., None]
    batch = tf.shape(offset)[0]
    query = self.query_embedder({"input_word_ids": features["question_word_ids"]})
    return dict(reader_logits=tf.tile(self.logits[None], [batch, 1, 1]),
                span_starts=offset + self.spans[..., 0], span_ends=offset + self.spans[..., 1],
                retriever_logits=tf.einsum("bd,bkd->bk", query, features["beam_emb"]))


@pytest.fixture(scope="module")
def answering(real):
  """``OpenQA`` over the article's paragraphs with the real vocabulary. The question retrieves
  the evidence paragraph first, then the "Verizon" one, then the "Danny Trevathan" one; the
  reader's best span in each starts or ends inside a word: ``tre ##vat`` ("Trevat") of
  "Trevathan", ``##riz`` of "Verizon" (``ve ##riz ##on``), ``##vat`` of "Trevathan"."""
  paragraphs, blocks = real["paragraphs"], real["blocks"]
  ranked = [real["target"], next(i for i, p in enumerate(paragraphs) if "Due to Verizon" in p),
            next(i for i, p in enumerate(paragraphs) if "Danny Trevathan recovered" in p)]
  runs = [["but", "tre", "##vat", "##han"], ["ve", "##riz", "##on"],
          ["danny", "tre", "##vat", "##han"]]
  at = [_find(_pieces(real, blocks[b]), run) + 1 for b, run in zip(ranked, runs)]
  spans = [[(at[0], at[0] + 1), (at[0] - 1, at[0] - 1)],
           [(at[1], at[1]), (0, 0)],
           [(at[2] + 1, at[2] + 1), (0, 0)]]
  assert max(at) + 3 < LR - LQ      # inside the reader's cut of the block
  embeddings = 3.0 * np.eye(len(paragraphs), dtype=np.float32)    # one direction a block
  query = embeddings[ranked[0]] + 0.5 * embeddings[ranked[1]] + 0.25 * embeddings[ranked[2]]
  index = mips_index.BruteForceIndex(embeddings)
  builder = inputs_lib.OpenQaInputBuilder(
      paragraphs, embeddings, index.search, real["tokenizer"], query_seq_length=LQ,
      reader_seq_length=LR, retriever_beam_size=3, reader_beam_size=3,
      titles=[f"{ARTICLE} {i}" for i in range(len(paragraphs))])
  model = _FixedSpanModel(query, spans)
  return dict(qa=predict.OpenQA(model, builder, "fixed"), model=model, builder=builder,
              ranked=ranked, target=real["target"])


def _on_word_edges(text, start, end):
  words = inputs_lib.basic_words(text)
  return start in {s for s, _ in words} and end in {e for _, e in words}


def test_openqa_answer_and_realm_answer_answer_in_whole_words(real, answering):
  a, = answering["qa"].answer([QUESTION])
  assert a.answer == "Trevathan" and a.answer in real["answers"]
  assert [e.block_id for e in a.evidence] == answering["ranked"]
  best = a.evidence[a.block_rank]
  assert best.block_id == answering["target"] and best.text[a.start:a.end] == "Trevathan"
  # realm-answer prints this Answer: the snippet brackets the whole word.
  text = report.format_answer(a)
  assert "answer:   Trevathan " in text and "but [[Trevathan]] recovered" in text


def test_realm_eval_scores_the_whole_word(real, answering):
  """``realm-eval``'s ``evaluate``: the prediction is the whole word, and official exact match
  (ORQA's normalization) counts it right; "Trevat" would not be."""
  records = [qa_lib.QARecord(QUESTION, real["answers"])]
  metrics, rows = evaluation.evaluate(answering["qa"], records, progress=False)
  assert rows[0]["prediction"] == "Trevathan" and rows[0]["correct"]
  assert metrics["exact_match"] == 1.0
  read = rows[0]["blocks"][rows[0]["block_rank"]]
  assert read["text"][read["answer_start"]:read["answer_end"]] == "Trevathan"
  assert not evaluation.answers_lib.is_correct("Trevat", real["answers"])


def test_realm_serve_answers_and_alternatives_in_whole_words(answering):
  """``realm-serve``'s service: the answer and each block's alternative are whole words."""
  # pylint: disable=protected-access
  service = service_lib.QAService.__new__(service_lib.QAService)   # its answering part only
  model = answering["model"]
  service._embed = tf.function(lambda x: model.query_embedder(x))
  service._forward = tf.function(model)
  service.model_step = 0
  index = service_lib._Index(answering["builder"], "/index/pub-1", (0, 1, 0), {})
  out, = service._answer_batch(index, [QUESTION], top_k=3)
  # pylint: enable=protected-access
  answers = out["answers"]
  assert [a["answer"] for a in answers] == ["Trevathan", "Verizon", "Trevathan"]
  assert [a["evidence"]["block_id"] for a in answers] == answering["ranked"]
  for a in answers:
    text = a["evidence"]["text"]
    assert text[a["start"]:a["end"]] == a["answer"]
    assert _on_word_edges(text, a["start"], a["end"]), a["answer"]
  assert answers[2]["evidence"]["text"][answers[2]["start"] - 6:answers[2]["end"]] == (
      "Danny Trevathan")
