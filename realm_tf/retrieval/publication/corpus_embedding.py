"""Embedding a blocks corpus with a block tower: ``tf.data`` in, ``[num_blocks, d]`` rows out.

Row ``i`` of the result is the embedding of ``block_id == i``. A large corpus can be embedded
by several workers, each with its own ``shard_index`` of ``num_shards``, writing
``embeddings-shard-<i>-of-<n>.npy`` and ``ids-shard-<i>-of-<n>.npy``; one step then merges the
shards (``merge_embedding_shards``) and builds the index. Each worker may itself run under any
``tf.distribute`` strategy.

Example::

    _, block_embedder = modeling.build_embedders(config.retriever)
    model_dir.restore(ckpt, block_embedder=block_embedder)
    ids, emb = embed_corpus(block_embedder, "blocks/", config.retriever.block_seq_length,
                            config.vocab_file)
    table = assemble_rows(ids, emb, num_blocks=len(ids))  # row i = block i

Every version of the corpus is read (``corpus_updates``): the pipeline's shards, then the
blocks updates appended; ``rows_from`` embeds only the rows an update added (from its first
row on). :func:`tower_fingerprint` names the block tower an index was embedded with.
"""

import glob
import hashlib
import os
import re
import weakref
from typing import Callable, Dict, List, Optional, Tuple

from absl import logging
import numpy as np
import tensorflow as tf
import tqdm

from realm_tf import tokenization
from realm_tf.data import corpus_updates
from realm_tf.data import features
from realm_tf.data import loaders
from realm_tf.data import manifests
from realm_tf.modeling import embedder as embedder_lib
from realm_tf.retrieval import errors

_SHARD_RE = re.compile(r"embeddings-shard-(\d+)-of-(\d+)\.npy$")


def tokens_match(manifest: dict, vocab_file: str, lower_case: bool) -> bool:
  """Whether the blocks' ``token_ids`` were made with this vocabulary and casing."""
  sha1 = manifest.get("vocab_sha1")
  if sha1 is None:
    return True  # No way to tell; trust the data.
  if sha1 != manifests.file_sha1(vocab_file):
    return False
  return bool(manifest.get("lower_case", lower_case)) == bool(lower_case)


def tower_fingerprint(tower: tf.Module) -> str:
  """Hex SHA1 over a tower's variables (names, shapes and values, in order): which weights
  embedded an index's blocks."""
  h = hashlib.sha1()
  for variable in tower.variables:
    value = np.ascontiguousarray(variable.numpy())
    h.update(f"{variable.name}:{value.shape}:{value.dtype}\n".encode("utf-8"))
    h.update(value.tobytes())
  return h.hexdigest()


def corpus_rows_files(blocks_dir: str, manifest: dict, rows_from: int = 0) -> List[str]:
  """The files holding rows ``rows_from ..`` of the corpus: all of them for 0, else the files
  of the updates from the one whose first row is ``rows_from``."""
  if rows_from == 0:
    return corpus_updates.corpus_files(blocks_dir, manifest)
  for update in corpus_updates.updates(manifest):
    if update["first_block_id"] == rows_from:
      return corpus_updates.update_files(blocks_dir, manifest, update["version"])
  raise errors.CorpusFormatError(f"{blocks_dir}: no update starts at row {rows_from}")


