"""Typed configs for REALM, in Model Garden style, and the registered experiments.

Every config is an ``official.modeling.hyperparams.Config`` dataclass: it round-trips through
YAML, and ``override`` refuses unknown keys. Named experiments are registered with
``official.core.exp_factory``::

    from realm_tf import configs
    params = configs.load_experiment("realm_pretrain_cpu",
                                     config_files=["my.yaml"],
                                     params_override="task.model.num_candidates=4")

The registered names and their one-line descriptions are in ``EXPERIMENTS``
(``realm-train --helpfull`` lists them too).
"""

import dataclasses
from typing import List, Mapping, Optional, Sequence, Union

from official.core import config_definitions as cfg
from official.core import exp_factory
from official.modeling import hyperparams
from official.modeling import optimization
from official.nlp.configs import encoders

from realm_tf import errors
from realm_tf.scann_settings import ScannSettings

# Sequence lengths of the paper and the released code.
QUERY_SEQ_LENGTH = 96
BLOCK_SEQ_LENGTH = 288
READER_SEQ_LENGTH = 384
OPENQA_READER_SEQ_LENGTH = 320


def bert_base(vocab_size: int = 30522) -> encoders.BertEncoderConfig:
  """BERT-base: 12 layers, 768 wide, 12 heads (the paper's towers)."""
  return encoders.BertEncoderConfig(vocab_size=vocab_size, hidden_size=768, num_layers=12,
                                    num_attention_heads=12, intermediate_size=3072)


def bert_tiny(vocab_size: int = 30522, hidden_size: int = 64,
              dropout_rate: float = 0.1) -> encoders.BertEncoderConfig:
  """A 2-layer BERT for CPU runs and tests."""
  return encoders.BertEncoderConfig(vocab_size=vocab_size, hidden_size=hidden_size,
                                    num_layers=2, num_attention_heads=2,
                                    intermediate_size=4 * hidden_size,
                                    max_position_embeddings=512, dropout_rate=dropout_rate,
                                    attention_dropout_rate=dropout_rate)


@dataclasses.dataclass
class RetrieverConfig(hyperparams.Config):
  """The embedder: ``LayerNorm(Dense_projection(BERT pooled output))``.

  Attributes:
    encoder: the BERT tower(s).
    projection_size: width of the retrieval embedding (128 in the paper).
    share_embedders: one tower for queries and blocks (as the released REALM) or two.
    query_seq_length: ``[CLS] x [SEP]`` length.
    block_seq_length: ``[CLS] title [SEP] body [SEP]`` length.
    projection_dropout: dropout on the embedding when training (ORQA's retriever module: 0.1
      after the LayerNorm, in ICT and in REALM, which loads it with the train tags).
  """
  encoder: encoders.BertEncoderConfig = dataclasses.field(default_factory=bert_base)
  projection_size: int = 128
  projection_dropout: float = 0.1
  share_embedders: bool = True
  query_seq_length: int = QUERY_SEQ_LENGTH
  block_seq_length: int = BLOCK_SEQ_LENGTH


@dataclasses.dataclass
class ReaderConfig(hyperparams.Config):
  """The knowledge-augmented encoder and its heads.

  Attributes:
    encoder: the reader BERT.
    seq_length: pre-training reader input, query + block body (96 + 288).
    openqa_seq_length: Open-QA reader input (320 in ORQA).
    span_hidden_size: half the width of the span scorer's first dense layer (256 -> 512).
    max_span_width: longest answer span, in wordpieces.
  """
  encoder: encoders.BertEncoderConfig = dataclasses.field(default_factory=bert_base)
  seq_length: int = READER_SEQ_LENGTH
  openqa_seq_length: int = OPENQA_READER_SEQ_LENGTH
  span_hidden_size: int = 256
  max_span_width: int = 10


@dataclasses.dataclass
class RealmModelConfig(hyperparams.Config):
  """The whole REALM model: retriever + reader + the vocabulary they share."""
  retriever: RetrieverConfig = dataclasses.field(default_factory=RetrieverConfig)
  reader: ReaderConfig = dataclasses.field(default_factory=ReaderConfig)
  vocab_file: str = ""
  lower_case: bool = True
  num_candidates: int = 8
  max_masks: int = 10


