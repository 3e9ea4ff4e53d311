"""The asynchronous index refresher: checkpoints in, published indexes out.

``refresh_loop`` polls a trainer's model directory. For each new checkpoint (at most one build
every ``min_step_interval`` steps, always the newest checkpoint) it restores only the towers it
needs, embeds the corpus with the block tower, builds the index, measures its recall@10
against exact search on a sample of query-tower embeddings, and publishes it as
``index_dir/step-<N>`` (see ``publish.py``). It exits once the trainer has written
``TRAINING_DONE`` and the final checkpoint has an index. Killed at any moment and restarted,
it removes leftover temporary directories and carries on from ``LATEST``.

Each build reads the corpus's current version (``data.corpus_updates``: blocks appended by
``realm-index upsert`` are embedded, deleted ones left out of the index) and records the block
tower it embedded with (``block_tower``: checkpoint, step, fingerprint), which later updates
must use. Before publishing it holds the index directory's lock and catches up with updates
made while it built (:meth:`Refresher.catch_up`): the build's own tower embeds the blocks
appended since, and the blocks deleted since are deleted.

Example (in-process; ``realm-refresh`` is the same loop as a binary)::

    refresh_loop("runs/pretrain", "runs/pretrain/index", "data/blocks", keep=3,
                 min_step_interval=500)

A model without a block tower (ORQA, converted by ``realm-convert``: its block embeddings come
as ``block_emb.npy``) is indexed once from those embeddings::

    build_index_for_checkpoint(None, "converted/orqa", "data/released_blocks", "idx",
                               embeddings_file="converted/orqa/block_emb.npy")
"""

import dataclasses
import os
import time
from typing import Callable, Optional

from absl import logging
import numpy as np
import tensorflow as tf

from realm_tf import checkpoint_convert
from realm_tf import model_dir as model_dir_lib
from realm_tf import configs
from realm_tf import modeling
from realm_tf.data import block_store
from realm_tf.data import corpus_updates
from realm_tf.data import manifests
from realm_tf.retrieval import errors
from realm_tf.retrieval.index import base as index_base
from realm_tf.retrieval.index import mips_index
from realm_tf.retrieval.publication import corpus_embedding
from realm_tf.retrieval.publication import index_io
from realm_tf.retrieval.publication import publish
from realm_tf.retrieval.sparse import sparse_index

RECALL_K = 10


@dataclasses.dataclass
class BuildOptions:
  """How each index is built.

  Attributes:
    index_type: ``scann`` (exact scoring below ``scann.brute_force_below`` blocks) or
      ``brute_force``.
    scann: ScaNN settings (defaults in ``mips_index.ScannSettings``).
    batch_size: global batch size of the corpus embedding.
    recall_queries: number of sample queries for the recall@10 measurement (0: skip). When
      it is measured, ScaNN also tunes itself (``scann.target_recall``) on
      ``scann.tuning_queries`` other sample blocks' query-tower embeddings; otherwise on rows
      of the embeddings.
    sparse: also a BM25 part over the same blocks (``configs.IndexConfig.sparse``).
    keep: indexes kept in ``index_dir``.
    tensorboard_dir: where build summaries go (default ``index_dir/tensorboard``; "" for none).
    progress: show progress bars.
  """
  index_type: str = "scann"
  scann: mips_index.ScannSettings = dataclasses.field(default_factory=mips_index.ScannSettings)
  batch_size: int = 128
  recall_queries: int = 200
  sparse: bool = True
  keep: int = 3
  tensorboard_dir: Optional[str] = None
  progress: bool = True

  @classmethod
  def from_config(cls, config: configs.IndexConfig, **runtime) -> "BuildOptions":
    """The options of an ``IndexConfig``; ``runtime``: ``keep``, ``tensorboard_dir``,
    ``progress``."""
    return cls(index_type=config.index_type, scann=config.scann, batch_size=config.batch_size,
               recall_queries=config.recall_queries, sparse=config.sparse, **runtime)

  def index_config(self) -> configs.IndexConfig:
    """The ``IndexConfig`` these options hold (recorded in each manifest)."""
    return configs.IndexConfig(index_type=self.index_type, batch_size=self.batch_size,
                               recall_queries=self.recall_queries, scann=self.scann,
                               sparse=self.sparse)


