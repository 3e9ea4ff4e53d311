"""The REALM pre-training task: retrieve -> rescore + read + marginalize (device).

Training inputs retrieve through the index that ``realm-refresh`` publishes in ``index_dir``
(swapped in as newer ones appear, unless ``refresh_index`` is off: the stale-index ablation).
With ``retrieval: host`` the host pipeline retrieves (``candidates.CandidateBuilder``, swaps
between batches); with ``retrieval: device`` the host only parses the masked examples and
each step retrieves on the replicas (``device_retrieval.DeviceRetriever``, swaps between
training loops). Validation measures the model on held-out masked sentences, retrieving
exactly over the corpus embedded with the current block tower at the start of each pass:

* ``recall@k``: zero-shot retrieval recall on the masked sentences: does one of the top-k
  blocks (the sentence's own block excluded) hold the masked answer (``answers.holds_answer``)?
  Over the pass's batches as ``recall@k``, and over every held-out sentence as
  ``held_out_recall@k`` (with ``held_out_sentences``: a cheap, tighter number, as recall reads
  nothing).
* ``retrieval_utility``: ``log p(y_j|x) - log p(y_j|null,x)`` per masked token, averaged over
  every real mask token of the pass (as the original code reports it), reading the null block
  and the top ``num_candidates - 1`` blocks; ``mlm_accuracy`` of the marginal prediction.
* with ``qa_eval_path``, ``qa_recall@k``: zero-shot recall on Open-QA questions (Table 2 of the
  paper): does one of the top-k blocks retrieved for the question (embedded with the current
  query tower, no block excluded) hold an answer? A hit is ORQA's ``HasAnswer``
  (``openqa.inputs.has_answer``) on the block body, the text the Open-QA task tests; and
  ``qa_questions``, how many questions were asked. These and ``held_out_recall@k`` are computed
  on the host in ``validation_begin`` and reach the validation logs and summaries through
  ``reduce_aggregated_logs``.

Training and validation also log the retrieval-health signals (``realm_tf.health``: entropy
ratio, ``p_null``, score margin, candidates holding the answer, the reader's gain from answer
and other blocks, tower cosines, distinct candidates) and ``skipped_duplicates``: the share of
examples whose retrieved blocks repeat a uid, which REALM's example generator skips (here their
mask weights are zeroed, so they add nothing to the loss). ``check_health`` turns the logged
values into alarms (``task.health``); the trainer calls it after every training loop and
validation pass, and the validation's one-line health report is printed.
"""

import hashlib
import logging
from typing import Optional

import numpy as np
import tensorflow as tf
import tf_keras
from official.core import task_factory

from realm_tf import configs
from realm_tf import health as health_lib
from realm_tf import model_dir as model_dir_lib
from realm_tf.data import answers
from realm_tf.data import block_store
from realm_tf.data import loaders
from realm_tf.data import manifests
from realm_tf.modeling import embedder as embedder_lib
from realm_tf.modeling import losses
from realm_tf.modeling.models import RealmPretrainer
from realm_tf.openqa import inputs as openqa_inputs
from realm_tf.retrieval.index import mips_index
from realm_tf.retrieval.publication import corpus_embedding
from realm_tf.retrieval.publication.handle import IndexHandle
from realm_tf.tasks import base
from realm_tf.tasks import candidates as candidates_lib
from realm_tf.tasks import device_retrieval
from realm_tf.tokenization import RealmTokenizer

DEVICE_FEATURES = ("query_word_ids", "query_mask", "query_type_ids", "candidate_word_ids",
                   "candidate_mask", "candidate_type_ids", "reader_word_ids", "reader_mask",
                   "reader_type_ids", "mlm_positions", "mlm_ids", "mlm_weights", "index_step",
                   "candidate_rows", "skipped_duplicates")
