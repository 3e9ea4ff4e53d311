"""Open-QA fine-tuning (ORQA's recipe): host inputs, the model, the loss, and end to end.

Each part is checked against an independent reference: the tokenizer on whole texts, brute
force over token ids, NumPy for the beam, the span scorer and the marginal log-likelihood and
its gradient, eager execution for XLA, one device for MirroredStrategy, and the validation
metrics recomputed from ``OpenQA.predict`` on the checkpoint that was validated.
"""

import json
import os
import re

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from experiments import assets
import realm_tf
from realm_tf import configs
from realm_tf import model_dir as model_dir_lib
from realm_tf import train_lib
from realm_tf.data import manifests
from realm_tf.modeling import factory
from realm_tf.modeling.models import OpenQaModel, tower_inputs
from realm_tf.openqa import host
from realm_tf.openqa import inputs as inputs_lib
from realm_tf.openqa import predict as predict_lib
from realm_tf.retrieval import errors
from realm_tf.retrieval.index import mips_index
from realm_tf.retrieval.publication import index_io
from realm_tf.retrieval.publication import refresher
from realm_tf.retrieval.publication import testing
from realm_tf.tasks import openqa as openqa_task
from realm_tf.tokenization import RealmTokenizer, load_vocab

import helpers

BERT_VOCAB = str(assets.BERT_VOCAB)

