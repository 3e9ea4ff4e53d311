"""The host side of REALM pre-training: retrieve candidates and build fixed-shape inputs.

For a batch of masked queries (the pre-training examples pipeline's output):

1. embed the queries with the query-tower snapshot stored with the current index;
2. search the top ``k - 1 + slack`` blocks through the ``IndexHandle``;
3. drop every block whose uid equals the query's source uid ("prohibit trivial retrieval");
4. put the null block (``[CLS] [SEP] [SEP]``) first and keep ``k`` candidates in all;
5. build int32 block inputs ``[b, k, Lb]`` and reader inputs ``[CLS] query [SEP] body [SEP]``
   ``[b, k, Lr]``.

Between batches ``maybe_swap`` picks up a newer index (unless refreshing is disabled: the
stale-index ablation), and every batch carries the step of the index it was retrieved with.
"""

from typing import Dict, List, Optional

import numpy as np
import tensorflow as tf

from realm_tf import configs
from realm_tf import model_dir as model_dir_lib
from realm_tf import modeling
from realm_tf.data import contract
from realm_tf.data.loaders import InputError


def pack_blocks(blocks: List[Dict], seq_length: int, cls_id: int, sep_id: int):
  """Blocks (``token_ids`` = ``[CLS] title [SEP] body [SEP]``) -> fixed-length arrays.

  Row ``len(blocks)`` is the null block ``[CLS] [SEP] [SEP]``. The packing is the refresher's
  (``contract.pack_block_ids``), so the trainer rescores exactly what the index
  embedded. Returns ``word_ids``, ``mask``, ``type_ids`` (int32 ``[n + 1, seq_length]``) and
  ``bodies``: per row, the body tokens with their closing ``[SEP]`` (for the reader).
  """
  rows = [np.asarray(b["token_ids"], np.int32) for b in blocks]
  rows.append(np.array([cls_id, sep_id, sep_id], np.int32))
  packed = contract.pack_block_ids(tf.ragged.constant(rows, dtype=tf.int32), seq_length,
                                   sep_id)
  bodies = [tokens[int(np.argmax(tokens == sep_id)) + 1:] for tokens in rows]
  return (packed["input_word_ids"].numpy(), packed["input_mask"].numpy(),
          packed["input_type_ids"].numpy(), bodies)


