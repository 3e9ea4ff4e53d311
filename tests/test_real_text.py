"""The real-text retrieval comparison (experiments/real_text/main.py) end to end at a tiny size, and
the failures real text showed, each on a short real snippet."""

import csv
import dataclasses
import json
import math
import os

import numpy as np
import pytest
import yaml

from data_prep import blocks
from data_prep import squad
from data_prep import wiki
from experiments import assets
from experiments.pipeline import common
from experiments.real_text import main as real_text
from experiments.real_text import report
from experiments.real_text import text_stages
from realm_tf.openqa import inputs as inputs_lib
from realm_tf.retrieval.publication import publish
from realm_tf.retrieval.sparse import sparse_index

# From the enwiki dump's Anarchism page (assets/wikipedia): the reference holds an unmatched
# '' (closing an italic that never opened), which pairs with the next line's '' and makes
# mwparserfromhell give up on the <ref> tag: its markup and content came out as text.
CRITCHLEY = (
    "it is an ethical outrage at the yawning inequality, impoverishment and disenfranchisment "
    "that is so palpable locally and globally.\"<ref>[[Simon Critchley#Infinitely Demanding|"
    "Infinitely Demanding]]'' by [[Simon Critchley]]. [[Verso Books|Verso]]. 2007. p. 125</ref>\n"
    "In 1793, [[William Godwin]], who has often<ref name=\"Everhart, Robert B 1982. p. 115\"/> "
    "been cited as the first anarchist, wrote ''[[Political Justice]]'', which some consider the "
    "first expression of anarchism.")


def test_reference_left_unparsed_is_dropped():
  text = wiki.clean_wikitext(CRITCHLEY)
  assert text == (
      "it is an ethical outrage at the yawning inequality, impoverishment and disenfranchisment "
      "that is so palpable locally and globally.\"\nIn 1793, William Godwin, who has often been "
      "cited as the first anarchist, wrote Political Justice, which some consider the first "
      "expression of anarchism.")
  # Tags left as text: a dropped element goes with its content, others keep their content;
  # angle brackets that are no tag stay.
  assert wiki.drop_unparsed_tags("a <small>b</small> c<ref name=x/> d<ref>e</ref> 3 < 4 > 2") == (
      "a b c d 3 < 4 > 2")


def test_squad_titles_are_display_titles():
  # SQuAD v1.1 dev's URL-form titles.
  assert squad.display_title("Fresno,_California") == "Fresno, California"
  assert squad.display_title("Sky_(United_Kingdom)") == "Sky (United Kingdom)"
  assert squad.display_title("Beyonc%C3%A9") == "Beyoncé"
  # BM25's words: the underscore form hides the title's words from every question.
  words = text_stages.bm25_tokens(["Super_Bowl_50", squad.display_title("Super_Bowl_50")])
  assert words == [["super_bowl_50"], ["super", "bowl", "50"]]


def test_squad_questions_and_split():
  articles = squad.read_squad(str(assets.SQUAD_DEV))
  assert len(articles) == 48
  title, first = next(squad.questions(articles))
  assert title == "Super Bowl 50"
  assert first.question == "Which NFL team represented the AFC at Super Bowl 50?"
  assert first.answers == ["Denver Broncos"]  # three annotators, one distinct answer
  # MD5 of the title, pinned: the split never changes between machines or runs.
  assert [squad.split_of(t) for t in ("Super Bowl 50", "Normans", "Nikola Tesla")] == [
      "dev", "train", "test"]
  with pytest.raises(squad.SplitError):
    squad.split_of("Normans", (0.5, 0.5, 0.5))


def test_mixed_corpus_input(tmp_path):
  jsonl = tmp_path / "docs.jsonl"
  jsonl.write_text('{"title": "a", "text": "b"}\n')
  kind, files = blocks.resolve_input(f"{jsonl},{assets.ENWIKI_DUMP}")
  assert kind == "mixed"
  assert [blocks.file_kind(f) for f in files] == ["jsonl", "xml"]
  assert blocks.resolve_input(str(jsonl))[0] == "jsonl"


def reference_bm25(documents, queries, k1=1.5, b=0.75):
  """Lucene's BM25 by its formula, scores ``[q, d]``, over the same words."""
  docs = text_stages.bm25_tokens(documents)
  lengths = np.array([len(d) for d in docs], float)
  average = lengths.mean()
  df = {}
  for d in docs:
    for w in set(d):
      df[w] = df.get(w, 0) + 1
  scores = np.zeros([len(queries), len(docs)])
  for qi, query in enumerate(text_stages.bm25_tokens(queries)):
    for w in query:
      if w not in df:
        continue
      idf = math.log(1 + (len(docs) - df[w] + 0.5) / (df[w] + 0.5))
      for di, d in enumerate(docs):
        tf = d.count(w)
        scores[qi, di] += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * lengths[di] / average))
  return scores


