"""Blocks -> Inverse Cloze Task examples (ORQA's retriever warm start).

For every sentence of every block with at least two sentences: the sentence is the pseudo-query
(``[CLS] sentence [SEP]``, ``query_seq_length`` 96) and its block is the positive
(``[CLS] title [SEP] body [SEP]``, ``block_seq_length`` 288), with the sentence cut out of the body
with probability ``--remove_prob`` (0.9, as in ORQA), decided by a seeded RNG per (block uid,
sentence index). One-sentence blocks give no example (``skip:single_sentence_block``): the
query would be the whole block. The eval split holds out whole blocks by the same hash rule as
the pre-training examples. Features: ``realm_tf.data.contract.ict_features``.

Command line (other flags are Beam pipeline options, e.g. ``--runner=DataflowRunner``)::

  python -m data_prep.ict_examples --blocks_dir /data/blocks --vocab_file vocab.txt \\
      --output_dir /data/ict
"""

import json
import logging
import os
import random
from typing import Dict, List, Optional, Sequence

from absl import flags
import apache_beam as beam
import tensorflow as tf

from data_prep import beam_utils
from data_prep import cli
from data_prep import pretrain_examples
from data_prep import text as text_lib
from realm_tf.data import contract


def ict_pairs(block: Dict, sentences, remove_prob: float, seed: int) -> List[Dict]:
  """One block + its sentence spans -> ``[{"query", "body", "sentence_removed", "index"}]``."""
  body = block["body"]
  if len(sentences) < 2:
    return []
  out = []
  for index, (s, e) in enumerate(sentences):
    rng = random.Random(f"{seed}:ict:{block['uid']}:{index}")
    removed = rng.random() < remove_prob
    new_body = (body[:s].rstrip() + " " + body[e:].lstrip()).strip() if removed else body
    out.append({"query": body[s:e], "body": new_body, "sentence_removed": int(removed),
                "index": index})
  return out


class BuildIctFn(beam.DoFn):
  """A batch of serialized blocks -> ``(split, (key, serialized ICT example))``."""

  def __init__(self, vocab_file, lower_case, query_seq_length, block_seq_length, remove_prob,
               seed, eval_fraction):
    self._cfg = (vocab_file, lower_case)
    self._qlen, self._blen = query_seq_length, block_seq_length
    self._remove_prob, self._seed, self._eval_fraction = remove_prob, seed, eval_fraction

  def setup(self):
    from realm_tf.tokenization import RealmTokenizer
    self._tok = RealmTokenizer(*self._cfg)
    self._progress = beam_utils.ProgressLogger("ICT blocks", every=5000)

  def process(self, batch):
    blocks = [contract.parse_block(s) for s in batch]
    spans = text_lib.batch_sentence_spans([b["body"] for b in blocks])
    rows = []
    for block, sents in zip(blocks, spans):
      pairs = ict_pairs(block, sents, self._remove_prob, self._seed)
      if not pairs:
        yield beam_utils.count_event("skip:single_sentence_block")
      rows.extend((block, p) for p in pairs)
    self._progress.add(len(blocks))
    if not rows:
      return
    q = self._tok.query_inputs([p["query"] for _, p in rows], self._qlen)
    b = self._tok.block_inputs([bl["title"] for bl, _ in rows], [p["body"] for _, p in rows],
                               self._blen)
    q = {k: v.numpy() for k, v in q.items()}
    b = {k: v.numpy() for k, v in b.items()}
    for i, (block, pair) in enumerate(rows):
      split = pretrain_examples.split_of(block["uid"], self._eval_fraction)
      feats = {
          "query_ids": q["input_word_ids"][i], "query_mask": q["input_mask"][i],
          "block_ids": b["input_word_ids"][i], "block_mask": b["input_mask"][i],
          "block_type_ids": b["input_type_ids"][i], "block_id": [block["block_id"]],
          "sentence_removed": [pair["sentence_removed"]],
      }
      ex = tf.train.Example(features=tf.train.Features(feature={
          k: tf.train.Feature(int64_list=tf.train.Int64List(value=[int(x) for x in v]))
          for k, v in feats.items()}))
      yield beam_utils.count_event(f"examples:{split}")
      yield beam_utils.count_event("sentence_removed", pair["sentence_removed"])
      yield beam.pvalue.TaggedOutput(
          split, ((block["block_id"], pair["index"]), ex.SerializeToString()))


