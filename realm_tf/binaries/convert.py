r"""realm-convert: TF1 BERT / REALM / ORQA or Hugging Face BERT checkpoints -> a model directory.

Example (the released REALM CC-News retriever and encoder, downloaded beforehand)::

  realm-convert \
    --tf1_checkpoint=cc_news_pretrained/embedder/variables/variables \
    --tf1_checkpoint=cc_news_pretrained/bert/model.ckpt \
    --bert_config=cc_news_pretrained/bert/bert_config.json \
    --vocab_file=cc_news_pretrained/bert/vocab.txt \
    --output_dir=converted/cc_news

ORQA (the fine-tuned Open-QA model; its block embeddings come from a checkpoint holding
``block_emb``, written as ``block_emb.npy``), then the released blocks and their index::

  realm-convert --tf1_checkpoint=<orqa_nq_model_from_realm checkpoint prefix> \
    --block_emb_checkpoint=<checkpoint prefix holding block_emb> \
    --bert_config=<its bert_config.json> --vocab_file=<its vocab.txt> \
    --output_dir=converted/orqa_nq
  realm-index import --blocks_tfr=<release>/blocks.tfr --titles_tfr=<release>/titles.tfr \
    --vocab_file=converted/orqa_nq/vocab.txt --blocks_dir=data/released_blocks
  realm-index build --model_dir=converted/orqa_nq --blocks_dir=data/released_blocks \
    --index_dir=converted/orqa_nq/index     # block embeddings: converted/orqa_nq/block_emb.npy

A Hugging Face BERT (a directory with ``config.json`` and ``model.safetensors``, read without
torch; the encoder config and its activation come from ``config.json``), into both the retriever
(projection freshly initialized) and the reader, or only those ``--hf_targets`` names::

  realm-convert --hf_dir=all-MiniLM-L6-v2 --vocab_file=bert-base-uncased-vocab.txt \
    --output_dir=converted/minilm
"""

import os

from absl import app
from absl import flags

from realm_tf import checkpoint_convert
from realm_tf import tokenization
from realm_tf.binaries import cli

FLAGS = flags.FLAGS
flags.DEFINE_multi_string("tf1_checkpoint", None, "TF1 checkpoint prefix; repeat to merge "
                          "an embedder and an encoder into one model directory.")
flags.DEFINE_string("hf_dir", None, "Hugging Face BERT directory (config.json + "
                    "model.safetensors), instead of --tf1_checkpoint.")
flags.DEFINE_list("hf_targets", list(checkpoint_convert.HF_TARGETS),
                  "With --hf_dir: what the BERT fills, retriever (the shared query/block "
                  "embedder; projection freshly initialized) and/or reader.")
flags.DEFINE_string("bert_config", None,
                    "google-research bert_config.json (with --tf1_checkpoint).")
flags.DEFINE_string("vocab_file", None, "WordPiece vocabulary of the checkpoint.")
flags.DEFINE_string("output_dir", None, "Model directory to write.")
flags.DEFINE_bool("lower_case", True, "Whether the vocabulary is uncased.")
flags.DEFINE_string("block_emb_checkpoint", None,
                    "ORQA: checkpoint holding `block_emb` [num_blocks, 128], saved as "
                    f"<output_dir>/{checkpoint_convert.BLOCK_EMB_NAME}.")
flags.mark_flags_as_required(["vocab_file", "output_dir"])
flags.mark_flags_as_mutual_exclusive(["tf1_checkpoint", "hf_dir"], required=True)


def main(argv):
  del argv
  tokenization.load_vocab(FLAGS.vocab_file)  # fail early on a bad vocab
  if FLAGS.hf_dir:
    for name in ("bert_config", "block_emb_checkpoint"):
      if FLAGS[name].value:
        raise app.UsageError(f"--{name} goes with --tf1_checkpoint, not --hf_dir (the config "
                             f"comes from {checkpoint_convert.HF_CONFIG_NAME})")
    path = checkpoint_convert.convert_hf(FLAGS.hf_dir, FLAGS.output_dir, FLAGS.vocab_file,
                                         lower_case=FLAGS.lower_case,
                                         targets=FLAGS.hf_targets)
    if "retriever" in FLAGS.hf_targets:
      print(f"wrote {path} (load it with realm_tf.Embedder.load({FLAGS.output_dir!r}))")
    else:
      print(f"wrote {path} (the reader only)")
    return
  if not FLAGS.bert_config:
    raise app.UsageError("--bert_config is required with --tf1_checkpoint")
  path = checkpoint_convert.convert(FLAGS.tf1_checkpoint, FLAGS.bert_config,
                                    FLAGS.vocab_file, FLAGS.output_dir,
                                    lower_case=FLAGS.lower_case,
                                    block_emb_checkpoint=FLAGS.block_emb_checkpoint)
  print(f"wrote {path} (load it with realm_tf.Embedder.load({FLAGS.output_dir!r}))")
  if FLAGS.block_emb_checkpoint:
    block_emb = os.path.join(FLAGS.output_dir, checkpoint_convert.BLOCK_EMB_NAME)
    print(f"wrote {block_emb} (index it with realm-index build --model_dir={FLAGS.output_dir} "
          "--blocks_dir=<realm-index import output> --index_dir=...)")


def run():
  cli.run_main(main)


if __name__ == "__main__":
  run()
