"""All corpus steps in order: blocks -> salient spans -> pre-training examples -> ICT examples.

:func:`prepare_all` is what ``make demo`` calls. Output layout::

  output_dir/blocks/      blocks-*.tfrecord + manifest.json
  output_dir/sentences/   sentences-*.jsonl + manifest.json
  output_dir/pretrain/    train-*.tfrecord, eval-*.tfrecord + manifest.json
  output_dir/ict/         train-*.tfrecord, eval-*.tfrecord + manifest.json

Each step writes its directory atomically. With ``source_corpus`` (``--source_corpus NAME``)
the corpus is documents that REALM does not retrieve from (the paper's X = CC-News over
Z = Wikipedia): their blocks are only the unit the sentences are read from, the masked examples
name no block of the knowledge corpus (``data_prep.pretrain_examples``), and no ICT examples are
written. Command line (other flags are Beam pipeline
options, e.g. ``--runner=DataflowRunner``)::

  python -m data_prep.pipeline --corpus world/articles.jsonl --vocab_file world/vocab.txt \\
      --output_dir /tmp/prepared --patterns_file world/entity_patterns.jsonl
  python -m data_prep.pipeline --corpus world/news.jsonl --source_corpus news ...  # X != Z
"""

import json
import logging
import os
import time
from typing import Dict, Optional, Sequence

from absl import flags

from data_prep import blocks
from data_prep import cli
from data_prep import ict_examples
from data_prep import pretrain_examples
from data_prep import salient_spans


def prepare_all(corpus_jsonl_or_xml: str, vocab_file: str, output_dir: str,
                masking: str = "salient", spacy_model: str = "auto",
                patterns_file: Optional[str] = None, lower_case: bool = True,
                block_seq_length: int = 288, query_seq_length: int = 96, max_masks: int = 10,
                examples_per_sentence: int = 1, eval_fraction: float = 0.02,
                drop_list_pages: bool = True, seed: int = 0,
                pipeline_args: Optional[Sequence[str]] = None,
                source_corpus: Optional[str] = None) -> Dict[str, Dict]:
  """Runs the four corpus pipelines; returns ``{"blocks"|"sentences"|"pretrain"|"ict": manifest}``
  and each manifest's directory under ``"dirs"``. With ``source_corpus`` (a document corpus
  that is not the knowledge corpus), the first three only."""
  steps = ("blocks", "sentences", "pretrain") + (() if source_corpus else ("ict",))
  dirs = {k: os.path.join(output_dir, k) for k in steps}
  start = time.time()
  out = {"dirs": dirs}
  out["blocks"] = blocks.run_blocks(corpus_jsonl_or_xml, vocab_file, dirs["blocks"], lower_case,
                                    block_seq_length, drop_list_pages,
                                    pipeline_args=pipeline_args)
  out["sentences"] = salient_spans.run_annotate(dirs["blocks"], dirs["sentences"], spacy_model,
                                                patterns_file, pipeline_args=pipeline_args)
  out["pretrain"] = pretrain_examples.run_pretrain_examples(
      dirs["sentences"], vocab_file, dirs["pretrain"], masking, lower_case, query_seq_length,
      max_masks, examples_per_sentence, eval_fraction, seed, pipeline_args=pipeline_args,
      source_corpus=source_corpus)
  if source_corpus:
    logging.info("prepare_all: %s documents done in %.1f s -> %s", source_corpus,
                 time.time() - start, output_dir)
    return out
  out["ict"] = ict_examples.run_ict_examples(
      dirs["blocks"], vocab_file, dirs["ict"], lower_case, query_seq_length, block_seq_length,
      eval_fraction=eval_fraction, seed=seed, pipeline_args=pipeline_args)
  logging.info("prepare_all: done in %.1f s -> %s", time.time() - start, output_dir)
  return out


def define_flags() -> None:
  """The command line's flags (see :mod:`data_prep.cli`)."""
  flags.DEFINE_string("corpus", None, "XML dump, JSON lines or tfds:NAME[:SPLIT].")
  flags.DEFINE_string("output_dir", None, "Where blocks/, sentences/, pretrain/, ict/ go.")
  cli.define_vocab_flags()
  blocks.define_list_pages_flag()
  salient_spans.define_annotator_flags()
  pretrain_examples.define_masking_flags()
  pretrain_examples.define_source_corpus_flag()
  cli.define_split_flags()
  flags.mark_flags_as_required(["corpus", "output_dir"])
  for module in (cli, blocks, salient_spans, pretrain_examples):
    flags.adopt_module_key_flags(module)  # Their flags show in --help too.


def main(argv):
  f = flags.FLAGS
  out = prepare_all(f.corpus, f.vocab_file, f.output_dir, f.masking, f.spacy_model,
                    f.patterns_file, f.lower_case, examples_per_sentence=f.examples_per_sentence,
                    eval_fraction=f.eval_fraction, drop_list_pages=not f.keep_list_pages,
                    seed=f.seed, pipeline_args=argv[1:], source_corpus=f.source_corpus)
  print(json.dumps({"blocks": out["blocks"]["num_blocks"],
                    "sentences": out["sentences"]["num_sentences"],
                    "pretrain_train": out["pretrain"]["num_train"],
                    "ict_train": out["ict"]["num_train"] if "ict" in out else 0,
                    "source_corpus": out["pretrain"]["source_corpus"], "dirs": out["dirs"]}))


if __name__ == "__main__":
  cli.run(main, define_flags)