def has_block_tower(config, checkpoint_path: str) -> bool:
  """Whether a checkpoint of a model with this ``RealmModelConfig`` holds a block tower.

  Shared embedders always do; separate ones (ORQA) may ship precomputed block embeddings
  instead. Raises CheckpointNotFoundError when the checkpoint cannot be read.
  """
  if config.retriever.share_embedders:
    return True
  try:
    names = tf.train.load_checkpoint(checkpoint_path).get_variable_to_shape_map()
  except (tf.errors.OpError, ValueError) as e:
    raise errors.CheckpointNotFoundError(
        f"cannot read checkpoint {checkpoint_path}: {str(e).strip().splitlines()[0]}") from None
  return any(n.startswith("block_embedder/") for n in names)


def load_embeddings_file(path: str, num_blocks: int, dim: int,
                         blocks_dir: Optional[str] = None) -> np.ndarray:
  """A ``[num_blocks, dim]`` ``.npy`` file of block embeddings (row = block_id), memory-mapped.

  E.g. ``block_emb.npy``, which ``realm-convert --block_emb_checkpoint`` writes for ORQA.
  Raises MissingDataError (no such file), CorpusFormatError (unreadable, not floats, or a row
  count other than ``num_blocks``) or DimensionMismatchError (not ``[rows, dim]``), each
  naming the file.
  """
  if not tf.io.gfile.exists(path):
    raise manifests.MissingDataError(f"embeddings file not found: {path}")
  try:
    table = np.load(path, mmap_mode="r")
  except (OSError, ValueError) as e:
    raise errors.CorpusFormatError(f"cannot read {path} as a .npy array: "
                                   f"{str(e).strip().splitlines()[0]}") from None
  if not isinstance(table, np.ndarray) or not np.issubdtype(table.dtype, np.floating):
    kind = table.dtype if isinstance(table, np.ndarray) else type(table).__name__
    raise errors.CorpusFormatError(f"{path} holds {kind}, not float embeddings")
  if table.ndim != 2:
    raise errors.DimensionMismatchError(
        f"{path} has shape {list(table.shape)}, not [num_blocks, {dim}]")
  corpus = f" in {blocks_dir}" if blocks_dir else ""
  if table.shape[0] != num_blocks:
    raise errors.CorpusFormatError(
        f"{path} has {table.shape[0]} rows but the corpus{corpus} has {num_blocks} blocks "
        "(embeddings of another corpus?)")
  if table.shape[1] != dim:
    raise errors.DimensionMismatchError(
        f"{path} has dimension {table.shape[1]} but the model's projection_size is {dim}")
  return table if table.dtype == np.float32 else np.asarray(table, np.float32)


def corpus_metadata(manifest: dict) -> dict:
  """What an index's manifest records of its corpus version: ``corpus_fingerprint``, the
  fingerprints of that version and the older ones (``corpus_fingerprints``), the version."""
  return {"corpus_fingerprint": manifest["fingerprint"],
          "corpus_fingerprints": corpus_updates.fingerprints(manifest),
          "corpus_version": corpus_updates.version(manifest)}


def _require_model_dir(model_dir: str, wait_seconds: float = 0.0) -> None:
  deadline = time.time() + wait_seconds
  while not tf.io.gfile.isdir(model_dir):
    if time.time() >= deadline:
      raise errors.CheckpointNotFoundError(
          f"model directory not found: {model_dir} (give the trainer's --model_dir, or start "
          "the trainer first)")
    time.sleep(1.0)


def block_tower_fingerprint(model_dir: str, checkpoint_path: str) -> str:
  """The ``block_tower`` fingerprint of the block tower in ``checkpoint_path`` (a checkpoint of
  ``model_dir``): what an index built from it records (:meth:`Refresher.build`)."""
  config = model_dir_lib.load_config(model_dir)
  if not has_block_tower(config, checkpoint_path):
    raise errors.RetrievalError(f"checkpoint {checkpoint_path} has no block tower")
  _, block_embedder = modeling.build_embedders(config.retriever)
  model_dir_lib.restore(checkpoint_path, block_embedder=block_embedder)
  return corpus_embedding.tower_fingerprint(block_embedder)