def block_dataset(blocks_dir: str,
                  seq_length: int,
                  batch_size: int,
                  vocab_file: str,
                  lower_case: bool = True,
                  shard_index: int = 0,
                  num_shards: int = 1,
                  pad_to_batch: bool = True,
                  input_context: Optional[tf.distribute.InputContext] = None,
                  rows_from: int = 0, manifest: Optional[dict] = None) -> tf.data.Dataset:
  """Batches ``(block_id int64 [b], inputs)`` of one shard of the corpus (of its rows from
  ``rows_from`` on: :func:`corpus_rows_files`; of the version ``manifest`` describes, default
  the current one).

  ``inputs`` are int32 ``input_word_ids``, ``input_mask``, ``input_type_ids`` of shape
  ``[b, seq_length]``, packed from the stored ``token_ids`` (trimmed keeping the final
  ``[SEP]``). If the blocks were tokenized with another vocabulary or casing than the model's,
  titles and bodies are tokenized again in the graph instead. With ``pad_to_batch`` every batch
  has exactly ``batch_size`` rows (static shapes, as a TPU wants); filler rows have id -1.
  """
  if num_shards < 1 or not 0 <= shard_index < num_shards:
    raise ValueError(f"shard_index {shard_index} is not in [0, num_shards={num_shards})")
  manifest = manifest or manifests.load_blocks_manifest(blocks_dir)
  files = corpus_rows_files(blocks_dir, manifest, rows_from)
  vocab = tokenization.load_vocab(vocab_file)
  sep_id = vocab.index("[SEP]")
  if tokens_match(manifest, vocab_file, lower_case):
    tokenizer = None
  else:
    logging.warning("blocks in %s were tokenized with another vocabulary (%s) than the "
                    "model's (%s): tokenizing titles and bodies again", blocks_dir,
                    manifest.get("vocab_file"), vocab_file)
    tokenizer = tokenization.RealmTokenizer(vocab_file, lower_case=lower_case)

  # Records of this worker: shard `shard_index` of `num_shards`, then this input pipeline's part.
  pipelines = input_context.num_input_pipelines if input_context else 1
  pipeline_id = input_context.input_pipeline_id if input_context else 0
  dataset = tf.data.TFRecordDataset(files)
  total_shards = num_shards * pipelines
  if total_shards > 1:
    dataset = dataset.shard(total_shards, shard_index * pipelines + pipeline_id)

  def to_inputs(serialized):
    parsed = features.parse_block_batch(serialized)
    if tokenizer is None:
      inputs = features.pack_block_ids(parsed["token_ids"], seq_length, sep_id)
    else:
      inputs = tokenizer.block_inputs(parsed["title"], parsed["body"], seq_length)
    return parsed["block_id"], inputs

  def pad(ids, inputs):
    missing = batch_size - tf.shape(ids)[0]
    ids = tf.ensure_shape(tf.pad(ids, [[0, missing]], constant_values=-1), [batch_size])
    inputs = {k: tf.ensure_shape(tf.pad(v, [[0, missing], [0, 0]]), [batch_size, seq_length])
              for k, v in inputs.items()}
    return ids, inputs

  dataset = dataset.batch(batch_size).map(to_inputs, num_parallel_calls=tf.data.AUTOTUNE)
  if pad_to_batch:
    dataset = dataset.map(pad)
  return dataset.prefetch(tf.data.AUTOTUNE)


# One traced step per (embedder, strategy), so that a refresher does not retrace every build.
_STEPS = weakref.WeakKeyDictionary()


def _embed_step(block_embedder, strategy):
  per_model = _STEPS.setdefault(block_embedder, {})
  if id(strategy) not in per_model:

    @tf.function(autograph=False)  # As embedder_lib.inference_function, under a strategy.
    def step(batch):
      def replica_fn(ids, inputs):
        return ids, tf.cast(block_embedder(inputs, training=False), tf.float32)
      return strategy.run(replica_fn, args=batch)

    per_model[id(strategy)] = (strategy, step)  # Keeps the strategy alive with its id.
  return per_model[id(strategy)][1]


_STORE_STEPS = weakref.WeakKeyDictionary()


def embed_store_rows(block_embedder: Callable, store, rows: np.ndarray, seq_length: int,
                     batch_size: int = 128) -> np.ndarray:
  """float32 ``[len(rows), d]``: ``block_embedder`` over rows of a ``BlockStore``, their
  inputs packed by the store (``gather_packed``: what :func:`block_dataset` packs for blocks
  tokenized with the model's vocabulary). For an update's few rows: no ``tf.data`` pipeline to
  build; every batch is padded to ``batch_size`` rows (one trace)."""
  if block_embedder not in _STORE_STEPS:
    _STORE_STEPS[block_embedder] = embedder_lib.inference_function(block_embedder, float32=True)
  step = _STORE_STEPS[block_embedder]
  rows = np.asarray(rows, np.int64)
  out = []
  for start in range(0, len(rows), batch_size):
    chunk = rows[start:start + batch_size]
    packed = store.gather_packed(np.pad(chunk, (0, batch_size - len(chunk)), mode="edge"),
                                 seq_length)
    out.append(step({k: tf.constant(v) for k, v in packed.items()}).numpy()[:len(chunk)])
  return np.concatenate(out) if out else np.zeros([0, 0], np.float32)


def shard_size(num_blocks: int, shard_index: int, num_shards: int) -> int:
  """How many blocks record-level shard ``shard_index`` of ``num_shards`` holds."""
  return len(range(shard_index, num_blocks, num_shards))