# The tiny corpus of the unit tests. Block 3 has the answer only in lower case, block 5 more
# occurrences than MAX_GOLD, block 6 its occurrence past the reader's cut.
BODIES = [
    "Paris is the capital and largest city of France.",
    "The Eiffel Tower stands in Paris, on the river Seine.",
    "London is the capital of England, on the river Thames.",
    "paris in lower case is not the answer here.",
    "Berlin is the capital of Germany.",
    "Paris Paris Paris Paris, said the guide in Paris.",
    "The old bridge crosses the river near the museum, the church and the station of the "
    "city, far from the island and the ocean; it is in Paris.",
    "Madrid is the capital of Spain.",
    "Rome is the capital of Italy.",
    "Lisbon is the capital of Portugal.",
]
QUESTIONS = [
    inputs_lib.Question("what is the capital of france?", ["Paris"]),
    inputs_lib.Question("which river flows through london?", ["Thames", "the river Thames"]),
    inputs_lib.Question("who painted the sky?", ["Zanzibar"]),   # nothing correct anywhere
    inputs_lib.Question("what is the name of the capital city of the country of france in "
                        "europe today?", ["Paris"]),             # longer than the query length
]
# Retrieval scores of each block for each question (the query embedding is SCORES @ E).
SCORES = np.array([
    [5, 4, 1, 8, 0, 9, 10, 2, 3, 6],
    [3, 4, 10, 1, 5, 0, 2, 9, 8, 7],
    [1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
    [10, 9, 0, 1, 2, 3, 4, 5, 6, 7],
], np.float32)
LQ, LR, BEAM, READ, MAX_GOLD, DIM, WIDTH = 12, 24, 6, 3, 3, 16, 3


def _nll(logits, correct):
  """-log sum_{correct} softmax(logits), in float64."""
  logits = np.asarray(logits, np.float64)
  p = np.exp(logits - logits.max())
  p /= p.sum()
  return -np.log(p[correct].sum())


def _softmax(x):
  x = np.asarray(x, np.float64)
  p = np.exp(x - x.max())
  return p / p.sum()


@pytest.fixture(scope="module")
def bert_tokenizer():
  return RealmTokenizer(BERT_VOCAB)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  """The tiny corpus, its frozen embeddings (orthogonal rows), builder, model and features."""
  root = tmp_path_factory.mktemp("openqa_tiny")
  vocab = testing.write_vocab(str(root / "vocab.txt"),
                              BODIES + [q.question for q in QUESTIONS] + ["zanzibar"])
  tokenizer = RealmTokenizer(vocab)
  rng = np.random.default_rng(0)
  embeddings = 3.0 * np.linalg.qr(rng.normal(size=[DIM, DIM]))[0][:len(BODIES)]
  embeddings = embeddings.astype(np.float32)
  index = mips_index.BruteForceIndex(embeddings)
  builder = inputs_lib.OpenQaInputBuilder(
      BODIES, embeddings, index.search, tokenizer, query_seq_length=LQ, reader_seq_length=LR,
      retriever_beam_size=BEAM, reader_beam_size=READ, max_gold_spans=MAX_GOLD)
  query_embeddings = SCORES @ embeddings / 9.0
  features = builder.features(QUESTIONS, query_embeddings, question_indices=[0, 1, 2, 3])
  size = len(load_vocab(vocab))
  config = configs.RealmModelConfig(
      retriever=configs.RetrieverConfig(
          encoder=configs.bert_tiny(size, 32, dropout_rate=0.0), projection_size=DIM,
          projection_dropout=0.0, share_embedders=False, query_seq_length=LQ),
      reader=configs.ReaderConfig(encoder=configs.bert_tiny(size, 32, dropout_rate=0.0),
                                  openqa_seq_length=LR, span_hidden_size=8,
                                  max_span_width=WIDTH),
      vocab_file=vocab)
  tf_keras.utils.set_random_seed(1)
  model = OpenQaModel.from_config_dataclass(config)
  # Span scorer weights that make every part of the score visible: a projection small enough
  # for the layer norm's epsilon (1e-3) to matter, the layers after it of order one.
  scorer = model.reader.span_scorer
  for layer, scale in ((scorer.projection, 0.03), (scorer.layer_norm, 0.5),
                       (scorer.output_dense, 0.5)):
    for v in layer.weights:
      v.assign(rng.normal(0, scale, v.shape).astype(np.float32))
  task = openqa_task.OpenQaTask(configs.OpenQaTaskConfig(
      model=config, retriever_beam_size=BEAM, reader_beam_size=READ, max_gold_spans=MAX_GOLD,
      top_k=(1, 5)))
  return dict(root=root, vocab=vocab, tokenizer=tokenizer, embeddings=embeddings,
              builder=builder, query_embeddings=query_embeddings, features=features,
              config=config, model=model, task=task)


def _tensors(features, keys=None):
  return {k: tf.constant(v) for k, v in features.items() if keys is None or k in keys}


# ------------------------------------------------------------------------------ tokens --


def test_tokenize_with_offsets_matches_the_tokenizer_on_real_text(bert_tokenizer):
  tok = bert_tokenizer
  paragraphs = [p["context"] for a in assets.squad_dev()["data"] for p in a["paragraphs"]][::3]
  special = [
      "Café Müller's naïve façade — 東京大学 (1999)! «Ça va?» he asked; 50% off & more.",
      "10\u00a0km north\u3000of the\u2009river",   # no-break, ideographic and thin spaces
      "zero\u200bwidth, soft\u00adhyphen, tab\tand\r\nnewlines\x0bhere",
      "Mu\u0308nchen (decomposed) and München, İstanbul, straße, Ελληνικά ΣΑΣ, ﬁne ½ x²",
      "", "   ", "!!!", "emoji 🙂 and symbols ©®™ ≥ ≤",
  ]
  texts = paragraphs + special
  blocks = inputs_lib.tokenize_with_offsets(tok, texts)
  whole = tok.tokenize(texts)
  checked_ascii = 0
  for text, block, ids in zip(texts, blocks, whole):
    np.testing.assert_array_equal(block.token_ids, ids.numpy(), err_msg=repr(text[:80]))
    assert block.text == text
    assert len(block.char_starts) == len(block.char_ends) == len(block.token_ids)
    assert np.all(block.char_starts < block.char_ends)
    assert np.all(np.diff(block.char_starts) >= 0) and np.all(block.char_ends <= len(text))
    if text.isascii():
      for piece, s, e in zip(tok.convert_ids_to_tokens(block.token_ids), block.char_starts,
                             block.char_ends):
        if piece != "[UNK]":
          assert text[s:e].lower() == (piece[2:] if piece.startswith("##") else piece), (
              text[s:e], piece)
          checked_ascii += 1
  assert checked_ascii > 10000
  # Non-ASCII words keep the span of their own characters.
  block = blocks[len(paragraphs)]
  spans = [block.text[s:e] for s, e in zip(block.char_starts, block.char_ends)]
  assert spans[:6] == ["Café", "Müller", "'", "s", "naïve", "façade"]
  assert "東" in spans and "(" in spans


def test_basic_words_split_like_the_tokenizer():
  assert inputs_lib.basic_words("Hi, 東京!") == [(0, 2), (2, 3), (4, 5), (5, 6), (6, 7)]
  # A no-break space is no word boundary for the tokenizer, a zero-width space is.
  assert inputs_lib.basic_words("10\u00a0km") == [(0, 5)]
  assert inputs_lib.basic_words("a\u200bb c") == [(0, 1), (2, 3), (4, 5)]


# ----------------------------------------------------------------------------- answers --


def test_has_answer_rules():
  text = "The capital is Paris.\nIt lies on the Seine, in 1889 and later."
  assert inputs_lib.has_answer(text, ["Paris"])
  assert not inputs_lib.has_answer(text, ["paris"])            # case-sensitive
  assert inputs_lib.has_answer(text, ["London", "Seine"])       # any answer
  assert inputs_lib.has_answer(text, ["Pari"])                  # a plain substring
  assert inputs_lib.has_answer(text, ["is Paris.\nIt"])
  assert not inputs_lib.has_answer(text, [])
  assert not inputs_lib.has_answer(text, [""])
  # Regular expressions: re.search, ignoring case; a bad pattern never matches.
  assert inputs_lib.has_answer(text, [r"18\d\d"], is_regex=True)
  assert inputs_lib.has_answer(text, [r"PARIS"], is_regex=True)
  assert inputs_lib.has_answer(text, [r"in \d+ and"], is_regex=True)   # not at the start
  assert not inputs_lib.has_answer(text, [r"\Aparis"], is_regex=True)
  assert not inputs_lib.has_answer(text, [r"(unclosed"], is_regex=True)
  assert inputs_lib.has_answer(text, [r"(unclosed", r"sei?ne"], is_regex=True)
  assert not inputs_lib.has_answer(text, [r"Lyon|Nice"], is_regex=True)


def test_find_token_spans_matches_brute_force():
  rng = np.random.default_rng(3)
  for _ in range(200):
    block = rng.integers(0, 4, int(rng.integers(0, 15))).astype(np.int32)
    answers = [rng.integers(0, 4, int(rng.integers(0, 5))) for _ in range(int(rng.integers(1, 4)))]
    want = [(s, s + len(a) - 1) for a in answers if len(a)
            for s in range(len(block) - len(a) + 1) if list(block[s:s + len(a)]) == list(a)]
    assert sorted(inputs_lib.find_token_spans(block, answers)) == sorted(want)
  assert inputs_lib.find_token_spans(np.array([1, 2, 1, 2, 1]), [np.array([1, 2, 1])]) == [
      (0, 2), (2, 4)]   # overlapping occurrences all count


def test_find_regex_spans_on_wordpiece_edges(bert_tokenizer):
  tok = bert_tokenizer
  text = "The Eiffel Tower, built in 1889, stands in Paris; Mu\u0308nchenstadt is far."
  block = inputs_lib.tokenize_with_offsets(tok, [text])[0]
  pieces = tok.convert_ids_to_tokens(block.token_ids)

  def spans(*patterns):
    return [pieces[s:e + 1] for s, e in inputs_lib.find_regex_spans(block, patterns)]

  assert spans(r"eiffel\s+tower") == [["e", "##iff", "##el", "tower"]]
  assert spans(r"eif") == [] and spans(r"ffel") == []            # ends inside a wordpiece
  assert spans(r"eiff") == [["e", "##iff"]] and spans(r"iff") == [["##iff"]]
  assert spans(r"18\d\d") == [["1889"]]
  assert spans(r"889") == []                       # inside a wordpiece
  assert spans(r"\sparis\s*") == [["paris"]]        # surrounding whitespace is dropped
  assert spans(r"in") == [["in"], ["in"]]           # whole pieces only (not "built", "stands")
  # A word whose normalized form is shorter (a decomposed accent): all its pieces.
  assert spans(r"m\S+stadt") == [["munchen", "##stadt"]]
  assert spans(r"(bad") == []


# ------------------------------------------------------------------------------ inputs --


def test_builder_features(tiny):
  f, tok, builder = tiny["features"], tiny["tokenizer"], tiny["builder"]
  emb, bodies = tiny["embeddings"], BODIES
  assert set(f) == set(inputs_lib.FEATURES)
  want_beam = np.argsort(-(tiny["query_embeddings"] @ emb.T), axis=1)[:, :BEAM]
  np.testing.assert_array_equal(want_beam, np.argsort(-SCORES, axis=1)[:, :BEAM])
  np.testing.assert_array_equal(f["beam_ids"], want_beam)
  np.testing.assert_array_equal(f["beam_emb"], emb[want_beam])
  np.testing.assert_array_equal(
      f["retriever_correct"],
      [[any(a in bodies[i] for a in q.answers) for i in row]
       for q, row in zip(QUESTIONS, want_beam)])
  assert f["retriever_correct"][2].sum() == 0 and f["retriever_correct"][0, 0] == 1
  assert f["retriever_correct"][0, 2] == 0       # "paris" only in lower case
  np.testing.assert_array_equal(f["question_index"], [0, 1, 2, 3])

  cls, sep = tok.cls_id, tok.sep_id
  for b, q in enumerate(QUESTIONS):
    q_ids = tok.tokenize([q.question])[0].numpy()[:LQ - 2]
    np.testing.assert_array_equal(
        f["question_word_ids"][b, :len(q_ids) + 2], [cls, *q_ids, sep])
    assert f["question_mask"][b].sum() == len(q_ids) + 2 and not f["question_type_ids"][b].any()
    answer_ids = [tok.tokenize([a])[0].numpy() for a in q.answers]
    for r in range(READ):
      body = tok.tokenize([bodies[want_beam[b, r]]])[0].numpy()
      kept = body[:LR - 3 - len(q_ids)]
      row = [cls, *q_ids, sep, *kept, sep]
      offset = len(q_ids) + 2
      np.testing.assert_array_equal(f["reader_word_ids"][b, r], row + [0] * (LR - len(row)))
      np.testing.assert_array_equal(f["reader_mask"][b, r], [1] * len(row) + [0] * (LR - len(row)))
      np.testing.assert_array_equal(f["reader_type_ids"][b, r],
                                    [0] * offset + [1] * (len(kept) + 1) + [0] * (LR - len(row)))
      want = sorted({(s, s + len(a) - 1) for a in answer_ids
                     for s in range(offset, offset + len(kept) - len(a) + 1)
                     if list(row[s:s + len(a)]) == list(a)})
      mask = f["gold_mask"][b, r] > 0
      got = list(zip(f["gold_starts"][b, r][mask], f["gold_ends"][b, r][mask]))
      assert got == want[:MAX_GOLD], (b, r)
      text = builder.block_texts([want_beam[b, r]])[0]
      for s, e in got:
        assert predict_lib.span_text(text, s - offset, e - offset).lower() in [
            a.lower() for a in q.answers]
  # Question 0 reads blocks 6 (answer past the cut), 5 (five occurrences) and 3 (lower case:
  # not a correct block, but its wordpieces are those of the answer, as in ORQA).
  np.testing.assert_array_equal(want_beam[0, :READ], [6, 5, 3])
  assert f["retriever_correct"][0, 0] and f["gold_mask"][0, 0].sum() == 0
  assert f["gold_mask"][0, 1].sum() == MAX_GOLD and f["gold_mask"][0, 2].sum() == 1
  np.testing.assert_array_equal(f["gold_mask"][1, 0], [1, 1, 0])   # "Thames" and "the river .."
  assert builder.stats["questions_truncated"] == 1 and builder.stats["questions"] == 4
  assert builder.stats["spans_dropped"] == 5 - MAX_GOLD

  # A regular-expression answer (CuratedTrec): correct blocks ignore case, gold spans are the
  # matches on wordpiece edges inside the reader's cut.
  regex = inputs_lib.OpenQaInputBuilder(
      BODIES, emb, builder.search, tok, query_seq_length=LQ, reader_seq_length=LR,
      retriever_beam_size=BEAM, reader_beam_size=READ, max_gold_spans=MAX_GOLD)
  g = regex.features([inputs_lib.Question(QUESTIONS[0].question, [r"\bpar\w+"], True)],
                     tiny["query_embeddings"][:1])
  np.testing.assert_array_equal(g["retriever_correct"][0],
                                [re.search(r"(?i)\bpar\w+", bodies[i]) is not None
                                 for i in want_beam[0]])
  assert g["retriever_correct"][0, 2] == 1                       # "paris", lower case
  np.testing.assert_array_equal(g["gold_mask"][0].sum(-1), [0, MAX_GOLD, 1])
  for r in range(READ):
    for s, e, m in zip(g["gold_starts"][0, r], g["gold_ends"][0, r], g["gold_mask"][0, r]):
      if m:
        assert s == e and tok.vocab[g["reader_word_ids"][0, r, s]] == "paris"


# ------------------------------------------------------------------------------- model --


def _span_reference(model, features):
  """NumPy span logits from the reader's sequence output and the span scorer's weights."""
  feats = _tensors(features, host.MODEL_FEATURES)
  sequence = model.reader(tower_inputs(feats, "reader"), training=False)["sequence_output"]
  sequence = sequence.numpy().astype(np.float64)                          # [b*R, L, H]
  scorer = model.reader.span_scorer
  w1, b1 = [v.numpy().astype(np.float64) for v in scorer.projection.weights]
  gamma, beta = [v.numpy().astype(np.float64) for v in scorer.layer_norm.weights]
  w2, b2 = [v.numpy().astype(np.float64) for v in scorer.output_dense.weights]
  query = model.query_embedder(tower_inputs(feats, "question"), training=False).numpy()
  retriever = np.einsum("bd,bkd->bk", query.astype(np.float64), features["beam_emb"])
  proj = sequence @ w1 + b1
  half = w1.shape[1] // 2
  b, read, length = features["reader_word_ids"].shape
  starts = np.repeat(np.arange(length), WIDTH)
  ends = starts + np.tile(np.arange(WIDTH), length)
  clipped = np.minimum(ends, length - 1)
  logits = np.zeros([b, read, len(starts)])
  valid = np.zeros([b, read, len(starts)], bool)
  for i in range(b):
    for r in range(read):
      p = proj[i * read + r]
      h = np.maximum(p[starts, :half] + p[clipped, half:], 0.0)
      h = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-3)
      score = (h * gamma + beta) @ w2[:, 0] + b2[0]
      block = np.flatnonzero((features["reader_type_ids"][i, r] == 1) &
                             (features["reader_mask"][i, r] == 1))
      valid[i, r] = (starts >= block[0]) & (ends < block[-1])
      logits[i, r] = score + np.where(valid[i, r], 0.0, -10000.0) + retriever[i, r]
  return dict(logits=logits, valid=valid, starts=starts, ends=clipped, retriever=retriever,
              query=query.astype(np.float64))