@dataclasses.dataclass
class ExamplesDataConfig(cfg.DataConfig):
  """TFRecord examples of a pipeline: ``input_path`` is a glob or a list of globs."""
  input_path: str = ""
  global_batch_size: int = 512
  is_training: bool = True
  shuffle_buffer_size: int = 1000
  seed: Optional[int] = None


@dataclasses.dataclass
class IctDataConfig(ExamplesDataConfig):
  """ICT examples (the ICT examples pipeline).

  ``query_mask_prob``: the share of queries in which a span of 1 to ``query_mask_span``
  wordpieces is replaced by ``[MASK]``, so that the query tower learns queries shaped like
  REALM's masked sentences (0: ORQA's ICT, whose queries never hold ``[MASK]``).
  """
  query_mask_prob: float = 0.0
  query_mask_span: int = 3


@dataclasses.dataclass
class MaskedLmDataConfig(ExamplesDataConfig):
  """Masked sentences (the pre-training examples pipeline) and the blocks they retrieve from.

  ``resample_masks``: when training, each read of a sentence draws one of its masking variants
  (a salient span afresh, as REALM's example generator); off, or when evaluating, the fixed one.
  """
  blocks_dir: str = ""
  resample_masks: bool = True


@dataclasses.dataclass
class ReadingDataConfig(cfg.DataConfig):
  """The reading warm start's corpora: ``input_path[i]`` are masked sentences of the corpus
  in ``blocks_dir[i]``."""
  input_path: List[str] = dataclasses.field(default_factory=list)
  blocks_dir: List[str] = dataclasses.field(default_factory=list)
  global_batch_size: int = 32
  is_training: bool = True
  seed: Optional[int] = None


@dataclasses.dataclass
class IctTaskConfig(cfg.TaskConfig):
  """ORQA's Inverse Cloze Task, to warm-start the retriever.

  ``init_checkpoint``: the towers' start (a converted BERT, or a retriever's model directory);
  with ``init_encoders_from_reader``, a checkpoint with a ``reader`` instead, whose encoder
  starts each tower's encoder (the CPU recipe's stand-in for BERT is the reader's start; the
  projection starts fresh).
  """
  model: RetrieverConfig = dataclasses.field(default_factory=RetrieverConfig)
  vocab_file: str = ""
  init_encoders_from_reader: bool = False
  train_data: IctDataConfig = dataclasses.field(default_factory=IctDataConfig)
  validation_data: IctDataConfig = dataclasses.field(
      default_factory=lambda: IctDataConfig(is_training=False))
  recall_at: Sequence[int] = (1, 5, 10)


@dataclasses.dataclass
class ReaderReadTaskConfig(cfg.TaskConfig):
  """Reading warm start of the reader (toy-scale stand-in for BERT's ability to read).

  REALM's loss over two fixed candidates, the null block and a block (not the sentence's own)
  that holds the masked answer, on corpora other than the one REALM is trained and evaluated on
  (``tasks/reader_read.py``). ``train_data.input_path`` and ``train_data.blocks_dir`` are
  lists, one pre-training example pattern and one blocks directory per corpus.
  ``distractors``: also read each sentence beside this many lexically close blocks that do not
  hold its answer, and train the reader to predict as well from them as from the query alone
  (0: the null and the reading block only).
  """
  model: RealmModelConfig = dataclasses.field(default_factory=RealmModelConfig)
  distractors: int = 0
  train_data: ReadingDataConfig = dataclasses.field(default_factory=ReadingDataConfig)
  validation_data: ReadingDataConfig = dataclasses.field(
      default_factory=lambda: ReadingDataConfig(is_training=False))
  init_checkpoint: str = ""


@dataclasses.dataclass
class BlockMlmDataConfig(cfg.DataConfig):
  """A corpus's blocks for BERT's masked LM (``tasks/reader_mlm.py``): each block's body cut
  into windows of the reader's ``seq_length``; ``mask_rate`` of a window's wordpieces (at most
  ``max_predictions``) predicted. The blocks of ``manifests.split_of(uid, held_out_fraction)``
  == ``"eval"`` are validation's and are never trained on."""
  blocks_dir: str = ""
  held_out_fraction: float = 0.05
  mask_rate: float = 0.15
  max_predictions: int = 20
  global_batch_size: int = 32
  is_training: bool = True
  seed: Optional[int] = None


