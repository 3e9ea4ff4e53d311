"""Tests of data_prep.masking and the pre-training example builder."""

import collections
import pathlib
import random

import pytest

from experiments import assets
from data_prep import masking
from data_prep import pretrain_examples
from realm_tf.tokenization import RealmTokenizer

VOCAB = str(assets.BERT_VOCAB)
CLS, SEP, MASK = 2, 3, 4


@pytest.fixture(scope="module")
def tokenizer():
  return RealmTokenizer(VOCAB)


def test_mask_span_example():
  q = masking.mask_span([7, 8], [9, 10], [11], "x", CLS, SEP, MASK)
  assert q.query_ids == [2, 7, 8, 4, 4, 11, 3]
  assert q.mlm_positions == [3, 4] and q.mlm_ids == [9, 10]
  assert masking.mask_span([1], [], [], "x", CLS, SEP, MASK) is None


def test_mask_span_longer_than_max_masks_predicts_its_first_wordpieces():
  span = list(range(100, 113))  # 13 wordpieces, max_masks 10.
  q = masking.mask_span([7], span, [8, 9], "x", CLS, SEP, MASK, query_seq_length=20)
  assert q.query_ids == [CLS, 7] + [MASK] * 13 + [8, 9, SEP]
  assert q.mlm_positions == list(range(2, 12)) and q.mlm_ids == span[:10]
  # A span that does not fit in the query (18 + [CLS] + [SEP] > 19) is still refused.
  assert masking.mask_span([], list(range(18)), [], "x", CLS, SEP, MASK,
                           query_seq_length=19) is None
  assert masking.mask_span([], list(range(17)), [], "x", CLS, SEP, MASK,
                           query_seq_length=19) is not None


def test_mask_span_cuts_long_sentence_around_span():
  prefix, span, suffix = list(range(100, 200)), [5, 6, 7], list(range(300, 400))
  q = masking.mask_span(prefix, span, suffix, "x", CLS, SEP, MASK, query_seq_length=20)
  assert len(q.query_ids) == 20
  assert [q.query_ids[p] for p in q.mlm_positions] == [MASK] * 3
  assert q.query_ids[1:q.mlm_positions[0]] == prefix[-len(q.query_ids[1:q.mlm_positions[0]]):]
  left = q.mlm_positions[0] - 1
  assert abs(left - (20 - 2 - 3 - left)) <= 1  # Context on both sides, evenly.
  q = masking.mask_span([1, 2], span, suffix, "x", CLS, SEP, MASK, query_seq_length=20)
  assert q.query_ids[:3] == [CLS, 1, 2] and len(q.query_ids) == 20


def test_uniform_masking_statistics():
  rng = random.Random(0)
  random_ids = list(range(1000, 2000))
  tokens = list(range(5000, 5040))  # 40 tokens -> 6 masks each.
  selected = kinds = 0
  counts = collections.Counter()
  for _ in range(3000):
    q = masking.mask_uniform(tokens, rng, CLS, SEP, MASK, random_ids)
    assert q.query_ids[0] == CLS and q.query_ids[-1] == SEP
    assert len(set(q.mlm_positions)) == len(q.mlm_positions) <= 10
    selected += len(q.mlm_positions)
    for p, orig in zip(q.mlm_positions, q.mlm_ids):
      assert tokens[p - 1] == orig
      new = q.query_ids[p]
      counts["mask" if new == MASK else "keep" if new == orig else "random"] += 1
      kinds += 1
      if new not in (MASK, orig):
        assert new in random_ids
    unselected = [q.query_ids[i + 1] for i in range(40) if i + 1 not in q.mlm_positions]
    assert unselected == [t for i, t in enumerate(tokens) if i + 1 not in q.mlm_positions]
  assert selected / (3000 * 40) == pytest.approx(0.15, abs=0.005)
  assert counts["mask"] / kinds == pytest.approx(0.8, abs=0.02)
  assert counts["random"] / kinds == pytest.approx(0.1, abs=0.015)
  assert counts["keep"] / kinds == pytest.approx(0.1, abs=0.015)


def test_uniform_masking_position_coverage():
  rng = random.Random(1)
  hits = collections.Counter()
  for _ in range(2000):
    q = masking.mask_uniform(list(range(100, 120)), rng, CLS, SEP, MASK, [50])
    hits.update(q.mlm_positions)
  assert set(hits) == set(range(1, 21))  # Every real token, never [CLS]/[SEP].
  assert max(hits.values()) / min(hits.values()) < 1.5


def test_random_span_is_whole_words():
  rng = random.Random(0)
  sentence = "The quick brown fox jumps over the lazy dog near the riverbank."
  words = masking.word_spans(sentence)
  lengths = collections.Counter()
  for _ in range(500):
    s, e = masking.choose_random_span(words, [1] * len(words), rng, max_masks=10)
    assert (s, e) != (0, 0)
    assert any(w[0] == s for w in words) and any(w[1] == e for w in words)
    lengths[sum(1 for w in words if s <= w[0] and w[1] <= e)] += 1
  assert max(lengths) <= 10 and lengths[1] > lengths[5]