def test_model_span_logits_match_numpy(tiny):
  model, f = tiny["model"], tiny["features"]
  out = model(_tensors(f, host.MODEL_FEATURES), training=False)
  ref = _span_reference(model, f)
  np.testing.assert_allclose(out["retriever_logits"], ref["retriever"], rtol=1e-5, atol=1e-5)
  b = len(QUESTIONS)
  np.testing.assert_array_equal(out["span_starts"], np.broadcast_to(ref["starts"],
                                                                    [b, READ, LR * WIDTH]))
  np.testing.assert_array_equal(out["span_ends"], np.broadcast_to(ref["ends"],
                                                                  [b, READ, LR * WIDTH]))
  got = out["reader_logits"].numpy()
  valid = ref["valid"]
  np.testing.assert_allclose(got[valid], ref["logits"][valid], rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(got[~valid], ref["logits"][~valid], atol=4e-3)   # float32 at 1e4
  assert np.all(got[valid] > -1000) and np.all(got[~valid] < -9000)
  # The valid spans are those inside the block text (never its closing [SEP]) of <= WIDTH.
  for i in range(b):
    for r in range(READ):
      offset = int((f["reader_mask"][i, r] - f["reader_type_ids"][i, r]).sum())
      body_len = int(f["reader_type_ids"][i, r].sum()) - 1
      want = {(s, e) for s in range(offset, offset + body_len)
              for e in range(s, min(s + WIDTH, offset + body_len))}
      assert set(zip(ref["starts"][valid[i, r]], ref["ends"][valid[i, r]])) == want

  # The retriever logit enters every span score of its block, and nothing else.
  r = 1
  changed = dict(f, beam_emb=f["beam_emb"].copy())
  changed["beam_emb"][:, r] += np.random.default_rng(5).normal(size=[b, DIM]).astype(np.float32)
  out2 = model(_tensors(changed, host.MODEL_FEATURES), training=False)
  delta = (out2["retriever_logits"] - out["retriever_logits"]).numpy()
  moved = changed["beam_emb"][:, r] - f["beam_emb"][:, r]
  np.testing.assert_allclose(delta[:, r], np.einsum("bd,bd->b", ref["query"], moved),
                             rtol=1e-4, atol=1e-5)
  assert np.abs(delta[:, r]).min() > 1e-3
  np.testing.assert_allclose(np.delete(delta, r, axis=1), 0.0, atol=1e-6)
  shift = (out2["reader_logits"] - out["reader_logits"]).numpy()
  for i in range(b):
    np.testing.assert_allclose(shift[i, r][valid[i, r]], delta[i, r], atol=1e-4)
  np.testing.assert_allclose(np.delete(shift, r, axis=1), 0.0, atol=1e-6)

  # A block prior (a fused beam's rule) stands in for the retriever logit in every span score
  # of its block; the retriever logits are unchanged.
  prior = np.random.default_rng(6).normal(size=[b, READ]).astype(np.float32)
  out3 = model(dict(_tensors(f, host.MODEL_FEATURES), block_prior=tf.constant(prior)),
               training=False)
  np.testing.assert_allclose(out3["retriever_logits"], out["retriever_logits"], atol=1e-6)
  want = ref["logits"] - ref["retriever"][:, :READ, None] + prior[:, :, None]
  np.testing.assert_allclose(out3["reader_logits"].numpy()[valid], want[valid], rtol=1e-5,
                             atol=1e-4)


def test_model_compiles_with_xla(tiny):
  model, feats = tiny["model"], _tensors(tiny["features"], host.MODEL_FEATURES)
  eager = model(feats, training=False)
  xla = tf.function(lambda f: model(f, training=False), jit_compile=True)(feats)
  assert set(eager) == set(xla)
  for k in eager:
    np.testing.assert_allclose(xla[k], eager[k], rtol=1e-5, atol=1e-5, err_msg=k)
  valid = eager["reader_logits"].numpy() > -1000
  np.testing.assert_allclose(xla["reader_logits"].numpy()[valid],
                             eager["reader_logits"].numpy()[valid], atol=1e-5)


# -------------------------------------------------------------------------------- loss --


def test_loss_metrics_and_gradients_match_numpy(tiny):
  model, task, f = tiny["model"], tiny["task"], tiny["features"]
  feats = _tensors(f)
  out = {k: v.numpy().astype(np.float64) for k, v in model(feats, training=False).items()}
  metrics = task.build_metrics()
  loss, best = task.forward_outputs(feats, model, metrics, training=False)

  b = len(QUESTIONS)
  correct = np.zeros(out["reader_logits"].shape, bool)
  for i in range(b):
    for r in range(READ):
      gold = {(s, e) for s, e, m in zip(f["gold_starts"][i, r], f["gold_ends"][i, r],
                                        f["gold_mask"][i, r]) if m}
      correct[i, r] = [(s, e) in gold for s, e in zip(out["span_starts"][i, r],
                                                      out["span_ends"][i, r])]
  rc = f["retriever_correct"].astype(bool)
  terms = [(_nll(out["retriever_logits"][i], rc[i]) if rc[i].any() else 0.0) +
           (_nll(out["reader_logits"][i].ravel(), correct[i].ravel()) if correct[i].any()
            else 0.0) for i in range(b)]
  assert not rc[2].any() and not correct[2].any()       # question 2: both terms dropped
  assert rc[0].any() and correct[0].any()
  np.testing.assert_allclose(loss.numpy(), np.mean(terms), rtol=1e-5)

  flat = out["reader_logits"].reshape(b, -1)
  top = flat.argmax(1)
  block, span = top // (LR * WIDTH), top % (LR * WIDTH)
  np.testing.assert_array_equal(best["block"], block)
  offsets = (f["reader_mask"] - f["reader_type_ids"]).sum(-1)[np.arange(b), block]
  np.testing.assert_array_equal(best["start"],
                                out["span_starts"][np.arange(b), block, span] - offsets)
  np.testing.assert_array_equal(best["end"], out["span_ends"][np.arange(b), block, span] - offsets)
  want = {
      "exact_match": np.mean(correct[np.arange(b), block, span]),
      "reader_oracle": np.mean(correct.reshape(b, -1).any(1)),
      "no_correct_in_beam": np.mean(~rc.any(1)),
      "no_correct_read": np.mean(~correct.reshape(b, -1).any(1)),
      "top_1_match": np.mean(rc[:, 0]), "top_5_match": np.mean(rc[:, :5].any(1)),
  }
  results = {m.name: m.result().numpy() for m in metrics}
  assert set(want) <= set(results)
  for name, value in want.items():
    np.testing.assert_allclose(results[name], value, rtol=1e-6, err_msg=name)

  # Gradients: the query tower and the reader get them; the block embeddings are an input
  # whose gradient is d loss / d retriever logit times the query, and never a variable.
  beam_emb = tf.Variable(f["beam_emb"])
  with tf.GradientTape() as tape:
    loss = task.forward(dict(feats, beam_emb=beam_emb), model, None, training=False)
  variables = model.trainable_variables
  grads = tape.gradient(loss, variables + [beam_emb])
  nonzero = {id(v) for v, g in zip(variables, grads[:-1])
             if g is not None and np.abs(tf.convert_to_tensor(g).numpy()).sum() > 0}
  ids = lambda layer: {id(v) for v in layer.trainable_variables}
  assert ids(model.reader.span_scorer) <= nonzero
  assert len(nonzero & ids(model.query_embedder)) > 10
  assert len(nonzero & ids(model.reader.encoder)) > 10
  d_logits = np.zeros([b, BEAM])
  for i in range(b):
    if rc[i].any():
      p = _softmax(out["retriever_logits"][i])
      d_logits[i] += p - np.where(rc[i], p, 0.0) / p[rc[i]].sum()
    if correct[i].any():
      p = _softmax(out["reader_logits"][i].ravel())
      post = np.where(correct[i].ravel(), p, 0.0) / p[correct[i].ravel()].sum()
      d_logits[i, :READ] += (p - post).reshape(READ, -1).sum(1)
  query = _span_reference(model, f)["query"]
  want_grad = d_logits[:, :, None] * query[:, None, :] / b
  np.testing.assert_allclose(grads[-1].numpy(), want_grad, rtol=1e-3, atol=1e-6)
  assert np.abs(grads[-1].numpy()[2]).max() == 0.0       # question 2 teaches nothing
  assert np.abs(grads[-1].numpy()[0, READ:]).max() > 0   # unread blocks: the retriever term
  # No variable of the model holds the block embeddings.
  table = tiny["embeddings"]
  assert model.block_embedder is None
  assert all(tuple(v.shape) != table.shape for v in model.variables)
  assert all(v is not beam_emb for v in model.trainable_variables)


def test_official_exact_match_from_wordpiece_positions(tiny):
  """reduce_aggregated_logs maps (block id, wordpiece start, end) back to the block's own
  characters and scores them with ORQA's normalization; each question counts once."""
  task = openqa_task.OpenQaTask(tiny["task"].task_config)
  task._builder = tiny["builder"]          # pylint: disable=protected-access
  task._questions[False] = QUESTIONS       # pylint: disable=protected-access
  # Blocks: 0 "Paris is ...", 2 "London is the capital of England, on the river Thames.",
  # 1 "The Eiffel Tower stands in Paris, ..." (one wordpiece a word here), 7 "Madrid ...".
  steps = [
      dict(question_index=[0, 1], predicted_block=[0, 2], predicted_start=[0, 8],
           predicted_end=[0, 10]),                           # "Paris"; "the river Thames"
      dict(question_index=[2, 3], predicted_block=[7, 1], predicted_start=[0, 5],
           predicted_end=[0, 5]),                            # "Madrid" (wrong); "Paris"
      dict(question_index=[0, -1], predicted_block=[7, 0], predicted_start=[0, 0],
           predicted_end=[0, 0]),                            # a repeat, and padding
  ]
  state = None
  for step in steps:   # As Model Garden passes them: a tuple of per-replica values each.
    state = task.aggregate_logs(state, {k: (np.array(v),) for k, v in step.items()})
  logs = task.reduce_aggregated_logs(state)
  assert logs == {"official_exact_match": 0.75, "questions": 4.0}
  # Per question, in the file's order, the first prediction of each (the tables' records).
  assert [(r["question"], r["prediction"], r["correct"]) for r in task.question_records] == [
      (QUESTIONS[0].question, "Paris", True), (QUESTIONS[1].question, "the river Thames", True),
      (QUESTIONS[2].question, "Madrid", False), (QUESTIONS[3].question, "Paris", True)]
  block = tiny["builder"].block_texts([2])[0]
  assert predict_lib.span_text(block, 8, 10) == "the river Thames"
  assert predict_lib.span_text(block, 10, 12) == ""          # past the block: no answer

  # The validation step itself: its predictions are the global argmax, as block ids.
  model, f = tiny["model"], tiny["features"]
  feats = _tensors(f)
  out = model(feats, training=False)
  logs = task.validation_step(feats, model)
  flat = out["reader_logits"].numpy().reshape(len(QUESTIONS), -1)
  rank = flat.argmax(1) // (LR * WIDTH)
  np.testing.assert_array_equal(logs["predicted_block"], f["beam_ids"][np.arange(4), rank])
  np.testing.assert_array_equal(logs["question_index"], [0, 1, 2, 3])


def test_mirrored_strategy_matches_one_device(tiny):
  config, task, f = tiny["config"], tiny["task"], _tensors(tiny["features"])
  strategy = testing.two_cpu_strategy()
  assert strategy.num_replicas_in_sync == 2
  single = OpenQaModel.from_config_dataclass(config)
  single.set_weights(tiny["model"].get_weights())
  with strategy.scope():
    mirrored = OpenQaModel.from_config_dataclass(config)
    mirrored.set_weights(tiny["model"].get_weights())
    optimizer = tf_keras.optimizers.SGD(0.5)
  want = task.train_step(f, single, tf_keras.optimizers.SGD(0.5))["loss"]
  dataset = strategy.experimental_distribute_dataset(
      tf.data.Dataset.from_tensor_slices(f).batch(len(QUESTIONS)))

  @tf.function
  def step(x):
    logs = strategy.run(lambda x: task.train_step(x, mirrored, optimizer), args=(x,))
    return strategy.reduce("MEAN", logs["loss"], axis=None)

  got = step(next(iter(dataset)))
  np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4)
  moved = 0
  for a, b, c in zip(single.get_weights(), mirrored.get_weights(), tiny["model"].get_weights()):
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)
    moved += int(np.abs(a - c).max() > 1e-6)
  assert moved > 10   # the step did change the weights


