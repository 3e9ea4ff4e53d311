r"""realm-export: a model directory's towers out as Hugging Face BERT and sentence-transformers
folders (``realm_tf/export.py``), with the block embeddings of a published index.

  realm-export --model_dir=demo_out/realm --output_dir=exported/realm
  realm-export --model_dir=demo_out/openqa_realm --output_dir=exported/openqa \
    --index_dir=demo_out/index                 # + block_embeddings/ (embeddings.npy, blocks.jsonl)

Then, without realm_tf::

  from sentence_transformers import SentenceTransformer
  q = SentenceTransformer("exported/realm/query_tower").encode(["who wrote hamlet?"])
  from transformers import BertForMaskedLM
  reader = BertForMaskedLM.from_pretrained("exported/realm/reader")
"""

from absl import flags

from realm_tf import export
from realm_tf.binaries import cli

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "The model directory (REALM pre-training, ICT, Open-QA "
                    "or realm-convert's output) whose newest checkpoint is exported.")
flags.DEFINE_string("checkpoint", None, "A checkpoint prefix in --model_dir instead of its "
                    "newest.")
flags.DEFINE_string("output_dir", None, "The folder to write (query_tower/, block_tower/, "
                    "reader/, EXPORT.json).")
flags.DEFINE_string("index_dir", None, "A published index (realm-index, the refresher) whose "
                    "LATEST block embeddings go to block_embeddings/, with their ids and titles.")
flags.DEFINE_string("blocks_dir", None, "With --index_dir: the blocks directory it indexes (by "
                    "default the one its manifest names).")
flags.DEFINE_list("parts", [], "Which of query_tower, block_tower, reader to write (default: "
                  "every one the checkpoint holds).")
flags.DEFINE_bool("overwrite", False, "Replace --output_dir when it exists.")
flags.mark_flags_as_required(["model_dir", "output_dir"])


def main(argv):
  del argv
  manifest = export.export(FLAGS.model_dir, FLAGS.output_dir, overwrite=FLAGS.overwrite,
                           checkpoint=FLAGS.checkpoint, index_dir=FLAGS.index_dir,
                           blocks_dir=FLAGS.blocks_dir, parts=FLAGS.parts)
  for name, what in manifest["written"].items():
    print(f"wrote {FLAGS.output_dir}/{name}: {what}")


def run():
  cli.run_main(main)


if __name__ == "__main__":
  run()
