"""Corpus -> retrieval blocks: the Beam pipeline and the per-article functions behind it.

Input (``--input``): a MediaWiki XML dump (``.xml``, ``.xml.bz2``, a glob of several), JSON lines
``{"title", "text"}`` (``.jsonl``/``.json``, a glob), both in a comma list (each file read by its
kind), or a prepared TFDS Wikipedia split written as ``tfds:<name>[:<split>]`` (e.g.
``tfds:wikipedia/20230601.en:train``).

Per article: wiki markup is cleaned (``data_prep.wiki``), redirects, non-article namespaces and
(as ORQA does; ``--keep_list_pages`` keeps them) list / index / outline / disambiguation pages are
dropped, the text is split into sentences, and whole sentences are packed greedily into blocks of
at most ``--block_seq_length`` (288) wordpieces counting ``[CLS] title [SEP] body [SEP]``. A
sentence longer than a block is cut between words (between characters for a monstrous word),
never dropped. Dropped or unreadable records are counted in ``manifest.json["counts"]`` and
logged, never lost silently.

Block ids are dense, ``0..n-1``, in the order (title, SHA1 of the article text, position of the
block in the article), so they are the same on every run and every runner. Exact duplicate
articles (same title and text) are kept once and counted.

Command line (other flags are Beam pipeline options, e.g. ``--runner=DataflowRunner``)::

  python -m data_prep.blocks --input enwiki.xml.bz2 --vocab_file vocab.txt \\
      --output_dir /data/blocks [--nolower_case] [--keep_list_pages] [--num_shards 0]

Output: a blocks directory as ``realm_tf.data.manifests`` defines it (``blocks-*.tfrecord`` +
``manifest.json``).
"""

import json
import logging
import os
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from absl import flags
import apache_beam as beam
import tensorflow as tf

from data_prep import beam_utils
from data_prep import cli
from data_prep import text as text_lib
from data_prep import wiki
from realm_tf.data import features
from realm_tf.data import manifests
# The per-article functions are the library's (realm-index upsert cuts documents by the same
# rules, and realm_tf never imports data_prep), here under their old names too.
from realm_tf.data.articles import (  # pylint: disable=unused-import
    MIN_BODY_BUDGET, article_to_blocks, articles_to_blocks, cut_long_span, pack_units,
    parse_jsonl_article)
from realm_tf.tokenization import RealmTokenizer, load_vocab


class CorpusInputError(manifests.DataError):
  """The corpus input cannot be used (unknown format, nothing readable)."""


# ----------------------------------------------------------------------------------- input --

def resolve_input(input_spec: str) -> Tuple[str, List[str]]:
  """``input_spec`` -> ``(kind, files)``, kind in ``xml``, ``jsonl``, ``mixed``, ``tfds``.

  ``mixed``: XML dumps and JSON lines together (a dump slice plus documents of another source in
  one corpus); each file is then read by its own kind (:func:`file_kind`).

  Raises CorpusInputError / FileNotFoundError with the spec in the message when nothing matches.
  """
  if input_spec.startswith("tfds:"):
    return "tfds", [input_spec[len("tfds:"):]]
  specs = [s for s in input_spec.split(",") if s]
  files = []
  for spec in specs:
    matched = sorted(tf.io.gfile.glob(spec)) if any(c in spec for c in "*?[") else (
        [spec] if tf.io.gfile.exists(spec) else [])
    if not matched:
      raise FileNotFoundError(f"corpus input not found: {spec}")
    files.extend(matched)
  kinds = {file_kind(f) for f in files}
  return (kinds.pop() if len(kinds) == 1 else "mixed"), files


def file_kind(path: str) -> str:
  """``xml`` or ``jsonl`` from a corpus file's name (``.bz2``/``.gz`` looked through)."""
  name = path.lower()
  for suffix in (".bz2", ".gz"):
    if name.endswith(suffix):
      name = name[:-len(suffix)]
  if name.endswith(".xml"):
    return "xml"
  if name.endswith((".jsonl", ".json", ".ndjson")):
    return "jsonl"
  raise CorpusInputError(f"unknown corpus format for {path}: expected .xml[.bz2] or .jsonl")