# ---------------------------------------------------------------------------- end to end --


@pytest.fixture(scope="module")
def trained(openqa_world, tmp_path_factory):
  """conftest's Open-QA world (its random-init REALM model) and a brute-force index of its
  block tower, then a few steps of ``openqa_cpu`` (train_and_eval) from it."""
  root = tmp_path_factory.mktemp("openqa_e2e")
  files, blocks_dir = openqa_world["files"], openqa_world["blocks_dir"]
  realm_dir, index_dir = openqa_world["realm_dir"], str(root / "index")
  refresher.build_index_for_checkpoint(
      None, realm_dir, blocks_dir, index_dir,
      refresher.BuildOptions(index_type="brute_force", recall_queries=0, progress=False,
                             tensorboard_dir=""))
  size = len(load_vocab(files["vocab"]))
  overrides = {
      "task.model.vocab_file": files["vocab"],
      "task.model.retriever.encoder.vocab_size": size,
      "task.model.retriever.encoder.hidden_size": 16,
      "task.model.retriever.encoder.intermediate_size": 64,
      "task.model.retriever.projection_size": 16,
      "task.model.retriever.query_seq_length": 24,
      "task.model.retriever.block_seq_length": 48,
      "task.model.reader.encoder.vocab_size": size,
      "task.model.reader.encoder.hidden_size": 32,
      "task.model.reader.encoder.intermediate_size": 64,
      "task.model.reader.openqa_seq_length": 64,
      "task.model.reader.span_hidden_size": 16,
      "task.init_checkpoint": realm_dir,
      "task.index_dir": index_dir,
      "task.retriever_beam_size": 10,
      "task.reader_beam_size": 8,
      "task.top_k": "[1, 5, 10]",
      "task.train_data.input_path": files["qa_train"],
      "task.train_data.global_batch_size": 4,
      "task.train_data.seed": 0,
      "task.validation_data.input_path": files["qa_dev"],
      "task.validation_data.global_batch_size": 3,
      "trainer.train_steps": 4,
      "trainer.steps_per_loop": 2,
      "trainer.summary_interval": 2,
      "trainer.checkpoint_interval": 2,
      "trainer.validation_interval": 2,
  }
  params = configs.load_experiment(
      "openqa_cpu", params_override=",".join(f"{k}={v}" for k, v in overrides.items()))
  model_dir = str(root / "openqa")
  metrics = train_lib.run_experiment(params, model_dir, mode="train_and_eval")
  return dict(root=root, files=files, blocks_dir=blocks_dir, realm_dir=realm_dir,
              index_dir=index_dir, model_dir=model_dir, metrics=metrics, params=params,
              tiny_trainer=openqa_world["tiny_trainer"], vocab=files["vocab"])