# What only host retrieval knows: which candidates hold the masked answer (health signals).
HOST_PATH_FEATURES = DEVICE_FEATURES + ("candidate_holds_answer",)
VALIDATION_FEATURES = HOST_PATH_FEATURES + ("recall_hit",)
EMBED_BATCH = 256   # queries per call of the query tower in validation_begin


def _bits(hits) -> str:
  """Per-item hits as one string of "0" and "1" (``model_dir.append_validation_hits``)."""
  return "".join("1" if h else "0" for h in hits)


def replica_loss(model, features, training: bool):
  """The replicated computation: this replica's loss share and per-example metrics.

  The loss is the mean over all real mask tokens of the global batch of
  ``-log sum_z p(z|x) p(y_j|z,x)``; each replica returns its share (its token sum divided by
  the all-reduced global token count), so summing over replicas gives the global mean and the
  gradients need no further scaling under any strategy. The metrics (``losses.realm_metrics``)
  also carry the model's ``retrieval_logits`` and embeddings, for the health signals.
  """
  out = model(features, training=training)
  m = losses.realm_metrics(out["retrieval_logits"], out["mlm_logits"], features["mlm_ids"],
                           features["mlm_weights"])
  m.update((k, out[k]) for k in ("retrieval_logits", "query_embedding", "candidate_embeddings"))
  return losses.realm_loss_share(m), m


