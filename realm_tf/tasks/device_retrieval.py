"""REALM's retrieval on the accelerator: exact top-k inside the training step.

The host path (``candidates.CandidateBuilder``) embeds every query on the host with the
index's query-tower snapshot and searches a ScaNN index there. Here the corpus lives on the
replicas instead, and each step retrieves with the query tower it is training:

* **Tables.** Rows ``0 .. n-1`` of the corpus are split into ``R`` equal shards, ``R`` the
  strategy's replicas (the last one padded); replica ``r`` holds rows ``[r S, (r + 1) S)``:
  ``embeddings`` ``[S, d]`` float32 (the published index's, swapped in by :meth:`load`
  between training loops when the refresher publishes), ``tokens`` ``[S, W + 2]`` int32 (each
  block's ids ``[CLS] title [SEP] body [SEP]`` then 0, ``W`` the longest block, then its length
  and its uid group) and ``groups`` ``[S]`` int32 (the uid group: the first row with the
  block's uid; -1 for padding and deleted blocks). They are non-trainable ``SyncOnRead``
  variables without aggregation: every replica keeps its own shard, 1/R of the corpus (at
  13.3M blocks, 288 ids, 64 cores: 106 MB of float32 embeddings and 240 MB of ids a core).
* **A step** (replica context; this replica's queries ``q`` ``[b, d]``, embedded with the
  current query tower, and the uid group of each query's source block):
  1. all-gather the global batch's queries and source groups;
  2. score them against the local shard, padding and the blocks of each query's own uid at
     ``-inf`` (REALM's "prohibit trivial retrieval"), and keep the local top ``k - 1``;
  3. all-gather the ``R`` local tops and merge them into the global top ``k - 1`` (ties to
     the lower row);
  4. each replica gathers the token rows it holds for the merged candidates (0 for the
     others); an all-reduce (sum) gives every replica all of them; keep this replica's;
  5. put the null block ``[CLS] [SEP] [SEP]`` first and build the block inputs and the
     reader's ``[CLS] query [SEP] body [SEP]``, by the host builder's rules
     (``features.pack_block_ids``, ``CandidateBuilder.reader_inputs``);
  6. as the host builder does, skip (zero the mask weights of) an example whose candidates
     repeat a uid group, and mark it in ``skipped_duplicates``.
  The model then rescores these candidates with its current towers, as on the host path.

The search is exact (recall 1.0): per step ``2 B n d`` FLOPs split over the replicas (1.75
TFLOP at batch 512, 13.3M blocks, 128-d: 27 GFLOP a core) and two small collectives (the
token rows: ``B k W`` int32, 4.7 MB at the paper's sizes). The host only parses the masked
examples. One difference from the host path: the host retrieves with the query tower the
index was built with; here the current one retrieves (both rescore with current weights).
"""

import math
from typing import Dict, Optional

import numpy as np
import tensorflow as tf

from realm_tf import configs
from realm_tf.data import block_store
from realm_tf.data.loaders import InputError
from realm_tf.tasks import candidates

# The host-side features of a batch in this mode (the rest are built in the step).
HOST_FEATURES = ("query_word_ids", "query_mask", "query_type_ids", "mlm_positions", "mlm_ids",
                 "mlm_weights", "source_group")


def uid_groups(store: block_store.BlockStore) -> np.ndarray:
  """int32 ``[n]``: for each row, the first row with the same uid digest."""
  n = len(store)
  if n == 0:
    return np.zeros([0], np.int32)
  _, first, inverse = np.unique(store.uid_keys, return_index=True, return_inverse=True)
  return first[inverse.reshape(-1)].astype(np.int32)


def source_groups(store: block_store.BlockStore, groups: np.ndarray, source_block_ids,
                  source_uids=None, source_corpora=None) -> np.ndarray:
  """int32 ``[b]``: the uid group (``uid_groups``) of each query's source block, the host
  side of a batch, checked as the host path checks them (``candidates.check_sources``); -1
  for a query from another corpus than the knowledge corpus (X != Z), which bans no block.
  """
  ids = np.asarray(source_block_ids, np.int64).reshape(-1)
  external = candidates.check_sources(store, ids, source_uids, source_corpora)
  return np.where(external, -1, groups[np.where(external, 0, ids)]).astype(np.int32)


