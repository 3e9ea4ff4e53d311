"""Masking variants: written by the pre-training examples builder, drawn afresh per read."""

import collections
import pathlib

import numpy as np
import pytest
import tensorflow as tf

from experiments import assets
from data_prep import pretrain_examples
from realm_tf import configs
from realm_tf.data import features
from realm_tf.data import loaders
from realm_tf.tokenization import RealmTokenizer

VOCAB = str(assets.BERT_VOCAB)
QLEN, MAX_MASKS = 32, 10
SENTENCE = "Zoë Quintrell was born in Mérida in 1843."
SPANS = ("Zoë Quintrell", "Mérida", "1843")
OLD_SENTENCE = "Ada Lovelace wrote in 1843."


@pytest.fixture(scope="module")
def tokenizer():
  return RealmTokenizer(VOCAB)


def _record(sentence, spans, uid="u1", index=0):
  enc = sentence.encode("utf-8")
  out = []
  for text in spans:
    start = enc.index(text.encode("utf-8"))
    out.append({"span_byte_start": start, "span_byte_limit": start + len(text.encode("utf-8")),
                "label": "X"})
  return {"block_id": 7, "block_uid": uid, "title": "T", "sentence_index": index,
          "sentence": sentence, "sentence_byte_start": 0, "sentence_byte_limit": len(enc),
          "spans": out}


def _ids(tokenizer, text):
  return tokenizer.tokenize([text])[0].numpy().tolist()


def _write(path, serialized):
  with tf.io.TFRecordWriter(str(path)) as writer:
    for s in serialized:
      writer.write(s)
  return str(path)


@pytest.fixture(scope="module")
def files(tokenizer, tmp_path_factory):
  """A 3-span sentence written with its variants; an old-format record written without."""
  root = tmp_path_factory.mktemp("variants")
  builder = pretrain_examples.ExampleBuilder(tokenizer, "salient", QLEN, MAX_MASKS)
  (record, fixed, variants), = builder.build_variants([_record(SENTENCE, SPANS)])[0]
  new = pretrain_examples.to_example(fixed[0], record, QLEN, MAX_MASKS, variants)
  old_record = _record(OLD_SENTENCE, ["Ada Lovelace"], uid="u2")
  (_, (old_q,), _), = builder.build_variants([old_record])[0]
  old = pretrain_examples.to_example(old_q, old_record, QLEN, MAX_MASKS)
  return {"new": _write(root / "new.tfrecord", [new]), "old": _write(root / "old.tfrecord", [old]),
          "fixed_answer": fixed[0].answer, "old_answer": old_q.answer,
          "fixed": fixed[0], "variants": variants, "record": record}


def _masked_answer_ids(row):
  """The wordpieces a parsed row predicts, checked to be [MASK] in its query."""
  n = int(row["mlm_weights"].sum())
  positions = row["mlm_positions"][:n].tolist()
  return tuple(row["mlm_ids"][:n].tolist()), positions


def _reads(path, n_batches, seed=3, is_training=True, resample=True, batch=20):
  params = configs.MaskedLmDataConfig(input_path=path, global_batch_size=batch,
                                      is_training=is_training, seed=seed,
                                      shuffle_buffer_size=4, resample_masks=resample)
  ds = loaders.MaskedExamplesLoader(params, QLEN, MAX_MASKS).load()
  return ds, list(ds.take(n_batches).as_numpy_iterator())


def test_every_usable_salient_span_is_a_variant(tokenizer, files):
  variants = files["variants"]
  span_ids = {tuple(_ids(tokenizer, s)) for s in SPANS}
  assert {tuple(v.mlm_ids) for v in variants} == span_ids and len(variants) == 3
  assert {v.answer for v in variants} == set(SPANS)
  assert files["fixed"] in variants
  ex = features.example_to_dict(tf.train.Example.FromString(
      next(iter(tf.data.TFRecordDataset(files["new"]))).numpy()))
  assert ex["num_variants"] == [3]
  sent_ids = [tokenizer.cls_id] + _ids(tokenizer, SENTENCE) + [tokenizer.sep_id]
  decoded = set()
  for i in range(3):
    query = ex["variant_query_ids"][i * QLEN:(i + 1) * QLEN]
    weights = ex["variant_mlm_weights"][i * MAX_MASKS:(i + 1) * MAX_MASKS]
    n = int(sum(weights))
    positions = ex["variant_mlm_positions"][i * MAX_MASKS:i * MAX_MASKS + n]
    ids = ex["variant_mlm_ids"][i * MAX_MASKS:i * MAX_MASKS + n]
    assert [query[p] for p in positions] == [tokenizer.mask_id] * n
    assert query.count(tokenizer.mask_id) == n
    assert [sent_ids[p] for p in positions] == ids  # The masked wordpieces are the span's.
    assert tokenizer.tokenize([ex["variant_answer"][i]])[0].numpy().tolist() == ids
    decoded.add(tuple(ids))
  assert decoded == span_ids
  # The fixed features are what to_example writes without variants.
  plain = features.example_to_dict(tf.train.Example.FromString(pretrain_examples.to_example(
      files["fixed"], files["record"], QLEN, MAX_MASKS)))
  assert {k: v for k, v in ex.items() if k in plain} == plain
  assert set(ex) - set(plain) == {"num_variants"} | {
      "variant_" + n for n in features.PRETRAIN_VARIANT_FIELDS}


