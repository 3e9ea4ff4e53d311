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

    # Google's released corpus (blocks.tfr + titles.tfr) -> a blocks directory, then the index
    # of a converted ORQA model from its precomputed block embeddings (realm-convert
    # --block_emb_checkpoint wrote <model_dir>/block_emb.npy; it is the default here, since the
    # model has no block tower).
    realm-index import --blocks_tfr=release/blocks.tfr --titles_tfr=release/titles.tfr \
        --vocab_file=converted/orqa/vocab.txt --blocks_dir=data/released_blocks
    realm-index build --model_dir=converted/orqa --blocks_dir=data/released_blocks \
        --index_dir=idx [--embeddings_file=converted/orqa/block_emb.npy]

    # Updates, by uid or title, never by row (retrieval/publication/updates.py): only the new
    # blocks are embedded, with the block tower the index records; a new step-N-uK publishes.
    realm-index upsert --index_dir=idx --input=docs.jsonl      # {"title", "text"} per line
    realm-index upsert --index_dir=idx --new_blocks_dir=more/blocks   # data_prep.blocks' output
    realm-index delete --index_dir=idx --uid=<hex uid> --title="Some title"
    # --model_dir (and --checkpoint) must name the index's own tower; default: what it records.
    # An update cut short by a crash is rolled forward by the next writer; on demand:
    realm-index reconcile --index_dir=idx

    # Index settings as YAML (an IndexConfig: index_type, recall_queries, scann: {...});
    # the flags override it.
    realm-index build ... --index_config=index.yaml --target_recall=0.9