def host_features(examples: Dict[str, np.ndarray], config: configs.RealmModelConfig,
                  store: block_store.BlockStore, groups: np.ndarray) -> Dict[str, np.ndarray]:
  """``HOST_FEATURES`` of a batch of parsed masked examples (``source_block_id``, and
  ``source_uid`` when present for the check of ``source_groups``)."""
  candidates.check_query_length(examples, config)
  query_ids = examples["query_ids"].astype(np.int32)
  return dict(query_word_ids=query_ids, query_mask=examples["query_mask"].astype(np.int32),
              query_type_ids=np.zeros_like(query_ids),
              mlm_positions=examples["mlm_positions"].astype(np.int32),
              mlm_ids=examples["mlm_ids"].astype(np.int32),
              mlm_weights=examples["mlm_weights"].astype(np.float32),
              source_group=source_groups(store, groups, examples["source_block_id"],
                                         examples.get("source_uid"),
                                         examples.get("source_corpus")))


class DeviceRetriever(tf.Module):
  """The corpus sharded over the replicas and the in-step retrieval (see the module doc).

  Build it under the strategy's scope (or with ``strategy``); :meth:`load` the embeddings of
  an index before the first step; call :meth:`features` in replica context.

  Args:
    store: the corpus (``block_store.BlockStore``); rows of the tables are its rows.
    model_config: the ``RealmModelConfig`` (sequence lengths, ``num_candidates``).
    cls_id, sep_id: the vocabulary's special ids.
    strategy: the distribution strategy (default: the current one).
    groups: ``uid_groups(store)`` if already computed.
  """

  def __init__(self, store: block_store.BlockStore, model_config: configs.RealmModelConfig,
               cls_id: int, sep_id: int, strategy: Optional[tf.distribute.Strategy] = None,
               groups: Optional[np.ndarray] = None, name: str = "device_retriever"):
    super().__init__(name=name)
    self.strategy = strategy or tf.distribute.get_strategy()
    self.config = model_config
    self.k = model_config.num_candidates
    self.cls_id, self.sep_id = int(cls_id), int(sep_id)
    self.store = store
    self.num_blocks = n = len(store)
    self.groups = uid_groups(store) if groups is None else np.asarray(groups, np.int32)
    largest = int(np.bincount(self.groups).max()) if n else 0
    if n - largest < self.k - 1:
      raise InputError(f"the corpus has {n} blocks, {largest} of them with one uid; REALM "
                       f"needs num_candidates - 1 = {self.k - 1} blocks besides a query's own")
    if model_config.reader.seq_length < model_config.retriever.query_seq_length:
      raise configs.ConfigError(
          f"the reader's seq_length {model_config.reader.seq_length} is shorter than "
          f"query_seq_length {model_config.retriever.query_seq_length}")
    self.num_shards = self.strategy.num_replicas_in_sync
    self.shard_rows = max(1, math.ceil(n / self.num_shards))
    lengths = store.token_lengths() if n else np.zeros([0])
    self.width = max(3, int(lengths.max()) if n else 0)
    self.dim = model_config.retriever.projection_size
    s, w = self.shard_rows, self.width

    def local(shape, dtype):
      return tf.Variable(tf.zeros(shape, dtype), trainable=False,
                         synchronization=tf.VariableSynchronization.ON_READ,
                         aggregation=tf.VariableAggregation.NONE)

    with self.strategy.scope():
      self.embeddings = local([s, self.dim], tf.float32)
      self.tokens = local([s, w + 2], tf.int32)
      self.shard_groups = local([s], tf.int32)
      self.index_step = tf.Variable(-1, trainable=False, dtype=tf.int32)
    self._assign_shards(self.tokens, self._token_shard)
    self._assign_shards(self.shard_groups, self._group_shard)

  # ---- the tables (host) ----
  def _rows(self, shard: int) -> np.ndarray:
    start = shard * self.shard_rows
    return np.arange(start, min(start + self.shard_rows, self.num_blocks))

  def _token_shard(self, shard: int) -> np.ndarray:
    rows = self._rows(shard)
    out = np.zeros([self.shard_rows, self.width + 2], np.int32)
    if len(rows):
      packed = self.store.gather_packed(rows, self.width, self.cls_id, self.sep_id)
      out[:len(rows), :self.width] = packed["input_word_ids"]
      out[:len(rows), self.width] = packed["input_mask"].sum(axis=1)
      out[:len(rows), self.width + 1] = self.groups[rows]
    return out

  def _group_shard(self, shard: int) -> np.ndarray:
    """The shard's uid groups; -1 (never retrieved) for padding and deleted blocks."""
    out = np.full([self.shard_rows], -1, np.int32)
    rows = self._rows(shard)
    out[:len(rows)] = np.where(self.store.is_live(rows), self.groups[rows], -1)
    return out

  def _assign_shards(self, variable: tf.Variable, make_shard) -> None:
    """Each replica's component of ``variable`` := ``make_shard(replica id)``."""
    if self.num_shards == 1:
      variable.assign(make_shard(0))
      return
    values = self.strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(make_shard(ctx.replica_id_in_sync_group)))
    self.strategy.run(tf.function(variable.assign), args=(values,))

  def load(self, embeddings: np.ndarray, step: int) -> None:
    """Swaps in an index's embeddings (float32 ``[n, d]``, e.g. ``IndexHandle.embeddings()``;
    a memory map is read a shard at a time); ``step``: the checkpoint they embed."""
    if tuple(embeddings.shape) != (self.num_blocks, self.dim):
      raise InputError(f"index embeddings of shape {tuple(embeddings.shape)}, but the corpus "
                       f"has {self.num_blocks} blocks and the model {self.dim}-d embeddings")

    def shard(i):
      rows = self._rows(i)
      out = np.zeros([self.shard_rows, self.dim], np.float32)
      out[:len(rows)] = embeddings[rows[0]:rows[-1] + 1] if len(rows) else 0
      return out
    self._assign_shards(self.embeddings, shard)
    self.index_step.assign(int(step))

  def host_features(self, examples: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """``host_features`` over this retriever's corpus."""
    return host_features(examples, self.config, self.store, self.groups)

  # ---- the step (replica context) ----
  def retrieve(self, query_embeddings: tf.Tensor, source_groups: tf.Tensor):
    """Candidate rows ``[b, k]`` (null first), their token rows ``[b, k, W]``, lengths and
    uid groups (the null block's: -1)."""
    ctx = tf.distribute.get_replica_context()
    many = self.num_shards > 1
    q = tf.cast(query_embeddings, tf.float32)
    groups = tf.cast(source_groups, tf.int32)
    b = tf.shape(q)[0]
    if many:
      q, groups = ctx.all_gather(q, axis=0), ctx.all_gather(groups, axis=0)
      shard = tf.cast(ctx.replica_id_in_sync_group, tf.int32)
    else:
      shard = tf.constant(0, tf.int32)
    offset = shard * self.shard_rows
    shard_groups = tf.identity(self.shard_groups)
    scores = tf.matmul(q, self.embeddings, transpose_b=True)              # [B, S]
    banned = (shard_groups[tf.newaxis, :] < 0) | tf.equal(
        shard_groups[tf.newaxis, :], groups[:, tf.newaxis])
    scores = tf.where(banned, tf.constant(-np.inf, tf.float32), scores)
    m = min(self.k - 1, self.shard_rows)
    top_scores, top_rows = tf.math.top_k(scores, m)                         # [B, m]
    top_rows += offset
    if many:
      def by_query(x):   # every shard's [B, m] -> [B, R * m], the shards in order
        x = tf.reshape(ctx.all_gather(x, axis=0), [self.num_shards, -1, m])
        return tf.reshape(tf.transpose(x, [1, 0, 2]), [-1, self.num_shards * m])
      top_scores, top_rows = by_query(top_scores), by_query(top_rows)
      _, best = tf.math.top_k(top_scores, self.k - 1)
      top_rows = tf.gather(top_rows, best, batch_dims=1)                   # [B, k - 1]
    # The token rows: gathered where held, summed over the replicas.
    local = top_rows - offset
    held = (local >= 0) & (local < self.shard_rows)
    rows = tf.gather(tf.identity(self.tokens), tf.where(held, local, 0))     # [B, k-1, W+2]
    rows = tf.where(held[..., tf.newaxis], rows, 0)
    if many:
      rows = ctx.all_reduce(tf.distribute.ReduceOp.SUM, rows)
      start = shard * b
      rows, top_rows = rows[start:start + b], top_rows[start:start + b]
    null = tf.constant([self.cls_id, self.sep_id, self.sep_id] + [0] * (self.width - 3) +
                       [3, -1], tf.int32)
    null = tf.tile(null[tf.newaxis, tf.newaxis, :], [b, 1, 1])
    rows = tf.concat([null, rows], axis=1)                                   # [b, k, W+2]
    candidates = tf.concat([tf.fill([b, 1], self.num_blocks), top_rows], axis=1)
    return (candidates, rows[..., :self.width], rows[..., self.width],
            rows[..., self.width + 1])

  def features(self, inputs: Dict[str, tf.Tensor], query_embedder) -> Dict[str, tf.Tensor]:
    """REALM's device features (``candidates.feature_signature``) from this replica's host
    features (``HOST_FEATURES``), retrieving with ``query_embedder`` (no gradient here: the
    model embeds the queries again for its scores)."""
    query = dict(input_word_ids=inputs["query_word_ids"], input_mask=inputs["query_mask"],
                 input_type_ids=inputs["query_type_ids"])
    q = tf.stop_gradient(query_embedder(query, training=False))
    candidates, tokens, lengths, groups = self.retrieve(q, inputs["source_group"])
    retrieved = groups[:, 1:]
    pairs = tf.equal(retrieved[:, :, tf.newaxis], retrieved[:, tf.newaxis, :])
    repeated = tf.reduce_any(pairs & ~tf.eye(self.k - 1, dtype=tf.bool), axis=[1, 2])
    is_sep = tf.equal(tokens, self.sep_id) & (
        tf.range(self.width)[tf.newaxis, tf.newaxis, :] < lengths[..., tf.newaxis])
    first_sep = tf.where(tf.reduce_any(is_sep, -1),
                         tf.argmax(tf.cast(is_sep, tf.int32), -1, output_type=tf.int32), -1)
    block = _packed(tokens, lengths, first_sep, self.config.retriever.block_seq_length,
                    self.sep_id)
    reader_ids, reader_types = _reader_inputs(
        tf.cast(inputs["query_word_ids"], tf.int32), tf.cast(inputs["query_mask"], tf.int32),
        tokens, lengths, first_sep, self.config.reader.seq_length, self.sep_id)
    b = tf.shape(candidates)[0]
    out = dict(inputs)
    out["mlm_weights"] = inputs["mlm_weights"] * tf.cast(~repeated, tf.float32)[:, tf.newaxis]
    out.update(skipped_duplicates=tf.cast(repeated, tf.float32),
        candidate_word_ids=block["input_word_ids"], candidate_mask=block["input_mask"],
        candidate_type_ids=block["input_type_ids"], reader_word_ids=reader_ids,
        reader_mask=tf.cast(reader_ids > 0, tf.int32), reader_type_ids=reader_types,
        candidate_rows=candidates, index_step=tf.fill([b], tf.identity(self.index_step)))
    return out


def _packed(tokens, lengths, first_sep, seq_length: int, sep_id: int) -> Dict[str, tf.Tensor]:
  """``features.pack_block_ids`` of unpadded token rows ``[..., W]`` (``lengths``), on device."""
  width = tokens.shape[-1]
  if width < seq_length:
    tokens = tf.pad(tokens, [[0, 0], [0, 0], [0, seq_length - width]])
  pos = tf.range(seq_length)[tf.newaxis, tf.newaxis, :]
  kept = tf.minimum(lengths, seq_length)[..., tf.newaxis]
  word = tf.where(pos < kept, tokens[..., :seq_length], 0)
  word = tf.where((lengths > seq_length)[..., tf.newaxis] & tf.equal(pos, seq_length - 1),
                  sep_id, word)
  mask = pos < kept
  first = first_sep[..., tf.newaxis]
  first = tf.where((first >= 0) & (first < kept), first, seq_length)
  return {"input_word_ids": word, "input_mask": tf.cast(mask, tf.int32),
          "input_type_ids": tf.cast((pos > first) & mask, tf.int32)}


def _reader_inputs(query_ids, query_mask, tokens, lengths, first_sep, seq_length: int,
                   sep_id: int):
  """``CandidateBuilder.reader_inputs`` on device: ``[CLS] query [SEP] body [SEP]`` ids and
  type ids ``[b, k, seq_length]``, the body cut to fit with its last kept id ``[SEP]``."""
  width = tokens.shape[-1]
  q_len = tf.reduce_sum(query_mask, axis=1)                                 # [b]
  pos = tf.range(seq_length)
  q_width = query_ids.shape[-1]
  query = tf.pad(query_ids, [[0, 0], [0, max(seq_length - q_width, 0)]])[:, :seq_length]
  query = tf.where(pos[tf.newaxis, :] < q_len[:, tf.newaxis], query, 0)    # [b, L]
  skip = tf.where(first_sep >= 0, first_sep + 1, 1)                         # [b, k]
  take = tf.minimum(tf.maximum(lengths - skip, 0), (seq_length - q_len)[:, tf.newaxis])
  rel = pos[tf.newaxis, tf.newaxis, :] - q_len[:, tf.newaxis, tf.newaxis]  # [b, 1, L]
  in_body = (rel >= 0) & (rel < take[..., tf.newaxis])
  source = tf.clip_by_value(skip[..., tf.newaxis] + rel, 0, width - 1)
  body = tf.gather(tokens, source, batch_dims=2)
  body = tf.where(tf.equal(rel, take[..., tf.newaxis] - 1), sep_id, body)
  ids = tf.where(in_body, body, query[:, tf.newaxis, :])
  return ids, tf.cast(in_body, tf.int32)
