"""Annotated sentences -> masked-LM pre-training examples (REALM's queries).

Maskings (``--masking``):

* ``salient`` (default; the paper's): one whole salient span (named entity or date) of the
  sentence, every wordpiece ``[MASK]``; of a span longer than ``max_masks`` wordpieces the first
  ``max_masks`` are predicted (as Google's ``featurization.py``; counted as
  ``long_span_first_predicted``), a span longer than the query is not used.
  ``--examples_per_sentence`` k gives up to k examples per sentence, each with a different span.
  Sentences without a usable span give no example (counted as ``skip:no_salient_span``).
* ``random_span``: Table 2's "random span masks" ablation (SpanBERT-style whole-word spans).
* ``uniform``: Table 2's "random uniform masks" ablation (BERT: 15% of wordpieces, 80/10/10).

Sentences longer than ``query_seq_length - 2`` wordpieces are cut around the masked span (kept,
not skipped); see ``data_prep.masking``. Each example carries ``source_block_id`` and
``source_uid``, the block the sentence came from, for "prohibit trivial retrieval", and
``source_corpus``, the corpus it came from. With ``--source_corpus NAME`` the sentences are from
documents that are not the knowledge corpus REALM retrieves from (the paper's X = CC-News over
Z = Wikipedia): their examples name no block (``source_block_id`` -1, ``source_uid`` empty), so
REALM excludes nothing for them, and ``source_corpus`` is NAME.

Resampling: every example also carries the sentence's **variants**, the maskings training draws
from (``variant_*`` features): ``salient``, one per usable salient span, all of them, in a seeded
order (Google's ``example_generator.py`` draws a salient span afresh each time it reads a
sentence); ``random_span`` and ``uniform``, ``--variants_per_sentence`` independent draws. The
fixed features (``query_ids``, ``mlm_*``, ``answer``) are one of the variants, for validation;
training (``realm_tf.data.loaders.MaskedExamplesLoader``) draws one variant per read.

The eval split holds out whole blocks: a sentence goes to ``eval`` when its block does
(``realm_tf.data.manifests.split_of``: SHA1 of ``"eval:" + block_uid`` below
``eval_fraction``). Features: ``realm_tf.data.features.pretrain_features`` and
``realm_tf.data.features.pretrain_variant_features``.

Command line (other flags are Beam pipeline options, e.g. ``--runner=DataflowRunner``)::

  python -m data_prep.pretrain_examples --sentences_dir /data/sentences \\
      --vocab_file vocab.txt --output_dir /data/pretrain [--masking salient]
"""

import json
import logging
import os
import random
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from absl import flags
import apache_beam as beam
import tensorflow as tf

from data_prep import beam_utils
from data_prep import cli
from data_prep import masking as masking_lib
from data_prep import text as text_lib
from realm_tf.data import features
from realm_tf.data import manifests
from realm_tf.tokenization import RealmTokenizer, load_vocab

MASKINGS = ("salient", "random_span", "uniform")


split_of = manifests.split_of  # the held-out blocks' rule, shared with the library


def _int_feature(values):
  return tf.train.Feature(int64_list=tf.train.Int64List(value=list(values)))


def _bytes_feature(value: str):
  return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value.encode("utf-8")]))


def _padded(q: masking_lib.MaskedQuery, query_seq_length: int, max_masks: int) -> Dict[str, List]:
  """The fixed-length lists of one masked query, by feature name."""
  return {
      "query_ids": masking_lib.pad_to(q.query_ids, query_seq_length),
      "query_mask": masking_lib.pad_to([1] * len(q.query_ids), query_seq_length),
      "mlm_positions": masking_lib.pad_to(q.mlm_positions, max_masks),
      "mlm_ids": masking_lib.pad_to(q.mlm_ids, max_masks),
      "mlm_weights": masking_lib.pad_to([1.0] * len(q.mlm_positions), max_masks, 0.0),
  }


def _float_feature(values):
  return tf.train.Feature(float_list=tf.train.FloatList(value=list(values)))