@task_factory.register_task_cls(configs.RealmPretrainTaskConfig)
class RealmPretrainTask(base.RealmBaseTask):
  """REALM pre-training with validation (see the module docstring)."""

  validate_at_start = True   # the step-0 recalls that the health alarms compare against

  def __init__(self, params: configs.RealmPretrainTaskConfig, logging_dir=None, name="realm"):
    super().__init__(params, logging_dir=logging_dir, name=name)
    if params.retrieval not in ("host", "device"):
      raise configs.ConfigError(f"task.retrieval must be 'host' or 'device', got "
                                f"{params.retrieval!r}")
    self._builder = None           # training: retrieves through the published index
    self._device = None            # retrieval: device: the sharded corpus and its index
    self._device_handle = None
    self._corpus = None            # retrieval: device: (store, uid groups), opened once
    self._eval_builder = None      # validation: exact retrieval with the current towers
    self._frozen_index = None      # freeze_block_tower: the corpus embedded once
    self._eval_loader = None
    self._eval_features = None
    self._embed_query = None
    self._qa = None                # (questions, their query inputs), read once
    self._qa_logs = {}             # this validation pass's host-side numbers
    self._health = health_lib.HealthMonitor(params.health,
                                            (f"recall@{params.recall_at}",
                                             f"qa_recall@{params.recall_at}"))

  # ---- model ----
  def build_model(self) -> RealmPretrainer:
    model = RealmPretrainer.from_config_dataclass(self.task_config.model)
    if self.task_config.freeze_block_tower:
      if model.block_embedder is model.query_embedder:
        raise configs.ConfigError("task.freeze_block_tower needs two towers; these share one "
                                  "(task.model.retriever.share_embedders)")
      model.block_embedder.trainable = False
    return model

  def initialize(self, model: RealmPretrainer):
    """Restores the towers from the ICT (or converted) checkpoint and the reader, if given."""
    cfg = self.task_config
    if cfg.retriever_init_checkpoint:
      path = model_dir_lib.resolve_checkpoint(cfg.retriever_init_checkpoint)
      if model.query_embedder is model.block_embedder:
        model_dir_lib.restore(path, query_embedder=model.query_embedder,
                              block_embedder=model.block_embedder)
      else:
        # Untied towers restore one at a time: a shared tower's checkpoint saved its two names
        # as one object, which one restore cannot bind to two.
        for name in ("query_embedder", "block_embedder"):
          model_dir_lib.restore(path, **{name: getattr(model, name)})
      logging.info("retriever initialized from %s", path)
    if cfg.reader_init_checkpoint:
      path = model_dir_lib.resolve_checkpoint(cfg.reader_init_checkpoint)
      # Strict, like the towers: the reader's start (the reader warm start's model directory,
      # or a converted BERT, test_paper_recipe) holds the whole reader, MLM head included.
      model_dir_lib.restore(path, reader=model.reader)
      logging.info("reader initialized from %s", path)

  def model_dir_config(self):
    return self.task_config.model, self.task_config.model.vocab_file

  # ---- inputs ----
  def candidate_builder(self, handle=None) -> candidates_lib.CandidateBuilder:
    """The host pipeline over ``train_data.blocks_dir`` and the index in ``index_dir``.

    Waits (up to ``index_wait_seconds``) for the first index when no ``handle`` is given.
    """
    cfg = self.task_config
    blocks_dir = cfg.train_data.blocks_dir
    manifest = manifests.load_blocks_manifest(blocks_dir)
    if handle is None:
      handle = IndexHandle(cfg.index_dir, expected_fingerprint=manifest["fingerprint"],
                           expected_dim=cfg.model.retriever.projection_size,
                           wait_seconds=cfg.index_wait_seconds, watch=cfg.refresh_index,
                           poll_seconds=cfg.index_poll_seconds)
      handle.wait_for_first()
    return self.builder_over(blocks_dir, handle)

  def builder_over(self, blocks_dir: str, handle=None) -> candidates_lib.CandidateBuilder:
    """The host pipeline over ``blocks_dir``, retrieving through ``handle`` (None: only exact
    retrieval, ``exact_candidates``)."""
    cfg = self.task_config
    tokenizer = RealmTokenizer(cfg.model.vocab_file, lower_case=cfg.model.lower_case)
    return candidates_lib.CandidateBuilder.from_blocks_dir(
        blocks_dir, cfg.model, handle, tokenizer.cls_id, tokenizer.sep_id,
        refresh=cfg.refresh_index)

  def loader(self, params: configs.MaskedLmDataConfig) -> loaders.MaskedExamplesLoader:
    """The masked examples of a data config, at the model's query length and masks."""
    model = self.task_config.model
    return loaders.get_loader(params, query_seq_length=model.retriever.query_seq_length,
                              max_masks=model.max_masks)

  def build_inputs(self, params: configs.MaskedLmDataConfig, input_context=None):
    # Training batches are always full (the loader drops the remainder): a static batch
    # dimension, as a TPU needs. Validation's last batch may be partial.
    batch = loaders.per_replica_batch_size(params.global_batch_size, input_context)
    signature = candidates_lib.feature_signature(self.task_config.model,
                                                 batch if params.is_training else None)
    signature["recall_hit"] = tf.TensorSpec([None], tf.float32)
    if not params.is_training:
      return self._validation_inputs(params, input_context, signature)
    examples = self.loader(params).load(input_context)
    if self.task_config.retrieval == "device":
      return self._device_inputs(examples, signature)

    def generate():
      # Built at the first batch, not here: the first index needs ckpt-0, which the trainer
      # saves after building its inputs.
      if self._builder is None:
        self._builder = self.candidate_builder()
      builder = self._builder
      for batch in examples.as_numpy_iterator():
        if builder.maybe_swap():
          logging.info("swapped in the index of step %d", builder.handle.step)
        features = builder.features(batch)
        yield {k: features[k] for k in HOST_PATH_FEATURES}

    return tf.data.Dataset.from_generator(
        generate, output_signature={k: signature[k] for k in HOST_PATH_FEATURES}).prefetch(1)

  # ---- retrieval: device ----
  def _device_corpus(self):
    """The block store of ``train_data.blocks_dir`` and its uid groups (opened once)."""
    if self._corpus is None:
      cfg = self.task_config
      tokenizer = RealmTokenizer(cfg.model.vocab_file, lower_case=cfg.model.lower_case)
      store = block_store.BlockStore.open(cfg.train_data.blocks_dir, cls_id=tokenizer.cls_id,
                                          sep_id=tokenizer.sep_id)
      self._corpus = store, device_retrieval.uid_groups(store)
    return self._corpus

  def _device_inputs(self, examples, signature):
    """The host's share with ``retrieval: device``: the parsed queries and their source
    blocks' uid groups; the step retrieves (``device_retrieval.HOST_FEATURES``)."""
    signature = dict(signature, source_group=tf.TensorSpec(signature["index_step"].shape,
                                                           tf.int32))

    def generate():
      store, groups = self._device_corpus()
      for batch in examples.as_numpy_iterator():
        yield device_retrieval.host_features(batch, self.task_config.model, store, groups)

    return tf.data.Dataset.from_generator(
        generate, output_signature={k: signature[k] for k in device_retrieval.HOST_FEATURES}
    ).prefetch(1)

  def before_train_loop(self, model):
    """Called by the trainer on the host before each training loop (under the strategy's
    scope). With ``retrieval: device``: builds the sharded corpus on the first call, waiting
    for the first index, and swaps in a newer index's embeddings on later ones."""
    del model
    cfg = self.task_config
    if cfg.retrieval != "device":
      return
    if self._device is None:
      store, groups = self._device_corpus()
      handle = IndexHandle(cfg.index_dir, expected_fingerprint=store.fingerprint,
                           expected_dim=cfg.model.retriever.projection_size,
                           wait_seconds=cfg.index_wait_seconds, watch=cfg.refresh_index,
                           poll_seconds=cfg.index_poll_seconds)
      handle.wait_for_first()
      self._device = device_retrieval.DeviceRetriever(store, cfg.model, store.cls_id,
                                                      store.sep_id, groups=groups)
      self._device_handle = handle
    elif not (cfg.refresh_index and self._device_handle.maybe_swap()):
      return
    self._device.load(self._device_handle.embeddings(), self._device_handle.step)
    logging.info("retrieving on the device with the index of step %d",
                 self._device_handle.step)

  def _validation_inputs(self, params, input_context, signature):
    """Batches of the features that ``validation_begin`` prepared for this pass."""
    self._eval_loader = self.loader(params)
    batch_size = loaders.per_replica_batch_size(params.global_batch_size, input_context)
    pipelines = input_context.num_input_pipelines if input_context else 1
    pipeline = input_context.input_pipeline_id if input_context else 0

    def generate():
      if self._eval_features is None:
        raise RuntimeError("validation_begin(model) must run before a validation pass")
      features = {k: v[pipeline::pipelines] for k, v in self._eval_features.items()}
      for start in range(0, len(features["recall_hit"]), batch_size):
        yield {k: v[start:start + batch_size] for k, v in features.items()}

    return tf.data.Dataset.from_generator(
        generate, output_signature={k: signature[k] for k in VALIDATION_FEATURES})

  def validation_begin(self, model: RealmPretrainer):
    """Embeds the corpus with the current block tower and retrieves for the held-out
    sentences exactly (called by the trainer at the start of each validation pass), giving
    ``held_out_recall@k`` over all of them; with ``qa_eval_path``, also for the QA questions,
    giving this pass's ``qa_recall@k``."""
    cfg = self.task_config
    builder = self.validation_builder()
    examples = self._eval_loader.read_all()
    depth = min(max(cfg.recall_at, builder.k - 1) + builder.search_slack, builder.null_row)
    candidates, ranked, index = self.exact_candidates(model, examples, depth)
    hits = [any(answers.holds_answer(builder.bodies_text[b], answer)
                for b in builder.non_trivial(row, uid)[:cfg.recall_at])
            for row, uid, answer in zip(ranked, examples["source_uid"], examples["answer"])]
    features = builder.features(examples, candidates=candidates)
    self._eval_features = dict({k: features[k] for k in HOST_PATH_FEATURES},
                               recall_hit=np.asarray(hits, np.float32))
    # Recall needs no reading, so it is measured over every held-out sentence, not only the
    # pass's batches (whose ``recall@k`` the health monitor follows).
    self._qa_logs = {f"held_out_recall@{cfg.recall_at}": float(np.mean(hits)),
                     "held_out_sentences": float(len(hits))}
    self._hits = {"k": cfg.recall_at, "held_out": _bits(hits)}
    if cfg.qa_eval_path:
      self._qa_logs.update(self._qa_recall(model, index, builder))

  def validation_blocks_dir(self) -> str:
    """The validation corpus: ``validation_data.blocks_dir``, else ``train_data``'s."""
    cfg = self.task_config
    return cfg.validation_data.blocks_dir or cfg.train_data.blocks_dir

  def validation_builder(self) -> candidates_lib.CandidateBuilder:
    """The candidate builder over the validation corpus, for exact retrieval; built once."""
    if self._eval_builder is None:
      self._eval_builder = self.builder_over(self.validation_blocks_dir())
    return self._eval_builder

  def exact_candidates(self, model: RealmPretrainer, examples, depth: Optional[int] = None):
    """Exact retrieval with ``model``'s current towers over the whole validation corpus.

    The corpus is embedded with the block tower and searched exactly for the queries of
    ``examples`` (a loader's ``read_all()``) embedded with the query tower; each query's
    candidates are picked by the training rules (``CandidateBuilder.select_candidates``).

    Returns:
      ``(candidates, ranked, index)``: the block ids of each query's candidates
      ``[n, num_candidates]`` (the null block first), its top ``depth`` block ids (default:
      the whole corpus) and the brute-force index, for searches with other queries.
    """
    builder = self.validation_builder()
    index = self.corpus_index(model)
    queries = self._embed_queries(model, examples["query_ids"], examples["query_mask"])
    ranked, _ = index.search(queries, min(depth or builder.null_row, index.num_live))
    return builder.select_candidates(ranked, examples["source_uid"]), ranked, index

  def corpus_index(self, model: RealmPretrainer):
    """A brute-force index of the validation corpus embedded with ``model``'s block tower
    (blocks deleted by updates are never retrieved); with ``freeze_block_tower``, built once."""
    if self.task_config.freeze_block_tower and self._frozen_index is not None:
      return self._frozen_index
    model_config, blocks_dir = self.task_config.model, self.validation_blocks_dir()
    builder = self.validation_builder()
    ids, emb = corpus_embedding.embed_corpus(
        model.block_embedder, blocks_dir, model_config.retriever.block_seq_length,
        model_config.vocab_file, model_config.lower_case, progress=False)
    index = mips_index.BruteForceIndex(
        corpus_embedding.assemble_rows(ids, emb, builder.null_row, where=blocks_dir),
        deleted=builder.store.deleted)
    if self.task_config.freeze_block_tower:
      self._frozen_index = index
    return index

  def _embed_queries(self, model: RealmPretrainer, word_ids, mask) -> np.ndarray:
    """Query-tower embeddings (float32 ``[n, dim]``) of ``[CLS] ... [SEP]`` inputs."""
    if self._embed_query is None or self._embed_query[0] is not model:
      self._embed_query = model, embedder_lib.inference_function(model.query_embedder,
                                                                 float32=True)
    embed = self._embed_query[1]
    return np.concatenate([
        embed(dict(input_word_ids=word_ids[i:i + EMBED_BATCH],
                   input_mask=mask[i:i + EMBED_BATCH],
                   input_type_ids=np.zeros_like(word_ids[i:i + EMBED_BATCH]))).numpy()
        for i in range(0, len(word_ids), EMBED_BATCH)])

  def qa_questions(self):
    """The questions of ``qa_eval_path`` and their query inputs ``[CLS] question [SEP]`` at
    ``query_seq_length`` (as the Open-QA task feeds its query tower); read once."""
    if self._qa is None:
      cfg = self.task_config
      questions = openqa_inputs.load_questions(cfg.qa_eval_path, cfg.qa_answer_type)
      tokenizer = RealmTokenizer(cfg.model.vocab_file, lower_case=cfg.model.lower_case)
      inputs = tokenizer.query_inputs([q.question for q in questions],
                                      seq_length=cfg.model.retriever.query_seq_length)
      self._qa = questions, {k: v.numpy() for k, v in inputs.items()}
    return self._qa

  def qa_hits(self, model, index, builder, k: int):
    """Per question of ``qa_eval_path``, in order: does one of the top ``k`` blocks retrieved
    for it (``index``, searched with ``model``'s query tower) hold an answer?"""
    questions, inputs = self.qa_questions()
    embeddings = self._embed_queries(model, inputs["input_word_ids"], inputs["input_mask"])
    ranked, _ = index.search(embeddings, min(k, builder.null_row))
    return [any(openqa_inputs.has_answer(builder.bodies_text[b], q.answers, q.is_regex)
                for b in row[:k] if 0 <= b < builder.null_row)   # never the null row
            for q, row in zip(questions, ranked)]

  def _qa_recall(self, model, index, builder) -> dict:
    """Zero-shot ``qa_recall@k`` over ``qa_eval_path``'s questions (see the module doc)."""
    k = self.task_config.recall_at
    hits = self.qa_hits(model, index, builder, k)
    path = self.task_config.qa_eval_path
    with tf.io.gfile.GFile(path, "rb") as f:
      digest = hashlib.sha256(f.read()).hexdigest()
    self._hits.update(qa=_bits(hits), qa_file=path, qa_sha256=digest)
    return {f"qa_recall@{k}": float(np.mean(hits)), "qa_questions": float(len(hits))}

  # ---- losses, metrics, steps ----
  def build_losses(self, labels, model_outputs, aux_losses=None) -> tf.Tensor:
    """This replica's share of the global per-token mean of ``-log p(y|x)``
    (``model_outputs``: ``losses.realm_metrics``)."""
    return losses.realm_loss_share(model_outputs)

  def build_metrics(self, training=None):
    names = ["mlm_accuracy", "retrieval_utility", "retrieval_entropy"]
    names += ["index_age"] if training else [f"recall@{self.task_config.recall_at}"]
    # The health signals this path can compute: device retrieval has no answer marks.
    marked = not (training and self.task_config.retrieval == "device")
    names += [n for n in health_lib.SIGNALS if n not in (
        health_lib.UNMARKED_SIGNALS if marked else health_lib.MARKED_SIGNALS)]
    names += ["skipped_duplicates"]
    metrics = [tf_keras.metrics.Mean(n) for n in names]
    # Validation also counts the held-out sentences it scored.
    return metrics if training else metrics + [tf_keras.metrics.Sum("examples")]

  def check_health(self, phase: str, step: int, logs) -> dict:
    """The retrieval-health alarms of one training loop's or validation pass's ``logs``
    (``realm_tf.health.HealthMonitor``), as summaries to add; a validation pass also prints
    its one-line health report."""
    logs = {k: float(v) for k, v in logs.items() if np.ndim(v) == 0}
    extra = self._health.check(phase, step, logs)
    if phase == "validation":
      print(self._health.summary_line(step, logs, extra), flush=True)   # once, as orbit's
    return extra

  def forward(self, inputs, model, metrics, training: bool):
    loss, m = replica_loss(model, inputs, training=training)
    by_name = {metric.name: metric for metric in metrics or []}
    if by_name:
      signals = health_lib.retrieval_signals(
          m["retrieval_logits"], m["token_log_p_given_z"], inputs["mlm_weights"],
          m["query_embedding"], m["candidate_embeddings"], inputs.get("candidate_rows"),
          inputs.get("candidate_holds_answer"))
      for name, (values, weights) in signals.items():
        if name in by_name:
          by_name[name].update_state(values, sample_weight=tf.broadcast_to(
              weights, tf.shape(values)))
      if "skipped_duplicates" in inputs and "skipped_duplicates" in by_name:
        by_name["skipped_duplicates"].update_state(inputs["skipped_duplicates"])
      by_name["mlm_accuracy"].update_state(m["correct"] / tf.maximum(m["num_tokens"], 1.0),
                                           sample_weight=m["num_tokens"])
      # The mean over the pass's real mask tokens (an example weighs its token count).
      by_name["retrieval_utility"].update_state(m["retrieval_utility"],
                                                sample_weight=m["num_tokens"])
      by_name["retrieval_entropy"].update_state(m["entropy"])
      if "recall_hit" in inputs:
        by_name[f"recall@{self.task_config.recall_at}"].update_state(inputs["recall_hit"])
        by_name["examples"].update_state(tf.cast(tf.size(inputs["recall_hit"]), tf.float32))
    return loss

  def aggregate_logs(self, state=None, step_outputs=None):
    """Counts the pass's validation steps. A state makes Model Garden's trainer call
    ``reduce_aggregated_logs`` at the end of the pass (the step outputs are not needed)."""
    del step_outputs
    return {"validation_steps": (state or {}).get("validation_steps", 0) + 1}

  def reduce_aggregated_logs(self, aggregated_logs, global_step=None):
    """The host-side numbers of this pass (``held_out_recall@k``, ``held_out_sentences``,
    ``qa_recall@k``, ``qa_questions``), which Model Garden adds to the validation logs and
    summaries; with a model directory (``logging_dir``) and the trainer's step, their
    per-sentence and per-question hits go to its ``validation_hits.jsonl``."""
    if self.logging_dir and global_step is not None:
      model_dir_lib.append_validation_hits(
          self.logging_dir, dict(self._hits, step=int(global_step)))
    return dict(self._qa_logs)

  def transform_gradients(self, grads_and_vars, model, optimizer):
    """With ``retriever_freeze_steps`` N: the towers' gradients are zeroed for the first N
    steps (their Adam moments stay 0, so they do not move, but for weight decay)."""
    n = self.task_config.retriever_freeze_steps
    if not n:
      return grads_and_vars
    towers = {id(v) for v in (model.query_embedder.trainable_variables +
                              model.block_embedder.trainable_variables)}
    live = tf.cast(optimizer.iterations >= n, tf.float32)
    return [(g * tf.cast(live, g.dtype), v) if id(v) in towers else (g, v)
            for g, v in grads_and_vars]

  def update_scales(self, model):
    """The towers' steps scaled by ``lr_retriever`` (see ``configs.RealmPretrainTaskConfig``)."""
    c = float(self.task_config.lr_retriever)
    if c < 0:
      raise configs.ConfigError(f"task.lr_retriever must be >= 0, got {c}")
    towers = {id(v): v for v in (model.query_embedder.trainable_variables +
                                 model.block_embedder.trainable_variables)}
    return [(list(towers.values()), c)]   # Each once: the towers may share variables.

  def train_step(self, inputs, model, optimizer, metrics=None):
    if self.task_config.retrieval == "device":
      if self._device is None:
        raise RuntimeError("retrieval: device needs before_train_loop(model) (RealmTrainer "
                           "calls it) before the first training step")
      inputs = self._device.features(inputs, model.query_embedder)
    logs = super().train_step(inputs, model, optimizer, metrics)
    # Off-policy delay: how many steps old the index that retrieved these candidates is.
    index_age = (tf.cast(optimizer.iterations, tf.float32) - 1.0 -
                 tf.cast(inputs["index_step"], tf.float32))
    for metric in metrics or []:
      if metric.name == "index_age":
        metric.update_state(index_age)
    return logs