def read_corpus_file(path: str, kind: str) -> Iterator:
  """Yields ``("article", dict)``, ``("page", dict)`` or ``("skip", reason)`` from one file."""
  if kind == "xml":
    for page in wiki.iter_dump_pages(path):
      yield "page", page
    return
  for line_number, raw in beam_utils.iter_lines_checked(path):
    article, reason = parse_jsonl_article(path, line_number, raw)
    if article is not None:
      yield "article", article
    elif reason != "blank_line":
      yield "skip", reason


def doc_key(title: str, text: str) -> str:
  """Sort key of an article: its title, then the SHA1 of its text (duplicate titles)."""
  return f"{title}\x00{text_lib.sha1_hex(text)}"


# ---------------------------------------------------------------------------------- DoFns --

@beam.typehints.with_output_types(Tuple[str, Any])
class ArticleToBlocksFn(beam.DoFn):
  """``(kind, record)`` -> ``(doc_key, {"title", "blocks"})``; counted events on "stats"."""

  def __init__(self, vocab_file: str, lower_case: bool, block_seq_length: int,
               drop_list_pages: bool):
    self._vocab_file = vocab_file
    self._lower_case = lower_case
    self._block_seq_length = block_seq_length
    self._drop_list_pages = drop_list_pages

  def setup(self):
    self._tokenizer = RealmTokenizer(self._vocab_file, lower_case=self._lower_case)
    self._progress = beam_utils.ProgressLogger("articles read", every=2000)

  def process(self, element):
    kind, record = element
    self._progress.add()
    yield beam_utils.count_event("records_read")
    if kind == "skip":
      reason = record.split(":", 1)[0]
      logging.warning("data_prep.blocks: skipped record (%s)", record)
      yield beam_utils.count_event(f"skip:{reason}")
      return
    if kind == "page":
      reason = wiki.page_drop_reason(record, self._drop_list_pages)
      if reason:
        yield beam_utils.count_event(f"drop:{reason}")
        return
      title, text = record["title"], wiki.clean_wikitext(record["wikitext"])
      where = f"page {title!r} (id {record.get('id')})"
    else:
      title, text, where = record["title"].strip(), record["text"], record.get("source", "")
      reason = wiki.title_drop_reason(title) if self._drop_list_pages else None
      if reason:
        yield beam_utils.count_event(f"drop:{reason}")
        return
    if not title or not text.strip():
      logging.warning("data_prep.blocks: skipped empty article %s", where)
      yield beam_utils.count_event("skip:empty_article")
      return
    try:
      blocks = article_to_blocks(title, text, self._tokenizer, self._block_seq_length)
    except ValueError as e:
      logging.warning("data_prep.blocks: skipped %s: %s", where, e)
      yield beam_utils.count_event("skip:title_too_long")
      return
    yield beam_utils.count_event("articles_kept")
    yield doc_key(title, text), {"title": title, "bodies": [b["body"] for b in blocks],
                                 "token_ids": [b["token_ids"] for b in blocks]}


def _dedupe(kv):
  key, values = kv
  values = list(values)
  yield key, values[0]
  if len(values) > 1:
    yield beam_utils.count_event("drop:duplicate_article", len(values) - 1)


def _offsets(key_counts: List[Tuple[str, int]]) -> Dict[str, int]:
  offsets, total = {}, 0
  for key, n in sorted(key_counts):
    offsets[key] = total
    total += n
  return offsets


def _assign_ids(kv, offsets):
  key, doc = kv
  first = offsets[key]
  for i, (body, token_ids) in enumerate(zip(doc["bodies"], doc["token_ids"])):
    yield {"block_id": first + i, "uid": features.block_uid(doc["title"], body),
           "title": doc["title"], "body": body, "token_ids": token_ids}


