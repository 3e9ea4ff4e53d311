"""Tests of the synthetic world, the span annotator, and prepare_all end to end."""

import json
import logging
import os
import pathlib
import re

import numpy as np
import pytest
import tensorflow as tf

from experiments import assets
from data_prep import pipeline
from data_prep import salient_spans
from data_prep import synthetic_world
from realm_tf import configs
from realm_tf.data import features
from realm_tf.data import loaders
from realm_tf.data import manifests
from realm_tf.tokenization import RealmTokenizer

BERT_VOCAB = str(assets.BERT_VOCAB)
SMALL = dict(num_regions=3, num_cities=8, num_people=20, num_organizations=6, num_works=10)


def test_world_is_deterministic_and_states_each_fact_twice():
  a = synthetic_world.generate_world(seed=3)
  b = synthetic_world.generate_world(seed=3)
  assert a == b
  assert synthetic_world.generate_world(seed=4).articles != a.articles
  assert 150 <= len(a.articles) <= 300
  texts = {x["title"]: x["text"] for x in a.articles}
  assert len(texts) == len(a.articles)  # Unique titles.
  for f in a.facts:
    assert len(f["articles"]) >= 2, f
    phrasings = set()
    for title in f["articles"]:
      sents = [s for s in re.split(r"(?<=\.)\s+", texts[title])
               if f["object"] in s and (f["subject"] in s or title == f["subject"])]
      assert sents, (f, title)
      phrasings.update(sents)
    assert len(phrasings) >= 2, f  # Phrased differently in different articles.
  assert len(a.qa) == len(a.facts) and all(q["answers"] for q in a.qa)
  vocab = set(open(BERT_VOCAB, encoding="utf-8").read().split())
  people = [p["pattern"] for p in a.patterns if p["label"] == "PERSON"]
  assert sum(n.split()[1].lower() in vocab for n in people) <= 2  # Invented names.


def test_name_seed_keeps_the_names_and_changes_the_facts():
  world = synthetic_world.generate_world(seed=0, **SMALL)
  assert synthetic_world.generate_world(seed=0, name_seed=0, **SMALL) == world
  other = synthetic_world.generate_world(seed=1, name_seed=0, **SMALL)
  assert other.patterns == world.patterns
  facts = lambda w: {(f["subject"], f["relation"], f["object"]) for f in w.facts}
  assert len(facts(world) & facts(other)) < len(facts(world)) / 2
  assert synthetic_world.generate_world(seed=1, **SMALL).patterns != world.patterns


def _read_jsonl(path):
  return [json.loads(line) for line in open(path, encoding="utf-8")]


def test_qa_splits_are_held_out_by_fact(tmp_path):
  world = synthetic_world.generate_world(seed=0)
  paths = synthetic_world.write_world(world, str(tmp_path / "world"))
  qa = _read_jsonl(paths["qa"])
  assert qa == world.qa  # qa.jsonl is unchanged.
  splits = {s: _read_jsonl(paths[f"qa_{s}"]) for s in ("train", "dev", "test")}
  assert {s: os.path.basename(paths[f"qa_{s}"]) for s in splits} == {
      "train": "qa-train.jsonl", "dev": "qa-dev.jsonl", "test": "qa-test.jsonl"}
  for records in splits.values():
    assert all(set(r) == {"question", "answers", "answer_type"} for r in records)
    assert all(r["answer_type"] == "text" for r in records)
  # The splits partition qa.jsonl exactly (as a multiset of records).
  key = lambda r: (r["question"], tuple(r["answers"]))
  assert sorted(key(r) for rs in splits.values() for r in rs) == sorted(map(key, qa))
  n = len(qa)
  for split, want in (("train", 0.7), ("dev", 0.1), ("test", 0.2)):
    assert abs(len(splits[split]) / n - want) < 0.05, (split, len(splits[split]), n)
  # No test question text, and no test fact, is in train (qa[i] asks facts[i]).
  questions = {s: {r["question"] for r in rs} for s, rs in splits.items()}
  assert not questions["test"] & questions["train"]
  assert not questions["dev"] & (questions["train"] | questions["test"])
  pairs = synthetic_world.qa_facts(world)
  facts = {s: {(f["subject"], f["relation"], f["object"]) for q, f in pairs
               if q["question"] in questions[s]} for s in splits}
  assert not facts["test"] & facts["train"] and sum(map(len, facts.values())) == n
  # Deterministic across calls and runs (a SHA1, not Python's hash).
  indices = synthetic_world.split_qa(world.qa)
  assert indices == synthetic_world.split_qa(synthetic_world.generate_world(seed=0).qa)
  assert [world.qa[i]["question"] for i in indices["test"]] == [
      r["question"] for r in splits["test"]]
  again = synthetic_world.write_world(world, str(tmp_path / "again"))
  for split in ("qa_train", "qa_dev", "qa_test"):
    assert open(again[split], "rb").read() == open(paths[split], "rb").read()