"""

import json
import os

from absl import flags

from realm_tf import checkpoint_convert
from realm_tf import model_dir as model_dir_lib
from realm_tf.binaries import cli
from realm_tf.binaries import index_flags
from realm_tf.data import features
from realm_tf.data import manifests
from realm_tf.data import released
from realm_tf.retrieval import errors
from realm_tf.retrieval.publication import corpus_embedding
from realm_tf.retrieval.publication import publish
from realm_tf.retrieval.publication import refresher
from realm_tf.retrieval.publication import search as search_lib
from realm_tf.retrieval.publication import updates

flags.DEFINE_string("model_dir", None, "A model directory (model_config.yaml, vocab, ckpt-N).")
flags.DEFINE_string("checkpoint", None, "A checkpoint in --model_dir (default: the newest).")
flags.DEFINE_string("blocks_dir", None,
                    "The blocks directory (the blocks pipeline's output; import: written).")
flags.DEFINE_string("index_dir", None, "The index directory (step-<N>/ and LATEST).")
flags.DEFINE_string("embeddings_dir", None,
                    "embed: where shards go; build: merge these shards instead of embedding.")
flags.DEFINE_string("embeddings_file", None,
                    "build: a [num_blocks, projection_size] .npy of block embeddings to index "
                    "instead of embedding (default: <model_dir>/"
                    f"{checkpoint_convert.BLOCK_EMB_NAME} for a model without a block tower).")
flags.DEFINE_integer("shard_index", 0, "embed: which shard of the corpus.")
flags.DEFINE_integer("num_shards", 0, "embed: into how many shards the corpus is split (0: 1); "
                     "import: output shards (0: one per "
                     f"{released.BLOCKS_PER_SHARD:,} blocks).")
flags.DEFINE_string("blocks_tfr", None, "import: the released blocks.tfr (block texts).")
flags.DEFINE_string("titles_tfr", None, "import: the released titles.tfr (their titles).")
flags.DEFINE_string("vocab_file", None, "import: the WordPiece vocabulary of the model.")
flags.DEFINE_bool("lower_case", True, "import: whether the vocabulary is uncased.")
flags.DEFINE_integer("block_seq_length", features.BLOCK_SEQ_LENGTH,
                     "import: wordpieces per block, [CLS] title [SEP] body [SEP] included.")
flags.DEFINE_integer("limit", 0, "import: only the first N blocks (0: all).")
flags.register_validator("num_shards", lambda v: v >= 0, message="--num_shards must be >= 0")
flags.register_validator("limit", lambda v: v >= 0, message="--limit must be >= 0")
flags.register_validator("block_seq_length", lambda v: v >= 3,
                         message="--block_seq_length must be at least 3")
flags.DEFINE_string("input", None,
                    "upsert: a JSON-lines file of {\"title\", \"text\"} documents.")
flags.DEFINE_string("new_blocks_dir", None, "upsert: a blocks directory (data_prep.blocks) of "
                    "documents to add or replace.")
flags.DEFINE_multi_string("uid", [], "delete: the uid of a block to delete (repeatable).")
flags.DEFINE_multi_string("title", [], "delete: a title whose blocks to delete (repeatable).")
flags.DEFINE_integer("keep", 3, "build, upsert, delete: indexes to keep in --index_dir.")
flags.DEFINE_multi_string("query", None, "search: query text (repeatable).")
flags.DEFINE_integer("k", 5, "search: results per query.")
flags.DEFINE_integer("snippet_chars", 160, "search: characters of block text to show.")
index_flags.define_build_flags()

FLAGS = flags.FLAGS


def _require(values: flags.FlagValues, *names):
  missing = [n for n in names if not getattr(values, n)]
  if missing:
    raise errors.RetrievalError(f"missing flags: {', '.join('--' + n for n in missing)}")


def _default_embeddings_file(model_dir: str, checkpoint: str):
  """``<model_dir>/block_emb.npy`` when it exists and the model has no block tower, else None."""
  path = os.path.join(model_dir, checkpoint_convert.BLOCK_EMB_NAME)
  if not os.path.exists(path):
    return None
  if refresher.has_block_tower(model_dir_lib.load_config(model_dir), checkpoint):
    return None
  print(f"[realm-index] the model has no block tower: indexing {path}", flush=True)
  return path


def build():
  _require(FLAGS, "model_dir", "blocks_dir", "index_dir")
  if FLAGS.embeddings_dir and FLAGS.embeddings_file:
    raise errors.RetrievalError("give --embeddings_dir or --embeddings_file, not both")
  checkpoint = refresher.find_checkpoint(FLAGS.model_dir, FLAGS.checkpoint)
  embeddings, embeddings_file = None, FLAGS.embeddings_file
  if FLAGS.embeddings_dir:
    manifest = manifests.load_blocks_manifest(FLAGS.blocks_dir)
    embeddings = corpus_embedding.merge_embedding_shards(FLAGS.embeddings_dir,
                                                         int(manifest["num_blocks"]))
  elif not embeddings_file:
    embeddings_file = _default_embeddings_file(FLAGS.model_dir, checkpoint)
  path = refresher.build_index_for_checkpoint(
      checkpoint, FLAGS.model_dir, FLAGS.blocks_dir, FLAGS.index_dir,
      options=index_flags.build_options_from_flags(FLAGS, keep=FLAGS.keep), embeddings=embeddings,
      embeddings_file=embeddings_file)
  print(path)


def embed():
  _require(FLAGS, "model_dir", "blocks_dir", "embeddings_dir")
  print(refresher.embed_shard_for_checkpoint(
      FLAGS.checkpoint, FLAGS.model_dir, FLAGS.blocks_dir, FLAGS.embeddings_dir,
      FLAGS.shard_index, FLAGS.num_shards or 1, batch_size=FLAGS.batch_size,
      progress=FLAGS.progress))


def import_blocks():
  _require(FLAGS, "blocks_tfr", "titles_tfr", "vocab_file", "blocks_dir")
  manifest = released.import_released_blocks(
      FLAGS.blocks_tfr, FLAGS.titles_tfr, FLAGS.vocab_file, FLAGS.blocks_dir,
      lower_case=FLAGS.lower_case, block_seq_length=FLAGS.block_seq_length,
      num_shards=FLAGS.num_shards or None, progress=FLAGS.progress, limit=FLAGS.limit or None)
  shards = manifest["num_shards"]
  print(f"wrote {manifest['num_blocks']} blocks in {shards} shard{'s' * (shards != 1)} to "
        f"{FLAGS.blocks_dir} (fingerprint {manifest['fingerprint']})")


def _snippet(text: str, chars: int) -> str:
  text = " ".join(text.split())
  return text[:chars] + "..." if len(text) > chars else text


def search():
  _require(FLAGS, "index_dir", "model_dir", "blocks_dir", "query")
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
      print(f"      {_snippet(hit.body, FLAGS.snippet_chars)}")


def _updater(values: flags.FlagValues) -> updates.Updater:
  _require(values, "index_dir")
  return updates.Updater(values.index_dir, values.model_dir, values.checkpoint, keep=values.keep,
                         progress=values.progress)


def upsert():
  if bool(FLAGS.input) == bool(FLAGS.new_blocks_dir):
    raise errors.RetrievalError("upsert: give --input (JSON lines) or --new_blocks_dir")
  if FLAGS.input:
    result = _updater(FLAGS).upsert(documents=updates.read_documents(FLAGS.input))
  else:
    result = _updater(FLAGS).upsert(blocks_dir=FLAGS.new_blocks_dir)
  print(json.dumps(result.to_json(), ensure_ascii=False))


def delete():
  print(json.dumps(_updater(FLAGS).delete(uids=FLAGS.uid, titles=FLAGS.title).to_json(),
                   ensure_ascii=False))


def reconcile():
  """Rolls the published index forward to its corpus if an update was cut short."""
  result = _updater(FLAGS).reconcile()
  print(json.dumps(result or {"index": publish.read_latest(FLAGS.index_dir),
                              "up_to_date": True}))


# The subcommands' handlers: each reads the flags it needs (tests/test_flag_reads.py).
SUBCOMMANDS = {"build": build, "delete": delete, "embed": embed, "import": import_blocks,
               "reconcile": reconcile, "search": search, "upsert": upsert}


def main(argv):
  if len(argv) != 2 or argv[1] not in SUBCOMMANDS:
    raise errors.RetrievalError(f"usage: realm-index {{{'|'.join(sorted(SUBCOMMANDS))}}} "
                                f"--flags... (got {' '.join(argv[1:])!r})")
  SUBCOMMANDS[argv[1]]()


def run():
  cli.run_main(main)


if __name__ == "__main__":
  run()