def to_example(q: masking_lib.MaskedQuery, record: Dict, query_seq_length: int,
               max_masks: int,
               variants: Optional[Sequence[masking_lib.MaskedQuery]] = None,
               source_corpus: Optional[str] = None) -> bytes:
  """A masked query + its sentence record -> serialized tf.Example (fixed lengths).

  With ``variants`` (the sentence's maskings, ``q`` usually among them) the example also has
  ``num_variants`` and the flattened ``variant_*`` lists; without, only the fixed features.
  With ``source_corpus`` (a name) the record's block is a document of another corpus than the
  knowledge corpus: the example names no block (``features.EXTERNAL_SOURCE_BLOCK_ID``, empty
  ``source_uid``) and records ``source_corpus``.
  """
  fixed = _padded(q, query_seq_length, max_masks)
  feature = {k: _float_feature(v) if k == "mlm_weights" else _int_feature(v)
             for k, v in fixed.items()}
  feature.update({
      "source_block_id": _int_feature([features.EXTERNAL_SOURCE_BLOCK_ID if source_corpus
                                       else record["block_id"]]),
      "source_uid": _bytes_feature("" if source_corpus else record["block_uid"]),
      "source_corpus": _bytes_feature(source_corpus or features.KNOWLEDGE_CORPUS),
      "answer": _bytes_feature(q.answer),
      "sentence": _bytes_feature(record["sentence"]),
  })
  if variants is not None:
    padded = [_padded(v, query_seq_length, max_masks) for v in variants]
    for name in fixed:
      flat = [x for p in padded for x in p[name]]
      feature["variant_" + name] = (_float_feature(flat) if name == "mlm_weights"
                                    else _int_feature(flat))
    feature["variant_answer"] = tf.train.Feature(bytes_list=tf.train.BytesList(
        value=[v.answer.encode("utf-8") for v in variants]))
    feature["num_variants"] = _int_feature([len(variants)])
  return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