def run_ict_examples(blocks_dir: str, vocab_file: str, output_dir: str, lower_case: bool = True,
                     query_seq_length: int = 96, block_seq_length: int = 288,
                     remove_prob: float = 0.9, eval_fraction: float = 0.02, seed: int = 0,
                     num_shards: int = 0, pipeline_args: Optional[Sequence[str]] = None) -> Dict:
  """Runs the ICT pipeline; writes ``output_dir`` atomically; returns the manifest."""
  from realm_tf.tokenization import load_vocab
  load_vocab(vocab_file)
  blocks_manifest = contract.load_blocks_manifest(blocks_dir)
  files = contract.block_shard_files(blocks_dir, blocks_manifest)
  with beam_utils.atomic_output_dir(output_dir) as tmp:
    def build(p):
      out = (p | "ReadBlocks" >> beam_utils.ReadTFRecordFiles(files)
             | "Batch" >> beam.BatchElements(min_batch_size=16, max_batch_size=128)
             | "ICT" >> beam.ParDo(BuildIctFn(
                 vocab_file, lower_case, query_seq_length, block_seq_length, remove_prob, seed,
                 eval_fraction)).with_outputs(
                     beam_utils.STATS_TAG, contract.TRAIN_SPLIT, contract.EVAL_SPLIT))
      for split in (contract.TRAIN_SPLIT, contract.EVAL_SPLIT):
        _ = out[split] | f"Write_{split}" >> beam_utils.WriteTFRecordShards(
            os.path.join(tmp, split), contract.TFRECORD_SUFFIX, num_shards)
      _ = (out[beam_utils.STATS_TAG],) | "Stats" >> beam_utils.CollectStats(tmp)
    beam_utils.run_pipeline(build, pipeline_args, "ict_examples")
    counts = beam_utils.pop_stats(tmp)["counts"]
    for split in (contract.TRAIN_SPLIT, contract.EVAL_SPLIT):
      beam_utils.fill_missing_shards(tmp, split, contract.TFRECORD_SUFFIX)
    manifest = {
        "kind": "ict",
        "num_train": counts.get(f"examples:{contract.TRAIN_SPLIT}", 0),
        "num_eval": counts.get(f"examples:{contract.EVAL_SPLIT}", 0),
        "num_sentence_removed": counts.get("sentence_removed", 0),
        "remove_prob": remove_prob,
        "eval_fraction": eval_fraction,
        "eval_rule": "hash_fraction(block_uid, salt='eval:') < eval_fraction",
        "query_seq_length": query_seq_length,
        "block_seq_length": block_seq_length,
        "seed": seed,
        "vocab_file": vocab_file,
        "lower_case": lower_case,
        "blocks_fingerprint": blocks_manifest["fingerprint"],
        "blocks_dir": blocks_dir,
        "counts": counts,
    }
    if manifest["num_train"] == 0:
      raise contract.DataError(f"no ICT examples from {blocks_dir} ({counts}); nothing written")
    beam_utils.write_json(os.path.join(tmp, contract.MANIFEST), manifest)
  logging.info("ICT examples: %d train, %d eval -> %s", manifest["num_train"],
               manifest["num_eval"], output_dir)
  return manifest


def define_flags() -> None:
  """The command line's flags (see :mod:`data_prep.cli`)."""
  flags.DEFINE_string("blocks_dir", None, "The blocks directory.")
  flags.DEFINE_string("output_dir", None, "The ICT examples directory to write.")
  cli.define_vocab_flags()
  flags.DEFINE_integer("block_seq_length", contract.BLOCK_SEQ_LENGTH, "Wordpieces per block.")
  flags.DEFINE_float("remove_prob", 0.9,
                     "Probability that the query sentence is cut out of its block.")
  cli.define_example_flags()
  flags.mark_flags_as_required(["blocks_dir", "output_dir"])
  flags.adopt_module_key_flags(cli)  # The shared flags show in --help too.


def main(argv):
  f = flags.FLAGS
  m = run_ict_examples(f.blocks_dir, f.vocab_file, f.output_dir, f.lower_case,
                       f.query_seq_length, f.block_seq_length, f.remove_prob, f.eval_fraction,
                       f.seed, f.num_shards, pipeline_args=argv[1:])
  print(json.dumps({k: m[k] for k in ("num_train", "num_eval", "num_sentence_removed")}))


if __name__ == "__main__":
  cli.run(main, define_flags)