# The trained stages at a tiny size: a handful of steps, short sequences, few questions.
TINY_BUDGET = real_text.Budget(
    ict_steps=4, ict_batch_size=8, ict_query_seq_length=16, ict_block_seq_length=48,
    ict_learning_rate=1e-4, gold_learning_rate=1e-4, gold_epochs=0.02, gold_batch_size=16,
    openqa_steps=4, openqa_batch_size=2, openqa_learning_rate=5e-5,
    reader_seq_length=64, reader_beam_size=2, retriever_beam_size=8, openqa_validations=2,
    openqa_dev_questions=6, openqa_test_questions=8, eval_batch_size=4)
TINY = dict(max_articles=4, max_paragraphs=4, max_pages=1, salient_spans=False, batch_size=8,
            budget=TINY_BUDGET)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  """Four SQuAD articles, four paragraphs each, and the dump's first page (a redirect); every
  stage, the trained ones at TINY_BUDGET."""
  out = str(tmp_path_factory.mktemp("real_text"))
  stages = real_text.run_experiment(out, **TINY)
  return out, stages


def test_tiny_run_end_to_end(tiny_run):
  out, stages = tiny_run
  work = os.path.join(out, "work")
  # The corpus: 16 SQuAD paragraphs, and the dump's page went through the same pipeline.
  assert stages["corpus"]["squad_paragraphs"] == 16
  assert stages["corpus"]["counts"]["drop:redirect"] == 1
  from realm_tf.data import manifests  # pylint: disable=g-import-not-at-top
  got = manifests.read_blocks(os.path.join(work, "blocks"))
  assert {b["title"] for b in got} == {"Super Bowl 50", "Warsaw", "Normans", "Nikola Tesla"}
  assert all(len(b["token_ids"]) <= 288 for b in got)

  # No article in two splits; every question file holds only its split's articles' questions.
  split = stages["questions"]["articles"]
  seen = [t for titles in split.values() for t in titles]
  assert len(seen) == len(set(seen)) == 4
  assert split["test"] == ["Nikola Tesla"]
  test = text_stages.test_questions(work, 0)
  assert len(test) == stages["questions"]["questions"]["test"] == stages["bm25"][
      "test_questions"] > 10

  # BM25 against Lucene's formula computed here: the same top blocks, the same recall.
  texts = [f"{b['title']}\n{b['body']}" for b in got]
  want = reference_bm25(texts, [r.question for r in test])
  top = np.load(os.path.join(work, "bm25", "top_ids.npy"))
  for row, scores in zip(top, want):
    np.testing.assert_allclose(scores[row], np.sort(scores)[::-1][:len(row)], rtol=1e-4,
                               atol=1e-5)
  ref_top = np.argsort(-want, axis=1, kind="stable")[:, :20]
  bodies = [b["body"] for b in got]
  assert text_stages.recall_at(ref_top, bodies, test) == pytest.approx(
      {k: v for k, v in stages["bm25"].items() if k.startswith("recall")})
  # Recall is monotone in k, and at k >= the corpus it is the share of answerable questions.
  r = stages["bm25"]
  assert r["recall@1"] <= r["recall@5"] <= r["recall@20"]
  if len(got) <= 20:
    oracle = np.mean([any(inputs_lib.has_answer(body, q.answers) for body in bodies)
                      for q in test])
    assert r["recall@20"] == pytest.approx(oracle)


def test_tower_pass_sides_of_untied_towers(tmp_path):
  """Untied towers (REALM's frozen block tower, ``--realm_freeze_blocks``): the test rows embed
  blocks with the block side, each side exactly its tower's own inference, and the two
  differ."""
  # pylint: disable=g-import-not-at-top
  import helpers
  import tensorflow as tf
  import tf_keras
  from realm_tf import model_dir as model_dir_lib
  from realm_tf.data import features
  from realm_tf.modeling.models import RealmPretrainer
  # pylint: enable=g-import-not-at-top
  tf_keras.utils.set_random_seed(0)
  config = helpers.tiny_config(share=False)
  model = RealmPretrainer.from_config_dataclass(config)
  vocab = tmp_path / "vocab.txt"
  helpers.write_word_vocab(vocab, [f"w{i}" for i in range(helpers.VOCAB -
                                                           len(helpers.RESERVED))])
  model_dir = str(tmp_path / "realm")
  model_dir_lib.write_metadata(model_dir, config, str(vocab))
  model_dir_lib.make_checkpoint(**model.checkpoint_items).save(os.path.join(model_dir, "ckpt"))
  rows = [[helpers.CLS, 7, 8, 9, helpers.SEP], [helpers.CLS, 10, helpers.SEP, 11, helpers.SEP]]
  query = text_stages.TowerPass(model_dir)
  got = {side: text_stages.embed_token_ids(text_stages.TowerPass(query.embedder, side), rows, 8,
                                           2)[0] for side in ("query", "block")}
  inputs = features.pack_block_ids(tf.ragged.constant(rows, tf.int32), 8, helpers.SEP)
  for side in ("query", "block"):
    want = getattr(model, f"{side}_embedder")(inputs, training=False).numpy()
    np.testing.assert_allclose(got[side], want, rtol=1e-4, atol=1e-5)
  assert np.abs(got["query"] - got["block"]).max() > 1e-3