def embed_corpus(block_embedder: Callable,
                 blocks_dir: str,
                 seq_length: int,
                 vocab_file: str,
                 lower_case: bool = True,
                 batch_size: int = 128,
                 shard_index: int = 0,
                 num_shards: int = 1,
                 strategy: Optional[tf.distribute.Strategy] = None,
                 progress: bool = True, rows_from: int = 0,
                 manifest: Optional[dict] = None) -> Tuple[np.ndarray, np.ndarray]:
  """Embeds one shard of the corpus with ``block_embedder``.

  Args:
    block_embedder: a ``RealmEmbedder`` (created under ``strategy.scope()`` when a strategy is
      given) mapping int32 inputs ``[b, seq_length]`` to float ``[b, d]``.
    blocks_dir: a blocks directory (see ``realm_tf.data.manifests``).
    seq_length: the model's block length; longer blocks are trimmed, shorter ones padded.
    vocab_file, lower_case: the model's vocabulary (to check the blocks' tokenization).
    batch_size: global batch size (split over the strategy's replicas).
    shard_index, num_shards: which record-level shard of the corpus to embed.
    strategy: a ``tf.distribute`` strategy; default ``tf.distribute.get_strategy()``.
    progress: show a tqdm progress bar.
    rows_from: embed only rows ``rows_from ..`` (those of the updates from the one that
      starts there on: the blocks an update added).
    manifest: the corpus version to embed (default: the current one).

  Returns:
    ``(block_ids int64 [m], embeddings float32 [m, d])`` for the ``m`` blocks of the shard, in
    reading order.
  """
  strategy = strategy or tf.distribute.get_strategy()
  manifest = manifest or manifests.load_blocks_manifest(blocks_dir)
  total = shard_size(int(manifest["num_blocks"]) - rows_from, shard_index, num_shards)
  if total == 0:
    raise errors.EmptyCorpusError(
        f"shard {shard_index} of {num_shards} of {blocks_dir} holds no blocks "
        f"(the corpus has {manifest['num_blocks']})")

  def dataset_fn(input_context):
    per_replica = loaders.per_replica_batch_size(batch_size, input_context)
    return block_dataset(blocks_dir, seq_length, per_replica, vocab_file, lower_case,
                         shard_index, num_shards, pad_to_batch=True,
                         input_context=input_context, rows_from=rows_from, manifest=manifest)

  dataset = strategy.distribute_datasets_from_function(dataset_fn)
  step = _embed_step(block_embedder, strategy)

  all_ids, all_emb = [], []
  bar = tqdm.tqdm(total=total, desc=f"embedding blocks (shard {shard_index}/{num_shards})",
                  unit="block", disable=not progress, mininterval=2.0)
  for batch in dataset:
    ids, emb = step(batch)
    for i, e in zip(strategy.experimental_local_results(ids),
                    strategy.experimental_local_results(emb)):
      i, e = i.numpy(), e.numpy()
      keep = i >= 0
      all_ids.append(i[keep])
      all_emb.append(e[keep])
      bar.update(int(keep.sum()))
  bar.close()
  ids = np.concatenate(all_ids) if all_ids else np.zeros([0], np.int64)
  emb = np.concatenate(all_emb) if all_emb else np.zeros([0, 0], np.float32)
  if len(ids) == 0:
    raise errors.EmptyCorpusError(f"no blocks read from {blocks_dir} (shard {shard_index} of "
                                  f"{num_shards})")
  if len(ids) != total:
    raise errors.CorpusFormatError(
        f"{blocks_dir}: read {len(ids)} blocks in shard {shard_index} of {num_shards}, "
        f"the manifest implies {total}")
  return ids.astype(np.int64), emb.astype(np.float32)


def assemble_rows(ids: np.ndarray, embeddings: np.ndarray, num_blocks: int,
                  where: str = "embeddings") -> np.ndarray:
  """Places ``embeddings[j]`` at row ``ids[j]``; every id in ``[0, num_blocks)`` exactly once."""
  if len(ids) != len(embeddings):
    raise errors.CorpusFormatError(f"{where}: {len(ids)} ids for {len(embeddings)} rows")
  if len(ids) != num_blocks:
    raise errors.CorpusFormatError(f"{where}: {len(ids)} blocks, expected {num_blocks}")
  if num_blocks == 0:
    raise errors.EmptyCorpusError(f"{where}: no blocks")
  if ids.min() < 0 or ids.max() >= num_blocks:
    raise errors.CorpusFormatError(
        f"{where}: block ids must lie in [0, {num_blocks}), found {ids.min()}..{ids.max()}")
  seen = np.bincount(ids, minlength=num_blocks)
  if (seen != 1).any():
    bad = int(np.flatnonzero(seen != 1)[0])
    raise errors.CorpusFormatError(f"{where}: block id {bad} occurs {seen[bad]} times "
                                   "(block ids must be dense 0..n-1, each once)")
  out = np.empty([num_blocks, embeddings.shape[1]], np.float32)
  out[ids] = embeddings
  return out