@dataclasses.dataclass
class ReaderMlmTaskConfig(cfg.TaskConfig):
  """BERT's masked-LM pre-training of the reader on a corpus's own text: what a reader that
  never had it (MiniLM's contrastive encoder) needs before it can fill a mask, as REALM's
  reader starts from BERT. The reader's output layer is tied to its word embeddings."""
  model: RealmModelConfig = dataclasses.field(default_factory=RealmModelConfig)
  train_data: BlockMlmDataConfig = dataclasses.field(default_factory=BlockMlmDataConfig)
  validation_data: BlockMlmDataConfig = dataclasses.field(
      default_factory=lambda: BlockMlmDataConfig(is_training=False))
  init_checkpoint: str = ""


@dataclasses.dataclass
class HealthConfig(hyperparams.Config):
  """Retrieval-health alarms (``realm_tf.health``): a training summary's signal beyond its
  bound for ``patience`` summaries in a row, or a validation recall below ``recall_drop``
  times its first (step-0) value, logs a warning and an ``alarm/<signal>`` summary."""
  enabled: bool = True
  max_entropy_ratio: float = 0.95
  max_p_null: float = 0.9
  max_cosine: float = 0.98
  min_distinct_candidates: float = 0.1
  recall_drop: float = 0.5
  patience: int = 3


@dataclasses.dataclass
class RealmPretrainTaskConfig(cfg.TaskConfig):
  """REALM pre-training: retrieve with a (stale) index, rescore, read, marginalize.

  Attributes:
    index_dir: where ``realm-refresh`` publishes ``step-<N>`` indexes and ``LATEST``.
    refresh_index: swap in newer indexes while training (False: the stale-index ablation).
    index_wait_seconds: how long to wait for a first index before giving up.
    index_poll_seconds: how often the trainer looks for a newer index (reading ``LATEST``
      is cheap; at 10 s a 3.5 steps/s trainer added ~35 steps to the index's age).
    retriever_init_checkpoint: an ICT (or converted) checkpoint to start both towers from.
    reader_init_checkpoint: a checkpoint with a ``reader`` to start the reader from.
    recall_at: validation's zero-shot recall@k: does one of the top k blocks (the sentence's
      own block excluded) hold the masked answer?
    qa_eval_path: a QA file (JSON lines, ``realm_tf.data.qa``: e.g. the synthetic world's
      ``qa-dev.jsonl``); when set, each validation pass also reports ``qa_recall@<recall_at>``
      (Table 2 of the paper: does one of the top k blocks retrieved for the question hold an
      answer, by ORQA's ``HasAnswer``) and ``qa_questions``. Empty: no QA recall.
    qa_answer_type: ``regex`` (CuratedTrec's patterns) or ``text`` for every question of
      ``qa_eval_path``; empty: as its records say.
    retrieval: where training retrieves. ``host``: the query-tower snapshot of the index
      embeds the queries on the host and its ScaNN index searches them
      (``tasks.candidates``). ``device``: the index's embeddings and the corpus's ids are
      sharded over the replicas and each step retrieves exactly with the current query tower
      (``tasks.device_retrieval``); newer indexes are swapped in between training loops
      (``trainer.steps_per_loop``).
    health: the retrieval-health alarms (``realm_tf.health``).
    retriever_freeze_steps: the retriever (both towers) gets no gradient for the first N
      steps, so the reader first learns to read the retriever's candidates (Atlas's
      ``freeze_retriever_steps``); 0, the paper's recipe: both train from the first step.
    lr_retriever: a multiplier on the learning rate of the retriever (both towers) relative to
      the reader's (Atlas's ``lr_retriever``): the optimizer's step of their variables is
      scaled by it (``tasks.base.scale_updates``); 1.0, the paper's recipe: one rate.
    freeze_block_tower: the block tower is not trained and embeds without dropout, so the
      index it built stays exact (ORQA's fine-tuning; a deviation from REALM's pre-training,
      where both towers train and the refresher follows them); only the query tower learns.

  Validation (``validation_data``: held-out masked sentences) retrieves exactly, over the
  whole corpus embedded with the current block tower: it measures the model, not the
  staleness of an index.
  """
  model: RealmModelConfig = dataclasses.field(default_factory=RealmModelConfig)
  train_data: MaskedLmDataConfig = dataclasses.field(default_factory=MaskedLmDataConfig)
  validation_data: MaskedLmDataConfig = dataclasses.field(
      default_factory=lambda: MaskedLmDataConfig(is_training=False))
  index_dir: str = ""
  refresh_index: bool = True
  index_wait_seconds: float = 600.0
  index_poll_seconds: float = 1.0
  retriever_init_checkpoint: str = ""
  reader_init_checkpoint: str = ""
  recall_at: int = 5
  qa_eval_path: str = ""
  qa_answer_type: str = ""
  retrieval: str = "host"
  health: HealthConfig = dataclasses.field(default_factory=HealthConfig)
  retriever_freeze_steps: int = 0
  lr_retriever: float = 1.0
  freeze_block_tower: bool = False