def _fingerprint(id_uids: List[Tuple[int, str]]) -> Dict:
  id_uids = sorted(id_uids)
  if [i for i, _ in id_uids] != list(range(len(id_uids))):
    raise AssertionError("block ids are not dense")
  return {"num_blocks": len(id_uids),
          "fingerprint": manifests.corpus_fingerprint(u for _, u in id_uids)}


def _read_tfds(p, name_split: str):
  import tensorflow_datasets as tfds  # inside: only tfds: inputs need it
  name, _, split = name_split.partition(":")
  split = split or "train"
  try:
    builder = tfds.builder(name)
  except Exception as e:  # pylint: disable=broad-except
    raise CorpusInputError(f"unknown TFDS dataset {name!r}: {e}") from e
  if not tf.io.gfile.exists(os.path.join(builder.data_dir, "dataset_info.json")):
    raise CorpusInputError(f"TFDS dataset {name!r} is not prepared under {builder.data_dir}; "
                           f"build it first (tfds build {name}) or pass a dump / JSON lines file")

  def to_article(ex):
    def s(v):
      return v.decode("utf-8") if isinstance(v, bytes) else str(v)
    return "article", {"title": s(ex["title"]), "text": s(ex["text"]), "source": name_split}

  return (p | "ReadTFDS" >> tfds.beam.ReadFromTFDS(builder, split=split)
          | "TFDSToArticle" >> beam.Map(to_article))


def build_blocks_pipeline(p, input_spec: str, vocab_file: str, tmp_dir: str,
                          lower_case: bool = True, block_seq_length: int = 288,
                          drop_list_pages: bool = True, num_shards: int = 0) -> None:
  """Adds the blocks pipeline to ``p``; writes shards and ``_stats.json`` into ``tmp_dir``."""
  kind, files = resolve_input(input_spec)
  if kind == "tfds":
    records = _read_tfds(p, files[0])
  else:
    records = (p | "Files" >> beam.Create([(f, file_kind(f)) for f in files])
               | "ReadRecords" >> beam.FlatMapTuple(read_corpus_file)
               | "Distribute" >> beam.Reshuffle())
  docs = records | "ToBlocks" >> beam.ParDo(ArticleToBlocksFn(
      vocab_file, lower_case, block_seq_length, drop_list_pages)).with_outputs(
          beam_utils.STATS_TAG, main="docs")
  unique = (docs.docs | "GroupByDoc" >> beam.GroupByKey()
            | "Dedupe" >> beam.FlatMap(_dedupe).with_output_types(
                Tuple[str, Any]).with_outputs(beam_utils.STATS_TAG, main="docs"))
  offsets = (unique.docs | "DocSizes" >> beam.Map(lambda kv: (kv[0], len(kv[1]["bodies"])))
             | "AllDocSizes" >> beam.combiners.ToList() | "Offsets" >> beam.Map(_offsets))
  blocks = unique.docs | "AssignIds" >> beam.FlatMap(
      _assign_ids, offsets=beam.pvalue.AsSingleton(offsets))
  _ = (blocks | "ToExample" >> beam.Map(lambda b: (b["block_id"], features.serialize_block(
           b["block_id"], b["uid"], b["title"], b["body"], b["token_ids"])))
       | "WriteBlocks" >> beam_utils.WriteTFRecordShards(
           os.path.join(tmp_dir, manifests.BLOCKS_PREFIX), manifests.TFRECORD_SUFFIX, num_shards))
  fingerprint = (blocks | "IdUid" >> beam.Map(lambda b: (b["block_id"], b["uid"]))
                 | "AllIdUids" >> beam.combiners.ToList() | "Fingerprint" >> beam.Map(_fingerprint))
  _ = ((docs[beam_utils.STATS_TAG], unique[beam_utils.STATS_TAG])
       | "Stats" >> beam_utils.CollectStats(tmp_dir, {"blocks": fingerprint}))


