"""X != Z: the synthetic world's news corpus (``synthetic_world.generate_news``) and masked
examples from documents that are not the knowledge corpus (``data_prep.pipeline
--source_corpus``), read by the REALM task's host path, which excludes nothing for them."""

import json
import re

import numpy as np
import pytest

from data_prep import pipeline
from data_prep import synthetic_world
from data_prep import useful_examples
from realm_tf import configs
from realm_tf.data import features
from realm_tf.data import loaders
from realm_tf.data import manifests
from realm_tf.data.loaders import InputError
from realm_tf.retrieval.publication import testing
from realm_tf.tasks import candidates
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


def test_teaching_news_restates_each_fact_four_ways_with_two_spans_in_the_starts_words():
  world = synthetic_world.generate_world(seed=0)
  items, coverage = synthetic_world.generate_news(world, seed=0, share=1.0, style="teaching")
  assert coverage["style"] == "teaching" and not coverage["never_covered"]
  names = {p["pattern"] for p in world.patterns}
  texts = [i["text"] for i in items]
  birthplace = {f["subject"]: f["object"] for f in world.facts if f["relation"] == "born_in"}
  fact_texts = set()
  for f in world.facts:
    stating = [t for t in texts if f["subject"] in t and str(f["object"]) in t]
    shapes = {_shape(t, names) for t in stating}
    assert len(stating) >= 3 and len(shapes) >= 3, (f, stating)
    fact_texts.update(stating)
  # Every sentence that states a fact names at least two entities or years (salient spans).
  for t in fact_texts:
    spans = [n for n in names if n in t] + re.findall(r"\b\d{4}\b", t)
    assert len(spans) >= 2, t
  fillers = [t for t in texts if t not in fact_texts]
  assert 0 < len(fillers) <= 0.1 * len(items)
  assert coverage["fact_items"] == 4 * len(world.facts) == len(items) - len(fillers)
  # Not an article's sentence nor a question; an occupation's second span is its birthplace.
  articles = {_shape(s, names) for a in world.articles for s in _sentences(a["text"])}
  questions = {_shape(q["question"], names) for q in world.qa}
  assert not {_shape(t, names) for t in texts} & (articles | questions)
  person = next(f for f in world.facts if f["relation"] == "occupation")
  assert all(birthplace[person["subject"]] in t for t in texts
             if person["subject"] in t and person["object"] in t)
  # Every word of the templates occurs in the encyclopedia's articles (the old ones' did not).
  templates = [t for v in synthetic_world.TEACHING_TEMPLATES.values() for t in v] + [
      t for v in synthetic_world.TEACHING_FILLERS.values() for t in v]
  words = lambda text: [w.lower() for w in re.findall(r"\w+|[^\w\s]", text)]
  out = useful_examples.unseen_wordpieces(templates, [a["text"] for a in world.articles], words)
  assert out["share_unseen"] == 0, out["unseen"]
  assert useful_examples.unseen_wordpieces(
      list(synthetic_world.NEWS_TEMPLATES.values()), [a["text"] for a in world.articles],
      words)["share_unseen"] > 0.3
  # The single style is the demo's and is unchanged by the new one: one item per fact.
  single, cov = synthetic_world.generate_news(world, seed=0, share=1.0)
  assert cov["style"] == "single" and cov["fact_items"] == len(world.facts)
  with pytest.raises(ValueError, match="restatements"):
    synthetic_world.generate_news(world, style="teaching", restatements=5)


def _sentence(uid, title, text, spans):
  """A sentence record as data_prep.salient_spans writes it, spans given as (text, label)."""
  raw = text.encode()
  out = []
  for span, label in spans:
    start = raw.index(span.encode())
    out.append(dict(span_byte_start=start, span_byte_limit=start + len(span.encode()),
                    label=label))
  return dict(block_uid=uid, title=title, sentence=text, spans=out,
              spans_text=[(s, l) for s, l in spans])


