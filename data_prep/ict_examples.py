"""Blocks -> Inverse Cloze Task records (ORQA's retriever warm start), one per block.

ORQA draws its ICT pairs when it reads a block: one random sentence is the pseudo-query
(``[CLS] sentence [SEP]``) and the block the positive, with the sentence cut out of it with
probability 0.9, a fresh coin at every read. So this pipeline writes, for every block with at
least two sentences, the material of those draws: ``block_id``, the title's wordpieces and the
body's sentences as wordpiece lists (:func:`realm_tf.data.features.serialize_ict_block`); the
ICT loader (``realm_tf.data.loaders.IctLoader``) samples the pairs, at the model's query and
block lengths (``features.sample_ict_examples``). One-sentence blocks give no record
(``skip:single_sentence_block``): the query would be the whole block. The eval split holds out
whole blocks by the same hash rule as the pre-training examples.

Sentences are tokenized one by one. Their concatenation equals the body's wordpieces as the
blocks pipeline tokenizes it whenever consecutive sentences are separated by whitespace or
punctuation (BERT's basic tokenizer splits there); blocks where it does not are counted
(``sentence_tokens_differ``). Sentences without wordpieces are dropped, and so are those that
start past the end of a ``--block_seq_length`` block (``skip:sentence_past_block``): they could
never show in their block.

The manifest has ``"sampling"`` (``manifests.ICT_SAMPLING``), ``num_train``/``num_eval``
(blocks), ``num_sentences``, ``remove_prob`` (``--remove_prob``: the loader's default), and the
vocabulary's ``cls_id``/``sep_id``, which the loader packs with.

Command line (other flags are Beam pipeline options, e.g. ``--runner=DataflowRunner``)::

  python -m data_prep.ict_examples --blocks_dir /data/blocks --vocab_file vocab.txt \\
      --output_dir /data/ict
"""

import json
import logging
import os
from typing import Dict, List, Optional, Sequence, Tuple

from absl import flags
import apache_beam as beam

from data_prep import beam_utils
from data_prep import cli
from data_prep import pretrain_examples
from data_prep import text as text_lib
from realm_tf.data import features
from realm_tf.data import manifests
from realm_tf.tokenization import RealmTokenizer, load_vocab


def block_sentences(title_ids: Sequence[int], sentence_ids: Sequence[Sequence[int]],
                    block_seq_length: int) -> Tuple[List[List[int]], int]:
  """The sentences an ICT record keeps: non-empty, starting inside the block.

  A sentence is kept when it has wordpieces and starts before the block's last position in
  ``[CLS] title [SEP] body [SEP]`` at ``block_seq_length``. Returns ``(kept, number of non-empty
  sentences dropped)``.
  """
  position = 2 + min(len(title_ids), block_seq_length - 3)  # Where the body starts.
  kept, dropped = [], 0
  for ids in sentence_ids:
    if not ids:
      continue
    if position >= block_seq_length - 1:
      dropped += 1
      continue
    kept.append(list(ids))
    position += len(ids)
  return kept, dropped


class BuildIctFn(beam.DoFn):
  """A batch of serialized blocks -> ``(split, (block_id, serialized ICT record))``."""

  def __init__(self, vocab_file, lower_case, block_seq_length, eval_fraction):
    self._cfg = (vocab_file, lower_case)
    self._blen, self._eval_fraction = block_seq_length, eval_fraction

  def setup(self):
    self._tok = RealmTokenizer(*self._cfg)
    self._progress = beam_utils.ProgressLogger("ICT blocks", every=5000)

  def process(self, batch):
    blocks = [features.parse_block(s) for s in batch]
    spans = text_lib.batch_sentence_spans([b["body"] for b in blocks])
    texts = [b["body"][s:e] for b, sents in zip(blocks, spans) for s, e in sents]
    flat = self._tok.tokenize(texts).to_list() if texts else []
    titles = self._tok.tokenize([b["title"] for b in blocks]).to_list()
    bodies = self._tok.tokenize([b["body"] for b in blocks]).to_list()
    self._progress.add(len(blocks))
    start = 0
    for block, sents, title_ids, body_ids in zip(blocks, spans, titles, bodies):
      sentence_ids, start = flat[start:start + len(sents)], start + len(sents)
      if [i for ids in sentence_ids for i in ids] != body_ids:
        yield beam_utils.count_event("sentence_tokens_differ")
      kept, dropped = block_sentences(title_ids, sentence_ids, self._blen)
      if dropped:
        yield beam_utils.count_event("skip:sentence_past_block", dropped)
      if len(kept) < 2:
        yield beam_utils.count_event("skip:single_sentence_block")
        continue
      split = pretrain_examples.split_of(block["uid"], self._eval_fraction)
      yield beam_utils.count_event(f"examples:{split}")
      yield beam_utils.count_event("sentences", len(kept))
      yield beam.pvalue.TaggedOutput(split, (block["block_id"], features.serialize_ict_block(
          block["block_id"], title_ids, kept)))