def find_checkpoint(model_dir: str, checkpoint_path: Optional[str] = None) -> str:
  """``checkpoint_path`` if given (it must exist), else the newest checkpoint of ``model_dir``.

  Raises CheckpointNotFoundError naming the missing checkpoint or model directory.
  """
  if checkpoint_path:
    if not tf.io.gfile.exists(checkpoint_path + ".index"):
      raise errors.CheckpointNotFoundError(f"checkpoint not found: {checkpoint_path}")
    return checkpoint_path
  try:
    return model_dir_lib.latest_checkpoint(model_dir)
  except model_dir_lib.ModelDirError as e:
    raise errors.CheckpointNotFoundError(str(e)) from None


class Refresher:
  """Holds the towers of one model directory across builds; ``build(checkpoint)`` publishes.

  Args:
    model_dir: the trainer's model directory (``model_config.yaml``, ``vocab.txt``,
      ``ckpt-N``).
    blocks_dir: the corpus.
    index_dir: where indexes are published.
    options: ``BuildOptions``.
    strategy: the ``tf.distribute`` strategy to embed under (default: the current one).
  """

  def __init__(self, model_dir: str, blocks_dir: str, index_dir: str,
               options: Optional[BuildOptions] = None,
               strategy: Optional[tf.distribute.Strategy] = None):
    self.model_dir = model_dir
    self.blocks_dir = blocks_dir
    self.index_dir = index_dir
    self.options = options or BuildOptions()
    self.strategy = strategy or tf.distribute.get_strategy()
    self.blocks_manifest = manifests.load_blocks_manifest(blocks_dir)  # Re-read by each build.
    self.config = None
    self.query_embedder = None
    self.block_embedder = None
    self.block_tower: Optional[dict] = None  # checkpoint, step, fingerprint of the restored one
    self._writer = None
    self._embed_query = None

  def _build_towers(self):
    if self.config is not None:
      return
    self.config = model_dir_lib.load_config(self.model_dir)
    with self.strategy.scope():
      self.query_embedder, self.block_embedder = modeling.build_embedders(self.config.retriever)
    self._embed_query = modeling.inference_function(self.query_embedder)

  def _restore(self, checkpoint_path: str, block_tower: bool = True) -> None:
    """Partial restore of the towers; CheckpointVanishedError if the files went away.

    Without ``block_tower`` (the corpus embeddings are given) only the query tower is needed.
    """
    shared = self.query_embedder is self.block_embedder
    if block_tower and not shared:
      try:
        present = has_block_tower(self.config, checkpoint_path)
      except errors.CheckpointNotFoundError:
        if not tf.io.gfile.exists(checkpoint_path + ".index"):
          raise errors.CheckpointVanishedError(
              f"checkpoint {checkpoint_path} disappeared while being read") from None
        raise
      if not present:
        block_emb = os.path.join(self.model_dir, checkpoint_convert.BLOCK_EMB_NAME)
        raise errors.RetrievalError(
            f"checkpoint {checkpoint_path} has no block tower (an ORQA model ships its block "
            f"embeddings instead): build the index from them (realm-index build "
            f"--embeddings_file={block_emb})")
    try:
      if shared:
        model_dir_lib.restore(checkpoint_path, block_embedder=self.block_embedder)
      elif not block_tower:
        model_dir_lib.restore(checkpoint_path, query_embedder=self.query_embedder)
      else:
        model_dir_lib.restore(checkpoint_path, query_embedder=self.query_embedder,
                              block_embedder=self.block_embedder)
    except (model_dir_lib.ModelDirError, tf.errors.OpError) as e:
      if not tf.io.gfile.exists(checkpoint_path + ".index"):
        raise errors.CheckpointVanishedError(
            f"checkpoint {checkpoint_path} disappeared while being read") from None
      raise e
    self.block_tower = None if not block_tower else {
        "checkpoint": os.path.abspath(checkpoint_path) if "://" not in checkpoint_path
                      else checkpoint_path,
        "step": model_dir_lib.checkpoint_step(checkpoint_path),
        "fingerprint": corpus_embedding.tower_fingerprint(self.block_embedder)}

  def restore_block_tower(self, checkpoint_path: str) -> dict:
    """Builds the towers and restores both from ``checkpoint_path``; returns
    ``block_tower`` (``{"checkpoint", "step", "fingerprint"}``)."""
    self._build_towers()
    self._restore(checkpoint_path)
    return dict(self.block_tower)

  def embed_rows(self, manifest: dict, rows_from: int = 0) -> np.ndarray:
    """float32 ``[num_blocks - rows_from, d]``: the restored block tower's embeddings of rows
    ``rows_from ..`` of the corpus version ``manifest``, in row order. An update's rows
    (``rows_from > 0``) are packed from the block store when their ids are the model's
    vocabulary's; the whole corpus streams through ``corpus_embedding.embed_corpus``."""
    retriever = self.config.retriever
    if rows_from and corpus_embedding.tokens_match(manifest, self.config.vocab_file,
                                                   self.config.lower_case):
      store = block_store.BlockStore.open(self.blocks_dir, fingerprint=manifest["fingerprint"])
      return corpus_embedding.embed_store_rows(
          self.block_embedder, store, np.arange(rows_from, int(manifest["num_blocks"])),
          retriever.block_seq_length, self.options.batch_size)
    ids, emb = corpus_embedding.embed_corpus(
        self.block_embedder, self.blocks_dir, self.config.retriever.block_seq_length,
        self.config.vocab_file, self.config.lower_case, batch_size=self.options.batch_size,
        strategy=self.strategy, progress=self.options.progress, rows_from=rows_from,
        manifest=manifest)
    return corpus_embedding.assemble_rows(ids - rows_from, emb,
                                          int(manifest["num_blocks"]) - rows_from,
                                          where=self.blocks_dir)

  def sparse_part(self, manifest: dict) -> sparse_index.SparseIndex:
    """BM25 over the corpus version ``manifest``: the last publication's sparse part when it
    covers that version (it does not depend on the model), else built from the block store."""
    path = publish.read_latest(self.index_dir)
    if path:
      published = index_base.read_manifest(path)
      if (published.get("sparse") and
          published.get("corpus_fingerprint") == manifest["fingerprint"]):
        return index_io.load_sparse(path, published,
                                    index_base.load_deleted(path, published))
    store = block_store.BlockStore.open(self.blocks_dir, fingerprint=manifest["fingerprint"])
    sparse = sparse_index.SparseIndex.build(sparse_index.store_texts(store, range(len(store))))
    sparse.delete(corpus_updates.deleted_rows(manifest))
    return sparse

  def catch_up(self, index: mips_index.MipsIndex, manifest: Optional[dict] = None):
    """``(index, manifest, changes)``: ``index`` brought up to the corpus version ``manifest``
    (default: the current one). Rows it lacks are embedded with the restored block tower and
    appended, rows deleted since are deleted, then ScaNN's rule may rebalance or rebuild it
    (``scann_index``). ``changes``: ``{"appended", "deleted", "maintenance"}``."""
    manifest = manifest or manifests.load_blocks_manifest(self.blocks_dir)
    have, want = index.num_blocks, int(manifest["num_blocks"])
    if want < have:
      raise errors.FingerprintMismatchError(
          f"the index has {have} rows but {self.blocks_dir} only {want}: another corpus")
    changes = {"appended": want - have, "deleted": 0, "maintenance": None}
    if want > have:
      if self.block_tower is None:
        raise errors.RetrievalError(
            "blocks were added to the corpus but this index has no block tower to embed them "
            "(built from precomputed embeddings): rebuild it")
      texts = None
      if index.sparse is not None:
        store = block_store.BlockStore.open(self.blocks_dir, fingerprint=manifest["fingerprint"])
        texts = list(sparse_index.store_texts(store, range(have, want)))
      index.append(self.embed_rows(manifest, rows_from=have), texts)
    dead = np.setdiff1d(corpus_updates.deleted_rows(manifest), index.deleted)
    if dead.size:
      index.delete(dead)
      changes["deleted"] = int(dead.size)
    if isinstance(index, (mips_index.ScannIndex, mips_index.ShardedIndex)):
      index, changes["maintenance"] = index.maintained()
    return index, manifest, changes

  def _summary_writer(self):
    if self._writer is None:
      logdir = self.options.tensorboard_dir
      if logdir is None:
        logdir = os.path.join(self.index_dir, "tensorboard")
      if logdir:
        self._writer = tf.summary.create_file_writer(logdir)
    return self._writer

  def sample_queries(self, num: int) -> np.ndarray:
    """Query-tower embeddings of the first ``num`` sample blocks (fewer in a small corpus)."""
    inputs = corpus_embedding.sample_query_inputs(self.blocks_dir, num,
                                                  self.config.retriever.query_seq_length,
                                                  self.config.vocab_file, self.config.lower_case)
    return np.concatenate([
        self._embed_query({k: v[i:i + 128] for k, v in inputs.items()}).numpy()
        for i in range(0, int(inputs["input_word_ids"].shape[0]), 128)])

  def _split_queries(self, num_blocks: int):
    """``(tuning queries or None, measurement queries or None)`` for one build.

    ScaNN tunes its leaves and reordering depth on query-tower embeddings (the queries it
    will really see) when the recall is measured at all; the measurement uses other sample
    blocks than the tuning, so the recorded recall is a held-out one.
    """
    opts = self.options
    num_measure = opts.recall_queries
    if num_measure <= 0 or opts.index_type != "scann":  # Brute force: recall 1.0, no queries.
      return None, None
    tunes = opts.scann.target_recall is not None and num_blocks >= opts.scann.brute_force_below
    num_tune = opts.scann.tuning_queries if tunes else 0
    queries = self.sample_queries(num_tune + num_measure)
    if not num_tune:
      return None, queries
    num_measure = min(num_measure, max(1, len(queries) // 2))
    tune = queries[:len(queries) - num_measure]
    return (tune if len(tune) else None), queries[len(queries) - num_measure:]

  def measure_recall(self, index: mips_index.MipsIndex, embeddings: np.ndarray,
                     queries: Optional[np.ndarray] = None) -> Optional[float]:
    """Recall@10 of ``index`` against exact search, on query-tower embeddings of sample blocks
    (``queries``, or the first ``recall_queries`` sample blocks)."""
    num = self.options.recall_queries
    if num <= 0:
      return None
    if isinstance(index, mips_index.BruteForceIndex):
      return 1.0
    if queries is None:
      queries = self.sample_queries(num)
    return mips_index.measure_recall(index, embeddings, queries, min(RECALL_K, index.num_live))

  def build(self, checkpoint_path: str, embeddings: Optional[np.ndarray] = None,
            embeddings_file: Optional[str] = None) -> str:
    """Restores, embeds, builds, publishes; returns the published directory.

    Args:
      checkpoint_path: the checkpoint to index.
      embeddings: the corpus already embedded with this checkpoint (e.g. merged from
        ``realm-index embed`` shards); the corpus is then not embedded again. The block tower is
        still restored and recorded when the checkpoint has one, so that later updates embed
        new blocks with it.
      embeddings_file: the same as a ``[num_blocks, projection_size]`` ``.npy`` file (e.g. an
        ORQA model's ``block_emb.npy``); checked by :func:`load_embeddings_file`.
    """
    if embeddings is not None and embeddings_file:
      raise ValueError("give embeddings or embeddings_file, not both")
    start = time.time()
    step = model_dir_lib.checkpoint_step(checkpoint_path)
    opts = self.options
    self.blocks_manifest = manifests.load_blocks_manifest(self.blocks_dir)
    num_blocks = int(self.blocks_manifest["num_blocks"])
    if embeddings_file:  # Checked before the towers are built: a wrong file fails fast.
      config = self.config or model_dir_lib.load_config(self.model_dir)
      embeddings = load_embeddings_file(embeddings_file, num_blocks,
                                        config.retriever.projection_size, self.blocks_dir)
    self._build_towers()
    self._restore(checkpoint_path, block_tower=(
        embeddings is None or has_block_tower(self.config, checkpoint_path)))
    restored = time.time()
    if embeddings is None:
      table = self.embed_rows(self.blocks_manifest)
    else:
      table = embeddings  # A float32 memory map stays one (a sharded build reads it so).
      if not (isinstance(table, np.memmap) and table.dtype == np.float32):
        table = np.asarray(embeddings, np.float32)
      if table.shape[0] != num_blocks:
        raise errors.CorpusFormatError(
            f"{table.shape[0]} embeddings for a corpus of {num_blocks} blocks "
            f"({self.blocks_dir})")
    expected_dim = self.config.retriever.projection_size
    if table.shape[1] != expected_dim:
      raise errors.DimensionMismatchError(
          f"embeddings have dimension {table.shape[1]} but the model's projection_size is "
          f"{expected_dim}")
    embedded = time.time()
    deleted = corpus_updates.deleted_rows(self.blocks_manifest)
    tune_queries, measure_queries = self._split_queries(num_blocks - len(deleted))
    index = mips_index.build_index(table, opts.index_type, opts.scann,
                                   tuning_queries=tune_queries, deleted=deleted)
    if opts.sparse:
      index.sparse = self.sparse_part(self.blocks_manifest)
    built = time.time()
    recall = self.measure_recall(index, table, measure_queries)
    metadata = {
        "blocks_dir": os.path.abspath(self.blocks_dir),
        "model_dir": os.path.abspath(self.model_dir),
        "checkpoint": checkpoint_path,
        "block_tower": self.block_tower,
        "index_config": opts.index_config().as_dict(),
        "restore_seconds": round(restored - start, 3),
        "embed_seconds": round(embedded - restored, 3),
        "index_build_seconds": round(built - embedded, 3),
        f"recall_at_{RECALL_K}": recall,
        "recall_queries": (0 if recall is None else
                           len(measure_queries) if measure_queries is not None else
                           opts.recall_queries),
    }
    if embeddings_file:
      metadata["embeddings_file"] = (embeddings_file if "://" in embeddings_file
                                     else os.path.abspath(embeddings_file))
    with publish.lock(self.index_dir):  # No update publishes between the catch-up and ours.
      index, manifest, changes = self.catch_up(index)
      metadata.update(corpus_metadata(manifest), caught_up=changes)
      metadata["build_seconds"] = round(time.time() - start, 3)
      path = publish.publish(index, self.index_dir, step, metadata,
                             query_embedder=self.query_embedder, keep=opts.keep)
    total = time.time() - start
    recall_text = "n/a" if recall is None else f"{recall:.4f}"
    print(f"[realm-refresh] published {path}: step {step}, {num_blocks} blocks, dim "
          f"{table.shape[1]}, {index.index_type}/{index.settings().get('mode')}, "
          f"embed {embedded - restored:.1f}s, index {built - embedded:.1f}s, "
          f"total {total:.1f}s, recall@{RECALL_K} {recall_text}", flush=True)
    writer = self._summary_writer()
    if writer is not None:
      with writer.as_default():
        tf.summary.scalar("refresh/num_blocks", num_blocks, step=step)
        tf.summary.scalar("refresh/build_seconds", total, step=step)
        tf.summary.scalar("refresh/embed_seconds", embedded - restored, step=step)
        tf.summary.scalar("refresh/index_seconds", built - embedded, step=step)
        tf.summary.scalar("refresh/blocks_per_second", num_blocks / max(embedded - restored,
                                                                          1e-9), step=step)
        if recall is not None:
          tf.summary.scalar(f"refresh/recall_at_{RECALL_K}", recall, step=step)
      writer.flush()
    return path


def build_index_for_checkpoint(checkpoint_path: Optional[str], model_dir: str, blocks_dir: str,
                               index_dir: str, options: Optional[BuildOptions] = None,
                               strategy: Optional[tf.distribute.Strategy] = None,
                               embeddings: Optional[np.ndarray] = None,
                               embeddings_file: Optional[str] = None) -> str:
  """Builds and publishes the index of one checkpoint; returns ``index_dir/step-<N>``.

  ``checkpoint_path`` None means the newest checkpoint of ``model_dir``. ``embeddings`` or
  ``embeddings_file``: precomputed corpus embeddings (see ``Refresher.build``), needed for a
  model without a block tower.
  """
  _require_model_dir(model_dir)
  checkpoint_path = find_checkpoint(model_dir, checkpoint_path)
  return Refresher(model_dir, blocks_dir, index_dir, options, strategy).build(
      checkpoint_path, embeddings=embeddings, embeddings_file=embeddings_file)


def embed_shard_for_checkpoint(checkpoint_path: Optional[str], model_dir: str, blocks_dir: str,
                               embeddings_dir: str, shard_index: int = 0, num_shards: int = 1,
                               batch_size: int = 128,
                               strategy: Optional[tf.distribute.Strategy] = None,
                               progress: bool = True) -> str:
  """Embeds one shard of the corpus with a checkpoint's block tower; returns the shard's file.

  ``checkpoint_path`` None means the newest checkpoint of ``model_dir``. The shard is written
  into ``embeddings_dir`` by ``corpus_embedding.save_embedding_shard``; once every shard is
  there, ``build_index_for_checkpoint`` takes them merged as its ``embeddings``.
  """
  checkpoint_path = find_checkpoint(model_dir, checkpoint_path)
  config = model_dir_lib.load_config(model_dir)
  strategy = strategy or tf.distribute.get_strategy()
  with strategy.scope():
    _, block_embedder = modeling.build_embedders(config.retriever)
  model_dir_lib.restore(checkpoint_path, block_embedder=block_embedder)
  ids, emb = corpus_embedding.embed_corpus(
      block_embedder, blocks_dir, config.retriever.block_seq_length, config.vocab_file,
      config.lower_case, batch_size=batch_size, shard_index=shard_index, num_shards=num_shards,
      strategy=strategy, progress=progress)
  return corpus_embedding.save_embedding_shard(embeddings_dir, ids, emb, shard_index, num_shards)


def refresh_loop(model_dir: str,
                 index_dir: str,
                 blocks_dir: str,
                 keep: int = 3,
                 min_step_interval: int = 0,
                 poll_seconds: float = 30.0,
                 exit_when_done: bool = True,
                 max_builds: Optional[int] = None,
                 options: Optional[BuildOptions] = None,
                 strategy: Optional[tf.distribute.Strategy] = None,
                 model_dir_wait_seconds: float = 0.0,
                 sleep: Callable[[float], None] = time.sleep) -> int:
  """Keeps ``index_dir`` fresh while a trainer writes checkpoints into ``model_dir``.

  Args:
    model_dir: the trainer's model directory (must exist; see ``model_dir_wait_seconds``).
    index_dir: where indexes are published.
    blocks_dir: the corpus.
    keep: indexes kept.
    min_step_interval: build at most once every this many steps (0: every new checkpoint);
      the final checkpoint is always built.
    poll_seconds: how often to look for a new checkpoint.
    exit_when_done: return once ``TRAINING_DONE`` exists and the newest checkpoint is indexed.
    max_builds: return after this many builds (None: no limit).
    options: ``BuildOptions`` (``keep`` overrides ``options.keep``).
    strategy: ``tf.distribute`` strategy for the embedding.
    model_dir_wait_seconds: wait this long for ``model_dir`` to appear before failing.

  Returns:
    The number of indexes built.
  """
  _require_model_dir(model_dir, model_dir_wait_seconds)
  options = dataclasses.replace(options or BuildOptions(), keep=keep)
  os.makedirs(index_dir, exist_ok=True)
  for path in publish.clean_temporaries(index_dir):
    print(f"[realm-refresh] removed leftover {path}", flush=True)
  refresher = Refresher(model_dir, blocks_dir, index_dir, options, strategy)
  last = publish.latest_step(index_dir)
  behind = publish.index_behind_corpus(index_dir) if last is not None else None
  if behind:
    print(f"[realm-refresh] {behind['index']} covers an older version of "
          f"{blocks_dir} than its current one (an update was cut short): indexing the newest "
          "checkpoint over the whole corpus now", flush=True)
    last = None
  builds = 0
  told_waiting = False
  while True:
    done = model_dir_lib.training_done(model_dir)  # Read before the checkpoint list.
    checkpoint = tf.train.latest_checkpoint(model_dir)
    if checkpoint is not None:
      step = model_dir_lib.checkpoint_step(checkpoint)
      due = last is None or (step > last and (step - last >= min_step_interval or done))
      if due:
        try:
          refresher.build(checkpoint)
        except errors.CheckpointVanishedError as e:
          logging.warning("%s; looking for a newer one", e)
          continue
        last = step
        builds += 1
        if max_builds is not None and builds >= max_builds:
          return builds
        continue  # A newer checkpoint may have arrived while we built.
    elif not told_waiting:
      print(f"[realm-refresh] waiting for a checkpoint in {model_dir}", flush=True)
      told_waiting = True
    if done and exit_when_done:
      if checkpoint is None or last is None or model_dir_lib.checkpoint_step(checkpoint) <= last:
        print(f"[realm-refresh] {model_dir_lib.TRAINING_DONE} found; the index of step {last} "
              "is final", flush=True)
        return builds
    sleep(poll_seconds)
