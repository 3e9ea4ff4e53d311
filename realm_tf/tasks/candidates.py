"""The host side of REALM pre-training: retrieve candidates and build fixed-shape inputs.

For a batch of masked queries (the pre-training examples pipeline's output):

1. embed the queries with the query-tower snapshot stored with the current index;
2. search the top ``k - 1 + slack`` blocks through the ``IndexHandle``;
3. drop every block whose uid equals the query's source uid ("prohibit trivial retrieval");
   a query from a document corpus that is not the knowledge corpus (X != Z: its
   ``source_block_id`` is ``features.EXTERNAL_SOURCE_BLOCK_ID``, its ``source_uid`` empty)
   drops nothing (``check_sources``);
4. put the null block (``[CLS] [SEP] [SEP]``) first and keep ``k`` candidates in all;
5. build int32 block inputs ``[b, k, Lb]`` and reader inputs ``[CLS] query [SEP] body [SEP]``
   ``[b, k, Lr]``;
6. mark the candidates that hold the masked answer (``candidate_holds_answer``, for the
   retrieval-health signals) and skip, as REALM's example generator does, an example whose
   retrieved blocks repeat a uid (its ``mlm_weights`` zeroed; ``skipped_duplicates`` = 1).

Between batches ``maybe_swap`` picks up a newer index (unless refreshing is disabled: the
stale-index ablation), and every batch carries the step of the index it was retrieved with.
"""

from typing import Dict, List, Optional

import numpy as np
import tensorflow as tf

from realm_tf import configs
from realm_tf import model_dir as model_dir_lib
from realm_tf import modeling
from realm_tf.data import answers
from realm_tf.data import block_store
from realm_tf.data import features
from realm_tf.data.loaders import InputError


def pack_blocks(blocks: List[Dict], seq_length: int, cls_id: int, sep_id: int):
  """Blocks (``token_ids`` = ``[CLS] title [SEP] body [SEP]``) -> fixed-length arrays.

  Row ``len(blocks)`` is the null block ``[CLS] [SEP] [SEP]``. The packing is the refresher's
  (``features.pack_block_ids``), so the trainer rescores exactly what the index
  embedded. Returns ``word_ids``, ``mask``, ``type_ids`` (int32 ``[n + 1, seq_length]``) and
  ``bodies``: per row, the body tokens with their closing ``[SEP]`` (for the reader).
  """
  rows = [np.asarray(b["token_ids"], np.int32) for b in blocks]
  rows.append(np.array([cls_id, sep_id, sep_id], np.int32))
  packed = features.pack_block_ids(tf.ragged.constant(rows, dtype=tf.int32), seq_length,
                                   sep_id)
  bodies = [tokens[int(np.argmax(tokens == sep_id)) + 1:] for tokens in rows]
  return (packed["input_word_ids"].numpy(), packed["input_mask"].numpy(),
          packed["input_type_ids"].numpy(), bodies)


class _Bodies:
  """Per row, the body tokens with their closing ``[SEP]`` (int32), read from the store when
  indexed (row ``len(store)``: the null block's ``[SEP]``)."""

  def __init__(self, store: block_store.BlockStore, sep_id: int):
    self._store, self._sep_id = store, sep_id

  def __len__(self):
    return len(self._store) + 1

  def __getitem__(self, row):
    return self._store.body(row, sep_id=self._sep_id)