@dataclasses.dataclass
class OpenQaDataConfig(cfg.DataConfig):
  """Open-QA questions: a JSON-lines file (the Open-QA converter's ``{"question", "answers",
  "answer_type"}``, or NQ-open/DrQA's ``{"question", "answer"}``).

  Attributes:
    answer_type: ``regex`` for CuratedTrec's patterns; empty: as the records say.
  """
  input_path: str = ""
  answer_type: str = ""
  global_batch_size: int = 1
  is_training: bool = True
  seed: Optional[int] = None


@dataclasses.dataclass
class OpenQaTaskConfig(cfg.TaskConfig):
  """ORQA's Open-QA fine-tuning, as REALM fine-tunes (``tasks/openqa.py``).

  Attributes:
    index_dir: the index whose block embeddings are searched and rescored (built with the
      block tower of the model fine-tuned from: ``realm-index build``, or an ORQA model's
      ``block_emb``). Frozen unless ``trainable_blocks``.
    blocks_dir: the corpus of the index (default: the one its manifest names).
    init_checkpoint: a model directory or checkpoint; its query tower and reader start the
      model (a span scorer missing from it starts fresh).
    retriever_init_checkpoint / reader_init_checkpoint: override the query tower's / the
      reader's source (e.g. ICT towers with a separately trained reader).
    retriever_beam_size: blocks retrieved per question, for the retriever loss and
      ``top_k_match`` (ORQA: 5000).
    reader_beam_size: the top blocks of the beam that the reader reads (ORQA: 5).
    max_gold_spans: gold spans kept per read block (beyond: counted, dropped).
    top_k: the ``top_k_match`` cut-offs reported (those above the beam are skipped).
    trainable_blocks: 0 (ORQA's and REALM's recipe): the block tower is frozen and every
      retriever score uses the index's embeddings. N > 0: the model gets its own block tower
      (started from the init checkpoint's), the top N blocks of each question's beam are
      embedded with it on the device, and it trains; ``realm-refresh`` run on this model
      directory then keeps ``index_dir`` fresh (it builds the first index from ``ckpt-0``),
      as in REALM pre-training.
    refresh_index: with ``trainable_blocks``, swap in the newer indexes that the refresher
      publishes between batches (False: search the first index throughout).
    index_wait_seconds: with ``trainable_blocks``, how long to wait for the first index.
    retriever: how the beam is retrieved (``retrieval.sparse.hybrid``): ``dense`` (ORQA's and
      REALM's), ``bm25`` or ``hybrid`` (the index's BM25 part, beside the dense search for
      ``hybrid``). The retriever loss uses the query tower's logits over that beam; the reader
      adds each read block's prior (``inputs.OpenQaInputBuilder``'s ``block_prior``).
  """
  model: RealmModelConfig = dataclasses.field(default_factory=RealmModelConfig)
  train_data: OpenQaDataConfig = dataclasses.field(default_factory=OpenQaDataConfig)
  validation_data: OpenQaDataConfig = dataclasses.field(
      default_factory=lambda: OpenQaDataConfig(is_training=False, global_batch_size=8))
  index_dir: str = ""
  blocks_dir: str = ""
  retriever_init_checkpoint: str = ""
  reader_init_checkpoint: str = ""
  retriever_beam_size: int = 5000
  reader_beam_size: int = 5
  max_gold_spans: int = 32
  top_k: Sequence[int] = (5, 10, 50, 100, 500, 1000, 5000)
  trainable_blocks: int = 0
  refresh_index: bool = True
  index_wait_seconds: float = 600.0
  retriever: str = "dense"