def test_tiny_run_minilm_and_tables(tiny_run):
  out, stages = tiny_run
  work = os.path.join(out, "work")
  test = text_stages.test_questions(work, 0)
  # The one encoder pass gives exactly the converted tower's own embeddings.
  tower = text_stages.TowerPass(os.path.join(work, "minilm_model"))
  questions = [r.question for r in test[:3]]
  want = tower.embedder.embed_queries(questions)
  np.testing.assert_allclose(np.load(os.path.join(work, "minilm", "question_emb.npy"))[:3], want,
                             atol=2e-4)
  for name in ("realm", "mean"):
    r = stages["minilm"][name]
    assert 0.0 <= r["recall@1"] <= r["recall@5"] <= r["recall@20"] <= 1.0

  with open(os.path.join(out, "results", "real_text_retrieval.csv")) as f:
    rows = list(csv.DictReader(f))
  assert [r["retriever"] for r in rows] == [report.BM25, report.MINILM, report.MINILM_MEAN,
                                            report.MINILM_ICT, report.HYBRID]
  assert all(int(r["test_questions"]) == len(test) for r in rows)
  assert float(rows[0]["recall@5"]) == pytest.approx(stages["bm25"]["recall@5"], abs=1e-4)
  assert float(rows[3]["recall@5"]) == pytest.approx(stages["ict"]["recall@5"], abs=1e-4)
  # Every recall has its 95% interval over the questions, around it, in [0, 1].
  for row in rows:
    for k in real_text.TOP_K:
      lo, value, hi = (float(row[f"recall@{k}{s}"]) for s in ("_lo", "", "_hi"))
      assert 0.0 <= lo <= value <= hi <= 1.0 and hi - lo > 0.0
      assert (lo, hi) == pytest.approx(common.wilson_interval(round(value * len(test)),
                                                                 len(test)), abs=1e-4)
  md = open(os.path.join(out, "results", "real_text_retrieval.md")).read()
  assert "| BM25 |" in md and f"| {report.MINILM_ICT} |" in md and "ICT: 4 steps" in md
  low, high = rows[3]["recall@5_lo"], rows[3]["recall@5_hi"]
  assert f"{float(rows[3]['recall@5']):.3f} [{float(low):.3f}, {float(high):.3f}]" in md

  # A second run skips every stage (their summaries, times included, are the recorded ones)
  # and writes the same tables; other options in the same directory are refused.
  tables = {n: open(stages["results"][n]).read() for n in ("csv", "md", "openqa_csv")}
  again = real_text.run_experiment(out, **TINY)
  names = [n for n in report.STAGE_NAMES if n != "spans"]
  for name in names + ["reader_convert", "openqa_train", "openqa_eval"]:
    assert again[name] == stages[name], name
  assert {n: open(again["results"][n]).read() for n in tables} == tables
  with pytest.raises(real_text.RealTextError, match="max_articles"):
    real_text.run_experiment(out, **dict(TINY, max_articles=5))
  with pytest.raises(real_text.RealTextError, match="ict_steps"):
    real_text.run_experiment(out, **dict(TINY, budget=dataclasses.replace(TINY_BUDGET,
                                                                          ict_steps=5)))
  with open(os.path.join(work, "options.json")) as f:
    assert json.load(f)["max_articles"] == 4