def _record(sentence, spans, uid="u1", index=0):
  enc = sentence.encode("utf-8")
  out = []
  for text, label in spans:
    start = enc.index(text.encode("utf-8"))
    out.append({"span_byte_start": start, "span_byte_limit": start + len(text.encode("utf-8")),
                "label": label})
  return {"block_id": 7, "block_uid": uid, "title": "T", "sentence_index": index,
          "sentence": sentence, "sentence_byte_start": 0, "sentence_byte_limit": len(enc),
          "spans": out}


def test_salient_examples_mask_exactly_one_whole_span(tokenizer):
  records = [
      _record("Zoë Quintrell was born in Mérida in 1843.",
              [("Zoë Quintrell", "PERSON"), ("Mérida", "GPE"), ("1843", "DATE")], index=i)
      for i in range(12)] + [_record("Nothing salient here.", [], index=99)]
  builder = pretrain_examples.ExampleBuilder(tokenizer, "salient", examples_per_sentence=1)
  built, events = builder.build(records)
  assert len(built) == 12 and events.count("skip:no_salient_span") == 1
  answers = set()
  for r, q in built:
    sent_ids = tokenizer.tokenize([r["sentence"]])[0].numpy().tolist()
    answer_ids = tokenizer.tokenize([q.answer])[0].numpy().tolist()
    assert q.answer in r["sentence"] and q.answer in ("Zoë Quintrell", "Mérida", "1843")
    assert q.mlm_ids == answer_ids
    assert [q.query_ids[p] for p in q.mlm_positions] == [tokenizer.mask_id] * len(answer_ids)
    assert q.mlm_positions == list(range(q.mlm_positions[0], q.mlm_positions[-1] + 1))
    restored = list(q.query_ids)
    for p, t in zip(q.mlm_positions, q.mlm_ids):
      restored[p] = t
    assert restored == [tokenizer.cls_id] + sent_ids + [tokenizer.sep_id]
    assert q.query_ids.count(tokenizer.mask_id) == len(answer_ids)
    answers.add(q.answer)
  assert len(answers) == 3  # The span choice varies with the sentence.
  again, _ = pretrain_examples.ExampleBuilder(tokenizer, "salient").build(records)
  assert [q.query_ids for _, q in again] == [q.query_ids for _, q in built]  # Deterministic.


def test_random_span_and_uniform_builders(tokenizer):
  records = [_record("Ada Lovelace wrote the first published algorithm in 1843.", [], index=i)
             for i in range(20)]
  for kind in ("random_span", "uniform"):
    built, _ = pretrain_examples.ExampleBuilder(tokenizer, kind).build(records)
    assert len(built) == 20
    for r, q in built:
      assert 1 <= len(q.mlm_positions) <= 10
      assert len(q.query_ids) <= 96
      if kind == "random_span":
        assert q.answer in r["sentence"]
        assert q.mlm_ids == tokenizer.tokenize([q.answer])[0].numpy().tolist()


def test_long_sentence_is_cut_around_the_span(tokenizer):
  sentence = " ".join(["filler"] * 150) + " Quintrell " + " ".join(["tail"] * 150)
  builder = pretrain_examples.ExampleBuilder(tokenizer, "salient")
  built, events = builder.build([_record(sentence, [("Quintrell", "PERSON")])])
  (_, q), = built
  assert len(q.query_ids) == 96 and "sentence_cut_around_span" in events
  assert q.mlm_ids == tokenizer.tokenize(["Quintrell"])[0].numpy().tolist()


LONG_NAME = "Qorvanthiuszel Pyrmadqoxtil"


def test_long_salient_span_is_masked_whole_and_first_max_masks_predicted(tokenizer):
  sentence = f"The explorer {LONG_NAME} reached Mérida in 1843."
  name_ids = tokenizer.tokenize([LONG_NAME])[0].numpy().tolist()
  assert len(name_ids) == 13  # The premise of the test.
  prefix_ids = tokenizer.tokenize(["The explorer "])[0].numpy().tolist()
  sent_ids = tokenizer.tokenize([sentence])[0].numpy().tolist()
  builder = pretrain_examples.ExampleBuilder(tokenizer, "salient")
  built, events = builder.build([_record(sentence, [(LONG_NAME, "PERSON")])])
  (_, q), = built
  start = 1 + len(prefix_ids)
  assert q.query_ids == ([tokenizer.cls_id] + sent_ids[:start - 1] + [tokenizer.mask_id] * 13
                         + sent_ids[start - 1 + 13:] + [tokenizer.sep_id])
  assert q.mlm_positions == list(range(start, start + 10))
  assert q.mlm_ids == name_ids[:10] and q.answer == LONG_NAME
  assert events.count("long_span_first_predicted") == 1
  assert not any(e.startswith("skip:") for e in events)
  # A query too short for the whole span: the span is refused, the sentence gives nothing.
  short = pretrain_examples.ExampleBuilder(tokenizer, "salient", query_seq_length=14)
  built, events = short.build([_record(sentence, [(LONG_NAME, "PERSON")])])
  assert built == [] and "skip:span_longer_than_query" in events
  assert "skip:no_usable_salient_span" in events