def test_training_reads_draw_every_variant_uniformly_and_reproducibly(tokenizer, files):
  ds, batches = _reads(files["new"], 30)
  spans = {tuple(_ids(tokenizer, s)): s for s in SPANS}
  counts = collections.Counter()
  for b in batches:
    for r in range(len(b["answer"])):
      row = {k: v[r] for k, v in b.items()}
      ids, positions = _masked_answer_ids(row)
      assert [row["query_ids"][p] for p in positions] == [tokenizer.mask_id] * len(ids)
      assert int((row["query_ids"] == tokenizer.mask_id).sum()) == len(ids)
      assert spans[ids] == row["answer"].decode()  # The answer goes with its masking.
      counts[ids] += 1
  assert sum(counts.values()) == 600 and set(counts) == set(spans)
  # Binomial(600, 1/3): mean 200, sd 11.5; the draws are fixed by the seed.
  assert all(140 <= c <= 260 for c in counts.values()), counts
  _, again = _reads(files["new"], 30)
  for a, b in zip(batches, again):
    np.testing.assert_array_equal(a["query_ids"], b["query_ids"])
  _, other = _reads(files["new"], 30, seed=4)
  assert any((a["query_ids"] != b["query_ids"]).any() for a, b in zip(batches, other))
  # Same keys, shapes and dtypes as the fixed-feature pipeline.
  fixed_ds, _ = _reads(files["new"], 0, resample=False)
  assert ds.element_spec == fixed_ds.element_spec
  assert "num_variants" not in batches[0] and batches[0]["query_ids"].dtype == np.int32


def test_validation_and_no_resampling_read_the_fixed_variant(tokenizer, files):
  fixed_ids = tuple(files["fixed"].mlm_ids)
  for kwargs in (dict(is_training=False, batch=1), dict(resample=False)):
    _, batches = _reads(files["new"], 3, **kwargs)
    rows = [_masked_answer_ids({k: v[r] for k, v in b.items()})[0]
            for b in batches for r in range(len(b["answer"]))]
    assert rows and set(rows) == {fixed_ids}
  params = configs.MaskedLmDataConfig(input_path=files["new"], is_training=False)
  everything = loaders.MaskedExamplesLoader(params, QLEN, MAX_MASKS).read_all()
  q = files["fixed"]
  assert everything["query_ids"].tolist() == [q.query_ids + [0] * (QLEN - len(q.query_ids))]
  assert set(everything) == set(features.pretrain_features(QLEN, MAX_MASKS))


def test_old_format_records_load_in_training(tokenizer, files):
  old = features.example_to_dict(tf.train.Example.FromString(
      next(iter(tf.data.TFRecordDataset(files["old"]))).numpy()))
  assert "num_variants" not in old
  _, batches = _reads(files["old"], 2)
  for b in batches:
    for r in range(len(b["answer"])):
      assert b["answer"][r].decode() == files["old_answer"] == "Ada Lovelace"
      assert b["query_ids"][r].tolist() == old["query_ids"]
      assert b["mlm_ids"][r].tolist() == old["mlm_ids"]
  # Mixed in one batch with records that have variants: those vary, the old one stays.
  _, mixed = _reads([files["old"], files["new"]], 10)
  answers = collections.Counter(a.decode() for b in mixed for a in b["answer"])
  assert answers["Ada Lovelace"] > 0 and set(answers) == {"Ada Lovelace", *SPANS}
  for b in mixed:
    for r in range(len(b["answer"])):
      if b["answer"][r].decode() == "Ada Lovelace":
        assert b["query_ids"][r].tolist() == old["query_ids"]


def test_random_span_and_uniform_write_independent_draws(tokenizer):
  record = _record("Ada Lovelace wrote the first published algorithm in 1843.", [])
  for kind in ("random_span", "uniform"):
    builder = pretrain_examples.ExampleBuilder(tokenizer, kind, QLEN, MAX_MASKS,
                                               examples_per_sentence=2, variants_per_sentence=5)
    (_, fixed, variants), = builder.build_variants([record])[0]
    assert len(fixed) == 2 and len(variants) == 5 and fixed == variants[:2]
    assert len({tuple(v.query_ids) for v in variants}) > 1  # Draws, not copies.
    # The fixed draws are those of a builder that writes fewer variants.
    fewer = pretrain_examples.ExampleBuilder(tokenizer, kind, QLEN, MAX_MASKS,
                                             examples_per_sentence=2, variants_per_sentence=1)
    assert fewer.build([record])[0] == [(record, q) for q in fixed]
    ex = features.parse_pretrain_example(
        tf.constant([pretrain_examples.to_example(fixed[0], record, QLEN, MAX_MASKS, variants)]),
        QLEN, MAX_MASKS, with_variants=True)
    assert ex["num_variants"].numpy().tolist() == [5]
    np.testing.assert_array_equal(
        ex["variant_query_ids"].values.numpy().reshape(5, QLEN),
        [v.query_ids + [0] * (QLEN - len(v.query_ids)) for v in variants])