def run_blocks(input_spec: str, vocab_file: str, output_dir: str, lower_case: bool = True,
               block_seq_length: int = 288, drop_list_pages: bool = True, num_shards: int = 0,
               pipeline_args: Optional[Sequence[str]] = None) -> Dict:
  """Runs the blocks pipeline and writes ``output_dir`` atomically; returns the manifest."""
  load_vocab(vocab_file)  # Fails early, naming the file, if the vocab is missing or unusable.
  resolve_input(input_spec)  # Fails early on a missing input.
  with beam_utils.atomic_output_dir(output_dir) as tmp:
    beam_utils.run_pipeline(
        lambda p: build_blocks_pipeline(p, input_spec, vocab_file, tmp, lower_case,
                                        block_seq_length, drop_list_pages, num_shards),
        pipeline_args, "blocks")
    stats = beam_utils.pop_stats(tmp)
    counts = stats["counts"]
    num_blocks = stats["blocks"]["num_blocks"]
    if num_blocks == 0:
      raise CorpusInputError(f"no blocks from {input_spec}: every record was dropped or skipped "
                             f"({counts}); nothing written to {output_dir}")
    shards = beam_utils.fill_missing_shards(tmp, manifests.BLOCKS_PREFIX, manifests.TFRECORD_SUFFIX)
    manifest = {
        "num_blocks": num_blocks,
        "num_documents": counts.get("articles_kept", 0) - counts.get("drop:duplicate_article", 0),
        "vocab_file": os.path.abspath(vocab_file) if "://" not in vocab_file else vocab_file,
        "vocab_sha1": manifests.file_sha1(vocab_file),
        "lower_case": lower_case,
        "block_seq_length": block_seq_length,
        "fingerprint": stats["blocks"]["fingerprint"],
        "num_shards": len(shards),
        "source": input_spec,
        "drop_list_pages": drop_list_pages,
        "block_order": "title, sha1(article text), position in article",
        "counts": counts,
    }
    beam_utils.write_json(os.path.join(tmp, manifests.MANIFEST), manifest)
  skipped = {k: v for k, v in counts.items() if k.startswith(("skip:", "drop:"))}
  logging.info("blocks: %d blocks from %d articles -> %s (dropped/skipped: %s)", num_blocks,
               manifest["num_documents"], output_dir, skipped)
  return manifest


def define_list_pages_flag() -> None:
  """``--[no]keep_list_pages`` (also ``data_prep.pipeline``'s)."""
  flags.DEFINE_bool("keep_list_pages", False,
                    "Keep list/index/outline/disambiguation pages (ORQA drops them).")


def define_flags() -> None:
  """The command line's flags (see :mod:`data_prep.cli`)."""
  flags.DEFINE_string("input", None, "XML dump(s), JSON lines file(s) (comma list or glob) or "
                      "tfds:NAME[:SPLIT].")
  flags.DEFINE_string("output_dir", None, "The blocks directory to write.")
  cli.define_vocab_flags()
  flags.DEFINE_integer("block_seq_length", features.BLOCK_SEQ_LENGTH,
                       "Wordpieces per block, [CLS] title [SEP] body [SEP] included.")
  define_list_pages_flag()
  cli.define_num_shards()
  flags.mark_flags_as_required(["input", "output_dir"])
  flags.adopt_module_key_flags(cli)  # The shared flags show in --help too.


def main(argv):
  f = flags.FLAGS
  manifest = run_blocks(f.input, f.vocab_file, f.output_dir, f.lower_case, f.block_seq_length,
                        not f.keep_list_pages, f.num_shards, pipeline_args=argv[1:])
  print(json.dumps({k: manifest[k] for k in ("num_blocks", "num_documents", "fingerprint")}))


if __name__ == "__main__":
  cli.run(main, define_flags)