def test_tiny_run_ict(tiny_run):
  """ICT trained the converted tower (from its weights, for its steps), and the retrieval row
  and the Open-QA index are that tower's."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from realm_tf import model_dir as model_dir_lib  # pylint: disable=g-import-not-at-top
  out, stages = tiny_run
  work = os.path.join(out, "work")
  ict_dir = os.path.join(work, "ict_model")
  assert model_dir_lib.checkpoint_step(model_dir_lib.latest_checkpoint(ict_dir)) == 4
  assert model_dir_lib.load_config(ict_dir).retriever.block_seq_length == 48
  start = tf.train.load_checkpoint(model_dir_lib.latest_checkpoint(
      os.path.join(work, "minilm_model")))
  trained = tf.train.load_checkpoint(model_dir_lib.latest_checkpoint(ict_dir))
  names = [n for n in start.get_variable_to_shape_map()
           if n.startswith("block_embedder/") and "OPTIMIZER" not in n]  # one shared tower
  assert names
  moved = [n for n in names if not np.allclose(start.get_tensor(n), trained.get_tensor(n))]
  assert len(moved) > len(names) // 2  # trained from MiniLM's weights, not from scratch
  for n in names:  # ... and close to them after 4 steps
    np.testing.assert_allclose(start.get_tensor(n), trained.get_tensor(n), atol=0.05)
  # The row's question embeddings are the ICT tower's own.
  tower = text_stages.TowerPass(ict_dir)
  test = text_stages.test_questions(work, 0)
  np.testing.assert_allclose(np.load(os.path.join(work, "ict", "question_emb.npy"))[:3],
                             tower.embedder.embed_queries([r.question for r in test[:3]]),
                             atol=2e-4)
  assert os.path.exists(os.path.join(work, "ict_index", "LATEST"))
  assert 0 < stages["ict_examples"]["num_train"] <= stages["corpus"]["blocks"]


def test_tiny_run_hybrid(tiny_run):
  """The hybrid row: the ICT row's top list, scored again from the ICT index, and the index's
  BM25 part's (only blocks that share a word with the question), fused by the library's rule;
  its recall is that of its saved top ids."""
  # pylint: disable=g-import-not-at-top
  from realm_tf.data import manifests
  from realm_tf.retrieval.sparse import hybrid
  # pylint: enable=g-import-not-at-top
  out, stages = tiny_run
  work = os.path.join(out, "work")
  row = stages["hybrid"]
  assert row["fusion"] == hybrid.FUSION and row["test_questions"] == stages["ict"][
      "test_questions"]
  blocks = manifests.read_blocks(os.path.join(work, "blocks"))
  test = text_stages.test_questions(work, 0)
  depth = min(hybrid.FUSION["depth"], len(blocks))
  q_emb = np.load(os.path.join(work, "ict", "question_emb.npy"))
  emb = np.load(os.path.join(publish.read_latest(os.path.join(work, "ict_index")),
                             "embeddings.npy"))
  scores = q_emb @ emb.T
  ict_ids = np.argsort(-scores, axis=1, kind="stable")[:, :depth]
  bm25 = sparse_index.SparseIndex.build(
      [f"{b['title']}\n{b['body']}" for b in blocks]).search([r.question for r in test], depth)
  want = hybrid.fuse(ict_ids, np.take_along_axis(scores, ict_ids, 1), *bm25, depth).ids
  np.testing.assert_array_equal(np.load(os.path.join(work, "hybrid", "top_ids.npy")), want)
  bodies = [b["body"] for b in blocks]
  for k in (1, 5, 20):
    assert row[f"recall@{k}"] == text_stages.recall_at(want, bodies, test)[f"recall@{k}"]
  assert set(row["dev_recall"]) == {"BM25", "ICT"} | {
      f"bm25_weight {w}" for w in text_stages.HYBRID_WEIGHTS}
  # Its page pairs it with BM25 on the same questions.
  first = {k: text_stages.first_hits(ids, bodies, test) for k, ids in (
      ("hybrid", want), ("bm25", np.load(os.path.join(work, "bm25", "top_ids.npy"))))}
  page = open(os.path.join(out, "results", "real_text_hybrid.md")).read()
  line = next(l for l in page.splitlines() if l.startswith("| hybrid - BM25 | "))
  cells = line.strip("| ").split(" | ")[1:]
  for k, cell in zip((1, 5, 20), cells, strict=True):
    difference = np.mean((first["hybrid"] < k) * 1.0 - (first["bm25"] < k))
    assert cell.startswith(f"{100 * difference:+.1f} ["), (k, line)


def test_tiny_run_openqa(tiny_run):
  """Open-QA from the ICT retriever: the checkpoint chosen on dev, EM with its interval on
  the test sample, top-k match before and after; 'before' is what realm-eval measures on the
  run's initial checkpoint (ckpt-0)."""
  from realm_tf.data import qa  # pylint: disable=g-import-not-at-top
  from realm_tf.openqa import evaluation  # pylint: disable=g-import-not-at-top
  from realm_tf.openqa import predict  # pylint: disable=g-import-not-at-top
  out, stages = tiny_run
  work = os.path.join(out, "work")
  train, result = stages["openqa_train"], stages["openqa_eval"]
  dev_steps = [s for s, _ in train["dev"]["exact_match"]]
  assert dev_steps == [2, 4] and train["best_step"] in dev_steps
  assert result["checkpoint"] == train["best_checkpoint"]
  assert "best_ckpt" in result["checkpoint"]
  with open(os.path.join(out, "results", "real_text_openqa.csv")) as f:
    rows = list(csv.DictReader(f))
  assert [r["model"] for r in rows] == [report.OPENQA_GOLD, report.OPENQA_BEFORE,
                                        report.OPENQA_AFTER, report.OPENQA_BM25,
                                        report.OPENQA_HYBRID, report.OPENQA_HYBRID_FT]
  gold, before, after, bm25, fused, fused_ft = rows
  assert before["exact_match"] == "" and int(after["checkpoint_step"]) == train["best_step"]
  # Stage A ran, Open-QA started from its reader, and its gold row is the test sample's.
  assert text_stages.reader_start(work) == os.path.join(work, "gold_reader")
  assert int(gold["checkpoint_step"]) == stages["gold_reader"]["steps"] > 0
  assert stages["gold_test"]["test_file"] == result["test_file"]
  with open(os.path.join(work, "gold_reader", "test_predictions.jsonl")) as f:
    gold_rows = [json.loads(line) for line in f]
  assert float(gold["exact_match"]) == pytest.approx(np.mean([r["em"] for r in gold_rows]),
                                                     abs=1e-4)
  assert gold["top_5_match"] == "" and len(gold_rows) == 8
  # The BM25 row read BM25's blocks: its top-k match is BM25's on the same sample.
  from realm_tf.data import manifests  # pylint: disable=g-import-not-at-top
  bodies = [b["body"] for b in manifests.read_blocks(os.path.join(work, "blocks"))]
  sample, _ = qa.read_qa(result["test_file"])
  chosen = text_stages.qa_subset(work, "test", 8, 0)[1]
  first = text_stages.first_hits(np.load(os.path.join(work, "bm25", "top_ids.npy"))[chosen],
                               bodies, sample)
  for k in (1, 5):
    assert float(bm25[f"top_{k}_match"]) == pytest.approx(np.mean(first < k), abs=1e-4)
  with open(os.path.join(work, "bm25_reader_eval", "predictions_with_evidence.jsonl")) as f:
    read = [json.loads(line) for line in f]
  bm25_top = np.load(os.path.join(work, "bm25", "top_ids.npy"))[chosen]
  for row, top in zip(read, bm25_top):
    assert [b["block_id"] for b in row["blocks"]] == top[:2].tolist()
  # The hybrid row: the fine-tuned model with --retriever=hybrid, i.e. its own query tower's
  # top 20 over the ICT index's embeddings fused with BM25's top 20 (index without a BM25 part:
  # the same embeddings published again with one); its paired EM is the records' difference.
  # pylint: disable=g-import-not-at-top
  from realm_tf import embedder_api
  from realm_tf.retrieval.sparse import hybrid
  # pylint: enable=g-import-not-at-top
  with open(os.path.join(work, "hybrid_reader_eval", "predictions_with_evidence.jsonl")) as f:
    fused_read = [json.loads(line) for line in f]
  tower = embedder_api.Embedder.load(train["model_dir"], predict.best_checkpoint(
      train["model_dir"]))
  emb = np.load(os.path.join(publish.read_latest(os.path.join(work, "ict_index")),
                             "embeddings.npy"))
  scores = tower.embed_queries([r.question for r in sample]) @ emb.T
  depth = min(20, len(bodies))
  dense = np.argsort(-scores, axis=1, kind="stable")[:, :depth]
  blocks = manifests.read_blocks(os.path.join(work, "blocks"))
  bm25_lists = sparse_index.SparseIndex.build(
      [f"{b['title']}\n{b['body']}" for b in blocks]).search([r.question for r in sample], depth)
  fused_top = hybrid.fuse(dense, np.take_along_axis(scores, dense, 1), *bm25_lists, 2).ids
  assert [[b["block_id"] for b in r["blocks"]] for r in fused_read] == fused_top.tolist()
  em = {k: np.array([r["correct"] for r in rs], float) for k, rs in (("hybrid", fused_read),
                                                                     ("bm25", read))}
  assert float(fused["exact_match"]) == pytest.approx(em["hybrid"].mean(), abs=1e-4)
  page = open(os.path.join(out, "results", "real_text_hybrid.md")).read()
  assert f"| hybrid - BM25 | {100 * (em['hybrid'] - em['bm25']).mean():+.1f} [" in page
  with open(os.path.join(out, "results", "real_text_openqa_questions.csv")) as f:
    records = list(csv.DictReader(f))
  assert [int(r["hybrid_em"]) for r in records] == em["hybrid"].astype(int).tolist()
  # The hybrid fine-tune: ORQA's fine-tuning with hybrid beams of the rule's depth, answering
  # with the hybrid through its own fine-tuned query tower.
  ft = stages["openqa_hybrid_train"]
  with open(os.path.join(ft["model_dir"], "params.yaml")) as f:
    task = yaml.safe_load(f)["task"]
  assert task["retriever"] == "hybrid" and task["retriever_beam_size"] == 20
  assert task["index_dir"] == text_stages.sparse_index_dir(work)
  assert int(fused_ft["checkpoint_step"]) == ft["best_step"] in [s for s, _ in ft["dev"][
      "exact_match"]]
  tower = embedder_api.Embedder.load(ft["model_dir"], predict.best_checkpoint(ft["model_dir"]))
  scores = tower.embed_queries([r.question for r in sample]) @ emb.T
  dense = np.argsort(-scores, axis=1, kind="stable")[:, :depth]
  fused_top = hybrid.fuse(dense, np.take_along_axis(scores, dense, 1), *bm25_lists, 2).ids
  with open(os.path.join(work, "openqa_hybrid_eval", "predictions_with_evidence.jsonl")) as f:
    ft_read = [json.loads(line) for line in f]
  assert [[b["block_id"] for b in r["blocks"]] for r in ft_read] == fused_top.tolist()
  em["hybrid_ft"] = np.array([r["correct"] for r in ft_read], float)
  assert float(fused_ft["exact_match"]) == pytest.approx(em["hybrid_ft"].mean(), abs=1e-4)
  assert [int(r["hybrid_ft_em"]) for r in records] == em["hybrid_ft"].astype(int).tolist()
  assert (f"| hybrid fine-tune - BM25 | {100 * (em['hybrid_ft'] - em['bm25']).mean():+.1f} ["
          in page)
  # Read match is what fine-tuning trains on: a question whose read rows (the builder's
  # features for the blocks it read) hold a gold span.
  assert gold["read_match"] == before["read_match"] == ""
  for row, evidence in ((after, "openqa_eval"), (bm25, "bm25_reader_eval")):
    with open(os.path.join(work, evidence, "predictions_with_evidence.jsonl")) as f:
      answered = [json.loads(line) for line in f]
    model = predict.OpenQA.load(train["model_dir"], os.path.join(work, "ict_index"),
                                reader_beam_size=2, retriever_beam_size=2)
    hits = text_stages.read_hits(model, sample, answered)
    text_stages.read_given_beams(model, {r["question"]: [b["block_id"] for b in r["blocks"]]
                                       for r in answered})
    features = model.builder.features([inputs_lib.question_of(r) for r in sample],
                                      np.zeros([len(sample), 1], np.float32))
    assert hits == features["gold_mask"].any(axis=(1, 2)).tolist()
    assert float(row["read_match"]) == pytest.approx(np.mean(hits), abs=1e-4)
  for row in rows:
    assert int(row["test_questions"]) == result["test_questions"] == 8
    for name in ("exact_match", "read_match", "top_1_match", "top_5_match", "top_20_match"):
      if row[name]:
        lo, value, hi = (float(row[f"{name}{s}"]) for s in ("_lo", "", "_hi"))
        assert 0.0 <= lo <= value <= hi <= 1.0 and hi > lo
  with open(os.path.join(work, "openqa_eval", "metrics.json")) as f:
    metrics = json.load(f)
  assert float(after["exact_match"]) == pytest.approx(metrics["exact_match"], abs=1e-4)
  assert float(after["top_5_match"]) == pytest.approx(metrics["top_5_match"], abs=1e-4)
  md = open(os.path.join(out, "results", "real_text_openqa.md")).read()
  assert f"| {report.OPENQA_AFTER} | {train['best_step']} |" in md
  # 'Before' from the ICT stage's top 20 = realm-eval's top-k match of the initialization.
  records, _ = qa.read_qa(result["test_file"])
  model = predict.OpenQA.load(train["model_dir"], os.path.join(work, "ict_index"),
                              checkpoint=os.path.join(train["model_dir"], "ckpt-0"),
                              reader_beam_size=2, retriever_beam_size=8)
  initial, _ = evaluation.evaluate(model, records, batch_size=4, top_k=(1, 5), progress=False)
  for k in (1, 5):
    assert float(before[f"top_{k}_match"]) == pytest.approx(initial[f"top_{k}_match"],
                                                            abs=1e-4)