def test_end_to_end_train_eval_and_answer(trained):
  t = trained
  metrics, model_dir = t["metrics"], t["model_dir"]
  dev = helpers.read_jsonl(t["files"]["qa_dev"])
  assert 3 < len(dev) < 10   # more than one validation batch, the last one partial
  for key in ("validation/official_exact_match", "validation/top_5_match",
              "validation/exact_match", "validation/reader_oracle", "training_loss"):
    assert key in metrics, sorted(metrics)
  assert metrics["validation/questions"] == len(dev)   # each dev question scored once
  # Training read blocks with gold spans (both loss terms), with full batches.
  assert metrics["retriever_loss"] > 0 and metrics["reader_loss"] > 0
  np.testing.assert_allclose(metrics["training_loss"],
                             metrics["retriever_loss"] + metrics["reader_loss"], rtol=1e-5)
  assert 0.0 <= metrics["validation/official_exact_match"] <= 1.0
  assert model_dir_lib.checkpoint_step(model_dir_lib.latest_checkpoint(model_dir)) == 4
  with open(os.path.join(model_dir, "best_ckpt", "info.json")) as f:
    info = json.load(f)
  assert "exact_match" in info and info["best_ckpt_global_step"] in (2, 4)
  best = tf.train.latest_checkpoint(os.path.join(model_dir, "best_ckpt"))
  assert model_dir_lib.trained_step(best) == info["best_ckpt_global_step"]  # not best_ckpt-N
  assert model_dir_lib.trained_step(os.path.join(model_dir, "ckpt-4")) == 4
  # The fine-tuned model dir no longer shares its towers; the query tower started from the
  # REALM model's.
  assert not model_dir_lib.load_config(model_dir).retriever.share_embedders
  config = model_dir_lib.load_config(model_dir)
  query_embedder, _ = factory.build_embedders(config.retriever)
  model_dir_lib.restore(os.path.join(model_dir, "ckpt-0"), query_embedder=query_embedder)
  for a, b in zip(query_embedder.get_weights(), t["tiny_trainer"].query_embedder.get_weights()):
    np.testing.assert_array_equal(a, b)

  # The validation metrics again, from OpenQA.predict on the checkpoint that was validated.
  qa = realm_tf.OpenQA.load(model_dir, t["index_dir"],
                            checkpoint=model_dir_lib.latest_checkpoint(model_dir),
                            reader_beam_size=8, retriever_beam_size=10)
  questions = [inputs_lib.Question(d["question"], d["answers"]) for d in dev]
  results = qa.predict(questions)
  official = np.mean([inputs_lib.official_match(r["answer"], q)
                      for r, q in zip(results, questions)])
  np.testing.assert_allclose(metrics["validation/official_exact_match"], official)
  for k in (5, 10):
    np.testing.assert_allclose(metrics[f"validation/top_{k}_match"],
                               np.mean([r["retriever_correct"][:k].any() for r in results]),
                               rtol=1e-6)
  assert metrics["validation/top_10_match"] > 0
  np.testing.assert_allclose(metrics["validation/exact_match"],
                             np.mean([r["span_match"] for r in results]), rtol=1e-6)

  # Answers with evidence, from the best checkpoint by default.
  qa = realm_tf.OpenQA.load(model_dir, t["index_dir"])
  assert qa.checkpoint.startswith(os.path.join(model_dir, "best_ckpt"))
  fields = manifests.read_blocks(t["blocks_dir"])   # sorted by block_id
  asked = ([d["question"] for d in helpers.read_jsonl(t["files"]["qa_test"])][:4]
           + ["who is Zanzibar?"])
  answers = qa.answer(asked, batch_size=2)
  assert [a.question for a in answers] == asked
  for a in answers:
    assert len(a.evidence) == 5 and 0 <= a.block_rank < 5
    assert a.answer and a.evidence[a.block_rank].text[a.start:a.end] == a.answer
    scores = np.array([e.retrieval_score for e in a.evidence])
    assert np.all(np.diff(scores) <= 1e-4)   # best first (up to float rounding of near-ties)
    for e in a.evidence:
      assert e.text == fields[e.block_id]["body"] and e.title == fields[e.block_id]["title"]
    assert np.isfinite(a.score)
  assert json.dumps(answers[0].to_json())