class CandidateBuilder:
  """Turns pre-training examples into REALM's device inputs, retrieving through an index.

  The corpus is a ``block_store.BlockStore``: the candidates' block inputs and the reader's
  body tokens are gathered from it per batch, and the trivial-retrieval test compares uid
  digests. Over a blocks directory, :meth:`from_blocks_dir` opens (building on first use) its
  memory-mapped store; given a list of block dicts, the builder makes an in-memory store of
  them. Either way the features are the same.

  Args:
    blocks: the corpus: a ``BlockStore``, or the blocks as ``manifests.read_blocks`` returns
      them (``block_id`` = row).
    model_config: the ``RealmModelConfig`` (sequence lengths, number of candidates).
    handle: an ``IndexHandle`` (``search``, ``maybe_swap``, ``step``,
      ``query_embedder_checkpoint``); ``None`` for callers that pass candidates themselves.
    cls_id, sep_id: the vocabulary's special ids.
    refresh: swap in newer indexes between batches (False: stale-index ablation).

  Attributes:
    null_row: the null block's row (the number of blocks).
    store: the ``BlockStore``.
    bodies: per row, the body tokens with their closing ``[SEP]`` (read when indexed).
    bodies_text: per row, the block's body text ("" for the null row): a list for block
      dicts, read from the store's memory-mapped texts when indexed for a store.
  """

  def __init__(self, blocks, model_config: configs.RealmModelConfig, handle,
               cls_id: int, sep_id: int, refresh: bool = True, search_slack: int = 4):
    self.config = model_config
    self.k = model_config.num_candidates
    if len(blocks) < self.k:
      raise InputError(f"the corpus has {len(blocks)} blocks; REALM needs at least "
                       f"num_candidates={self.k}")
    self.cls_id, self.sep_id = cls_id, sep_id
    if isinstance(blocks, block_store.BlockStore):
      self.store = blocks
      self.bodies_text = blocks.texts
    else:
      self.store = block_store.BlockStore.from_blocks(blocks, cls_id, sep_id)
      self.bodies_text = [b.get("body", "") for b in blocks] + [""]
    self.null_row = len(self.store)
    self.bodies = _Bodies(self.store, sep_id)
    self.handle = handle
    self.refresh = refresh
    self.search_slack = search_slack
    self._query_tower = None
    self._snapshot = None

  @classmethod
  def from_blocks_dir(cls, blocks_dir: str, model_config: configs.RealmModelConfig, handle,
                      cls_id: int, sep_id: int, store_dir: Optional[str] = None,
                      **kwargs) -> "CandidateBuilder":
    """A builder over the memory-mapped ``BlockStore`` of ``blocks_dir`` (built on first use,
    in ``store_dir`` if given; see ``block_store.BlockStore.open``)."""
    store = block_store.BlockStore.open(blocks_dir, store_dir=store_dir, cls_id=cls_id,
                                        sep_id=sep_id)
    return cls(store, model_config, handle, cls_id, sep_id, **kwargs)

  def _packed(self, rows) -> Dict[str, np.ndarray]:
    return self.store.gather_packed(rows, self.config.retriever.block_seq_length, self.cls_id,
                                    self.sep_id)

  # The whole corpus packed, as pack_blocks gives it: built when read, for small corpora.
  @property
  def block_word_ids(self) -> np.ndarray:
    return self._packed(np.arange(self.null_row + 1))["input_word_ids"]

  @property
  def block_mask(self) -> np.ndarray:
    return self._packed(np.arange(self.null_row + 1))["input_mask"]

  @property
  def block_type_ids(self) -> np.ndarray:
    return self._packed(np.arange(self.null_row + 1))["input_type_ids"]

  # ---- retrieval ----
  def _query_embedder(self):
    """The query tower the current index was built with (reloaded when the index changes)."""
    path = self.handle.query_embedder_checkpoint
    if self._query_tower is None:
      self._query_tower = modeling.build_embedder(self.config.retriever, "snapshot_embedder")
      self._embed = modeling.inference_function(self._query_tower)
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
    ranked_row = np.asarray(ranked_row, np.int64).reshape(-1)
    keep = (ranked_row >= 0) & ~self.store.same_uid(ranked_row, source_uid)
    return [int(b) for b in ranked_row[keep]]

  def select_candidates(self, ranked_ids: np.ndarray, source_uids) -> np.ndarray:
    """Drops blocks with the query's source uid, puts the null row first, keeps k."""
    ranked_ids = np.asarray(ranked_ids, np.int64)
    out = np.full([len(ranked_ids), self.k], self.null_row, np.int32)
    keep = (ranked_ids >= 0) & ~self.store.same_uid(ranked_ids, list(source_uids))
    for i, row in enumerate(ranked_ids):
      kept = row[keep[i]][:self.k - 1]
      if len(kept) < self.k - 1:
        raise InputError(f"only {len(kept)} non-trivial blocks retrieved for query {i}; "
                         "search deeper (search_slack) or use a larger corpus")
      out[i, 1:] = kept
    return out

  def repeated_uids(self, candidates: np.ndarray) -> np.ndarray:
    """bool ``[b]``: do an example's retrieved candidates (the null block aside) repeat a uid?
    (REALM's ``example_generator.generate_queries_and_candidates`` skips those examples.)"""
    out = np.zeros(len(candidates), bool)
    for i, row in enumerate(candidates):
      digests = [self.store.uid_digest(int(r)) for r in row if r != self.null_row]
      out[i] = len(set(digests)) < len(digests)
    return out

  def holds_answer(self, candidates: np.ndarray, answer_texts) -> np.ndarray:
    """float32 ``[b, k]``: 1 where the candidate's body holds the example's masked answer
    (``answers.holds_answer``); the null block never does."""
    out = np.zeros(candidates.shape, np.float32)
    for i, (row, answer) in enumerate(zip(candidates, answer_texts)):
      for j, r in enumerate(row):
        out[i, j] = r != self.null_row and answers.holds_answer(self.bodies_text[int(r)], answer)
    return out

  # ---- inputs ----
  def features(self, examples: Dict[str, np.ndarray],
               candidates: Optional[np.ndarray] = None) -> Dict[str, np.ndarray]:
    """Fixed-shape int32 device inputs for a batch of parsed pre-training examples."""
    check_query_length(examples, self.config)
    if "source_block_id" in examples:
      check_sources(self.store, examples["source_block_id"], examples.get("source_uid"),
                    examples.get("source_corpus"))
    query_ids = examples["query_ids"].astype(np.int32)
    query_mask = examples["query_mask"].astype(np.int32)
    if candidates is None:
      candidates = self.retrieve(query_ids, query_mask, examples["source_uid"])
    r_len = self.config.reader.seq_length
    b = candidates.shape[0]
    reader_ids, reader_types = self.reader_inputs(query_ids, query_mask, candidates, r_len)
    packed = self._packed(candidates)
    index_step = self.handle.step if self.handle is not None else 0
    skipped = self.repeated_uids(candidates)
    holds = (self.holds_answer(candidates, examples["answer"]) if "answer" in examples
             else np.zeros(candidates.shape, np.float32))
    return dict(
        query_word_ids=query_ids, query_mask=query_mask,
        query_type_ids=np.zeros_like(query_ids),
        candidate_word_ids=packed["input_word_ids"],
        candidate_mask=packed["input_mask"],
        candidate_type_ids=packed["input_type_ids"],
        reader_word_ids=reader_ids, reader_mask=(reader_ids > 0).astype(np.int32),
        reader_type_ids=reader_types,
        mlm_positions=examples["mlm_positions"].astype(np.int32),
        mlm_ids=examples["mlm_ids"].astype(np.int32),
        mlm_weights=examples["mlm_weights"].astype(np.float32) * ~skipped[:, None],
        candidate_rows=candidates.astype(np.int32),
        index_step=np.full([b], index_step, np.int32),
        candidate_holds_answer=holds, skipped_duplicates=skipped.astype(np.float32))

  def reader_inputs(self, query_ids: np.ndarray, query_mask: np.ndarray, candidates: np.ndarray,
                    seq_length: int):
    """Reader ids and type ids ``[b, k, seq_length]``: ``[CLS] query [SEP] body [SEP]``.

    The body is cut to fit, its last kept position set to ``[SEP]``; type ids 1 over the body.
    """
    b, k = candidates.shape
    q_len = query_mask.sum(axis=1).astype(np.int64)                  # [b]
    room = seq_length - q_len
    if b and room.min() < 0:
      raise InputError(f"queries of {q_len.max()} tokens do not fit the reader's "
                       f"seq_length {seq_length}")
    bodies, body_len = self.store.gather_bodies(candidates, None, self.sep_id)  # all of them
    width = bodies.shape[-1]
    take = np.minimum(body_len, room[:, None])                       # [b, k]
    query = np.where(np.arange(seq_length)[None, :] < q_len[:, None],
                     np.pad(query_ids, [(0, 0), (0, max(seq_length - query_ids.shape[1], 0))]
                            )[:, :seq_length], 0).astype(np.int32)
    ids = np.repeat(query[:, None, :], k, axis=1)
    types = np.zeros([b, k, seq_length], np.int32)
    # The last kept body id is [SEP]; the bodies go right after each query.
    cut = np.arange(width)[None, None, :] == (take - 1)[:, :, None]
    bodies = np.where(cut, self.sep_id, bodies)
    keep = np.arange(width)[None, None, :] < take[:, :, None]
    target = ((np.arange(b * k) * seq_length).reshape(b, k) + q_len[:, None])[:, :, None] + (
        np.arange(width)[None, None, :])
    target = target[keep]
    ids.reshape(-1)[target] = bodies[keep]
    types.reshape(-1)[target] = 1
    return ids, types