@dataclasses.dataclass
class IndexConfig(hyperparams.Config):
  """How ``realm-index build``/``realm-refresh`` build an index and how updates keep it.

  YAML (``realm-index --config_file=index.yaml``; the binaries' flags override it)::

      index_type: scann
      recall_queries: 200
      scann: {target_recall: 0.95, dimensions_per_block: 3, rebalance_imbalance: 0.1}

  Attributes:
    index_type: ``scann`` (exact scoring below ``scann.brute_force_below`` blocks) or
      ``brute_force``.
    batch_size: global batch size of the corpus embedding.
    recall_queries: sample queries for the recall@10 check of each build (0: skip).
    scann: ScaNN's settings (``scann_settings.ScannSettings``: sizes, tuning
      target, quantization, the rebalance rule after updates).
    sparse: also a BM25 part over the same blocks (``retrieval.sparse.sparse_index``), kept by
      updates under the same commit point; a build reuses the last publication's when it
      covers the same corpus version (BM25 does not depend on the model).
  """
  index_type: str = "scann"
  batch_size: int = 128
  recall_queries: int = 200
  sparse: bool = True
  scann: ScannSettings = dataclasses.field(default_factory=ScannSettings)


def retriever_tiny() -> RetrieverConfig:
  """The toy retriever, without dropout.

  Towers trained from scratch start with pooled outputs that barely depend on the input
  (differences of ~1e-3 across examples). Dropout noise is far larger, and under it ICT's
  in-batch softmax drives the embeddings to a constant: with a batch of 128 the loss sat at
  log(128) from the first steps. Without dropout the same run learns (in-batch recall@1 0.94
  after 400 steps on the demo world). The paper's BERT-initialized towers keep dropout 0.1.
  """
  return RetrieverConfig(encoder=bert_tiny(dropout_rate=0.0), projection_dropout=0.0,
                         query_seq_length=32, block_seq_length=64)