def _atomic_save(path: str, array: np.ndarray) -> None:
  tmp = f"{path}.tmp-{os.getpid()}.npy"
  np.save(tmp, array)
  os.replace(tmp, path)


def save_embedding_shard(output_dir: str, ids: np.ndarray, embeddings: np.ndarray,
                         shard_index: int, num_shards: int) -> str:
  """Writes ``embeddings-shard-i-of-n.npy`` and ``ids-shard-i-of-n.npy`` (ids first)."""
  os.makedirs(output_dir, exist_ok=True)
  suffix = f"shard-{shard_index:05d}-of-{num_shards:05d}.npy"
  _atomic_save(os.path.join(output_dir, f"ids-{suffix}"), ids.astype(np.int64))
  path = os.path.join(output_dir, f"embeddings-{suffix}")
  _atomic_save(path, embeddings.astype(np.float32))
  return path


def merge_embedding_shards(output_dir: str, num_blocks: int) -> np.ndarray:
  """Reads every ``embeddings-shard-*`` of ``output_dir`` into ``[num_blocks, d]`` rows."""
  paths = sorted(glob.glob(os.path.join(output_dir, "embeddings-shard-*-of-*.npy")))
  if not paths:
    raise errors.CorpusFormatError(f"no embeddings-shard-*-of-*.npy files in {output_dir}")
  counts = {int(_SHARD_RE.search(p).group(2)) for p in paths}
  if len(counts) != 1:
    raise errors.CorpusFormatError(f"{output_dir}: shards of different splits {sorted(counts)}")
  num_shards = counts.pop()
  have = {int(_SHARD_RE.search(p).group(1)) for p in paths}
  missing = sorted(set(range(num_shards)) - have)
  if missing:
    raise errors.CorpusFormatError(f"{output_dir}: shards {missing} of {num_shards} are "
                                   "missing (a worker has not finished)")
  ids, emb = [], []
  for path in paths:
    ids.append(np.load(path.replace("embeddings-shard-", "ids-shard-")))
    emb.append(np.load(path))
    if len(ids[-1]) != len(emb[-1]):
      raise errors.CorpusFormatError(f"{path}: {len(emb[-1])} rows, {len(ids[-1])} ids")
  return assemble_rows(np.concatenate(ids), np.concatenate(emb), num_blocks, where=output_dir)


def sample_query_inputs(blocks_dir: str, num_queries: int, seq_length: int, vocab_file: str,
                        lower_case: bool = True) -> Dict[str, tf.Tensor]:
  """Query-layout inputs made from the first ``num_queries`` blocks (spread over the shards).

  Each is the block's ``[CLS] title [SEP] body`` prefix trimmed to ``seq_length`` with a final
  ``[SEP]`` and segment 0 throughout: realistic inputs for the query tower, used to measure the
  recall of an approximate index against exact search on the embeddings it will really see.
  """
  manifest = manifests.load_blocks_manifest(blocks_dir)
  files = manifests.block_shard_files(blocks_dir, manifest)
  num_queries = min(num_queries, int(manifest["num_blocks"]))
  dataset = tf.data.Dataset.from_tensor_slices(files).interleave(
      tf.data.TFRecordDataset, cycle_length=len(files), block_length=1)
  serialized = next(iter(dataset.take(num_queries).batch(num_queries)))
  parsed = features.parse_block_batch(serialized)
  if tokens_match(manifest, vocab_file, lower_case):
    sep_id = tokenization.load_vocab(vocab_file).index("[SEP]")
    return features.pack_block_ids(parsed["token_ids"], seq_length, sep_id, segment_ids=False)
  tokenizer = tokenization.RealmTokenizer(vocab_file, lower_case=lower_case)
  return tokenizer.query_inputs(parsed["body"], seq_length)