def test_fine_tuning_reads_the_beam_of_its_retriever(trained):
  """``task.retriever``: the training batches' beams are that retriever's over the index
  (``hybrid.retrieve`` with the query tower of the step), each block's embedding with it."""
  from realm_tf.retrieval.sparse import hybrid  # pylint: disable=g-import-not-at-top
  from realm_tf.retrieval.publication import publish  # pylint: disable=g-import-not-at-top
  t = trained
  index = index_io.load_index(publish.read_latest(t["index_dir"]))
  questions = inputs_lib.load_questions(t["files"]["qa_train"])
  for retriever in ("hybrid", "bm25"):
    task = openqa_task.OpenQaTask(t["params"].task.replace(retriever=retriever))
    model = task.build_model()
    task.initialize(model)
    batch = next(iter(task.build_inputs(task.task_config.train_data)))
    chosen = [questions[i] for i in batch["question_index"].numpy()]
    embeddings = task._embed_questions(task.builder().question_inputs(
        [q.question for q in chosen]))
    want = hybrid.retrieve(index, retriever, embeddings, [q.question for q in chosen], 10)
    np.testing.assert_array_equal(batch["beam_ids"].numpy(), want.ids)
    np.testing.assert_array_equal(batch["beam_emb"].numpy(), index.embeddings[want.ids])
    assert (want.bm25_rank >= 0).any() and (want.dense_rank < 0).any()   # not the dense beam
    # A fused beam is read by its rule's block prior, as answering reads it.
    prior = task.builder().block_prior()
    if prior == "retriever":
      assert "block_prior" not in batch
    else:
      np.testing.assert_allclose(batch["block_prior"].numpy(), want.fused[:, :8] if
                                 prior == "fusion" else 0.0, rtol=1e-6)
  with pytest.raises(errors.RetrievalError, match="unknown retriever"):
    openqa_task.OpenQaTask(t["params"].task.replace(retriever="bm42")).builder()