def test_split_qa_keeps_a_shared_question_in_one_split():
  records = [{"question": f"q{i % 50}", "answers": [str(i)]} for i in range(200)]
  indices = synthetic_world.split_qa(records, dev_fraction=0.3, test_fraction=0.3)
  assert sorted(i for v in indices.values() for i in v) == list(range(200))
  where = {}
  for split, ids in indices.items():
    for i in ids:
      assert where.setdefault(records[i]["question"], split) == split
  assert set(where.values()) == {"train", "dev", "test"}
  assert synthetic_world.split_qa(records, 0.0, 0.0) == {"train": list(range(200)), "dev": [],
                                                          "test": []}
  with pytest.raises(ValueError, match="fractions"):
    synthetic_world.split_qa(records, dev_fraction=0.6, test_fraction=0.6)
  world = synthetic_world.generate_world(seed=0, **SMALL)
  world.qa[0] = {"question": world.qa[0]["question"], "answers": ["something else"]}
  with pytest.raises(ValueError, match="does not ask fact"):
    synthetic_world.qa_facts(world)


def test_whole_word_names_are_one_wordpiece(tmp_path):
  world = synthetic_world.generate_world(seed=0, **SMALL)
  paths = synthetic_world.write_world(world, str(tmp_path), vocab_size=300,
                                      whole_word_names=True)
  tokenizer = RealmTokenizer(paths["vocab"])
  for word in synthetic_world.name_words(world)[::7]:
    assert tokenizer.tokenize_to_strings(word) == [word.lower()], word


def test_date_regex():
  s = "Born on 12 March 1843, died March 3, 1901; active 1870 to 1890 and in May 1888; 12345."
  found = [s[a:b] for a, b, _ in salient_spans.find_dates(s)]
  assert found == ["12 March 1843", "March 3, 1901", "1870", "1890", "May 1888"]


def test_annotator_model_ruler_and_fallback(tmp_path, caplog):
  patterns = tmp_path / "p.jsonl"
  patterns.write_text(json.dumps({"label": "PERSON", "pattern": "Velo Quintrell"}) + "\n")
  sentence = "Velo Quintrell met Barack Obama in Paris in 1998."
  ann = salient_spans.SpanAnnotator("auto", str(patterns))
  assert ann.has_statistical_model
  spans = {sentence[a:b]: l for a, b, l in ann.annotate([sentence])[0]}
  assert spans["Velo Quintrell"] == "PERSON" and spans["1998"] == "DATE"
  assert spans["Paris"] == "GPE" and spans["Barack Obama"] == "PERSON"
  with caplog.at_level(logging.WARNING):
    rules = salient_spans.SpanAnnotator("no_such_model_xyz", str(patterns))
  assert "rule-based" in caplog.text and "no_such_model_xyz" in caplog.text
  assert not rules.has_statistical_model
  spans = {sentence[a:b]: l for a, b, l in rules.annotate([sentence])[0]}
  assert spans == {"Velo Quintrell": "PERSON", "1998": "DATE"}
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"label": "X"}\n')
  with pytest.raises(ValueError, match="bad.jsonl:1"):
    salient_spans.SpanAnnotator("none", str(bad))


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
  root = tmp_path_factory.mktemp("prep")
  world = synthetic_world.generate_world(seed=0, **SMALL)
  paths = synthetic_world.write_world(world, str(root / "world"), vocab_size=1000)
  out = pipeline.prepare_all(paths["articles"], paths["vocab"], str(root / "out"),
                             patterns_file=paths["patterns"], eval_fraction=0.2)
  return world, paths, out


def test_prepare_all_outputs(prepared):
  world, paths, out = prepared
  dirs = out["dirs"]
  blocks = manifests.read_blocks(dirs["blocks"])
  assert len(blocks) == len(world.articles) == out["blocks"]["num_blocks"]
  fp = out["blocks"]["fingerprint"]
  assert out["sentences"]["blocks_fingerprint"] == fp
  assert out["pretrain"]["blocks_fingerprint"] == fp == out["ict"]["blocks_fingerprint"]
  by_id = {b["block_id"]: b for b in blocks}
  tok = RealmTokenizer(paths["vocab"])
  names = {p["pattern"] for p in world.patterns}
  sentences = list(manifests.read_sentences(dirs["sentences"]))
  for s in sentences:
    body = by_id[s["block_id"]]["body"].encode("utf-8")
    assert body[s["sentence_byte_start"]:s["sentence_byte_limit"]].decode() == s["sentence"]
    for sp in s["spans"]:
      assert 0 <= sp["span_byte_start"] < sp["span_byte_limit"] <= len(s["sentence"].encode())
  examples = manifests.read_examples(dirs["pretrain"], "train") + manifests.read_examples(
      dirs["pretrain"], "eval")
  assert len(examples) == out["pretrain"]["num_train"] + out["pretrain"]["num_eval"]
  assert out["pretrain"]["num_eval"] > 0
  for ex in examples:
    (block_id,), (uid,), (answer,), (sentence,) = (ex["source_block_id"], ex["source_uid"],
                                                   ex["answer"], ex["sentence"])
    assert by_id[block_id]["uid"] == uid and sentence in by_id[block_id]["body"]
    assert answer in sentence
    assert answer in names or re.fullmatch(r"\d{4}", answer), answer
    n = int(sum(ex["mlm_weights"]))
    # A span longer than 10 wordpieces is masked whole; its first 10 are predicted.
    answer_ids = tok.tokenize([answer])[0].numpy().tolist()
    assert n == min(len(answer_ids), 10) and ex["mlm_ids"][:n] == answer_ids[:n]
    assert [ex["query_ids"][p] for p in ex["mlm_positions"][:n]] == [tok.mask_id] * n
  ds = tf.data.TFRecordDataset(manifests.example_files(dirs["pretrain"], "train")).map(
      lambda s: features.parse_pretrain_example(s, with_host_features=False)).batch(4)
  batch = next(iter(ds))
  assert batch["query_ids"].dtype == tf.int32 and batch["query_ids"].shape == (4, 96)
  assert batch["mlm_positions"].shape == (4, 10) and batch["mlm_weights"].dtype == tf.float32


