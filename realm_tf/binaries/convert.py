r"""realm-convert: TF1 BERT / REALM / ORQA checkpoints -> a realm_tf model directory.

Example (the released REALM CC-News retriever and encoder, downloaded beforehand)::

  realm-convert \
    --tf1_checkpoint=cc_news_pretrained/embedder/variables/variables \
    --tf1_checkpoint=cc_news_pretrained/bert/model.ckpt \
    --bert_config=cc_news_pretrained/bert/bert_config.json \
    --vocab_file=cc_news_pretrained/bert/vocab.txt \
    --output_dir=converted/cc_news
"""

from absl import flags

from realm_tf import checkpoint_convert
from realm_tf.binaries import cli

FLAGS = flags.FLAGS
flags.DEFINE_multi_string("tf1_checkpoint", None, "TF1 checkpoint prefix; repeat to merge "
                          "an embedder and an encoder into one model directory.")
flags.DEFINE_string("bert_config", None, "google-research bert_config.json.")
flags.DEFINE_string("vocab_file", None, "WordPiece vocabulary of the checkpoint.")
flags.DEFINE_string("output_dir", None, "Model directory to write.")
flags.DEFINE_bool("lower_case", True, "Whether the vocabulary is uncased.")
flags.DEFINE_string("block_emb_checkpoint", None,
                    "ORQA: checkpoint holding `block_emb`, saved as block_emb.npy.")
flags.mark_flags_as_required(["tf1_checkpoint", "bert_config", "vocab_file", "output_dir"])


def main(argv):
  del argv
  from realm_tf import tokenization
  tokenization.load_vocab(FLAGS.vocab_file)  # fail early on a bad vocab
  path = checkpoint_convert.convert(FLAGS.tf1_checkpoint, FLAGS.bert_config,
                                    FLAGS.vocab_file, FLAGS.output_dir,
                                    lower_case=FLAGS.lower_case,
                                    block_emb_checkpoint=FLAGS.block_emb_checkpoint)
  print(f"wrote {path} (load it with realm_tf.Embedder.load({FLAGS.output_dir!r}))")


def run():
  cli.run_main(main)


if __name__ == "__main__":
  run()