def test_check_options(tmp_path):
  """A work directory's options: the first run records them, a changed one is refused, a new
  one is recorded, and one a later run does not pass (its stages do not run) is kept."""
  clock, work = real_text.Clock("test"), str(tmp_path)
  real_text.check_options(clock, work, {"seed": 0, "realm.steps": 10})
  with pytest.raises(real_text.RealTextError, match=r"seed: \[0\], now \[1\]"):
    real_text.check_options(clock, work, {"seed": 1})
  real_text.check_options(clock, work, {"seed": 0, "ict_steps": 5})
  with open(os.path.join(work, "options.json")) as f:
    assert json.load(f) == {"seed": 0, "realm.steps": 10, "ict_steps": 5}
  with pytest.raises(real_text.RealTextError, match="realm.steps"):
    real_text.check_options(clock, work, {"seed": 0, "realm.steps": 20})


def test_wilson_interval_and_budget():
  # A textbook value: 8 of 10 -> [0.490, 0.943].
  assert common.wilson_interval(8, 10) == pytest.approx((0.4902, 0.9433), abs=1e-4)
  assert common.wilson_interval(0, 8)[0] == 0.0 and common.wilson_interval(8, 8)[1] == 1.0
  with pytest.raises(real_text.RealTextError, match="reader_beam_size"):
    dataclasses.replace(TINY_BUDGET, reader_beam_size=9).check()
  with pytest.raises(real_text.RealTextError, match="ict_steps"):
    dataclasses.replace(TINY_BUDGET, ict_steps=0).check()