def test_ict_outputs(prepared):
  _, paths, out = prepared
  ict_dir, manifest = out["dirs"]["ict"], out["ict"]
  tok = RealmTokenizer(paths["vocab"])
  assert manifest["sampling"] == manifests.ICT_SAMPLING == manifests.load_ict_manifest(
      ict_dir)["sampling"]
  assert (manifest["cls_id"], manifest["sep_id"], manifest["remove_prob"]) == (
      tok.cls_id, tok.sep_id, 0.9)
  counts = manifest["counts"]
  # One record per block of two or more sentences; the others skipped and counted.
  assert manifest["num_train"] > 0 and manifest["num_eval"] > 0
  assert manifest["num_train"] + manifest["num_eval"] + counts.get(
      "skip:single_sentence_block", 0) == out["blocks"]["num_blocks"]
  # Tokenizing sentence by sentence gives the body's wordpieces (whitespace between them).
  assert counts.get("sentence_tokens_differ", 0) == 0 and "skip:sentence_past_block" not in counts
  by_id = {b["block_id"]: b for b in manifests.read_blocks(out["dirs"]["blocks"])}
  records = manifests.read_examples(ict_dir, "train") + manifests.read_examples(ict_dir, "eval")
  assert len(records) == manifest["num_train"] + manifest["num_eval"]
  assert sum(len(r["sentence_lengths"]) for r in records) == manifest["num_sentences"]
  for r in records:
    block = by_id[r["block_id"][0]]
    assert len(r["sentence_lengths"]) >= 2 and min(r["sentence_lengths"]) > 0
    assert r["title_ids"] == tok.tokenize([block["title"]])[0].numpy().tolist()
    assert r["sentence_token_ids"] == tok.tokenize([block["body"]])[0].numpy().tolist()
    # The block as the index sees it: [CLS] title [SEP] body [SEP].
    assert block["token_ids"] == [tok.cls_id] + r["title_ids"] + [tok.sep_id] + r[
        "sentence_token_ids"] + [tok.sep_id]
  # The loader draws the pairs: the query is in its block exactly when not removed, and a
  # block left whole is the blocks directory's.
  data = configs.IctDataConfig(input_path=os.path.join(ict_dir, "train-*"), is_training=False,
                               global_batch_size=50, drop_remainder=False)
  loader = loaders.get_loader(data, query_seq_length=96, block_seq_length=288)
  removed = []
  for batch in loader.load().take(4):
    for ex in [{k: v[i] for k, v in batch.items()} for i in range(len(batch["block_id"]))]:
      ex = {k: v.numpy() for k, v in ex.items()}
      assert ex["block_ids"].shape == (288,) and ex["query_ids"].shape == (96,)
      q = ex["query_ids"][1:ex["query_mask"].sum() - 1].tolist()
      body = ex["block_ids"][ex["block_type_ids"] == 1][:-1].tolist()
      contains = any(body[i:i + len(q)] == q for i in range(len(body) - len(q) + 1))
      assert contains == (not ex["sentence_removed"])
      if not ex["sentence_removed"]:
        token_ids = by_id[int(ex["block_id"])]["token_ids"]
        assert ex["block_ids"][:ex["block_mask"].sum()].tolist() == token_ids
      removed.append(ex["sentence_removed"])
  assert 0.75 < np.mean(removed) < 0.98


def test_pipeline_is_deterministic(prepared, tmp_path):
  world, paths, out = prepared
  from data_prep import blocks
  again = blocks.run_blocks(paths["articles"], paths["vocab"], str(tmp_path / "b"))
  assert again["fingerprint"] == out["blocks"]["fingerprint"]