def test_bad_inputs(trained, tmp_path):
  t = trained
  qa = realm_tf.OpenQA.load(t["model_dir"], t["index_dir"])
  with pytest.raises(ValueError, match="empty question"):
    qa.answer([""])
  with pytest.raises(ValueError, match="empty question"):
    qa.answer(["where was it?", "   "])
  # The REALM model before fine-tuning has no span scorer.
  with pytest.raises(model_dir_lib.ModelDirError, match="span scorer"):
    realm_tf.OpenQA.load(t["realm_dir"], t["index_dir"])
  with pytest.raises(model_dir_lib.ModelDirError, match="span scorer"):
    predict_lib.check_span_scorer(model_dir_lib.latest_checkpoint(t["realm_dir"]),
                                  t["realm_dir"])
  # An index with the blocks of another corpus.
  other = str(tmp_path / "other_blocks")
  testing.make_corpus(other, t["vocab"], 12, block_seq_length=48)
  with pytest.raises(manifests.DataError) as e:
    host.open_index(t["index_dir"], other)
  assert other in str(e.value) and t["index_dir"] in str(e.value)
  assert "another corpus" in str(e.value)
  with pytest.raises(errors.IndexNotReadyError, match="realm-index build"):
    host.open_index(str(tmp_path / "no_index"))


