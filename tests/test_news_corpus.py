"""X != Z: the synthetic world's news corpus (``synthetic_world.generate_news``) and masked
examples from documents that are not the knowledge corpus (``data_prep.pipeline
--source_corpus``), read by the REALM task's host path, which excludes nothing for them."""

import json
import re

import numpy as np
import pytest

from data_prep import pipeline
from data_prep import synthetic_world
from realm_tf import configs
from realm_tf.data import features
from realm_tf.data import loaders
from realm_tf.data import manifests
from realm_tf.data.loaders import InputError
from realm_tf.retrieval import candidates
from realm_tf.retrieval import testing
from realm_tf.tokenization import RealmTokenizer

SMALL = dict(num_regions=3, num_cities=8, num_people=20, num_organizations=6, num_works=10)


def _shape(sentence, names):
  """A sentence with every entity name and number replaced by a slot: its template."""
  for name in sorted(names, key=len, reverse=True):
    sentence = sentence.replace(name, "{}")
  return re.sub(r"\d+", "{}", sentence)


def _sentences(text):
  return [s for s in re.split(r"(?<=\.)\s+", text.replace("\n", " ")) if s.strip()]


def test_news_restates_facts_in_its_own_words_and_records_coverage():
  world = synthetic_world.generate_world(seed=0)
  items, coverage = synthetic_world.generate_news(world, seed=3)
  names = {p["pattern"] for p in world.patterns}
  news = {_shape(s, names) for item in items for s in _sentences(item["text"])}
  articles = {_shape(s, names) for a in world.articles for s in _sentences(a["text"])}
  questions = {_shape(q["question"], names) for q in world.qa}
  assert len(news) >= len(synthetic_world.NEWS_TEMPLATES)
  assert not news & articles, news & articles
  assert not news & questions, news & questions
  # No news sentence is an article's sentence, with its names.
  assert not ({s for i in items for s in _sentences(i["text"])} &
              {s for a in world.articles for s in _sentences(a["text"])})
  # Half of the entities (by default), chosen by the seed; the rest are never named.
  subjects = {f["subject"] for f in world.facts}
  covered, never = set(coverage["covered"]), set(coverage["never_covered"])
  assert covered | never == subjects and not covered & never
  assert abs(len(covered) - len(subjects) / 2) <= 1
  for f in world.facts:
    if f["subject"] in covered:
      assert any(f["subject"] in i["text"] and f["object"] in i["text"] for i in items), f
  # A never-covered entity's facts are never stated (it may be named as a covered entity's
  # object: the author of a covered work), and the items that state no fact name covered
  # entities only.
  stated = lambda f, i: f["subject"] in i["text"] and f["object"] in i["text"]
  for f in world.facts:
    if f["subject"] in never and not any(f["subject"] in other for other in covered):
      assert not any(stated(f, i) for i in items), f
  fillers = [i for i in items if not any(stated(f, i) for f in world.facts)]
  for i in fillers:
    named = [n for n in names if n in i["text"]]
    assert named and set(named) & covered, i
  assert fillers and len(items) == coverage["items"] == coverage["fact_items"] + len(fillers)
  assert all(re.fullmatch(r"\d{4}-\d\d-\d\d", i["date"]) for i in items)
  # Another seed covers other entities; the share is configurable.
  assert synthetic_world.generate_news(world, seed=4)[1]["covered"] != coverage["covered"]
  assert len(synthetic_world.generate_news(world, seed=3, share=0.25)[1]["covered"]) == round(
      0.25 * len(subjects))