def check_sources(store: block_store.BlockStore, source_block_ids, source_uids=None,
                  source_corpora=None) -> np.ndarray:
  """Checks the source block each masked example names against the corpus it retrieves from.

  An example from the knowledge corpus names its block (a row of ``store`` whose uid is its
  ``source_uid``), which REALM excludes from its candidates; one from another corpus of
  documents (X != Z) names none: ``source_block_id`` ``features.EXTERNAL_SOURCE_BLOCK_ID``,
  an empty ``source_uid``, and a ``source_corpus`` other than ``features.KNOWLEDGE_CORPUS``.
  Returns bool ``[b]``: which examples are from another corpus.

  Raises:
    InputError: naming the first example whose source block the corpus does not have, whose
      uid differs from that block's (the examples were made from another version of the
      corpus), or whose fields disagree on which corpus it came from.
  """
  ids = np.asarray(source_block_ids, np.int64).reshape(-1)
  n = len(store)
  external = ids == features.EXTERNAL_SOURCE_BLOCK_ID
  bad = np.flatnonzero(~external & ((ids < 0) | (ids >= n)))
  if bad.size:
    i = int(bad[0])
    raise InputError(
        f"example {i} names source block {int(ids[i])}, which this corpus of {n} blocks does "
        f"not have: rebuild the examples from this corpus's blocks, or, for sentences of "
        f"another corpus (X != Z), with data_prep --source_corpus NAME (source_block_id "
        f"{features.EXTERNAL_SOURCE_BLOCK_ID})")
  if source_corpora is not None:
    corpora = [c.decode() if isinstance(c, bytes) else str(c)
               for c in np.asarray(source_corpora).reshape(-1)]
    named = np.array([c != features.KNOWLEDGE_CORPUS for c in corpora], bool)
    if (named != external).any():
      i = int(np.flatnonzero(named != external)[0])
      raise InputError(f"example {i}: source_corpus {corpora[i]!r} "
                       f"disagrees with its source_block_id {int(ids[i])} (-1 only for "
                       f"sentences from another corpus than '{features.KNOWLEDGE_CORPUS}')")
  if source_uids is not None:
    uids = list(np.asarray(source_uids, object).reshape(-1))
    if any(len(uids[i]) for i in np.flatnonzero(external)):
      i = int(next(i for i in np.flatnonzero(external) if len(uids[i])))
      raise InputError(f"example {i} names no source block but has source_uid {uids[i]!r}")
    inside = np.flatnonzero(~external)
    if inside.size:
      same = store.same_uid(ids[inside], [uids[i] for i in inside])
      if not same.all():
        i = int(inside[np.flatnonzero(~same)[0]])
        raise InputError(f"example {i}: source_block_id {ids[i]} holds another uid than its "
                         f"source_uid {uids[i]!r}: the examples were made from another corpus")
  return external