def test_the_server_pins_the_block_tower_the_model_was_fine_tuned_against(trained, tmp_path):
  """Fine-tuning records the block tower of its index in the model directory; ``realm-serve``
  over that model refuses to start on an index directory whose ``LATEST`` is another tower's
  (a clear error naming the fix), starts on one of the recorded tower, and never swaps in an
  index of another tower published later."""
  from realm_tf.retrieval.publication import handle as handle_lib  # pylint: disable=g-import-not-at-top
  from realm_tf.retrieval.publication import publish  # pylint: disable=g-import-not-at-top
  from realm_tf.serving import service as service_lib  # pylint: disable=g-import-not-at-top
  t = trained
  path = publish.read_latest(t["index_dir"])
  manifest = mips_index.read_manifest(path)
  tower = handle_lib.block_tower_id(manifest)
  assert tower and tower == manifest["block_tower"]["fingerprint"]
  assert model_dir_lib.read_block_tower(t["model_dir"]) == {
      "fingerprint": tower, "index": os.path.basename(path)}
  index = index_io.load_index(path)
  other = dict(manifest, block_tower=dict(manifest["block_tower"], fingerprint="0" * 40))
  index_dir = str(tmp_path / "served")
  with publish.lock(index_dir):
    publish.publish(index, index_dir, 10, other)
  with pytest.raises(errors.BlockTowerMismatchError, match="0000000000") as e:
    service_lib.QAService(t["model_dir"], index_dir, reader_beam_size=2)
  for words in (tower, index_dir, model_dir_lib.BLOCK_TOWER_NAME, "realm-index build"):
    assert words in str(e.value), str(e.value)
  with publish.lock(index_dir):
    right = publish.publish(index, index_dir, 11, manifest)
  service = service_lib.QAService(t["model_dir"], index_dir, reader_beam_size=2,
                                  poll_seconds=3600)
  try:
    assert service.health()["index"] == os.path.basename(right)
    with publish.lock(index_dir):
      publish.publish(index, index_dir, 12, other)
    assert service._load_newer() is None  # pylint: disable=protected-access
    service._swap()  # pylint: disable=protected-access
    assert service.health()["index"] == os.path.basename(right)
  finally:
    service.close()
