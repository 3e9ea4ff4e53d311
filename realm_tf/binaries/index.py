r"""realm-index: build a MIPS index over a corpus once, and search it from the command line.

    # One step: embed the corpus with the newest checkpoint's block tower, build, publish.
    realm-index build --model_dir=runs/pretrain --blocks_dir=data/blocks --index_dir=idx

    # Large corpora: embed in N workers (any tf.distribute strategy each), then merge + build.
    realm-index embed --model_dir=... --blocks_dir=... --embeddings_dir=emb \
        --shard_index=0 --num_shards=4            # ... one per shard, in parallel
    realm-index build --model_dir=... --blocks_dir=... --index_dir=idx --embeddings_dir=emb

    # Search: query text in, top-k block titles, scores and text out.
    realm-index search --index_dir=idx --model_dir=runs/pretrain --blocks_dir=data/blocks \
        --query="who wrote hamlet?" --k=5
"""

from absl import flags
import tensorflow as tf

from realm_tf import model_dir as model_dir_lib
from realm_tf import modeling
from realm_tf import tokenization
from realm_tf.binaries import cli
from realm_tf.retrieval import blocks as blocks_lib
from realm_tf.retrieval import cli_flags
from realm_tf.retrieval import corpus
from realm_tf.retrieval import errors
from realm_tf.retrieval import handle as handle_lib
from realm_tf.retrieval import refresher

flags.DEFINE_string("model_dir", None, "A model directory (model_config.yaml, vocab, ckpt-N).")
flags.DEFINE_string("checkpoint", None, "A checkpoint in --model_dir (default: the newest).")
flags.DEFINE_string("blocks_dir", None, "The blocks directory (data_prep output).")
flags.DEFINE_string("index_dir", None, "The index directory (step-<N>/ and LATEST).")
flags.DEFINE_string("embeddings_dir", None,
                    "embed: where shards go; build: merge these shards instead of embedding.")
flags.DEFINE_integer("shard_index", 0, "embed: which shard of the corpus.")
flags.DEFINE_integer("num_shards", 1, "embed: into how many shards the corpus is split.")
flags.DEFINE_integer("keep", 3, "build: indexes to keep in --index_dir.")
flags.DEFINE_multi_string("query", None, "search: query text (repeatable).")
flags.DEFINE_integer("k", 5, "search: results per query.")
flags.DEFINE_integer("snippet_chars", 160, "search: characters of block text to show.")
cli_flags.define_build_flags()

FLAGS = flags.FLAGS
COMMANDS = ("build", "embed", "search")


def _require(*names):
  missing = [n for n in names if not getattr(FLAGS, n)]
  if missing:
    raise errors.RetrievalError(f"missing flags: {', '.join('--' + n for n in missing)}")


def _checkpoint():
  if FLAGS.checkpoint:
    if not tf.io.gfile.exists(FLAGS.checkpoint + ".index"):
      raise errors.CheckpointNotFoundError(f"checkpoint not found: {FLAGS.checkpoint}")
    return FLAGS.checkpoint
  if not tf.io.gfile.isdir(FLAGS.model_dir):
    raise errors.CheckpointNotFoundError(f"model directory not found: {FLAGS.model_dir}")
  path = tf.train.latest_checkpoint(FLAGS.model_dir)
  if path is None:
    raise errors.CheckpointNotFoundError(f"no checkpoint in {FLAGS.model_dir}")
  return path


def build():
  _require("model_dir", "blocks_dir", "index_dir")
  checkpoint = _checkpoint()
  embeddings = None
  if FLAGS.embeddings_dir:
    manifest = blocks_lib.load_manifest(FLAGS.blocks_dir)
    embeddings = corpus.merge_embedding_shards(FLAGS.embeddings_dir, int(manifest["num_blocks"]))
  path = refresher.build_index_for_checkpoint(
      checkpoint, FLAGS.model_dir, FLAGS.blocks_dir, FLAGS.index_dir,
      options=cli_flags.build_options_from_flags(keep=FLAGS.keep), embeddings=embeddings)
  print(path)


def embed():
  _require("model_dir", "blocks_dir", "embeddings_dir")
  checkpoint = _checkpoint()
  config = model_dir_lib.load_config(FLAGS.model_dir)
  strategy = tf.distribute.get_strategy()
  with strategy.scope():
    _, block_embedder = modeling.build_embedders(config.retriever)
  model_dir_lib.restore(checkpoint, block_embedder=block_embedder)
  ids, emb = corpus.embed_corpus(
      block_embedder, FLAGS.blocks_dir, config.retriever.block_seq_length, config.vocab_file,
      config.lower_case, batch_size=FLAGS.batch_size, shard_index=FLAGS.shard_index,
      num_shards=FLAGS.num_shards, strategy=strategy, progress=FLAGS.progress)
  print(corpus.save_embedding_shard(FLAGS.embeddings_dir, ids, emb, FLAGS.shard_index,
                                    FLAGS.num_shards))


def search():
  _require("index_dir", "model_dir", "blocks_dir", "query")
  config = model_dir_lib.load_config(FLAGS.model_dir)
  blocks_manifest = blocks_lib.load_manifest(FLAGS.blocks_dir)
  handle = handle_lib.IndexHandle(FLAGS.index_dir,
                                  expected_fingerprint=blocks_manifest["fingerprint"],
                                  expected_dim=config.retriever.projection_size,
                                  wait_seconds=0, watch=False)
  handle.wait_for_first()
  query_embedder, _ = modeling.build_embedders(config.retriever)
  # The query tower the index was built with, else the model directory's checkpoint.
  checkpoint = handle.query_embedder_checkpoint or _checkpoint()
  model_dir_lib.restore(checkpoint, query_embedder=query_embedder)
  tokenizer = tokenization.RealmTokenizer(config.vocab_file, lower_case=config.lower_case)
  queries = list(FLAGS.query)
  inputs = tokenizer.query_inputs(queries, config.retriever.query_seq_length)
  emb = query_embedder(inputs, training=False).numpy()
  k = min(FLAGS.k, handle.index.num_blocks)
  ids, scores = handle.search(emb, k)
  texts = blocks_lib.read_blocks(FLAGS.blocks_dir, set(ids.ravel().tolist()))
  print(f"index {handle.path} (model step {handle.step}, {handle.index.num_blocks} blocks)")
  for query, row_ids, row_scores in zip(queries, ids, scores):
    print(f"\nquery: {query}")
    for rank, (block_id, score) in enumerate(zip(row_ids, row_scores), 1):
      block = texts.get(int(block_id), {"title": "?", "body": ""})
      body = " ".join(block["body"].split())
      if len(body) > FLAGS.snippet_chars:
        body = body[:FLAGS.snippet_chars] + "..."
      print(f"  {rank:2d}. [{score:8.3f}] {block['title']}  (block {block_id})")
      print(f"      {body}")
  handle.close()


def main(argv):
  if len(argv) != 2 or argv[1] not in COMMANDS:
    raise errors.RetrievalError(
        f"usage: realm-index {{{'|'.join(COMMANDS)}}} --flags... (got {' '.join(argv[1:])!r})")
  {"build": build, "embed": embed, "search": search}[argv[1]]()


def run():
  cli.run_main(main, extra_errors=(errors.RetrievalError, errors.IndexNotReadyError))


if __name__ == "__main__":
  run()
