"""Open-QA fine-tuning (ORQA's recipe, which REALM fine-tunes with), as a Model Garden task.

Per question (``language/orqa/models/orqa_model.py``):

* host: embed the question with the *current* query tower, search the frozen index for the
  retriever beam, mark the blocks that hold an answer, build the reader inputs of the top
  ``reader_beam_size`` blocks and their gold spans (``openqa/inputs.py``; the index and
  the corpus are opened by ``openqa/host.py``, as for ``OpenQA.load``);
* device (fixed shapes, one XLA-compilable step): recompute the beam's retriever logits
  ``q . e(z)`` with the current query tower, read the top blocks, score every span of at most
  ``max_span_width`` wordpieces (span MLP + the block's retriever logit), and ORQA's loss
  (``modeling/openqa_losses.py``).

Where retrieval runs: on the host, as in ORQA (its ``retrieve`` is pinned to ``/cpu:0``). The
input pipeline calls the live query tower (no ``tf.data`` prefetch: a batch is retrieved with
the weights of the step before it, or the one before that where a strategy fetches a batch
ahead) and searches the index on the host CPU; the device step only sees fixed-shape tensors
(``beam_emb`` ``[b, 5000, 128]`` is 2.6 MB a question) and recomputes the beam's scores with
the current weights, so the gradient is exact. Untested on TPU: there the pipeline's
query-tower call is a small eager TPU program per batch.
At 13.3M blocks the host holds one ScaNN index (ORQA's own settings) and the block texts; the
device needs nothing of the corpus. Which blocks hold an answer is a text test
(``HasAnswer``, and regular expressions for CuratedTrec) that a device cannot run, which is
why the beam is built on the host rather than by a device-side top-k.

A trainable block tower (``trainable_blocks`` N > 0; the limitation the paper lists, and a
row of ``experiments/synthetic/tables.py``): the model gets its own block tower, started from
the one that built the index; the host adds the top N beam blocks' block-tower inputs
``beam_block_*`` ``[b, N, Lb]``, the device embeds them with the current block tower (so the
retriever loss trains it; the rest of the beam keeps the index's embeddings), and
``realm-refresh`` on this model directory re-embeds the corpus while fine-tuning goes on. The
host side is then built at the first batch (the refresher's first index needs ``ckpt-0``) and
swaps in each newer index, and its embeddings, between batches. Evaluate such a model against
an index of its own block tower (the refresher's last, or ``realm-index build``).

Training records in the model directory which block tower the query tower is fine-tuned
against (``block_tower.json``, ``model_dir.write_block_tower``; ``realm-serve`` serves no index
of another): the fingerprint of the frozen index's tower (its manifest's ``block_tower``), or,
with ``trainable_blocks``, the model's own, so that the right index is one built from the served
checkpoint (the refresher's last, built from the final checkpoint).

Metrics (per question, means): ``exact_match`` (the predicted span is a gold span; ORQA's
``exact_match``, which picks the best checkpoint), ``official_exact_match`` (validation only:
the predicted text, mapped back to the block's characters, under ORQA's ``eval_utils``
normalization), ``reader_oracle``, ``top_{k}_match``, ``retriever_loss``, ``reader_loss``, and
how often each loss term is dropped because nothing is correct (``no_correct_in_beam``,
``no_correct_read``).
"""

import logging
import os
from typing import Dict, List, Optional

import numpy as np
import tensorflow as tf
import tf_keras
from official.core import task_factory

from realm_tf import configs
from realm_tf import model_dir as model_dir_lib
from realm_tf.data import loaders
from realm_tf.data import manifests
from realm_tf.modeling import embedder as embedder_lib
from realm_tf.modeling import losses
from realm_tf.modeling import openqa_losses
from realm_tf.modeling.models import OpenQaModel
from realm_tf.openqa import host
from realm_tf.openqa import inputs as inputs_lib
from realm_tf.openqa import predict
from realm_tf.retrieval.publication import handle as handle_lib
from realm_tf.retrieval.sparse import hybrid
from realm_tf.tasks import base