@pytest.fixture(scope="module")
def news_examples(tmp_path_factory):
  root = tmp_path_factory.mktemp("news")
  world = synthetic_world.generate_world(seed=0, **SMALL)
  paths = synthetic_world.write_world(world, str(root / "world"), vocab_size=1000,
                                      whole_word_names=True)
  z = pipeline.prepare_all(paths["articles"], paths["vocab"], str(root / "z"),
                           patterns_file=paths["patterns"], block_seq_length=32,
                           query_seq_length=32, eval_fraction=0.2)
  x = pipeline.prepare_all(paths["news"], paths["vocab"], str(root / "news"),
                           patterns_file=paths["patterns"], block_seq_length=32,
                           query_seq_length=32, eval_fraction=0.2, source_corpus="news")
  return world, paths, z, x


def test_documents_give_examples_that_name_no_block_of_z(news_examples):
  _, paths, z, x = news_examples
  assert "ict" not in x and "ict" not in x["dirs"]
  manifest = x["pretrain"]
  assert manifest["source_corpus"] == "news" and manifest["blocks_fingerprint"] is None
  assert manifest["source_blocks_fingerprint"] == x["blocks"]["fingerprint"]
  assert z["pretrain"]["source_corpus"] == features.KNOWLEDGE_CORPUS
  assert json.load(open(paths["news_coverage"]))["covered"]
  params = configs.MaskedLmDataConfig(input_path=x["dirs"]["pretrain"] + "/train-*")
  news = loaders.MaskedExamplesLoader(params, 32, 10).read_all()
  assert len(news["source_block_id"]) == manifest["num_train"] > 20
  assert (news["source_block_id"] == features.EXTERNAL_SOURCE_BLOCK_ID).all()
  assert set(news["source_uid"]) == {b""} and set(news["source_corpus"]) == {b"news"}
  params = configs.MaskedLmDataConfig(input_path=z["dirs"]["pretrain"] + "/train-*")
  own = loaders.MaskedExamplesLoader(params, 32, 10).read_all()
  assert (own["source_block_id"] >= 0).all() and set(own["source_corpus"]) == {b"knowledge"}


def test_the_host_path_excludes_nothing_for_news_and_the_own_block_for_z(news_examples):
  """Over Z's blocks, with an exact index: a news query keeps its best block; a query from Z
  never gets its own block; an example naming a block Z does not have is refused."""
  _, paths, z, x = news_examples
  blocks = manifests.read_blocks(z["dirs"]["blocks"])
  tok = RealmTokenizer(paths["vocab"])
  config = testing.tiny_model_config(paths["vocab"], query_seq_length=32, block_seq_length=32)
  rng = np.random.default_rng(0)
  emb = rng.standard_normal([len(blocks), config.retriever.projection_size]).astype(np.float32)

  def read(d):
    params = configs.MaskedLmDataConfig(input_path=d + "/train-*")
    return {k: v[:8] for k, v in loaders.MaskedExamplesLoader(params, 32, 10).read_all().items()}

  news, own = read(x["dirs"]["pretrain"]), read(z["dirs"]["pretrain"])
  batch = {k: np.concatenate([news[k], own[k]]) for k in news}
  queries = rng.standard_normal([16, emb.shape[1]]).astype(np.float32)
  ranked = np.argsort(-(queries @ emb.T), axis=1, kind="stable")
  # Each query of Z names its best block as its source (the block it must not get).
  for i in range(8, 16):
    batch["source_block_id"][i] = ranked[i, 0]
    batch["source_uid"][i] = blocks[ranked[i, 0]]["uid"].encode()
  builder = candidates.CandidateBuilder(blocks, config, None, tok.cls_id, tok.sep_id)
  rows = builder.features(batch, candidates=builder.select_candidates(
      ranked, batch["source_uid"]))["candidate_rows"]
  assert (rows[:8, 1] == ranked[:8, 0]).all()
  assert all(ranked[i, 0] not in rows[i] for i in range(8, 16))
  bad = dict(batch, source_block_id=np.where(np.arange(16) == 3, len(blocks),
                                             batch["source_block_id"]))
  with pytest.raises(InputError, match=f"example 3 names source block {len(blocks)}"):
    builder.features(bad, candidates=rows)