def check_query_length(examples: Dict[str, np.ndarray], config: configs.RealmModelConfig):
  """Refuses masked examples whose query length is not the model's ``query_seq_length``."""
  q_len = config.retriever.query_seq_length
  if examples["query_ids"].shape[1] != q_len:
    raise InputError(f"masked examples have query length {examples['query_ids'].shape[1]} "
                     f"but the model's query_seq_length is {q_len}; rebuild the examples "
                     "with --query_seq_length or change the config")


def feature_signature(config: configs.RealmModelConfig,
                      batch_size: Optional[int] = None) -> Dict[str, tf.TensorSpec]:
  """``tf.TensorSpec`` of each feature that ``CandidateBuilder.features`` returns, for
  batches of ``batch_size`` (None: any)."""
  q, bl, r = (config.retriever.query_seq_length, config.retriever.block_seq_length,
              config.reader.seq_length)
  k, m = config.num_candidates, config.max_masks
  spec = lambda *s, dtype=tf.int32: tf.TensorSpec([batch_size, *s], dtype)
  return dict(
      query_word_ids=spec(q), query_mask=spec(q), query_type_ids=spec(q),
      candidate_word_ids=spec(k, bl), candidate_mask=spec(k, bl), candidate_type_ids=spec(k, bl),
      reader_word_ids=spec(k, r), reader_mask=spec(k, r), reader_type_ids=spec(k, r),
      mlm_positions=spec(m), mlm_ids=spec(m), mlm_weights=spec(m, dtype=tf.float32),
      candidate_rows=spec(k), index_step=spec(),
      candidate_holds_answer=spec(k, dtype=tf.float32),
      skipped_duplicates=spec(dtype=tf.float32))