class ExampleBuilder:
  """Builds masked queries for batches of sentence records (plain Python + one tokenizer).

  Args:
    tokenizer: a ``realm_tf.tokenization.RealmTokenizer``.
    masking: one of :data:`MASKINGS`.
    examples_per_sentence: k, the fixed examples (records) of a sentence, at most.
    seed: the random choices of a sentence depend only on (seed, block uid, sentence index).
    variants_per_sentence: V, the independent draws a ``random_span`` or ``uniform`` sentence
      carries as variants (``salient`` sentences carry one per usable span instead).

  ``build_variants(records)`` returns ``[(record, fixed queries, variants)]`` and a list of event
  names to count; the fixed queries are the first k variants (for ``random_span``/``uniform``,
  the first k of max(k, V) draws). ``build(records)`` returns ``[(record, MaskedQuery)]``, one
  pair per fixed query, and the events.
  """

  def __init__(self, tokenizer, masking: str = "salient", query_seq_length: int = 96,
               max_masks: int = 10, examples_per_sentence: int = 1, seed: int = 0,
               variants_per_sentence: int = 8):
    if masking not in MASKINGS:
      raise ValueError(f"masking must be one of {MASKINGS}, got {masking!r}")
    if variants_per_sentence < 1:
      raise ValueError(f"variants_per_sentence must be at least 1, got {variants_per_sentence}")
    self.tok = tokenizer
    self.masking = masking
    self.query_seq_length = query_seq_length
    self.max_masks = max_masks
    self.examples_per_sentence = examples_per_sentence
    self.seed = seed
    self.variants_per_sentence = variants_per_sentence
    special = {i for i, t in enumerate(tokenizer.vocab) if t.startswith("[") and t.endswith("]")}
    self.random_ids = [i for i in range(tokenizer.vocab_size) if i not in special]

  def _rng(self, record: Dict) -> random.Random:
    return random.Random(f"{self.seed}:{self.masking}:{record['block_uid']}:"
                         f"{record['sentence_index']}")

  def _draws(self) -> int:
    """Maskings drawn per sentence for ``random_span``/``uniform``: enough for both uses."""
    return max(self.examples_per_sentence, self.variants_per_sentence)

  def build(self, records: Sequence[Dict]) -> Tuple[List[Tuple[Dict, masking_lib.MaskedQuery]],
                                                    List[str]]:
    built, events = self.build_variants(records)
    return [(r, q) for r, fixed, _ in built for q in fixed], events

  def build_variants(self, records: Sequence[Dict]) -> Tuple[
      List[Tuple[Dict, List[masking_lib.MaskedQuery], List[masking_lib.MaskedQuery]]],
      List[str]]:
    if self.masking == "uniform":
      built, events = self._build_uniform(records)
    else:
      built, events = self._build_spans(records)
    for _, _, variants in built:
      events.append("variant_sentences")
      events.extend(["variants"] * len(variants))
      if len(variants) == 1:
        events.append("variant_sentences:single")
    return built, events

  def _build_spans(self, records):
    events: List[str] = []
    # (record, [(char start, char end)]) per sentence; one tokenizer call for all their pieces.
    plans: List[Tuple[Dict, List[Tuple[int, int]]]] = []
    if self.masking == "salient":
      for r in records:
        rng = self._rng(r)
        spans = [text_lib.byte_span_to_chars(r["sentence"], s["span_byte_start"],
                                             s["span_byte_limit"]) for s in r.get("spans", [])]
        if not spans:
          events.append("skip:no_salient_span")
          continue
        rng.shuffle(spans)
        plans.append((r, spans))
    else:
      words_of = [masking_lib.word_spans(r["sentence"]) for r in records]
      flat = [r["sentence"][s:e] for r, ws in zip(records, words_of) for s, e in ws]
      counts = self.tok.count_wordpieces(flat)
      i = 0
      for r, ws in zip(records, words_of):
        wc, i = counts[i:i + len(ws)], i + len(ws)
        rng = self._rng(r)
        spans = []
        for _ in range(self._draws()):
          span = masking_lib.choose_random_span(ws, wc, rng, self.max_masks)
          if span is None:
            events.append("skip:no_maskable_word")
            break
          spans.append(span)
        if spans:
          plans.append((r, spans))
    texts = []
    for r, spans in plans:
      sent = r["sentence"]
      for s, e in spans:
        texts.extend([sent[:s], sent[s:e], sent[e:]])
    ids = self.tok.tokenize(texts).to_list() if texts else []
    out, k = [], 0
    for r, spans in plans:
      queries = []  # (query, cut around the span, span longer than max_masks)
      for s, e in spans:
        prefix, span, suffix = ids[k], ids[k + 1], ids[k + 2]
        k += 3
        q = masking_lib.mask_span(prefix, span, suffix, r["sentence"][s:e], self.tok.cls_id,
                                  self.tok.sep_id, self.tok.mask_id, self.query_seq_length,
                                  self.max_masks)
        if q is None:
          events.append("skip:span_longer_than_query")
          continue
        cut = len(prefix) + len(span) + len(suffix) > self.query_seq_length - 2
        queries.append((q, cut, len(span) > self.max_masks))
      if not queries:
        if self.masking == "salient":
          events.append("skip:no_usable_salient_span")
        continue
      fixed = queries[:self.examples_per_sentence]
      for _, cut, long_span in fixed:
        if cut:
          events.append("sentence_cut_around_span")
        if long_span:
          events.append("long_span_first_predicted")
      if self.masking == "salient":
        variants = queries
      else:
        variants = queries[:self.variants_per_sentence]
      events.extend("variants_long_span_first_predicted" for _, _, ls in variants if ls)
      out.append((r, [q for q, _, _ in fixed], [q for q, _, _ in variants]))
    return out, events

  def _build_uniform(self, records):
    ids = self.tok.tokenize([r["sentence"] for r in records]).to_list() if records else []
    out, events = [], []
    for r, t in zip(records, ids):
      rng = self._rng(r)
      queries = []
      for _ in range(self._draws()):
        q = masking_lib.mask_uniform(t, rng, self.tok.cls_id, self.tok.sep_id, self.tok.mask_id,
                                     self.random_ids, self.query_seq_length, self.max_masks,
                                     vocab_lookup=lambda i: self.tok.vocab[i])
        if q is None:
          events.append("skip:empty_sentence")
          break
        queries.append(q)
      if not queries:
        continue
      fixed = queries[:self.examples_per_sentence]
      if len(t) > self.query_seq_length - 2:
        events.extend(["sentence_cut_at_end"] * len(fixed))
      out.append((r, fixed, queries[:self.variants_per_sentence]))
    return out, events


class BuildExamplesFn(beam.DoFn):
  """A batch of sentence JSON lines -> ``(split, (key, serialized))``; events on "stats"."""

  def __init__(self, vocab_file, lower_case, masking, query_seq_length, max_masks,
               examples_per_sentence, seed, eval_fraction, variants_per_sentence=8,
               source_corpus=None):
    self._cfg = (vocab_file, lower_case, masking, query_seq_length, max_masks,
                 examples_per_sentence, seed, variants_per_sentence)
    self._eval_fraction = eval_fraction
    self._source_corpus = source_corpus

  def setup(self):
    vocab_file, lower_case, masking, qlen, max_masks, k, seed, v = self._cfg
    self._builder = ExampleBuilder(RealmTokenizer(vocab_file, lower_case), masking, qlen,
                                   max_masks, k, seed, v)
    self._progress = beam_utils.ProgressLogger("sentences masked", every=20000)

  def process(self, lines):
    records = []
    for line in lines:
      records.append(json.loads(line))
    yield beam_utils.count_event("sentences_read", len(records))
    built, events = self._builder.build_variants(records)
    for e in events:
      yield beam_utils.count_event(e)
    qlen, max_masks = self._builder.query_seq_length, self._builder.max_masks
    for r, fixed, variants in built:
      split = split_of(r["block_uid"], self._eval_fraction)
      for j, q in enumerate(fixed):
        yield beam_utils.count_event(f"examples:{split}")
        yield beam.pvalue.TaggedOutput(split, (
            (r["block_id"], r["sentence_index"], j + 1),
            to_example(q, r, qlen, max_masks, variants, self._source_corpus)))
    self._progress.add(len(records))