# REALM's stages at a tiny size: two steps of each trained stage, short sequences.
TINY_REALM = real_text.RealmBudget(
    held_out_fraction=0.3, realm_query_seq_length=32, mlm_steps=2, mlm_batch_size=4,
    mlm_seq_length=32, mlm_validations=1, reading_steps=2, reading_batch_size=4,
    realm_reader_seq_length=64, realm_block_seq_length=48, realm_steps=2, realm_batch_size=2,
    num_candidates=3, refresh_every=1, validate_every=2, validation_sentences=16,
    qa_dev_questions=4, accuracy_sentences=12, distractor_steps=2, distractor_blocks=1,
    realm_lr_retriever=2.0, realm_reader_steps=1)


@pytest.mark.slow
def test_tiny_run_realm(tmp_path):
  """REALM on the tiny corpus: sentences from its blocks, the MiniLM reader's masked LM and
  reading warm start (strict restores, the converted reader's fresh MLM head included), REALM
  beside its refresher from the ICT tower and that reader, and the REALM tower's test
  recall."""
  # pylint: disable=g-import-not-at-top
  from experiments.real_text import text_realm
  from realm_tf import configs
  from realm_tf import model_dir as model_dir_lib
  from realm_tf.data import loaders
  from realm_tf.data import manifests
  from realm_tf.modeling import factory
  # pylint: enable=g-import-not-at-top
  out = str(tmp_path)
  stages = real_text.run_experiment(
      out, **dict(TINY, salient_spans=True), realm_seeds=[0], realm_budget=TINY_REALM)
  work = os.path.join(out, "work")
  data = stages["pretrain_data"]
  assert data["train_examples"] > 0 and data["eval_examples"] > 0
  assert sum(data["spans_by_label"].values()) == data["spans"]
  for name in ("reader_start_accuracy", "reader_mlm_accuracy", "mlm_reader_accuracy",
               "distract_reader_accuracy"):
    assert 0 < stages[name]["sentences"] <= TINY_REALM.accuracy_sentences
  assert [s for s, _ in stages["reader_mlm"]["validation"]["mlm_accuracy"]] == [2]
  # The accuracy against the reader run here on inputs built by hand: [CLS] query [SEP] and,
  # reading the own block, its body cut to the reader's room with a closing [SEP].
  reader_dir = os.path.join(work, "mlm_reader")
  got = text_realm.masked_span_accuracy(work, reader_dir,
                                       dataclasses.replace(TINY_REALM, accuracy_sentences=3))
  config = model_dir_lib.load_config(reader_dir)
  reader = factory.build_reader(config.reader)
  model_dir_lib.restore(model_dir_lib.latest_checkpoint(reader_dir), reader=reader)
  examples = loaders.MaskedExamplesLoader(
      configs.MaskedLmDataConfig(is_training=False), 32, 10,
      input_path=os.path.join(work, "pretrain", "eval-*")).read_all()
  store = {b["uid"]: b["token_ids"] for b in manifests.read_blocks(os.path.join(work, "blocks"))}
  right = {"null": [], "own_block": []}
  for i in range(3):
    query = examples["query_ids"][i][examples["query_mask"][i] > 0].tolist()
    block = store[examples["source_uid"][i].decode()]
    body = block[block.index(102) + 1:]                               # after the title's [SEP]
    room = TINY_REALM.realm_reader_seq_length - len(query)
    for name, extra in (("null", []), ("own_block", body[:room - 1] + [102] if len(body) >= room
                                        else body)):
      ids = query + extra
      row = np.zeros([1, TINY_REALM.realm_reader_seq_length], np.int32)
      row[0, :len(ids)] = ids
      types = np.zeros_like(row)
      types[0, len(query):len(ids)] = 1
      weights = examples["mlm_weights"][i] > 0
      logits = reader({"input_word_ids": row, "input_mask": (row > 0).astype(np.int32),
                       "input_type_ids": types,
                       "masked_lm_positions": examples["mlm_positions"][i:i + 1]},
                      training=False)["mlm_logits"].numpy()[0]
      right[name].append(logits.argmax(-1)[weights] == examples["mlm_ids"][i][weights])
  for name, rows in right.items():
    assert got[name]["token"]["value"] == pytest.approx(np.concatenate(rows).mean())
    assert got[name]["span"]["value"] == pytest.approx(np.mean([r.all() for r in rows]))
  assert model_dir_lib.checkpoint_step(model_dir_lib.latest_checkpoint(
      os.path.join(work, "mlm_reader"))) == 2
  # The distractor phase starts from the reading warm start's reader, and REALM's first phase
  # from it at the one rate; the second from the first, its towers at the budget's rate.
  distract = stages["distract_reader"]
  assert distract["model_dir"].endswith(text_realm.DISTRACT_DIR) and distract["steps"] == 2
  phase = text_realm.reading_params(work, str(assets.BERT_VOCAB), TINY_REALM, 0, True)
  assert phase.task.init_checkpoint == reader_dir and phase.task.distractors == 1
  def realm_yaml(name):
    return yaml.safe_load(open(os.path.join(work, name + ".yaml"), encoding="utf-8"))["task"]
  first, second = realm_yaml("realm_0_first"), realm_yaml("realm_0")
  assert first["reader_init_checkpoint"] == distract["model_dir"]
  assert first["lr_retriever"] == 1.0 and second["lr_retriever"] == 2.0
  assert second["reader_init_checkpoint"] == second["retriever_init_checkpoint"] == (
      os.path.join(work, "realm_0_first"))
  realm = stages["realm_0_train"]
  assert realm["steps"] == 3 and [p["steps"] for p in realm["phases"]] == [1, 2]
  assert realm["indexes_built"] >= 2
  assert model_dir_lib.checkpoint_step(model_dir_lib.latest_checkpoint(realm["model_dir"])) == 2
  assert [s for s, _ in realm["validation"]["held_out_recall@5"]] == [0, 1, 3]
  assert {"qa_recall@5", "recall@5", "held_out_recall@5"} <= set(realm["validation"])
  row = stages["realm_0"]
  assert 0 <= row["recall@5"] <= row["recall@20"] <= 1
  assert row["test_questions"] == stages["ict"]["test_questions"]
  assert row["blocks"] == stages["corpus"]["blocks"]
  # The Open-QA rows of the seed, on the ORQA row's test sample: the mixed row reads the REALM
  # tower's top blocks with ORQA's model; REALM's own went through stage A from its reader.
  orqa = stages["openqa_eval"]
  for name in ("realm_0_mixed", "realm_0_openqa_eval"):
    assert stages[name]["test_file"] == orqa["test_file"]
    assert stages[name]["test_questions"] == orqa["test_questions"]
  assert stages["realm_0_gold_reader"]["model_dir"].endswith("realm_0_gold_reader")
  mixed = np.load(os.path.join(work, "realm_0_test", "top_ids.npy"))
  assert mixed.shape == (row["test_questions"], min(20, row["blocks"]))
  # The results: REALM's row beside the others, the per-question records, REALM's page (its
  # curves, and the analysis, computed from the records, with one seed's interval undefined).
  results = stages["results"]
  with open(os.path.join(out, "results", "real_text_questions.csv"), encoding="utf-8") as f:
    header = next(csv.reader(f))
  assert header[3:] == ["bm25", "minilm", "minilm_mean", "ict", "hybrid",
                        "realm_0"]
  with open(os.path.join(out, "results", "real_text_openqa_questions.csv"),
            encoding="utf-8") as f:
    table = list(csv.DictReader(f))
  assert len(table) == orqa["test_questions"]
  assert sum(int(r["realm_0_openqa_em"]) for r in table) == round(
      stages["realm_0_openqa_eval"]["after"]["exact_match"]["value"] * len(table))
  with open(results["realm_md"], encoding="utf-8") as f:
    page = f.read()
  assert "(a) REALM - ICT, zero-shot recall@5" in page and "Seeds 0;" in page
  assert os.path.exists(os.path.join(out, "results", "real_text_realm.png"))
