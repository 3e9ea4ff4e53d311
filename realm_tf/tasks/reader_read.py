"""Reading warm start of the reader: REALM's loss over a fixed pair of blocks, on other corpora.

The paper's reader starts from BERT, which already fills a mask from a passage that holds the
answer. A toy reader trained from scratch on the corpus it is evaluated on memorizes the facts
instead, and then gains nothing from a retrieved block, so REALM's retriever gets no signal
(experiments/NOTES.md, section 2). This task teaches the reader to read on *other*
corpora, where memorizing does not pay: the demo uses worlds with the same names and other
facts (``synthetic_world.generate_world(name_seed=...)``).

Each masked sentence of those corpora (a salient span, as REALM masks) is read beside two
candidates: the null block, and the block (not the sentence's own) that holds the answer and
shares the most IDF-weighted wordpieces with the query (when no block holds the answer: the
block that shares the most). The loss is REALM's marginal likelihood with a uniform
``p(z|x)``, so the reader learns to use a block that helps and to fall back on the null
block's prior otherwise.

With ``distractors`` D > 0, each sentence is also read beside the D blocks that share the most
IDF-weighted wordpieces with it but do not hold its answer (the kind of block a retriever that
matches sentence templates ranks first), and the loss adds their mean ``-log p(y|z,x)``: the
reader learns to predict from the query alone when a block does not help, as BERT does,
instead of copying a name of the right kind from any block. It logs ``distractor_gain``, what a
distractor adds over the null block (nats per masked span; near 0 is the goal, very negative
means a confidently wrong reader).
"""

import logging
from typing import Dict, List

import numpy as np
import tensorflow as tf
import tf_keras
from official.core import task_factory

from realm_tf import configs
from realm_tf import model_dir as model_dir_lib
from realm_tf import modeling
from realm_tf.data import answers
from realm_tf.data import loaders
from realm_tf.data import manifests
from realm_tf.modeling import losses
from realm_tf.tasks import base
from realm_tf.modeling.models import ReaderModel, read_candidates
from realm_tf.tasks import candidates as candidates_lib
from realm_tf.tokenization import RealmTokenizer

_CHUNK = 1024     # queries per chunk of lexical_scores
READER_FEATURES = ("reader_word_ids", "reader_mask", "reader_type_ids", "mlm_positions",
                   "mlm_ids", "mlm_weights")


def lexical_scores(query_ids: np.ndarray, query_mask: np.ndarray, blocks: List[Dict],
                   ignore_ids=()) -> np.ndarray:
  """``[n, num_blocks]``: the IDF-weighted count of distinct wordpieces query and block share."""
  vocab = 1 + max(max(max(b["token_ids"]) for b in blocks), int(query_ids.max()))
  in_block = np.zeros([len(blocks), vocab], np.float32)
  for i, b in enumerate(blocks):
    in_block[i, b["token_ids"]] = 1
  idf = np.log(len(blocks) / (1.0 + in_block.sum(0)))
  idf[list(ignore_ids)] = 0
  weighted = (in_block * idf).T                                              # [vocab, blocks]
  scores = np.zeros([len(query_ids), len(blocks)], np.float32)
  # Queries a chunk at a time: a dense [n, vocab] row set of a real corpus's ~10^5 sentences
  # would take gigabytes.
  for start in range(0, len(query_ids), _CHUNK):
    ids, mask = query_ids[start:start + _CHUNK], query_mask[start:start + _CHUNK]
    in_query = np.zeros([len(ids), vocab], np.float32)
    for i, (row, row_mask) in enumerate(zip(ids, mask)):
      in_query[i, row[row_mask > 0]] = 1
    scores[start:start + len(ids)] = in_query @ weighted
  return scores


def answer_block_candidates(blocks: List[Dict], examples: Dict[str, np.ndarray],
                            ignore_ids=(), distractors: int = 0):
  """Candidate rows ``[n, 2 + distractors]`` (the null row ``len(blocks)``, the reading block,
  then the distractors) and whether each reading block holds the answer ``[n]``.

  The reading block is the best lexical match (``lexical_scores``) among the blocks that hold
  the example's answer (``answers.holds_answer``), the query's own block excluded; the best
  lexical match overall when none holds it. The distractors are the best lexical matches that
  do not hold the answer (neither the query's own block nor the reading block).
  """
  scores = lexical_scores(examples["query_ids"], examples["query_mask"], blocks, ignore_ids)
  uids = np.array([b["uid"] for b in blocks])
  source = np.array([u.decode() if isinstance(u, bytes) else u for u in examples["source_uid"]])
  scores[uids[None, :] == source[:, None]] = -np.inf
  bodies = [answers.words(b["body"]) for b in blocks]
  wanted = [answers.words(a) for a in examples["answer"]]
  holds = np.array([[a in body for body in bodies] for a in wanted]) & np.isfinite(scores)
  best = np.argmax(np.where(holds, scores, -np.inf), axis=1)
  fallback = np.argmax(scores, axis=1)
  found = holds.any(axis=1)
  reading = np.where(found, best, fallback)
  candidates = [np.full(len(wanted), len(blocks)), reading]
  if distractors:
    other = np.where(holds, -np.inf, scores)
    other[np.arange(len(reading)), reading] = -np.inf
    if (np.isfinite(other).sum(axis=1) < distractors).any():
      raise loaders.InputError(f"fewer than {distractors} blocks without the answer for some "
                               "sentence; use fewer distractors or a larger corpus")
    candidates += list(np.argsort(-other, axis=1, kind="stable")[:, :distractors].T)
  return np.stack(candidates, axis=1).astype(np.int32), found