def bert_warmup_steps(train_steps: int) -> int:
  """The warm-up of BERT's ``create_optimizer`` as REALM and ORQA call it
  (``realm/model.py``, ``orqa/models/*.py``): ``min(10000, max(100, train_steps // 10))``."""
  return min(10000, max(100, int(train_steps) // 10))


def _adamw(learning_rate: float, train_steps: int):
  """BERT's optimizer as closely as Model Garden's ``adamw`` allows: weight decay 0.01 (not on
  LayerNorm or biases), epsilon 1e-6, gradients clipped to global norm 1.0, linear warm-up
  then linear decay to 0. Two differences stay: Model Garden's Adam corrects the moments' bias
  and BERT's ``AdamWeightDecayOptimizer`` does not, so BERT's first updates are larger (by
  ``(1 - 0.9^t) / sqrt(1 - 0.999^t)``: 3.2x at t = 100, 1.3x at t = 1000, ~1 after 3000); and
  Model Garden's warm-up ramps to the decayed rate of its last step, BERT's to the peak rate
  (then steps down to the decayed one: 10% lower when warm-up is a tenth of training).
  ``warmup_steps`` and ``decay_steps`` are left unset here; ``load_experiment`` sets them
  from the final ``train_steps`` (BERT's warm-up formula) unless a config file sets them."""
  return optimization.OptimizationConfig({
      "optimizer": {"type": "adamw", "adamw": {
          "weight_decay_rate": 0.01, "epsilon": 1e-6, "gradient_clip_norm": 1.0,
          "exclude_from_weight_decay": ["LayerNorm", "layer_norm", "bias"]}},
      "learning_rate": {"type": "polynomial", "polynomial": {
          "initial_learning_rate": learning_rate, "decay_steps": None,
          "end_learning_rate": 0.0}},
      "warmup": {"type": "linear", "linear": {"warmup_steps": None}},
  })


def _trainer(train_steps, learning_rate, checkpoint_interval, summary_interval):
  """Orbit settings: one host round trip every ``summary_interval`` steps (``steps_per_loop``);
  a validation pass at every checkpoint."""
  return cfg.TrainerConfig(
      train_steps=train_steps,
      validation_steps=-1,
      validation_interval=checkpoint_interval,
      steps_per_loop=summary_interval,
      summary_interval=summary_interval,
      checkpoint_interval=checkpoint_interval,
      max_to_keep=5,
      optimizer_config=_adamw(learning_rate, train_steps))


def resolve_schedule(params: cfg.ExperimentConfig) -> None:
  """Sets the schedule's unset lengths from ``trainer.train_steps``: the polynomial decay runs
  over all the steps and the warm-up is BERT's (``bert_warmup_steps``; a tenth of the steps
  where BERT's 100-step minimum would outlast the whole run)."""
  steps = params.trainer.train_steps
  optimizer = params.trainer.optimizer_config
  if optimizer.learning_rate.type == "polynomial":
    if optimizer.learning_rate.polynomial.decay_steps is None:
      optimizer.learning_rate.polynomial.decay_steps = steps
  if optimizer.warmup.type == "linear" and optimizer.warmup.linear.warmup_steps is None:
    warmup = bert_warmup_steps(steps)
    # Model Garden's warm-up ramps to the decayed rate at its own last step, which is 0 when
    # the warm-up outlasts the decay: a run of at most 100 steps would never move. Such runs
    # warm up over a tenth of their steps, BERT's ratio.
    optimizer.warmup.linear.warmup_steps = warmup if warmup < steps else steps // 10


def _runtime(scale: str) -> cfg.RuntimeConfig:
  """Paper scale: Cloud TPU in bfloat16. CPU scale: one device, float32."""
  if scale == "paper":
    return cfg.RuntimeConfig(distribution_strategy="tpu", mixed_precision_dtype="bfloat16")
  return cfg.RuntimeConfig(distribution_strategy="one_device", num_gpus=0)


_RESTRICTIONS = ["task.train_data.is_training != None"]

EXPERIMENTS = {}  # name -> one-line description, in registration order


def _register(name: str):
  """``exp_factory.register_config_factory`` that also lists the experiment in EXPERIMENTS."""
  def register(factory):
    EXPERIMENTS[name] = (factory.__doc__ or "").strip().splitlines()[0]
    return exp_factory.register_config_factory(name)(factory)
  return register


@_register("realm_pretrain_paper")
def realm_pretrain_paper() -> cfg.ExperimentConfig:
  """The paper's setup: BERT-base towers, batch 512, lr 3e-5, 200k steps, 8 candidates."""
  return cfg.ExperimentConfig(
      task=RealmPretrainTaskConfig(
          model=RealmModelConfig(
              retriever=RetrieverConfig(encoder=bert_base()),
              reader=ReaderConfig(encoder=bert_base())),
          train_data=MaskedLmDataConfig(global_batch_size=512)),
      trainer=_trainer(200_000, 3e-5, 500, 100),
      runtime=_runtime("paper"),
      restrictions=_RESTRICTIONS)


@_register("realm_pretrain_cpu")
def realm_pretrain_cpu() -> cfg.ExperimentConfig:
  """Toy scale: 2-layer, 64-wide towers, short sequences, batch 16; for a laptop and CI."""
  return cfg.ExperimentConfig(
      task=RealmPretrainTaskConfig(
          model=RealmModelConfig(
              retriever=retriever_tiny(),
              reader=ReaderConfig(encoder=bert_tiny(), seq_length=96),
              num_candidates=8),
          train_data=MaskedLmDataConfig(global_batch_size=16),
          validation_data=MaskedLmDataConfig(global_batch_size=32, is_training=False),
          index_wait_seconds=300.0),
      trainer=_trainer(300, 3e-4, 50, 10),
      runtime=_runtime("cpu"),
      restrictions=_RESTRICTIONS)


@_register("ict_paper")
def ict_paper() -> cfg.ExperimentConfig:
  """ORQA's ICT warm start: BERT-base, 64-wordpiece queries, batch 4096, lr 1e-4, 100k steps."""
  return cfg.ExperimentConfig(
      task=IctTaskConfig(model=RetrieverConfig(encoder=bert_base(), query_seq_length=64),
                         train_data=IctDataConfig(global_batch_size=4096)),
      trainer=_trainer(100_000, 1e-4, 1000, 100),
      runtime=_runtime("paper"),
      restrictions=_RESTRICTIONS)


@_register("ict_cpu")
def ict_cpu() -> cfg.ExperimentConfig:
  """ICT at toy scale: batch 128, retriever without dropout."""
  return cfg.ExperimentConfig(
      task=IctTaskConfig(model=retriever_tiny(),
                         train_data=IctDataConfig(global_batch_size=128),
                         validation_data=IctDataConfig(global_batch_size=128,
                                                       is_training=False)),
      trainer=_trainer(300, 5e-4, 100, 10),
      runtime=_runtime("cpu"),
      restrictions=_RESTRICTIONS)


@_register("reader_read_cpu")
def reader_read_cpu() -> cfg.ExperimentConfig:
  """Reading warm start of the toy reader on other corpora (stands in for BERT)."""
  return cfg.ExperimentConfig(
      task=ReaderReadTaskConfig(
          model=RealmModelConfig(retriever=retriever_tiny(),
                                 reader=ReaderConfig(encoder=bert_tiny(), seq_length=96)),
          train_data=ReadingDataConfig(global_batch_size=32),
          validation_data=ReadingDataConfig(global_batch_size=64, is_training=False)),
      trainer=_trainer(3000, 1e-3, 500, 100),
      runtime=_runtime("cpu"),
      restrictions=_RESTRICTIONS)



@_register("reader_mlm_cpu")
def reader_mlm_cpu() -> cfg.ExperimentConfig:
  """BERT's masked LM for the reader on a corpus's blocks (MiniLM has never had it)."""
  return cfg.ExperimentConfig(
      task=ReaderMlmTaskConfig(
          model=RealmModelConfig(retriever=retriever_tiny(),
                                 reader=ReaderConfig(encoder=bert_tiny(), seq_length=128)),
          train_data=BlockMlmDataConfig(global_batch_size=32),
          validation_data=BlockMlmDataConfig(global_batch_size=64, is_training=False)),
      trainer=_trainer(1000, 1e-4, 200, 20),
      runtime=_runtime("cpu"),
      restrictions=_RESTRICTIONS)


def _openqa_trainer(train_steps: int, learning_rate: float, checkpoint_interval: int,
                    summary_interval: int) -> cfg.TrainerConfig:
  """ORQA's schedule (BERT's optimizer and warm-up, as every experiment), dev validation at
  every checkpoint, and the best checkpoint by dev ``exact_match`` kept in ``best_ckpt/``
  (ORQA's ``BestSavedModelAndCheckpointExporter`` on the same metric)."""
  trainer = _trainer(train_steps, learning_rate, checkpoint_interval, summary_interval)
  trainer.best_checkpoint_export_subdir = "best_ckpt"
  trainer.best_checkpoint_eval_metric = "exact_match"
  trainer.best_checkpoint_metric_comp = "higher"
  return trainer


def _openqa_paper(input_path: str, answer_type: str = "") -> cfg.ExperimentConfig:
  return cfg.ExperimentConfig(
      task=OpenQaTaskConfig(
          model=RealmModelConfig(
              retriever=RetrieverConfig(encoder=bert_base(), query_seq_length=64),
              reader=ReaderConfig(encoder=bert_base())),
          train_data=OpenQaDataConfig(input_path=f"{input_path}-train.jsonl",
                                      answer_type=answer_type, global_batch_size=1),
          validation_data=OpenQaDataConfig(input_path=f"{input_path}-dev.jsonl",
                                           answer_type=answer_type, global_batch_size=1,
                                           is_training=False)),
      trainer=_openqa_trainer(100_000, 1e-5, 1000, 100),
      runtime=_runtime("paper"),
      restrictions=_RESTRICTIONS)


@_register("openqa_nq_paper")
def openqa_nq_paper() -> cfg.ExperimentConfig:
  """ORQA's fine-tuning on NaturalQuestions-Open: beam 5000, read 5, lr 1e-5, batch 1."""
  return _openqa_paper("qa/nq")


@_register("openqa_wq_paper")
def openqa_wq_paper() -> cfg.ExperimentConfig:
  """ORQA's fine-tuning on WebQuestions (settings of openqa_nq_paper)."""
  return _openqa_paper("qa/wq")


@_register("openqa_ct_paper")
def openqa_ct_paper() -> cfg.ExperimentConfig:
  """ORQA's fine-tuning on CuratedTrec, whose answers are regular expressions."""
  return _openqa_paper("qa/ct", answer_type="regex")


@_register("openqa_cpu")
def openqa_cpu() -> cfg.ExperimentConfig:
  """Open-QA at toy scale on the synthetic world's questions: beam 64, read 5, batch 8."""
  return cfg.ExperimentConfig(
      task=OpenQaTaskConfig(
          model=RealmModelConfig(retriever=retriever_tiny(),
                                 reader=ReaderConfig(encoder=bert_tiny(), seq_length=96,
                                                     openqa_seq_length=64)),
          train_data=OpenQaDataConfig(global_batch_size=8),
          validation_data=OpenQaDataConfig(global_batch_size=32, is_training=False),
          retriever_beam_size=64, top_k=(1, 5, 10, 50)),
      trainer=_openqa_trainer(600, 1e-4, 200, 50),
      runtime=_runtime("cpu"),
      restrictions=_RESTRICTIONS)

class ConfigError(errors.RealmError, ValueError):
  """An experiment name, YAML file or override that does not fit the config."""


def load_experiment(name: str,
                    config_files: Sequence[str] = (),
                    params_override: Union[str, Mapping, Sequence] = ""
                    ) -> cfg.ExperimentConfig:
  """The registered experiment ``name``, layered with YAML files, then ``params_override``: an
  override string (``--params_override``'s), a nested mapping, or a list of those, in order.

  Raises ConfigError with a one-line message for an unknown name, a missing file or an unknown
  key.
  """
  try:
    params = exp_factory.get_exp_config(name)
  except LookupError:
    raise ConfigError(f"unknown experiment {name!r}; registered: "
                      f"{', '.join(EXPERIMENTS)}") from None
  for path in config_files:
    try:
      params = hyperparams.override_params_dict(params, path, is_strict=True)
    except KeyError as e:
      raise ConfigError(f"{path}: {e.args[0] if e.args else e}") from None
    except (OSError, ValueError) as e:
      raise ConfigError(f"cannot read config file {path}: {e}") from None
  overrides = params_override if isinstance(params_override, (list, tuple)) else [
      params_override]
  for override in overrides:
    try:
      params = hyperparams.override_params_dict(params, override, is_strict=True)
    except (KeyError, ValueError) as e:
      raise ConfigError(f"bad --params_override {override!r}: "
                        f"{e.args[0] if e.args else e}") from None
  resolve_schedule(params)
  params.validate()
  params.lock()
  return params


# ---- The paper's recipe starts every stage from trained weights. ----

# A YAML value that still has to be filled in (experiments/configs/*_paper__tpu.yaml).
PLACEHOLDER = "REPLACE_ME"


def init_requirements(task) -> List[List[Sequence[str]]]:
  """The init checkpoints a paper-scale task needs, as ``task.`` keys.

  Each requirement is a list of alternatives; an alternative (a tuple of keys) holds when all
  its keys are set. ICT starts both towers from BERT-base; REALM starts the retriever from ICT
  and the reader from BERT-base; Open-QA starts from REALM (or the towers and the reader from
  two model directories: ORQA's baseline is ICT + BERT).
  """
  if isinstance(task, IctTaskConfig):
    return [[("init_checkpoint",)]]
  if isinstance(task, RealmPretrainTaskConfig):
    return [[("retriever_init_checkpoint",)], [("reader_init_checkpoint",)]]
  if isinstance(task, OpenQaTaskConfig):
    return [[("init_checkpoint",), ("retriever_init_checkpoint", "reader_init_checkpoint")]]
  return []


def check_init_checkpoints(name: str, params: cfg.ExperimentConfig,
                           allow_random_init: bool = False) -> None:
  """Refuses to train a paper-scale experiment (``*_paper``) from random weights.

  Raises ConfigError naming the first missing (or still placeholder) ``task.`` key, unless
  ``allow_random_init``. CPU-scale experiments are never checked.
  """
  if allow_random_init or not name.endswith("_paper"):
    return

  def is_set(key):
    value = getattr(params.task, key)
    return bool(value) and not value.startswith(PLACEHOLDER)

  for alternatives in init_requirements(params.task):
    if any(all(is_set(k) for k in keys) for keys in alternatives):
      continue
    keys = next(k for k in alternatives[0] if not is_set(k))
    value = getattr(params.task, keys)
    state = f"is the placeholder {value!r}" if value else "is not set"
    wanted = " (or " + " and ".join(f"task.{k}" for k in alternatives[1]) + ")" if len(
        alternatives) > 1 else ""
    raise ConfigError(f"{name} starts from trained weights but task.{keys}{wanted} {state}; "
                      "set it (README: On Cloud TPU) or pass --allow_random_init")
