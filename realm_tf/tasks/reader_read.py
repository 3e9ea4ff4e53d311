"""Reading warm start of the reader: REALM's loss over a fixed pair of blocks, on other corpora.

The paper's reader starts from BERT, which already fills a mask from a passage that holds the
answer. A toy reader trained from scratch on the corpus it is evaluated on memorizes the facts
instead, and then gains nothing from a retrieved block, so REALM's retriever gets no signal
(README, "How the demo's reader came to read"). This task teaches the reader to read on *other*
corpora, where memorizing does not pay: the demo uses worlds with the same names and other
facts (``synthetic_world.generate_world(name_seed=...)``).

Each masked sentence of those corpora (a salient span, as REALM masks) is read beside two
candidates: the null block, and the block (not the sentence's own) that holds the answer and
shares the most IDF-weighted wordpieces with the query (when no block holds the answer: the
block that shares the most). The loss is REALM's marginal likelihood with a uniform
``p(z|x)``, so the reader learns to use a block that helps and to fall back on the null
block's prior otherwise.
"""

import logging
import re
from typing import Dict, List

import numpy as np
import tensorflow as tf
from official.core import base_task
from official.core import task_factory

from realm_tf import configs
from realm_tf import model_dir as model_dir_lib
from realm_tf import modeling
from realm_tf.tasks import losses
from realm_tf.tasks import retrieval_inputs
from realm_tf.tasks.reader_mlm import ReaderModel
from realm_tf.tasks.realm_model import read_candidates

READER_FEATURES = ("reader_word_ids", "reader_mask", "reader_type_ids", "mlm_positions",
                   "mlm_ids", "mlm_weights")


def _words(text: str) -> str:
  return " " + " ".join(re.findall(r"[0-9a-z]+", text.lower())) + " "


def lexical_scores(query_ids: np.ndarray, query_mask: np.ndarray, blocks: List[Dict],
                   ignore_ids=()) -> np.ndarray:
  """``[n, num_blocks]``: the IDF-weighted count of distinct wordpieces query and block share."""
  vocab = 1 + max(max(max(b["token_ids"]) for b in blocks), int(query_ids.max()))
  in_block = np.zeros([len(blocks), vocab], np.float32)
  for i, b in enumerate(blocks):
    in_block[i, b["token_ids"]] = 1
  idf = np.log(len(blocks) / (1.0 + in_block.sum(0)))
  idf[list(ignore_ids)] = 0
  in_query = np.zeros([len(query_ids), vocab], np.float32)
  for i, (ids, mask) in enumerate(zip(query_ids, query_mask)):
    in_query[i, ids[mask > 0]] = 1
  return (in_query * idf) @ in_block.T


def answer_block_candidates(blocks: List[Dict], examples: Dict[str, np.ndarray],
                            ignore_ids=()):
  """Candidate rows ``[n, 2]`` (the null row ``len(blocks)``, then the reading block) and
  whether each reading block holds the answer ``[n]``.

  The reading block is the best lexical match (``lexical_scores``) among the blocks that hold
  the example's answer as whole words, the query's own block excluded; the best lexical
  match overall when none holds it.
  """
  scores = lexical_scores(examples["query_ids"], examples["query_mask"], blocks, ignore_ids)
  uids = np.array([b["uid"] for b in blocks])
  source = np.array([u.decode() if isinstance(u, bytes) else u for u in examples["source_uid"]])
  scores[uids[None, :] == source[:, None]] = -np.inf
  bodies = [_words(b["body"]) for b in blocks]
  answers = [_words(a.decode() if isinstance(a, bytes) else a) for a in examples["answer"]]
  holds = np.array([[a in body for body in bodies] for a in answers]) & np.isfinite(scores)
  best = np.argmax(np.where(holds, scores, -np.inf), axis=1)
  fallback = np.argmax(scores, axis=1)
  found = holds.any(axis=1)
  candidates = np.stack([np.full(len(answers), len(blocks)), np.where(found, best, fallback)],
                        axis=1).astype(np.int32)
  return candidates, found


def reading_features(input_path: str, blocks_dir: str, model: configs.RealmModelConfig,
                     cls_id: int, sep_id: int, ignore_ids=()) -> Dict[str, np.ndarray]:
  """Reader inputs over (null, reading block) for every pre-training example of one corpus."""
  from data_prep import schema  # pylint: disable=g-import-not-at-top
  blocks = schema.read_blocks(blocks_dir)
  examples = retrieval_inputs.read_examples(input_path, model.retriever.query_seq_length,
                                            model.max_masks)
  batches = list(examples.batch(4096).as_numpy_iterator())
  examples = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
  builder = retrieval_inputs.CandidateBuilder(blocks, model.replace(num_candidates=2), None,
                                              cls_id, sep_id)
  candidates, found = answer_block_candidates(blocks, examples, ignore_ids)
  features = builder.features(examples, candidates=candidates)
  return dict({k: features[k] for k in READER_FEATURES}, holds_answer=found)