def run_ict_examples(blocks_dir: str, vocab_file: str, output_dir: str, lower_case: bool = True,
                     query_seq_length: int = 96, block_seq_length: int = 288,
                     remove_prob: float = 0.9, eval_fraction: float = 0.02, seed: int = 0,
                     num_shards: int = 0, pipeline_args: Optional[Sequence[str]] = None) -> Dict:
  """Runs the ICT pipeline; writes ``output_dir`` atomically; returns the manifest.

  ``remove_prob`` is recorded as the loader's default. ``query_seq_length`` and ``seed`` do not
  change the records (the queries are cut and the pairs drawn when read, at the model's length
  with the data config's seed); they stay for ``prepare_all`` and the shared flags.
  """
  del query_seq_length, seed  # Read-time settings (see above).
  vocab = load_vocab(vocab_file)
  blocks_manifest = manifests.load_blocks_manifest(blocks_dir)
  files = manifests.block_shard_files(blocks_dir, blocks_manifest)
  with beam_utils.atomic_output_dir(output_dir) as tmp:
    def build(p):
      out = (p | "ReadBlocks" >> beam_utils.ReadTFRecordFiles(files)
             | "Batch" >> beam.BatchElements(min_batch_size=16, max_batch_size=128)
             | "ICT" >> beam.ParDo(BuildIctFn(
                 vocab_file, lower_case, block_seq_length, eval_fraction)).with_outputs(
                     beam_utils.STATS_TAG, manifests.TRAIN_SPLIT, manifests.EVAL_SPLIT))
      for split in (manifests.TRAIN_SPLIT, manifests.EVAL_SPLIT):
        _ = out[split] | f"Write_{split}" >> beam_utils.WriteTFRecordShards(
            os.path.join(tmp, split), manifests.TFRECORD_SUFFIX, num_shards)
      _ = (out[beam_utils.STATS_TAG],) | "Stats" >> beam_utils.CollectStats(tmp)
    beam_utils.run_pipeline(build, pipeline_args, "ict_examples")
    counts = beam_utils.pop_stats(tmp)["counts"]
    for split in (manifests.TRAIN_SPLIT, manifests.EVAL_SPLIT):
      beam_utils.fill_missing_shards(tmp, split, manifests.TFRECORD_SUFFIX)
    manifest = {
        "kind": "ict",
        "sampling": manifests.ICT_SAMPLING,
        "num_train": counts.get(f"examples:{manifests.TRAIN_SPLIT}", 0),
        "num_eval": counts.get(f"examples:{manifests.EVAL_SPLIT}", 0),
        "num_sentences": counts.get("sentences", 0),
        "remove_prob": remove_prob,
        "cls_id": vocab.index("[CLS]"),
        "sep_id": vocab.index("[SEP]"),
        "eval_fraction": eval_fraction,
        "eval_rule": "hash_fraction(block_uid, salt='eval:') < eval_fraction",
        "block_seq_length": block_seq_length,
        "vocab_file": vocab_file,
        "lower_case": lower_case,
        "blocks_fingerprint": blocks_manifest["fingerprint"],
        "blocks_dir": blocks_dir,
        "counts": counts,
    }
    if manifest["num_train"] == 0:
      raise manifests.DataError(f"no ICT blocks from {blocks_dir} ({counts}); nothing written")
    beam_utils.write_json(os.path.join(tmp, manifests.MANIFEST), manifest)
  logging.info("ICT examples: %d train, %d eval blocks -> %s", manifest["num_train"],
               manifest["num_eval"], output_dir)
  return manifest


def define_flags() -> None:
  """The command line's flags (see :mod:`data_prep.cli`)."""
  flags.DEFINE_string("blocks_dir", None, "The blocks directory.")
  flags.DEFINE_string("output_dir", None, "The ICT examples directory to write.")
  cli.define_vocab_flags()
  flags.DEFINE_integer("block_seq_length", features.BLOCK_SEQ_LENGTH,
                       "Wordpieces per block: sentences starting past it are dropped.")
  flags.DEFINE_float("remove_prob", 0.9,
                     "Probability that the query sentence is cut out of its block: the "
                     "loader's default, recorded in the manifest.")
  cli.define_example_flags()
  flags.mark_flags_as_required(["blocks_dir", "output_dir"])
  flags.adopt_module_key_flags(cli)  # The shared flags show in --help too.


def main(argv):
  f = flags.FLAGS
  m = run_ict_examples(f.blocks_dir, f.vocab_file, f.output_dir, f.lower_case,
                       f.query_seq_length, f.block_seq_length, f.remove_prob, f.eval_fraction,
                       f.seed, f.num_shards, pipeline_args=argv[1:])
  print(json.dumps({k: m[k] for k in ("num_train", "num_eval", "num_sentences")}))


if __name__ == "__main__":
  cli.run(main, define_flags)