def _read_jsonl_lines(path: str) -> Iterable[str]:
  with tf.io.gfile.GFile(path, "r") as f:
    for line in f:
      if line.strip():
        yield line


def run_pretrain_examples(sentences_dir: str, vocab_file: str, output_dir: str,
                          masking: str = "salient", lower_case: bool = True,
                          query_seq_length: int = 96, max_masks: int = 10,
                          examples_per_sentence: int = 1, eval_fraction: float = 0.02,
                          seed: int = 0, num_shards: int = 0, variants_per_sentence: int = 8,
                          pipeline_args: Optional[Sequence[str]] = None,
                          source_corpus: Optional[str] = None) -> Dict:
  """Runs the pre-training examples pipeline; writes ``output_dir`` atomically.

  ``variants_per_sentence``: the maskings a ``random_span``/``uniform`` sentence carries for
  resampling (``salient`` sentences carry every usable span). ``source_corpus``: the name of
  the document corpus the sentences come from when it is not the knowledge corpus (see the
  module docstring); None: the sentences' blocks are the knowledge corpus.
  """
  if source_corpus is not None and (not source_corpus.strip() or
                                    source_corpus == features.KNOWLEDGE_CORPUS):
    raise ValueError(f"source_corpus names a document corpus other than the knowledge corpus; "
                     f"got {source_corpus!r} (leave it unset for the knowledge corpus)")
  if masking not in MASKINGS:
    raise ValueError(f"--masking must be one of {MASKINGS}, got {masking!r}")
  if variants_per_sentence < 1:
    raise ValueError(f"variants_per_sentence must be at least 1, got {variants_per_sentence}")
  if not 0.0 <= eval_fraction < 1.0:
    raise ValueError(f"eval_fraction must be in [0, 1), got {eval_fraction}")
  load_vocab(vocab_file)
  sent_manifest = manifests.load_manifest(sentences_dir)
  files = manifests.shard_files(sentences_dir, manifests.SENTENCES_PREFIX, manifests.JSONL_SUFFIX)
  with beam_utils.atomic_output_dir(output_dir) as tmp:
    def build(p):
      out = (p | "Files" >> beam.Create(files)
             | "ReadLines" >> beam.FlatMap(_read_jsonl_lines).with_output_types(str)
             | "Distribute" >> beam.Reshuffle()
             | "Batch" >> beam.BatchElements(min_batch_size=32, max_batch_size=512)
             | "Mask" >> beam.ParDo(BuildExamplesFn(
                 vocab_file, lower_case, masking, query_seq_length, max_masks,
                 examples_per_sentence, seed, eval_fraction,
                 variants_per_sentence, source_corpus)).with_outputs(
                     beam_utils.STATS_TAG, manifests.TRAIN_SPLIT, manifests.EVAL_SPLIT))
      for split in (manifests.TRAIN_SPLIT, manifests.EVAL_SPLIT):
        _ = out[split] | f"Write_{split}" >> beam_utils.WriteTFRecordShards(
            os.path.join(tmp, split), manifests.TFRECORD_SUFFIX, num_shards)
      _ = (out[beam_utils.STATS_TAG],) | "Stats" >> beam_utils.CollectStats(tmp)
    beam_utils.run_pipeline(build, pipeline_args, "pretrain_examples")
    counts = beam_utils.pop_stats(tmp)["counts"]
    for split in (manifests.TRAIN_SPLIT, manifests.EVAL_SPLIT):
      beam_utils.fill_missing_shards(tmp, split, manifests.TFRECORD_SUFFIX)
    num_train = counts.get(f"examples:{manifests.TRAIN_SPLIT}", 0)
    if num_train == 0:
      raise manifests.DataError(f"no training examples from {sentences_dir} with "
                                f"masking={masking!r} ({counts}); nothing written to {output_dir}")
    manifest = {
        "kind": "pretrain",
        "masking": masking,
        "num_train": num_train,
        "num_eval": counts.get(f"examples:{manifests.EVAL_SPLIT}", 0),
        "eval_fraction": eval_fraction,
        "eval_rule": "hash_fraction(block_uid, salt='eval:') < eval_fraction",
        "query_seq_length": query_seq_length,
        "max_masks": max_masks,
        "examples_per_sentence": examples_per_sentence,
        "resampling": "variants per sentence; training draws one per read",
        "variants_per_sentence": (variants_per_sentence if masking != "salient"
                                  else "every usable salient span"),
        "variants": _variant_stats(counts),
        "seed": seed,
        "vocab_file": vocab_file,
        "vocab_sha1": manifests.file_sha1(vocab_file),
        "lower_case": lower_case,
        # The knowledge corpus's fingerprint when its blocks are the sentences' source; for
        # another corpus the sentences' blocks are that corpus's, never retrieved from.
        "blocks_fingerprint": (None if source_corpus else sent_manifest["blocks_fingerprint"]),
        "source_corpus": source_corpus or features.KNOWLEDGE_CORPUS,
        "source_blocks_fingerprint": sent_manifest["blocks_fingerprint"],
        "trivial_retrieval": ("nothing excluded: the sentences are not from the knowledge corpus"
                              if source_corpus else "the source block's uid is excluded"),
        "sentences_dir": sentences_dir,
        "annotator": sent_manifest.get("annotator"),
        "long_sentences": "cut around the masked span" if masking != "uniform" else "cut at end",
        "counts": counts,
    }
    beam_utils.write_json(os.path.join(tmp, manifests.MANIFEST), manifest)
  logging.info("pretrain examples (%s): %d train, %d eval -> %s", masking, manifest["num_train"],
               manifest["num_eval"], output_dir)
  return manifest