def test_useful_examples_by_the_rule_on_hand_made_blocks():
  """Blocks: b1 names Ana, Rome and 1900; b2 names Ana and Rome and another person, Bo; b3
  names Cy and Oslo. Facts: (Ana, born_in, Rome), (Cy, born_in, Oslo)."""
  z = [_sentence("b1", "Ana", "Ana was born in Rome in 1900.",
                 [("Ana", "PERSON"), ("Rome", "GPE"), ("1900", "DATE")]),
       _sentence("b2", "Rome", "Rome is home to Ana and Bo.",
                 [("Rome", "GPE"), ("Ana", "PERSON"), ("Bo", "PERSON")]),
       _sentence("b3", "Cy", "Cy lived in Oslo.", [("Cy", "PERSON"), ("Oslo", "GPE")])]
  facts = [dict(subject="Ana", relation="born_in", object="Rome"),
           dict(subject="Cy", relation="born_in", object="Oslo")]
  x = [_sentence("n1", "News", "Ana left Rome.", [("Ana", "PERSON"), ("Rome", "GPE")]),
       _sentence("n2", "News", "Cy is here.", [("Cy", "PERSON")]),
       _sentence("n3", "News", "Oslo honours Cy.", [("Oslo", "GPE"), ("Cy", "PERSON")])]
  out = useful_examples.count_useful(z, facts, 0.0, x, 0.0, test_facts=[1])
  # n1: answer Ana with Rome kept -> b1 names both and no other person: useful; answer Rome
  # with Ana kept -> b1 (b2 also names them; one block is enough): useful. n2 keeps nothing.
  # n3: both of its spans are useful through b3.
  assert (out["possible"], out["useful"]) == (5, 4)
  assert out["counts"] == [2, 2] and out["per_fact"] == 2.0 and out["share"] == 1.0
  assert out["test_per_fact"] == 2.0 and out["test_facts"] == 1
  # X = Z: a sentence never uses its own block. b1's "Ana"+{Rome, 1900}: only b1 has 1900 ->
  # not useful; b1's Rome: same. b2's Ana with {Rome, Bo} kept -> b1 lacks Bo; b2's Bo: no
  # other block names Bo; b3's sentences: no other block names Cy.
  same = useful_examples.count_useful(z, facts, 0.0)
  assert same["useful"] == 0 and same["share"] == 0.0
  # Without b1, Ana's block b2 names another person (Bo) besides the kept spans: not useful.
  out = useful_examples.count_useful(z[1:], facts, 0.0, x[:1], 0.0)
  assert out["counts"][0] == 1  # answer Rome (the only GPE of b2) still is
  assert useful_examples.shortfall({"x_is_z": dict(per_fact=2.0, share=1.0),
                                    "x": dict(per_fact=1.0, share=1.0)}) == [
      "useful examples per fact: X 1.000 < X = Z 2.000"]


def test_the_tables_refuse_a_news_corpus_that_teaches_less_than_x_equals_z(news_examples,
                                                                             tmp_path):
  """The single-style news of half the entities (news_examples) has fewer useful examples than
  X = Z, so a table seed refuses it; the teaching news of every entity has more."""
  from experiments.synthetic import table_seed  # pylint: disable=g-import-not-at-top
  from experiments.pipeline.common import Clock  # pylint: disable=g-import-not-at-top
  clock, table = Clock("test"), table_seed.TableSettings()
  world, paths, z, x = news_examples
  with pytest.raises(table_seed.NewsCannotTeachError, match="refusing to run the news rows: "
                     r"the news corpus teaches less than X = Z \(useful examples per fact: X"):
    table_seed.news_check(clock, paths, z["dirs"]["sentences"], x["dirs"]["sentences"], table)
  teaching = synthetic_world.write_world(world, str(tmp_path / "world"), news_share=1.0,
                                         news_style="teaching")
  news = pipeline.prepare_all(teaching["news"], paths["vocab"], str(tmp_path / "news"),
                              patterns_file=paths["patterns"], block_seq_length=32,
                              query_seq_length=32, eval_fraction=0.0, source_corpus="news")
  check = table_seed.news_check(clock, dict(paths, qa=teaching["qa"], qa_test=teaching["qa_test"]),
                                z["dirs"]["sentences"], news["dirs"]["sentences"], table)
  assert check["x"]["per_fact"] >= check["x_is_z"]["per_fact"] > 0
  assert check["x"]["share"] >= check["x_is_z"]["share"] and check["x"]["share"] == 1.0