PREDICTION_KEYS = ("question_index", "predicted_block", "predicted_start", "predicted_end")


@task_factory.register_task_cls(configs.OpenQaTaskConfig)
class OpenQaTask(base.RealmBaseTask):
  """ORQA's Open-QA fine-tuning (see the module docstring)."""

  def __init__(self, params: configs.OpenQaTaskConfig, logging_dir=None, name="openqa"):
    super().__init__(params, logging_dir=logging_dir, name=name)
    self._model: Optional[OpenQaModel] = None
    self._builder: Optional[inputs_lib.OpenQaInputBuilder] = None
    self._questions: Dict[bool, List[inputs_lib.Question]] = {}
    self._embed = None
    # The last evaluation's questions: {"question", "prediction", "correct"}, in file order.
    self.question_records: List[Dict] = []

  # ---------------------------------------------------------------------- model --

  def model_dir_config(self):
    """The fine-tuned model's directory config: the query tower is no longer the block tower,
    so the two are not shared (the block embeddings stay those of the index)."""
    model = self.task_config.model.replace(
        retriever=self.task_config.model.retriever.replace(share_embedders=False))
    return model, self.task_config.model.vocab_file

  def build_model(self) -> OpenQaModel:
    self._model = OpenQaModel.from_config_dataclass(
        self.task_config.model, block_tower=self.task_config.trainable_blocks > 0)
    return self._model

  def initialize(self, model: OpenQaModel):
    cfg = self.task_config
    sources = [(cfg.init_checkpoint, dict(query_embedder=model.query_embedder,
                                          reader=model.reader)),
               (cfg.retriever_init_checkpoint, dict(query_embedder=model.query_embedder)),
               (cfg.reader_init_checkpoint, dict(reader=model.reader))]
    for path, items in sources:
      if path:
        # allow_missing: a warm start. ORQA's span scorer is new at fine-tuning, so a REALM,
        # ICT or MLM start lacks it (and ICT lacks the reader); it starts fresh. Reloading a
        # fine-tuned model for answering (predict.OpenQA.load) is strict.
        model_dir_lib.restore(model_dir_lib.resolve_checkpoint(path), allow_missing=True,
                              **items)
        logging.info("open-qa: %s from %s", ", ".join(items), path)
    if model.block_embedder is not None:
      # The trainable block tower starts as the tower that built the index: it must exist.
      path = cfg.retriever_init_checkpoint or cfg.init_checkpoint
      if not path:
        raise configs.ConfigError("trainable_blocks needs the block tower to start from: set "
                                  "task.init_checkpoint or task.retriever_init_checkpoint")
      model_dir_lib.restore(model_dir_lib.resolve_checkpoint(path),
                            block_embedder=model.block_embedder)
      logging.info("open-qa: block_embedder (trainable) from %s", path)

  # --------------------------------------------------------------------- inputs --

  def builder(self) -> inputs_lib.OpenQaInputBuilder:
    """The host side (``openqa.host``): the index, its embeddings and block texts, the
    tokenizer; with ``trainable_blocks``, waiting for the refresher's first index and watching
    for newer ones."""
    if self._builder is None:
      cfg = self.task_config
      if not cfg.index_dir:
        raise configs.ConfigError("task.index_dir is not set: the Open-QA task searches a "
                                  "frozen index (realm-index build --model_dir=<the initial "
                                  "model>)")
      trainable = cfg.trainable_blocks > 0
      self._builder = host.build_input_builder(
          cfg.model, cfg.index_dir, cfg.blocks_dir, cfg.retriever_beam_size,
          cfg.reader_beam_size, cfg.max_gold_spans, cfg.trainable_blocks,
          watch=trainable and cfg.refresh_index,
          wait_seconds=cfg.index_wait_seconds if trainable else 0.0, retriever=cfg.retriever)
    return self._builder

  def _record_block_tower(self) -> None:
    """Writes the model directory's ``block_tower.json`` (see the module docstring)."""
    if not self.logging_dir:
      return
    if self.task_config.trainable_blocks:
      record = {"own": True}
    else:
      handle = self.builder().handle
      tower = handle_lib.block_tower_id(handle.manifest)
      if tower is None:
        logging.warning("open-qa: the index %s records no block tower: realm-serve will pin "
                        "the tower of the index it starts with", handle.path)
        return
      record = {"fingerprint": tower, "index": os.path.basename(handle.path)}
    model_dir_lib.write_block_tower(self.logging_dir, record)

  def _embed_questions(self, question_inputs: Dict[str, np.ndarray]) -> np.ndarray:
    if self._model is None:
      raise RuntimeError("build_model must run before the inputs are read")
    if self._embed is None:
      embedder = self._model.query_embedder
      self._embed = embedder_lib.inference_function(embedder)
    inputs = {f"input_{k[9:]}": tf.constant(v) for k, v in question_inputs.items()}
    return self._embed(inputs).numpy().astype(np.float32)

  def build_inputs(self, params: configs.OpenQaDataConfig, input_context=None):
    """Questions -> features of the current query tower (see the module docstring)."""
    cfg = self.task_config
    questions = inputs_lib.load_questions(params.input_path, params.answer_type)
    self._questions[params.is_training] = questions
    if params.is_training:
      self._record_block_tower()
    if cfg.trainable_blocks:
      # The first index comes from the refresher, which needs ckpt-0, which the trainer saves
      # after building its inputs: the host side is built at the first batch.
      if not cfg.blocks_dir:
        raise configs.ConfigError("trainable_blocks needs task.blocks_dir (the refresher "
                                  "builds the first index from ckpt-0)")
      num_blocks = int(manifests.load_blocks_manifest(cfg.blocks_dir)["num_blocks"])
    else:
      num_blocks = len(self.builder().bodies)
    batch = loaders.per_replica_batch_size(params.global_batch_size, input_context)
    indices = np.arange(len(questions))
    if input_context and input_context.num_input_pipelines > 1:
      indices = indices[input_context.input_pipeline_id::input_context.num_input_pipelines]
    if params.is_training and len(indices) < batch:
      raise configs.ConfigError(f"{params.input_path}: {len(indices)} questions, fewer than "
                                f"one batch ({batch})")
    rng = np.random.RandomState(params.seed)

    def generate():
      builder = self.builder()
      cut = builder.count_truncated([q.question for q in questions])
      if cut:
        logging.warning("%s: %d of %d questions are longer than the query length (%d) and are "
                        "truncated", params.input_path, cut, len(questions),
                        builder.query_seq_length)
      order = indices.copy()
      while True:
        if params.is_training:
          rng.shuffle(order)
        stop = len(order) - len(order) % batch if params.is_training else len(order)
        for start in range(0, stop, batch):
          if builder.maybe_swap():
            logging.info("open-qa: swapped in the index of step %d", builder.handle.step)
          chunk = order[start:start + batch]
          chosen = [questions[i] for i in chunk]
          question_inputs = builder.question_inputs([q.question for q in chosen])
          features = builder.features(chosen, self._embed_questions(question_inputs),
                                      question_indices=chunk, question_inputs=question_inputs)
          for row in range(len(chunk)):
            yield {k: v[row] for k, v in features.items()}
        if not params.is_training:
          return

    # A BM25 or fused beam read by its rule's block prior (``inputs.OpenQaInputBuilder``) in
    # training as in answering; with trainable blocks the refresher publishes today's rule.
    prior = cfg.retriever != "dense" and (
        hybrid.FUSION["block_prior"] if cfg.trainable_blocks
        else self.builder().block_prior()) != "retriever"
    dataset = tf.data.Dataset.from_generator(
        generate, output_signature=host.feature_signature(cfg, num_blocks, block_prior=prior))
    # No prefetch: each batch is retrieved with the query tower its step starts from.
    return dataset.batch(batch, drop_remainder=params.is_training)

  # ----------------------------------------------------------------- the steps --

  def build_losses(self, labels, model_outputs, aux_losses=None) -> tf.Tensor:
    """This replica's share of the global mean over questions of ORQA's loss."""
    return losses.global_mean_share(
        tf.reduce_sum(model_outputs["retriever_loss"] + model_outputs["reader_loss"]),
        tf.shape(model_outputs["retriever_loss"])[0])

  def _top_k(self):
    return [k for k in self.task_config.top_k if k <= self.task_config.retriever_beam_size]

  def build_metrics(self, training=None):
    names = ["exact_match", "reader_oracle", "retriever_loss", "reader_loss",
             "no_correct_in_beam", "no_correct_read"] + [f"top_{k}_match" for k in self._top_k()]
    return [tf_keras.metrics.Mean(n) for n in names]

  def forward_outputs(self, inputs, model, metrics, training: bool):
    out = model(inputs, training=training)
    reader_correct = openqa_losses.correct_spans(
        out["span_starts"], out["span_ends"], inputs["gold_starts"], inputs["gold_ends"],
        inputs["gold_mask"])
    terms = openqa_losses.openqa_loss(out["retriever_logits"], inputs["retriever_correct"],
                                      out["reader_logits"], reader_correct)
    loss = self.build_losses(inputs, terms)
    best = predict.predictions(out, inputs)
    span_match = tf.gather_nd(reader_correct, tf.stack([best["block"], best["span"]], -1),
                              batch_dims=1)
    if metrics:
      retrieved = tf.cast(inputs["retriever_correct"], tf.bool)
      values = dict(
          exact_match=span_match,
          reader_oracle=terms["any_reader_correct"],
          retriever_loss=terms["retriever_loss"], reader_loss=terms["reader_loss"],
          no_correct_in_beam=~terms["any_retriever_correct"],
          no_correct_read=~terms["any_reader_correct"],
          **{f"top_{k}_match": tf.reduce_any(retrieved[:, :k], -1) for k in self._top_k()})
      for metric in metrics:
        metric.update_state(tf.cast(values[metric.name], tf.float32))
    return loss, best

  def forward(self, inputs, model, metrics, training: bool):
    return self.forward_outputs(inputs, model, metrics, training)[0]

  def validation_step(self, inputs, model, metrics=None):
    loss, best = self.forward_outputs(inputs, model, metrics, training=False)
    block_id = tf.gather(inputs["beam_ids"], best["block"], batch_dims=1)
    return {self.loss: loss * losses.num_replicas(),
            "question_index": inputs["question_index"], "predicted_block": block_id,
            "predicted_start": best["start"], "predicted_end": best["end"]}

  def aggregate_logs(self, state=None, step_outputs=None):
    state = state if state is not None else {k: [] for k in PREDICTION_KEYS}
    for key in PREDICTION_KEYS:
      state[key].extend(np.concatenate([np.asarray(v).reshape(-1)
                                        for v in step_outputs[key]]).tolist())
    return state

  def reduce_aggregated_logs(self, aggregated_logs, global_step=None):
    """``official_exact_match`` over the validation questions: the predicted span's text in
    the block, scored with ORQA's ``eval_utils`` rules."""
    questions = self._questions.get(False, [])
    builder = self.builder()
    records = {}
    for q_index, block_id, start, end in zip(*(aggregated_logs[k] for k in PREDICTION_KEYS)):
      if q_index < 0 or q_index in records:
        continue
      text = predict.span_text(builder.block_texts([block_id])[0], start, end)
      records[q_index] = {"question": questions[q_index].question, "prediction": text,
                          "correct": bool(inputs_lib.official_match(text, questions[q_index]))}
    # Per question, in the file's order (the mean of "correct" is official_exact_match).
    self.question_records = [records[i] for i in sorted(records)]
    correct = [r["correct"] for r in self.question_records]
    return {"official_exact_match": float(np.mean(correct)) if correct else 0.0,
            "questions": float(len(correct))}