class CandidateBuilder:
  """Turns pre-training examples into REALM's device inputs, retrieving through an index.

  Args:
    blocks: the corpus, as ``contract.read_blocks`` returns it (``block_id`` = row).
    model_config: the ``RealmModelConfig`` (sequence lengths, number of candidates).
    handle: an ``IndexHandle`` (``search``, ``maybe_swap``, ``step``,
      ``query_embedder_checkpoint``); ``None`` for callers that pass candidates themselves.
    cls_id, sep_id: the vocabulary's special ids.
    refresh: swap in newer indexes between batches (False: stale-index ablation).
  """

  def __init__(self, blocks: List[Dict], model_config: configs.RealmModelConfig, handle,
               cls_id: int, sep_id: int, refresh: bool = True, search_slack: int = 4):
    self.config = model_config
    self.k = model_config.num_candidates
    if len(blocks) < self.k:
      raise InputError(f"the corpus has {len(blocks)} blocks; REALM needs at least "
                       f"num_candidates={self.k}")
    self.null_row = len(blocks)
    self.uids = np.array([b["uid"] for b in blocks] + [""])
    self.bodies_text = [b.get("body", "") for b in blocks] + [""]
    self.cls_id, self.sep_id = cls_id, sep_id
    (self.block_word_ids, self.block_mask, self.block_type_ids,
     self.bodies) = pack_blocks(blocks, model_config.retriever.block_seq_length, cls_id, sep_id)
    self.handle = handle
    self.refresh = refresh
    self.search_slack = search_slack
    self._query_tower = None
    self._snapshot = None

  # ---- retrieval ----
  def _query_embedder(self):
    """The query tower the current index was built with (reloaded when the index changes)."""
    path = self.handle.query_embedder_checkpoint
    if self._query_tower is None:
      self._query_tower = modeling.build_embedder(self.config.retriever, "snapshot_embedder")
      self._embed = tf.function(lambda x: self._query_tower(x, training=False))
    if path != self._snapshot:
      model_dir_lib.restore(path, query_embedder=self._query_tower)
      self._snapshot = path
    return self._embed

  def maybe_swap(self) -> bool:
    return bool(self.refresh and self.handle.maybe_swap())

  def retrieve(self, query_word_ids, query_mask, source_uids) -> np.ndarray:
    """Candidate rows ``[b, k]``: null row first, then the top non-trivial blocks."""
    embed = self._query_embedder()
    emb = tf.cast(embed(dict(input_word_ids=query_word_ids, input_mask=query_mask,
                             input_type_ids=np.zeros_like(query_word_ids))), tf.float32).numpy()
    ids, _ = self.handle.search(emb, min(self.k - 1 + self.search_slack, self.null_row))
    return self.select_candidates(np.asarray(ids), source_uids)

  def non_trivial(self, ranked_row, source_uid) -> List[int]:
    """The ranked blocks whose uid is not the query's source uid, in order."""
    uid = source_uid.decode() if isinstance(source_uid, bytes) else source_uid
    return [int(b) for b in ranked_row if b >= 0 and self.uids[b] != uid]

  def select_candidates(self, ranked_ids: np.ndarray, source_uids) -> np.ndarray:
    """Drops blocks with the query's source uid, puts the null row first, keeps k."""
    out = np.full([len(ranked_ids), self.k], self.null_row, np.int32)
    for i, (row, uid) in enumerate(zip(ranked_ids, source_uids)):
      kept = self.non_trivial(row, uid)[:self.k - 1]
      if len(kept) < self.k - 1:
        raise InputError(f"only {len(kept)} non-trivial blocks retrieved for query {i}; "
                         "search deeper (search_slack) or use a larger corpus")
      out[i, 1:] = kept
    return out

  # ---- inputs ----
  def features(self, examples: Dict[str, np.ndarray],
               candidates: Optional[np.ndarray] = None) -> Dict[str, np.ndarray]:
    """Fixed-shape int32 device inputs for a batch of parsed pre-training examples."""
    q_len = self.config.retriever.query_seq_length
    if examples["query_ids"].shape[1] != q_len:
      raise InputError(f"masked examples have query length {examples['query_ids'].shape[1]} "
                       f"but the model's query_seq_length is {q_len}; rebuild the examples "
                       "with --query_seq_length or change the config")
    query_ids = examples["query_ids"].astype(np.int32)
    query_mask = examples["query_mask"].astype(np.int32)
    if candidates is None:
      candidates = self.retrieve(query_ids, query_mask, examples["source_uid"])
    r_len = self.config.reader.seq_length
    b, k = candidates.shape
    reader_ids = np.zeros([b, k, r_len], np.int32)
    reader_types = np.zeros([b, k, r_len], np.int32)
    for i in range(b):
      q = query_ids[i, :int(query_mask[i].sum())]
      for j, row in enumerate(candidates[i]):
        body = self.bodies[row][:r_len - len(q)]
        if len(body) and body[-1] != self.sep_id:
          body = np.concatenate([body[:-1], [self.sep_id]])
        reader_ids[i, j, :len(q)] = q
        reader_ids[i, j, len(q):len(q) + len(body)] = body
        reader_types[i, j, len(q):len(q) + len(body)] = 1
    index_step = self.handle.step if self.handle is not None else 0
    return dict(
        query_word_ids=query_ids, query_mask=query_mask,
        query_type_ids=np.zeros_like(query_ids),
        candidate_word_ids=self.block_word_ids[candidates],
        candidate_mask=self.block_mask[candidates],
        candidate_type_ids=self.block_type_ids[candidates],
        reader_word_ids=reader_ids, reader_mask=(reader_ids > 0).astype(np.int32),
        reader_type_ids=reader_types,
        mlm_positions=examples["mlm_positions"].astype(np.int32),
        mlm_ids=examples["mlm_ids"].astype(np.int32),
        mlm_weights=examples["mlm_weights"].astype(np.float32),
        candidate_rows=candidates.astype(np.int32),
        index_step=np.full([b], index_step, np.int32))


def feature_signature(config: configs.RealmModelConfig) -> Dict[str, tf.TensorSpec]:
  """``tf.TensorSpec`` of each feature that ``CandidateBuilder.features`` returns."""
  q, bl, r = (config.retriever.query_seq_length, config.retriever.block_seq_length,
              config.reader.seq_length)
  k, m = config.num_candidates, config.max_masks
  spec = lambda *s, dtype=tf.int32: tf.TensorSpec([None, *s], dtype)
  return dict(
      query_word_ids=spec(q), query_mask=spec(q), query_type_ids=spec(q),
      candidate_word_ids=spec(k, bl), candidate_mask=spec(k, bl), candidate_type_ids=spec(k, bl),
      reader_word_ids=spec(k, r), reader_mask=spec(k, r), reader_type_ids=spec(k, r),
      mlm_positions=spec(m), mlm_ids=spec(m), mlm_weights=spec(m, dtype=tf.float32),
      candidate_rows=spec(k), index_step=spec())