def reading_features(loader: loaders.MaskedExamplesLoader, blocks_dir: str,
                     model: configs.RealmModelConfig, cls_id: int, sep_id: int,
                     ignore_ids=(), distractors: int = 0) -> Dict[str, np.ndarray]:
  """Reader inputs over (null, reading block, distractors) for every masked sentence of one
  corpus."""
  blocks = manifests.read_blocks(blocks_dir)
  examples = loader.read_all()
  builder = candidates_lib.CandidateBuilder(
      blocks, model.replace(num_candidates=2 + distractors), None, cls_id, sep_id)
  candidates, found = answer_block_candidates(blocks, examples, ignore_ids, distractors)
  features = builder.features(examples, candidates=candidates)
  return dict({k: features[k] for k in READER_FEATURES}, holds_answer=found)


@task_factory.register_task_cls(configs.ReaderReadTaskConfig)
class ReaderReadTask(base.RealmBaseTask):
  """REALM's marginal likelihood over (null block, reading block) with ``p(z|x)`` uniform."""

  def build_model(self) -> ReaderModel:
    return ReaderModel(modeling.build_reader(self.task_config.model.reader))

  def initialize(self, model: ReaderModel):
    """Restores the whole reader, MLM head included, from ``init_checkpoint`` (an earlier
    reading warm start, or a converted BERT whose head ``realm-convert`` wrote, fresh when the
    BERT had none). Strict: this task trains the MLM head, so a start without it is refused,
    naming the missing variables, instead of starting a head afresh unnoticed."""
    if self.task_config.init_checkpoint:
      model_dir_lib.restore(model_dir_lib.resolve_checkpoint(self.task_config.init_checkpoint),
                            reader=model.reader)

  def model_dir_config(self):
    return self.task_config.model, self.task_config.model.vocab_file

  def build_inputs(self, params: configs.ReadingDataConfig, input_context=None):
    cfg = self.task_config
    if len(params.input_path) != len(params.blocks_dir):
      raise configs.ConfigError(
          f"reading warm start: {len(params.input_path)} input paths but "
          f"{len(params.blocks_dir)} blocks dirs; give one blocks_dir per input_path")
    tokenizer = RealmTokenizer(cfg.model.vocab_file, lower_case=cfg.model.lower_case)
    special = (0, tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id)
    parts = []
    for path, blocks_dir in zip(params.input_path, params.blocks_dir):
      loader = loaders.MaskedExamplesLoader(params, cfg.model.retriever.query_seq_length,
                                            cfg.model.max_masks, input_path=path)
      parts.append(reading_features(loader, blocks_dir, cfg.model, tokenizer.cls_id,
                                    tokenizer.sep_id, special, cfg.distractors))
    features = {k: np.concatenate([p[k] for p in parts]) for k in READER_FEATURES}
    held = np.concatenate([p["holds_answer"] for p in parts])
    logging.info("reading warm start: %d examples, %.0f%% with a block holding the answer",
                 len(held), 100 * held.mean())
    return loaders.distribute(tf.data.Dataset.from_tensor_slices(features), params,
                              input_context, shuffle_buffer_size=len(held)).prefetch(2)

  def build_losses(self, labels, model_outputs, aux_losses=None) -> tf.Tensor:
    """This replica's share of the global per-token mean of ``-log p(y|x)``
    (``model_outputs``: ``losses.realm_metrics``)."""
    return losses.realm_loss_share(model_outputs)

  def build_metrics(self, training=None):
    names = ["mlm_accuracy", "reading_gain"]
    names += ["distractor_gain"] if self.task_config.distractors else []
    return [tf_keras.metrics.Mean(n) for n in names]

  def forward(self, inputs, model, metrics, training: bool):
    logits = read_candidates(model.reader, inputs, training=training)       # [b, 2 + D, ...]
    # p(z|x) uniform over the null and the reading block.
    m = losses.realm_metrics(tf.zeros([tf.shape(logits)[0], 2]), logits[:, :2],
                             inputs["mlm_ids"], inputs["mlm_weights"])
    loss = self.build_losses(inputs, m)
    weights = inputs["mlm_weights"]
    log_p = losses.marginal_log_likelihood(tf.zeros(tf.shape(logits)[:2]), logits,
                                           inputs["mlm_ids"])["token_log_p_given_z"]
    # What each block adds over the null block, in nats per masked span.
    span_log_p = tf.reduce_sum(log_p * weights[:, None, :], -1)                 # [b, 2 + D]
    if self.task_config.distractors:
      # Their mean -log p(y|z,x), per real mask token of the global batch.
      distracted = -tf.reduce_sum(tf.reduce_mean(log_p[:, 2:], axis=1) * weights)
      loss += losses.global_mean_share(distracted, tf.reduce_sum(weights))
    if metrics:
      by_name = {metric.name: metric for metric in metrics}
      by_name["mlm_accuracy"].update_state(m["correct"] / tf.maximum(m["num_tokens"], 1.0),
                                           sample_weight=m["num_tokens"])
      by_name["reading_gain"].update_state(span_log_p[:, 1] - span_log_p[:, 0])
      if "distractor_gain" in by_name:
        by_name["distractor_gain"].update_state(
            tf.reduce_mean(span_log_p[:, 2:], axis=1) - span_log_p[:, 0])
    return loss
