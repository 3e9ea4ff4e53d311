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

from realm_tf.binaries import cli
from realm_tf.data import contract
from realm_tf.retrieval import cli_flags
from realm_tf.retrieval import corpus_embedding
from realm_tf.retrieval import errors
from realm_tf.retrieval import refresher
from realm_tf.retrieval import search as search_lib

flags.DEFINE_string("model_dir", None, "A model directory (model_config.yaml, vocab, ckpt-N).")
flags.DEFINE_string("checkpoint", None, "A checkpoint in --model_dir (default: the newest).")
flags.DEFINE_string("blocks_dir", None, "The blocks directory (the blocks pipeline's output).")
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


def build():
  _require("model_dir", "blocks_dir", "index_dir")
  checkpoint = refresher.find_checkpoint(FLAGS.model_dir, FLAGS.checkpoint)
  embeddings = None
  if FLAGS.embeddings_dir:
    manifest = contract.load_blocks_manifest(FLAGS.blocks_dir)
    embeddings = corpus_embedding.merge_embedding_shards(FLAGS.embeddings_dir,
                                                         int(manifest["num_blocks"]))
  path = refresher.build_index_for_checkpoint(
      checkpoint, FLAGS.model_dir, FLAGS.blocks_dir, FLAGS.index_dir,
      options=cli_flags.build_options_from_flags(keep=FLAGS.keep), embeddings=embeddings)
  print(path)


def embed():
  _require("model_dir", "blocks_dir", "embeddings_dir")
  print(refresher.embed_shard_for_checkpoint(
      FLAGS.checkpoint, FLAGS.model_dir, FLAGS.blocks_dir, FLAGS.embeddings_dir,
      FLAGS.shard_index, FLAGS.num_shards, batch_size=FLAGS.batch_size, progress=FLAGS.progress))


def _snippet(text: str) -> str:
  text = " ".join(text.split())
  return text[:FLAGS.snippet_chars] + "..." if len(text) > FLAGS.snippet_chars else text


def search():
  _require("index_dir", "model_dir", "blocks_dir", "query")
  with search_lib.TextSearcher(FLAGS.index_dir, FLAGS.model_dir, FLAGS.blocks_dir,
                               FLAGS.checkpoint) as searcher:
    queries = list(FLAGS.query)
    results = searcher.search_text(queries, FLAGS.k)
    handle = searcher.handle
    print(f"index {handle.path} (model step {handle.step}, {handle.index.num_blocks} blocks)")
  for query, hits in zip(queries, results):
    print(f"\nquery: {query}")
    for rank, hit in enumerate(hits, 1):
      print(f"  {rank:2d}. [{hit.score:8.3f}] {hit.title}  (block {hit.block_id})")
      print(f"      {_snippet(hit.body)}")


def main(argv):
  if len(argv) != 2 or argv[1] not in COMMANDS:
    raise errors.RetrievalError(
        f"usage: realm-index {{{'|'.join(COMMANDS)}}} --flags... (got {' '.join(argv[1:])!r})")
  {"build": build, "embed": embed, "search": search}[argv[1]]()


def run():
  cli.run_main(main, extra_errors=(errors.RetrievalError, errors.IndexNotReadyError))


if __name__ == "__main__":
  run()