def _variant_stats(counts: Dict[str, int]) -> Dict:
  """The variants written, from the pipeline's counts (sentences that gave examples)."""
  sentences, total = counts.get("variant_sentences", 0), counts.get("variants", 0)
  return {"sentences": sentences, "total": total,
          "mean_per_sentence": round(total / sentences, 3) if sentences else 0.0,
          "sentences_with_one": counts.get("variant_sentences:single", 0)}


def define_masking_flags() -> None:
  """``--masking`` and ``--examples_per_sentence`` (also ``data_prep.pipeline``'s)."""
  flags.DEFINE_enum("masking", "salient", MASKINGS, "What is masked in each sentence.")
  flags.DEFINE_integer("examples_per_sentence", 1, "Examples per sentence, at most.")


def define_source_corpus_flag() -> None:
  """``--source_corpus`` (also ``data_prep.pipeline``'s)."""
  flags.DEFINE_string("source_corpus", None,
                      "The sentences are documents of this corpus (e.g. news), not of the "
                      "knowledge corpus REALM retrieves from: their examples name no source "
                      "block, so nothing is excluded from their candidates (X != Z).")


def define_flags() -> None:
  """The command line's flags (see :mod:`data_prep.cli`)."""
  flags.DEFINE_string("sentences_dir", None, "The sentences directory (salient_spans' output).")
  flags.DEFINE_string("output_dir", None, "The pre-training examples directory to write.")
  cli.define_vocab_flags()
  define_masking_flags()
  flags.DEFINE_integer("variants_per_sentence", 8,
                       "Maskings per sentence that training draws from (random_span, uniform; "
                       "salient uses every usable span).", lower_bound=1)
  flags.DEFINE_integer("max_masks", features.MAX_MASKS, "Masked wordpieces per query, at most.")
  define_source_corpus_flag()
  cli.define_example_flags()
  flags.mark_flags_as_required(["sentences_dir", "output_dir"])
  flags.adopt_module_key_flags(cli)  # The shared flags show in --help too.


def main(argv):
  f = flags.FLAGS
  m = run_pretrain_examples(f.sentences_dir, f.vocab_file, f.output_dir, f.masking,
                            f.lower_case, f.query_seq_length, f.max_masks,
                            f.examples_per_sentence, f.eval_fraction, f.seed, f.num_shards,
                            f.variants_per_sentence, pipeline_args=argv[1:],
                            source_corpus=f.source_corpus)
  print(json.dumps({k: m[k] for k in ("masking", "num_train", "num_eval", "source_corpus")}))


if __name__ == "__main__":
  cli.run(main, define_flags)