@task_factory.register_task_cls(configs.ReaderReadTaskConfig)
class ReaderReadTask(base_task.Task):
  """REALM's marginal likelihood over (null block, reading block) with ``p(z|x)`` uniform."""

  @property
  def jit_compile(self) -> bool:
    return self.task_config.jit_compile

  def build_model(self) -> ReaderModel:
    return ReaderModel(modeling.build_reader(self.task_config.model.reader))

  def initialize(self, model: ReaderModel):
    if self.task_config.init_checkpoint:
      model_dir_lib.restore(model_dir_lib.resolve_checkpoint(self.task_config.init_checkpoint),
                            allow_missing=True, reader=model.reader)

  def write_model_metadata(self, model_dir: str):
    model_dir_lib.write_metadata(model_dir, self.task_config.model,
                                 self.task_config.model.vocab_file)

  def build_inputs(self, params: configs.RealmDataConfig, input_context=None):
    from realm_tf.tokenization import RealmTokenizer  # pylint: disable=g-import-not-at-top
    cfg = self.task_config
    paths = [p for p in params.input_path.split(",") if p]
    blocks_dirs = [d for d in params.blocks_dir.split(",") if d]
    if len(paths) != len(blocks_dirs):
      raise configs.ConfigError(
          f"reading warm start: {len(paths)} input paths but {len(blocks_dirs)} blocks dirs; "
          "give one blocks_dir per input_path (comma-separated)")
    tokenizer = RealmTokenizer(cfg.model.vocab_file, lower_case=cfg.model.lower_case)
    special = (0, tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id)
    parts = [reading_features(p, d, cfg.model, tokenizer.cls_id, tokenizer.sep_id, special)
             for p, d in zip(paths, blocks_dirs)]
    features = {k: np.concatenate([p[k] for p in parts]) for k in READER_FEATURES}
    held = np.concatenate([p["holds_answer"] for p in parts])
    logging.info("reading warm start: %d examples, %.0f%% with a block holding the answer",
                 len(held), 100 * held.mean())
    batch_size = (input_context.get_per_replica_batch_size(params.global_batch_size)
                  if input_context else params.global_batch_size)
    ds = tf.data.Dataset.from_tensor_slices(features)
    if input_context and input_context.num_input_pipelines > 1:
      ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    if params.is_training:
      ds = ds.shuffle(len(held), seed=params.seed).repeat()
    return ds.batch(batch_size, drop_remainder=params.is_training).prefetch(2)

  def train_step(self, inputs, model, optimizer, metrics=None):
    with tf.GradientTape() as tape:
      logits = read_candidates(model.reader, inputs, training=True)
      uniform = tf.zeros(tf.shape(logits)[:2])
      m = losses.realm_metrics(uniform, logits, inputs["mlm_ids"], inputs["mlm_weights"])
      local = tf.reduce_sum(m["num_tokens"])
      ctx = tf.distribute.get_replica_context()
      total = ctx.all_reduce(tf.distribute.ReduceOp.SUM, local) if ctx is not None else local
      loss = tf.reduce_sum(m["nll_sum"]) / tf.maximum(total, 1.0)
    variables = model.trainable_variables
    # The pooler takes no part in the MLM loss: leave it out.
    optimizer.apply_gradients((g, v) for g, v in zip(tape.gradient(loss, variables), variables)
                              if g is not None)
    # What the reading block adds over the null block, in nats per masked span.
    span_log_p = tf.reduce_sum(m["token_log_p_given_z"] * inputs["mlm_weights"][:, None, :], -1)
    return dict(loss=loss, correct=tf.reduce_sum(m["correct"]), tokens=local,
                reading_gain=tf.reduce_sum(span_log_p[:, 1] - span_log_p[:, 0]),
                examples=tf.cast(tf.shape(logits)[0], tf.float32))

  def summarize(self, totals: Dict[str, float], num_steps: int) -> Dict[str, float]:
    return dict(loss=totals["loss"] / max(num_steps, 1),
                mlm_accuracy=totals["correct"] / max(totals["tokens"], 1.0),
                reading_gain=totals["reading_gain"] / max(totals["examples"], 1.0))

  def close(self):
    pass
