"""Open-QA's host side: the published index and its corpus, and the input builder over them.

The fine-tuning task (``tasks/openqa.py``) and ``OpenQA.load`` (``realm-answer``,
``realm-eval``) open an index the same way, through the retrieval package's ``IndexHandle``
(it follows ``index_dir/LATEST``, waits for a first index and loads newer ones to swap in),
over the corpus the index was built from (checked by fingerprint), with the block texts and
titles memory-mapped from the block store. :func:`beam_size` is the one cap of the retriever
beam (at most the corpus).
"""

import logging
from typing import Dict, Optional

import numpy as np

import tensorflow as tf

from realm_tf import configs
from realm_tf.data import block_store
from realm_tf.data import corpus_updates
from realm_tf.data import manifests
from realm_tf.openqa import inputs as inputs_lib
from realm_tf.retrieval import errors
from realm_tf.retrieval.index import mips_index
from realm_tf.retrieval.publication import handle as handle_lib
from realm_tf.retrieval.publication import publish
from realm_tf.tokenization import RealmTokenizer

# The features the model reads (of ``inputs.FEATURES``).
MODEL_FEATURES = ("question_word_ids", "question_mask", "question_type_ids", "beam_emb",
                  "reader_word_ids", "reader_mask", "reader_type_ids")
# The block tower's inputs of the top of the beam (``trainable_blocks``).
BLOCK_TOWER_FEATURES = ("beam_block_word_ids", "beam_block_mask", "beam_block_type_ids")


def model_features(features: Dict[str, np.ndarray]) -> Dict[str, tf.Tensor]:
  """The features of a batch that the model reads, as tensors: ``MODEL_FEATURES`` and, when
  the builder gave one, the ``block_prior`` of a BM25 or fused beam."""
  names = MODEL_FEATURES + (("block_prior",) if "block_prior" in features else ())
  return {k: tf.constant(features[k]) for k in names}


def beam_size(retriever_beam_size: int, num_blocks: int) -> int:
  """The retriever beam over a corpus of ``num_blocks``: the requested size, at most the corpus
  (ORQA's 5000 over a small corpus retrieves all of it)."""
  return min(int(retriever_beam_size), int(num_blocks))


def open_index(index_dir: str, blocks_dir: str = "", expected_dim: Optional[int] = None,
               watch: bool = False, wait_seconds: float = 0.0):
  """The published index of ``index_dir`` and its corpus: ``(handle, blocks_dir)``.

  ``blocks_dir`` defaults to the one the published index's manifest names (the index must then
  exist already). The corpus must be the one the index was built over: the handle checks the
  fingerprint of every index it loads. ``watch``: the handle loads newer indexes to swap in
  (``maybe_swap``); ``wait_seconds``: how long to wait for a first index (``IndexNotReadyError``
  after that).
  """
  latest = None if blocks_dir else publish.read_latest(index_dir)
  if latest is not None:
    blocks_dir = mips_index.read_manifest(latest).get("blocks_dir", "")
    if not blocks_dir:
      raise errors.IndexFormatError(f"{latest}: the index does not name its blocks dir; give "
                                    "blocks_dir")
  # Every version of the corpus (realm-index upsert|delete): an index of an older one fits.
  versions = (corpus_updates.fingerprints(manifests.load_blocks_manifest(blocks_dir))
              if blocks_dir else None)
  handle = handle_lib.IndexHandle(index_dir, expected_fingerprint=versions,
                                  expected_dim=expected_dim, poll_seconds=1.0, watch=watch,
                                  wait_seconds=wait_seconds if blocks_dir else 0.0)
  try:
    handle.wait_for_first()
  except errors.FingerprintMismatchError as e:
    raise errors.FingerprintMismatchError(
        f"{blocks_dir} is another corpus than the one of the index in {index_dir}: {e}") from None
  return handle, blocks_dir


def build_input_builder(model: configs.RealmModelConfig, index_dir: str, blocks_dir: str = "",
                        retriever_beam_size: int = 5000, reader_beam_size: int = 5,
                        max_gold_spans: int = 32, trainable_blocks: int = 0,
                        watch: bool = False, wait_seconds: float = 0.0,
                        retriever: str = "dense", block_prior: Optional[str] = None
                        ) -> inputs_lib.OpenQaInputBuilder:
  """The host side of a model over an index: the index, its embeddings, the block texts and
  titles and the tokenizer (``open_index`` for ``blocks_dir``, ``watch``, ``wait_seconds``).

  ``trainable_blocks`` N > 0: the builder also gives the top N beam blocks' block-tower inputs,
  packed from the block store per batch as the refresher packs the corpus. ``retriever``,
  ``block_prior``: ``inputs.OpenQaInputBuilder``'s.
  """
  handle, blocks_dir = open_index(index_dir, blocks_dir, model.retriever.projection_size,
                                  watch=watch, wait_seconds=wait_seconds)
  tokenizer = RealmTokenizer(model.vocab_file, lower_case=model.lower_case)
  # Texts and titles memory-mapped from the block store, decoded when read.
  store = block_store.BlockStore.open(blocks_dir, cls_id=tokenizer.cls_id,
                                      sep_id=tokenizer.sep_id,
                                      fingerprint=handle.manifest.get("corpus_fingerprint"))
  bodies = store.texts.blocks()
  logging.info("open-qa: index %s (%d blocks), corpus %s", handle.path, len(bodies), blocks_dir)
  return inputs_lib.OpenQaInputBuilder(
      bodies, handle.embeddings(), handle.search, tokenizer,
      query_seq_length=model.retriever.query_seq_length,
      reader_seq_length=model.reader.openqa_seq_length,
      retriever_beam_size=beam_size(retriever_beam_size, len(bodies)),
      reader_beam_size=reader_beam_size, max_gold_spans=max_gold_spans,
      titles=store.titles.blocks(), blocks=store if trainable_blocks else None,
      block_seq_length=model.retriever.block_seq_length, trainable_blocks=trainable_blocks,
      handle=handle, retriever=retriever, block_prior=block_prior)


def feature_signature(cfg: configs.OpenQaTaskConfig, num_blocks: int,
                      block_prior: bool = False) -> Dict[str, tf.TensorSpec]:
  """The shapes of one question's features (``inputs.FEATURES``, the ``beam_block_*``
  inputs of the block tower with ``trainable_blocks``, and ``block_prior`` when the beam's
  rule gives one) over a corpus of ``num_blocks``."""
  model = cfg.model
  lq, lr = model.retriever.query_seq_length, model.reader.openqa_seq_length
  beam, read = beam_size(cfg.retriever_beam_size, num_blocks), cfg.reader_beam_size
  gold, dim = cfg.max_gold_spans, model.retriever.projection_size
  spec = lambda shape, dtype=tf.int32: tf.TensorSpec(shape, dtype)
  signature = dict(
      question_word_ids=spec([lq]), question_mask=spec([lq]), question_type_ids=spec([lq]),
      beam_ids=spec([beam]), beam_emb=spec([beam, dim], tf.float32),
      retriever_correct=spec([beam]), reader_word_ids=spec([read, lr]),
      reader_mask=spec([read, lr]), reader_type_ids=spec([read, lr]),
      gold_starts=spec([read, gold]), gold_ends=spec([read, gold]),
      gold_mask=spec([read, gold]), question_index=spec([]))
  if cfg.trainable_blocks:
    fresh = [cfg.trainable_blocks, model.retriever.block_seq_length]
    signature.update({k: spec(fresh) for k in BLOCK_TOWER_FEATURES})
  if block_prior:
    signature["block_prior"] = spec([read], tf.float32)
  return signature
