r"""REALM on real text (issue 53): the corpus's own sentences as pre-training data, a MiniLM
reader that fills masks, REALM pre-training from the ICT tower beside its refresher, and the
REALM tower's recall on the test questions. ``real_text/main.py`` runs these stages after
its ICT stages (``--realm_seeds``); each is a function of its arguments and returns a small
JSON-able summary that ``Clock.once`` keeps in its done file.

* :func:`make_pretrain_examples`: salient-span masked sentences (``data_prep.pretrain_examples``,
  the paper's masking) of every block's sentences (``sentences/``, spaCy NER + dates), into
  ``pretrain/{train,eval}-*``. Whole blocks are held out for validation
  (``RealmBudget.eval_fraction``: SHA1 of the block uid, salted, so the same blocks in every
  run); their sentences are never trained on. Only the blocks' text enters: no SQuAD question
  or answer annotation (tested).
* :func:`train_mlm`: BERT's masked LM (``tasks/reader_mlm.py``) for the converted MiniLM
  reader, whose masked-LM head ``realm-convert`` wrote fresh (MiniLM ships none; its output
  layer is tied to the word embeddings), on the text of the training blocks: MiniLM was trained
  contrastively and never filled a mask, where REALM's reader starts from BERT, which had.
* :func:`train_reader`: the reading warm start (``tasks/reader_read.py``) of that reader on
  the training sentences of this corpus: each
  sentence read beside the null block, the lexically closest other block that holds its answer,
  and ``reading_distractors`` close blocks that do not. Restored strictly. Then, with
  ``distractor_steps``, its distractor phase (as the demo's ``stages.reader_stages``): the
  same task from that reader with ``distractor_blocks`` close blocks without the answer beside
  each sentence, so that a retrieved block without the answer stops costing the reader
  (``mlm_reader_distract/``, REALM's reader then).
* :func:`masked_span_accuracy`: a reader's accuracy on held-out masked sentences, reading the
  null block or the sentence's own block (the trivial retrieval REALM forbids: the ceiling).
* :func:`pretrain_realm`: ``realm-train`` (``realm_pretrain_cpu`` with
  ``realm_pretrain_cpu__real_text.yaml``) beside ``realm-refresh``, which re-embeds every block
  with each new checkpoint and publishes the index the trainer retrieves from (the paper's
  asynchronous refresh), validated on held-out sentences and on dev questions.
* the REALM tower's test recall: ``text_stages.run_tower_retrieval``, as the ICT row's.
"""

import csv
import dataclasses
import os
import time
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from data_prep import pretrain_examples
from experiments.pipeline import paired
from experiments.pipeline import stages
from experiments.pipeline.common import Clock
from experiments.pipeline.common import flag_field
from experiments.pipeline.common import proportion
from experiments.pipeline.common import read_json
from experiments.real_text import text_stages as ts
from realm_tf import configs
from realm_tf import model_dir as model_dir_lib
from realm_tf.data import loaders
from realm_tf.data import manifests
from realm_tf.modeling import factory
from realm_tf.modeling.models import read_candidates
from realm_tf.tasks import candidates as candidates_lib
from realm_tf.tokenization import RealmTokenizer

PRETRAIN_DIR = "pretrain"
MLM_DIR = "minilm_mlm"
READER_DIR = "mlm_reader"
DISTRACT_DIR = "mlm_reader_distract"
VALIDATION_BATCH = 16


@dataclasses.dataclass(frozen=True)
class RealmBudget:
  """REALM on real text, cut to fit 2 CPU cores (flags of the same names in ``real_text``).

  The paper: BERT-base towers and reader, queries of 96 wordpieces, reader input 96 + 288,
  8 candidates (the null block among them), batch 512, lr 3e-5, 200k steps, the index
  refreshed about every 500 steps. Here MiniLM-L6 towers and reader, and what is cut is what
  the fields say.
  """
  held_out_fraction: float = flag_field(
      0.05, "REALM: share of blocks whose masked sentences are held out (validation, masked-span "
      "accuracy); never trained on.")
  realm_query_seq_length: int = flag_field(
      64, "REALM: masked-sentence (query) length (the paper: 96).")
  realm_max_masks: int = flag_field(10, "REALM: predicted wordpieces of a salient span at most.")
  mlm_steps: int = flag_field(
      800, "BERT's masked LM for the MiniLM reader (its fresh MLM head) on the training blocks' "
      "text, before the reading warm start: steps (0: none).")
  mlm_batch_size: int = flag_field(32, "Masked LM: windows per step.")
  mlm_seq_length: int = flag_field(128, "Masked LM: window length, [CLS] and [SEP] included.")
  mlm_learning_rate: float = flag_field(1e-4, "Masked LM: peak learning rate (BERT's: 1e-4).")
  mlm_validations: int = flag_field(
      4, "Masked LM: validations on the held-out blocks' windows (and checkpoints, so resumable "
      "points).")
  reading_steps: int = flag_field(300, "Reading warm start of the MiniLM reader: steps.")
  reading_batch_size: int = flag_field(8, "Reading warm start: sentences per step.")
  reading_learning_rate: float = flag_field(2e-4, "Reading warm start: peak learning rate.")
  # 1 from the first step kept the reader from reading.
  reading_distractors: int = flag_field(
      0, "Reading warm start: close blocks without the answer read beside each sentence.")
  reading_validations: int = flag_field(
      3, "Reading warm start: validations on held-out sentences (and checkpoints, so resumable "
      "points).")
  distractor_steps: int = flag_field(
      300, "The reading warm start's distractor phase after it (as the demo's reader): steps (0: "
      "none; REALM then starts from the reading warm start's reader).")
  distractor_blocks: int = flag_field(
      2, "Distractor phase: close blocks without the answer read beside each sentence.")
  realm_reader_seq_length: int = flag_field(
      192, "REALM: reader input, query + block body (the paper: 384).")
  realm_block_seq_length: int = flag_field(
      128, "REALM: block length of the towers in training and in the refresher's index (the test "
      "embeds blocks at --block_seq_length).")
  realm_reader_steps: int = flag_field(
      0, "REALM: a first phase of this many steps at the one rate, so that the reader learns "
      "REALM's own candidates before the towers' rate rises to --realm_lr_retriever (0: one phase; "
      "the paper's).")
  # NOTES 36.
  realm_steps: int = flag_field(
      300, "REALM pre-training steps (after the first phase; the paper: 200k).")
  realm_batch_size: int = flag_field(4, "REALM: masked sentences per step (the paper: 512).")
  realm_learning_rate: float = flag_field(3e-5, "REALM: peak learning rate (the paper: 3e-5).")
  realm_lr_retriever: float = flag_field(
      1.0, "REALM: the towers' learning rate over the reader's (task.lr_retriever; the paper: 1, "
      "one rate).")
  realm_freeze_blocks: bool = flag_field(
      False, "REALM: the block tower frozen (untied from the query tower) and its index built "
      "once, as ORQA's fine-tuning does; a deviation from the paper, where both towers train and "
      "the refresher follows them.")
  num_candidates: int = flag_field(
      8, "REALM: blocks read per sentence, the null block among them (the paper: 8).")
  refresh_every: int = flag_field(100, "REALM: checkpoint interval, so the refresher's cadence.")
  validate_every: int = flag_field(
      150, "REALM: validation interval (held-out sentences, dev questions).")
  validation_sentences: int = flag_field(
      96, "Held-out sentences per validation pass (REALM and the reading warm start).")
  qa_dev_questions: int = flag_field(1000, "REALM: dev questions of validation's zero-shot recall.")
  accuracy_sentences: int = flag_field(500, "Held-out sentences of the masked-span accuracy.")

  # The fields of the stages every seed shares (the data and the reader); the others are a
  # REALM run's own, recorded with it, so that dev variants can share one work directory.
  SHARED = ("held_out_fraction", "realm_query_seq_length", "realm_max_masks", "mlm_steps",
            "mlm_batch_size", "mlm_seq_length", "mlm_learning_rate", "mlm_validations",
            "reading_steps",
            "reading_batch_size", "reading_learning_rate", "reading_distractors",
            "reading_validations", "distractor_steps", "distractor_blocks",
            "realm_reader_seq_length", "accuracy_sentences")

  def shared(self) -> Dict:
    return {k: getattr(self, k) for k in self.SHARED}

  def per_run(self) -> Dict:
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
            if f.name not in self.SHARED}

  def check(self) -> None:
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if value < 0 or (value == 0 and field.name not in (
          "reading_distractors", "mlm_steps", "distractor_steps", "distractor_blocks",
          "realm_reader_steps", "realm_freeze_blocks")):
        raise ts.RealTextError(f"--{field.name}={value}: must be positive")
    if self.distractor_steps and not self.distractor_blocks:
      raise ts.RealTextError(f"--distractor_steps={self.distractor_steps} needs "
                             "--distractor_blocks of 1 or more")
    if not self.held_out_fraction < 1:
      raise ts.RealTextError(f"--held_out_fraction={self.held_out_fraction}: must be below 1")
    if self.realm_query_seq_length >= self.realm_reader_seq_length:
      raise ts.RealTextError(
          f"--realm_reader_seq_length={self.realm_reader_seq_length} leaves no room for a "
          f"block beside a query of {self.realm_query_seq_length}")


# ------------------------------------------------------------------------ pre-training data --


def make_pretrain_examples(work: str, vocab_file: str, budget: RealmBudget) -> Dict:
  """``sentences/`` -> ``pretrain/``: one salient span masked per sentence (training draws a
  span afresh at each read), whole blocks held out; the counts the issue asks for."""
  sentences = manifests.load_manifest(os.path.join(work, "sentences"))
  manifest = pretrain_examples.run_pretrain_examples(
      os.path.join(work, "sentences"), vocab_file, os.path.join(work, PRETRAIN_DIR),
      masking="salient", query_seq_length=budget.realm_query_seq_length,
      max_masks=budget.realm_max_masks, eval_fraction=budget.held_out_fraction)
  return {"sentences": sentences["num_sentences"],
          "sentences_with_spans": sentences["num_sentences_with_spans"],
          "spans": sentences["num_spans"], "spans_by_label": sentences["labels"],
          "annotator": sentences["annotator"],
          "train_examples": manifest["num_train"], "eval_examples": manifest["num_eval"],
          "eval_fraction": budget.held_out_fraction, "stats": manifest.get("stats", {})}


def examples_pattern(work: str, split: str) -> str:
  return os.path.join(work, PRETRAIN_DIR, f"{split}-*")


# ---------------------------------------------------------------------------------- reader --


def model_yaml(work: str) -> str:
  """The converted MiniLM's encoder for the retriever and the reader (``ts.encoder_yaml``)."""
  return ts.encoder_yaml(work, "openqa")


def shapes(budget: RealmBudget) -> stages.Settings:
  return {"task.model.retriever.query_seq_length": budget.realm_query_seq_length,
          "task.model.retriever.block_seq_length": budget.realm_block_seq_length,
          "task.model.reader.seq_length": budget.realm_reader_seq_length,
          "task.model.max_masks": budget.realm_max_masks}


def mlm_params(work: str, vocab_file: str, budget: RealmBudget, seed: int):
  """BERT's masked LM (``reader_mlm_cpu``) for ``minilm_reader_model/`` on the text of this
  corpus's training blocks, validated ``mlm_validations`` times on all the held-out blocks'
  windows (the blocks whose sentences are held out)."""
  blocks = os.path.join(work, "blocks")
  return stages.experiment_params(
      "reader_mlm_cpu", [os.path.join(stages.CONFIG_DIR, "reader_read_cpu__real_text.yaml"),
                         model_yaml(work)], dict(stages.towers(vocab_file), **{
          "task.model.reader.seq_length": budget.mlm_seq_length,
          "task.init_checkpoint": os.path.join(work, "minilm_reader_model"),
          "task.train_data.blocks_dir": blocks,
          "task.train_data.held_out_fraction": budget.held_out_fraction,
          "task.train_data.global_batch_size": budget.mlm_batch_size,
          "task.train_data.seed": seed,
          "task.validation_data.blocks_dir": blocks,
          "task.validation_data.held_out_fraction": budget.held_out_fraction,
          "trainer.validation_steps": -1,
          f"{ts.LEARNING_RATE}.initial_learning_rate": budget.mlm_learning_rate,
      }, **ts.train_lengths(budget.mlm_steps, budget.mlm_validations)))


def train_mlm(clock: Clock, work: str, vocab_file: str, budget: RealmBudget, seed: int,
              name: str = MLM_DIR) -> Dict:
  """BERT's masked LM (``mlm_params``) into ``<name>/``; its validation curve."""
  return _train_and_validate(clock, "reader MLM", mlm_params(work, vocab_file, budget, seed),
                             os.path.join(work, name), seed,
                             "BERT's masked LM for the MiniLM reader")


def _train_and_validate(clock: Clock, stage: str, params, model_dir: str, seed: int,
                        label: str) -> Dict:
  steps = params.trainer.train_steps
  start = time.time()
  logs = stages.train(clock, stage, params, model_dir, seed, mode="train_and_eval", label=label)
  seconds = time.time() - start
  curves = model_dir_lib.read_summaries(model_dir, "validation")
  return {"model_dir": model_dir, "steps": steps,
          "seconds_per_step_with_validation": round(seconds / steps, 3),
          "last_logs": {k: round(float(v), 4) for k, v in logs.items()},
          "validation": {k: [[int(s), round(float(v), 4)] for s, v in values]
                         for k, values in curves.items()}}


def reading_params(work: str, vocab_file: str, budget: RealmBudget, seed: int,
                   distractor_phase: bool = False):
  """The reading warm start (``reader_read_cpu``) of ``minilm_mlm/`` (``minilm_reader_model/``
  when ``mlm_steps`` is 0) on this corpus's
  training sentences and blocks, validated ``reading_validations`` times (a checkpoint each:
  the stage resumes from the last) on ``validation_sentences`` held-out sentences, read as in
  training: its curve of ``mlm_accuracy`` and ``reading_gain``. ``distractor_phase``: its
  second phase instead, from ``mlm_reader/``, ``distractor_steps`` steps with
  ``distractor_blocks`` distractors (the same rate, batch and validations)."""
  if distractor_phase:
    start, steps, distractors = READER_DIR, budget.distractor_steps, budget.distractor_blocks
  else:
    start = MLM_DIR if budget.mlm_steps else "minilm_reader_model"
    steps, distractors = budget.reading_steps, budget.reading_distractors
  return stages.experiment_params(
      "reader_read_cpu", [os.path.join(stages.CONFIG_DIR, "reader_read_cpu__real_text.yaml"),
                          model_yaml(work)], dict(stages.towers(vocab_file), **shapes(budget), **{
          "task.init_checkpoint": os.path.join(work, start),
          "task.distractors": distractors,
          "task.train_data.input_path": [examples_pattern(work, "train")],
          "task.train_data.blocks_dir": [os.path.join(work, "blocks")],
          "task.train_data.global_batch_size": budget.reading_batch_size,
          "task.train_data.seed": seed,
          "task.validation_data.input_path": [examples_pattern(work, "eval")],
          "task.validation_data.blocks_dir": [os.path.join(work, "blocks")],
          "task.validation_data.global_batch_size": VALIDATION_BATCH,
          "trainer.validation_steps": max(1, budget.validation_sentences // VALIDATION_BATCH),
          f"{ts.LEARNING_RATE}.initial_learning_rate": budget.reading_learning_rate,
      }, **ts.train_lengths(steps, budget.reading_validations)))


def train_reader(clock: Clock, work: str, vocab_file: str, budget: RealmBudget,
                 seed: int, name: Optional[str] = None, distractor_phase: bool = False) -> Dict:
  """The reading warm start (``reading_params``) into ``<name>/`` (default ``mlm_reader/``; a
  dev variant names its own), or with ``distractor_phase`` its distractor phase (default
  ``mlm_reader_distract/``)."""
  params = reading_params(work, vocab_file, budget, seed, distractor_phase)
  phase = "distractor phase" if distractor_phase else "reading warm start"
  return _train_and_validate(
      clock, f"MLM reader, {phase}", params,
      os.path.join(work, name or (DISTRACT_DIR if distractor_phase else READER_DIR)), seed,
      f"{phase} of the MiniLM reader")


def realm_reader_dir(budget: RealmBudget) -> str:
  """The reader REALM starts from: the distractor phase's, else the reading warm start's."""
  return DISTRACT_DIR if budget.distractor_steps else READER_DIR


def masked_span_accuracy(work: str, model_dir: str, budget: RealmBudget,
                         batch_size: int = 16) -> Dict:
  """The reader of ``model_dir`` on the first ``accuracy_sentences`` held-out masked sentences,
  reading the null block (``null``: the query alone) or the sentence's own block
  (``own_block``): per mask token (``token``) and per whole span (``span``: every token of it
  right), each with its 95% Wilson interval."""
  config = model_dir_lib.load_config(model_dir)
  config = config.replace(
      retriever=config.retriever.replace(query_seq_length=budget.realm_query_seq_length),
      reader=config.reader.replace(seq_length=budget.realm_reader_seq_length),
      num_candidates=2, max_masks=budget.realm_max_masks)
  reader = factory.build_reader(config.reader)
  model_dir_lib.restore(model_dir_lib.resolve_checkpoint(model_dir), reader=reader)
  tokenizer = RealmTokenizer(config.vocab_file, lower_case=config.lower_case)
  data = configs.MaskedLmDataConfig(is_training=False)
  examples = loaders.MaskedExamplesLoader(
      data, budget.realm_query_seq_length, budget.realm_max_masks,
      input_path=examples_pattern(work, "eval")).read_all()
  n = min(len(examples["query_ids"]), budget.accuracy_sentences)
  examples = {k: v[:n] for k, v in examples.items()}
  blocks = manifests.read_blocks(os.path.join(work, "blocks"))
  row_of = {b["uid"]: i for i, b in enumerate(blocks)}
  own = np.array([row_of[u.decode() if isinstance(u, bytes) else u]
                  for u in examples["source_uid"]])
  builder = candidates_lib.CandidateBuilder(blocks, config, None, tokenizer.cls_id,
                                            tokenizer.sep_id)
  candidates = np.stack([np.full(n, builder.null_row), own], axis=1).astype(np.int32)
  right = {"null": ([], []), "own_block": ([], [])}
  for start in range(0, n, batch_size):
    part = {k: v[start:start + batch_size] for k, v in examples.items()}
    features = builder.features(part, candidates=candidates[start:start + batch_size])
    logits = read_candidates(reader, {k: tf.constant(v) for k, v in features.items()},
                             training=False).numpy()                             # [b, 2, m, V]
    weights = features["mlm_weights"] > 0
    for j, name in enumerate(right):
      correct = logits[:, j].argmax(-1) == features["mlm_ids"]
      right[name][0].extend(correct[weights].tolist())
      right[name][1].extend(np.all(correct | ~weights, axis=1)[weights.any(1)].tolist())
  return {"sentences": n, **{name: {"token": proportion(tokens), "span": proportion(spans)}
                             for name, (tokens, spans) in right.items()}}


# ---------------------------------------------------------------------------- pre-training --


SECOND_PHASE_SEED = 10_000   # the second phase's sentence order: the seed plus this
# Settings that differ between the two phases, so that no ``more`` may set them for both.
PHASE_SETTINGS = ("task.retriever_init_checkpoint", "task.reader_init_checkpoint",
                  "task.lr_retriever", "task.index_dir", "task.train_data.seed",
                  "trainer.train_steps")


def realm_dir(work: str, seed: int, first: bool = False) -> str:
  """REALM seed ``seed``'s model directory; ``first``: its first phase's (two phases)."""
  return os.path.join(work, f"realm_{seed}" + ("_first" if first else ""))


def realm_params(work: str, vocab_file: str, budget: RealmBudget, seed: int,
                 dev_file: str, more: Optional[stages.Settings] = None, first: bool = False):
  """REALM pre-training (``realm_pretrain_cpu`` + ``realm_pretrain_cpu__real_text.yaml``):
  the ICT tower for both towers, the reader of ``realm_reader_dir`` (the distractor phase's,
  else the reading warm start's), the towers' rate ``realm_lr_retriever`` times the reader's,
  this corpus's training sentences, the refresher's index, validation on held-out sentences
  and ``dev_file``'s questions. ``more``: settings applied last (a dev variant).

  With ``realm_reader_steps``, two phases (Atlas's order: the reader first learns the
  retriever's own candidates, then the retriever goes faster): ``first``, that many steps at
  the one rate into ``realm_<seed>_first/``; then ``realm_steps`` with the towers at
  ``realm_lr_retriever``, towers and reader from the first phase, over a fresh sentence order
  (``SECOND_PHASE_SEED``)."""
  second = bool(budget.realm_reader_steps) and not first
  fixed = sorted(set(more or {}) & set(PHASE_SETTINGS)) if budget.realm_reader_steps else []
  if fixed:
    raise ts.RealTextError(f"{', '.join(fixed)}: set by each of REALM's two phases "
                           f"(--realm_reader_steps={budget.realm_reader_steps}); not a setting "
                           "for both")
  start = realm_dir(work, seed, first=True) if second else None
  blocks = os.path.join(work, "blocks")
  model_dir = realm_dir(work, seed, first)
  settings = dict(stages.towers(vocab_file), **shapes(budget), **{
      "task.model.num_candidates": budget.num_candidates,
      "task.train_data.input_path": examples_pattern(work, "train"),
      "task.train_data.blocks_dir": blocks,
      "task.train_data.global_batch_size": budget.realm_batch_size,
      "task.train_data.seed": seed + SECOND_PHASE_SEED if second else seed,
      "task.validation_data.input_path": examples_pattern(work, "eval"),
      "task.validation_data.blocks_dir": blocks,
      "task.index_dir": model_dir + "_index",
      "task.retriever_init_checkpoint": start or os.path.join(work, "ict_model"),
      "task.reader_init_checkpoint": start or os.path.join(work, realm_reader_dir(budget)),
      "task.lr_retriever": 1.0 if first else budget.realm_lr_retriever,
      # Frozen, the block tower is untied from the query tower (both start from one tower).
      "task.freeze_block_tower": budget.realm_freeze_blocks,
      "task.model.retriever.share_embedders": not budget.realm_freeze_blocks,
      "task.qa_eval_path": dev_file,
      "trainer.validation_steps": max(1, budget.validation_sentences // VALIDATION_BATCH),
      "task.validation_data.global_batch_size": VALIDATION_BATCH,
  }, **stages.intervals(budget.refresh_every, budget.validate_every),
                  **stages.schedule(budget.realm_reader_steps if first else budget.realm_steps,
                                    budget.realm_learning_rate))
  settings.update(more or {})
  return stages.experiment_params(
      "realm_pretrain_cpu", [os.path.join(stages.CONFIG_DIR,
                                          "realm_pretrain_cpu__real_text.yaml"),
                             model_yaml(work)], settings)


def pretrain_realm(clock: Clock, work: str, vocab_file: str, budget: RealmBudget, seed: int,
                   more: Optional[stages.Settings] = None) -> Dict:
  """REALM pre-training into ``realm_<seed>/`` beside its refresher (``realm_<seed>_index/``),
  after its first phase (``realm_<seed>_first/``, a finished one not rerun) when
  ``realm_reader_steps``; validation curves from the summaries, over both phases' steps."""
  dev_file, _ = ts.qa_subset(work, "dev", budget.qa_dev_questions, 0, name="realm")
  runs = []
  for first in ([True, False] if budget.realm_reader_steps else [False]):
    model_dir = realm_dir(work, seed, first)
    params = realm_params(work, vocab_file, budget, seed, dev_file, more, first)
    start = time.time()
    stages.run_side_by_side(clock, f"REALM seed {seed}", stages.realm_jobs(
        model_dir, params, os.path.join(work, "blocks"), min_interval=budget.refresh_every,
        once=budget.realm_freeze_blocks, validate=True))
    runs.append({"model_dir": model_dir, "steps": model_dir_lib.checkpoint_step(
                     model_dir_lib.latest_checkpoint(model_dir)),
                 "seconds": round(time.time() - start, 1),
                 "indexes_built": stages.indexes_built(model_dir),
                 "index_age": stages.index_ages(model_dir),
                 "curves": model_dir_lib.read_summaries(model_dir, "validation")})
  return dict(join_phases(runs), seed=seed, budget=budget.per_run(), dev_file=dev_file)


def join_phases(runs: List[Dict]) -> Dict:
  """REALM's phases (each ``model_dir``, ``steps``, ``seconds``, ``indexes_built``,
  ``index_age``, validation ``curves``) as one run: the later phase's steps after the earlier
  one's; where both validated the same model (the first's end, the second's start), the first's
  pass counts."""
  validation, ages, offset = {}, [], 0
  for run in runs:
    for tag, values in run["curves"].items():
      points = validation.setdefault(tag, {})
      for step, value in values:
        points.setdefault(int(step) + offset, round(float(value), 4))
    ages += [(int(step) + offset, value) for step, value in run["index_age"]["by_interval"]]
    offset += run["steps"]
  return {"model_dir": runs[-1]["model_dir"], "steps": offset,
          "seconds": round(sum(r["seconds"] for r in runs), 1),
          "indexes_built": sum(r["indexes_built"] for r in runs),
          "index_age": stages.age_summary(ages),
          "phases": [{k: r[k] for k in ("model_dir", "steps", "seconds")} for r in runs],
          "validation": {tag: [[s, v] for s, v in sorted(points.items())]
                         for tag, points in validation.items()}}


# ---------------------------------------------------------------------------- the analysis --
# The pre-registered analysis (experiments/NOTES.md section 30), fixed before any test number:
# every REALM pre-training seed starts from the one ICT tower and the one MiniLM reader, and is
# paired question by question with the rows it is compared to.
ICT, REALM, BM25 = "ICT", "REALM", "BM25"
ORQA, MIXED = "ORQA", "REALM retriever + ORQA's reader"
PRIMARY = (("(a) REALM - ICT, zero-shot recall@5", "recall@5", REALM, ICT),
           ("(b) REALM - ORQA, EM", "em", REALM, ORQA))
SECONDARY = (("REALM retriever + ORQA's reader - ORQA, EM", "em", MIXED, ORQA),
             ("REALM - BM25, zero-shot recall@5", "recall@5", REALM, BM25))


def hits(first: Sequence[int], k: int) -> str:
  """A row's per-question 0/1 string: whether its first answer-bearing block (``first``, the
  rank from ``ts.first_hits``) is in its top ``k``."""
  return "".join("1" if int(f) < k else "0" for f in first)


def seed_outcomes(first: Dict[str, Sequence[int]], em: Dict[str, Sequence[bool]]) -> Dict:
  """One REALM seed's per-question outcomes, as :func:`analysis` reads them:
  ``{"recall@5": {row: "0110..."}, "recall@20": {...}, "em": {row: "..."}}`` from each
  retriever's first-hit ranks on the test questions and each Open-QA row's exact matches on
  the Open-QA test sample."""
  out = {f"recall@{k}": {row: hits(f, k) for row, f in first.items()} for k in (5, 20)}
  out["em"] = {row: "".join("1" if x else "0" for x in values) for row, values in em.items()}
  return out


def outcome_of(run: Dict, outcome: str, row: str) -> Optional[str]:
  """A row's per-question 0/1 string in one run; None for an Open-QA row the run lacks (a seed
  without Open-QA rows counts in no comparison of them: NOTES 37)."""
  return run[outcome].get(row) if outcome == "em" else run[outcome][row]


def analysis(runs: Sequence[Dict]) -> Dict[str, List]:
  """``paired.analysis`` of :data:`PRIMARY` (Holm over both) and :data:`SECONDARY` over the
  seeds' :func:`seed_outcomes`."""
  return paired.analysis(runs, PRIMARY, SECONDARY, outcome_of)


def runs_from_records(questions_csv: str, openqa_csv: str, seeds: Sequence[int]) -> List[Dict]:
  """Each seed's :func:`seed_outcomes` from the committed per-question records
  (``real_text_questions.csv``: each retriever's first-hit rank per test question;
  ``real_text_openqa_questions.csv``: each Open-QA row's exact match per question). A seed
  with neither of its Open-QA columns (REALM test seed 0, NOTES 37) has its zero-shot rows
  only; one with a single one is an error."""
  with open(questions_csv, newline="", encoding="utf-8") as f:
    ranks = list(csv.DictReader(f))
  with open(openqa_csv, newline="", encoding="utf-8") as f:
    reader = csv.DictReader(f)
    columns, em = reader.fieldnames, list(reader)
  runs = []
  for s in seeds:
    first = {ICT: [int(r["ict"]) for r in ranks], REALM: [int(r[f"realm_{s}"]) for r in ranks],
             BM25: [int(r["bm25"]) for r in ranks]}
    exact = {ORQA: [r["orqa_em"] == "1" for r in em]}
    own = {REALM: f"realm_{s}_openqa_em", MIXED: f"realm_{s}_mixed_em"}
    present = [c in columns for c in own.values()]
    if any(present) and not all(present):
      raise ValueError(f"{openqa_csv}: REALM seed {s} has one of {sorted(own.values())} but "
                       "not the other")
    if all(present):
      exact.update({row: [r[c] == "1" for r in em] for row, c in own.items()})
    runs.append(seed_outcomes(first, exact))
  return runs


def check_seed_budget(done: str, seed: int, budget: RealmBudget) -> None:
  """Refuses to reuse REALM seed ``seed``'s run (its done file ``done``) made with other
  per-run settings than ``budget``'s; a field added since it ran was then at its default."""
  if not os.path.exists(done):
    return
  recorded = dict(dataclasses.asdict(RealmBudget()), **read_json(done)["budget"])
  recorded = {k: recorded[k] for k in budget.per_run()}
  if recorded != budget.per_run():
    changed = sorted(k for k, v in budget.per_run().items() if recorded[k] != v)
    raise ts.RealTextError(f"{done}: REALM seed {seed} ran with "
                           f"{ {k: recorded[k] for k in changed} }, not "
                           f"{ {k: budget.per_run()[k] for k in changed} }; use another seed, "
                           f"or delete it, realm_{seed}/, realm_{seed}_first/ and their "
                           "_index/ to run it again")


def run_realm(clock: Clock, work: str, vocab_file: str, seeds: Sequence[int],
              budget: RealmBudget, max_questions: int, batch_size: int,
              block_seq_length: int, seed: int, test: bool = True) -> Dict[str, Dict]:
  """REALM's stages (this module's, in order): the pre-training sentences, the MiniLM
  reader's masked LM (``mlm_steps``), reading warm start and distractor phase
  (``distractor_steps``), each with its masked-span accuracy, then for each pre-training seed
  REALM beside its refresher and (``test``) its tower's test recall. Dev runs pass
  ``test=False``: their choices see dev questions and held-out sentences only."""
  once, out = clock.once, {}
  out["pretrain_data"] = once(
      "REALM pre-training sentences", os.path.join(work, "pretrain_done.json"),
      lambda: make_pretrain_examples(work, vocab_file, budget))
  out["reader_start_accuracy"] = once(
      "Masked-span accuracy of the converted reader",
      os.path.join(work, "minilm_reader_accuracy.json"),
      lambda: masked_span_accuracy(work, os.path.join(work, "minilm_reader_model"), budget))

  def reader_phase(key: str, name: str, label: str, train: Callable[[], Dict]) -> None:
    """A reader phase into ``<name>/`` (``<name>_done.json``), then its masked-span accuracy
    (``<name>_accuracy.json``), as ``out[key]`` and ``out[key + "_accuracy"]``."""
    out[key] = once(label, os.path.join(work, f"{name}_done.json"), train)
    out[f"{key}_accuracy"] = once(
        f"Masked-span accuracy after {label}", os.path.join(work, f"{name}_accuracy.json"),
        lambda: masked_span_accuracy(work, os.path.join(work, name), budget))

  if budget.mlm_steps:
    reader_phase("reader_mlm", MLM_DIR, "BERT's masked LM for the MiniLM reader",
                 lambda: train_mlm(clock, work, vocab_file, budget, seed))
  reader_phase("mlm_reader", READER_DIR, "the MLM reader's reading warm start",
               lambda: train_reader(clock, work, vocab_file, budget, seed))
  if budget.distractor_steps:
    reader_phase("distract_reader", DISTRACT_DIR, "the MLM reader's distractor phase",
                 lambda: train_reader(clock, work, vocab_file, budget, seed,
                                      distractor_phase=True))
  for s in seeds:
    done = os.path.join(work, f"realm_{s}_done.json")
    check_seed_budget(done, s, budget)
    out[f"realm_{s}_train"] = once(
        f"REALM pre-training, seed {s}", done,
        lambda s=s: pretrain_realm(clock, work, vocab_file, budget, s))
    if not test:
      continue
    out[f"realm_{s}"] = once(
        f"REALM retrieval, seed {s}", os.path.join(work, f"realm_{s}_test", "done.json"),
        lambda s=s: ts.run_tower_retrieval(work, realm_dir(work, s), f"realm_{s}_test",
                                           max_questions, batch_size, block_seq_length))
  return out


def run_realm_openqa(clock: Clock, work: str, vocab_file: str, squad_file: str,
                     seeds: Sequence[int], budget: ts.Budget, seed: int, max_articles: int,
                     max_paragraphs: int, max_questions: int,
                     block_seq_length: int) -> Dict[str, Dict]:
  """Open-QA rows of each REALM seed on the Open-QA test sample: the paper's mixed row (ORQA's
  fine-tuned model reading the REALM tower's top blocks), then REALM itself: stage A from
  REALM's pre-trained reader and ORQA's fine-tuning from REALM's towers over their index."""
  once, out = clock.once, {}
  for s in seeds:
    name = f"realm_{s}"
    out[f"{name}_mixed"] = once(
        f"REALM retriever + ORQA's reader, seed {s}",
        os.path.join(work, f"{name}_mixed_eval", "done.json"),
        lambda s=s: ts.evaluate_bm25_reader(work, budget, seed, max_questions,
                                            retriever=f"realm_{s}_test",
                                            out=f"realm_{s}_mixed_eval"))
    out[f"{name}_gold_reader"] = once(
        f"Stage A from REALM's reader, seed {s}", os.path.join(work, f"{name}_gold_done.json"),
        lambda s=s: ts.train_gold_reader(work, squad_file, budget, s, max_articles,
                                         max_paragraphs, clock.say, start=f"realm_{s}",
                                         name=f"realm_{s}_gold_reader"))
    out[f"{name}_openqa_train"] = once(
        f"Open-QA training from REALM, seed {s}", os.path.join(work, f"{name}_openqa_done.json"),
        lambda s=s: ts.train_openqa(clock, work, vocab_file, budget, s, block_seq_length,
                                    name=f"realm_{s}_openqa", retriever=f"realm_{s}",
                                    index=f"realm_{s}_test_index",
                                    reader=f"realm_{s}_gold_reader", sample_seed=seed))
    out[f"{name}_openqa_eval"] = once(
        f"Open-QA evaluation of REALM, seed {s}",
        os.path.join(work, f"{name}_openqa_eval", "done.json"),
        lambda s=s: ts.evaluate_openqa(work, budget, seed, max_questions,
                                       name=f"realm_{s}_openqa", index=f"realm_{s}_test_index",
                                       before=f"realm_{s}_test"))
  return out
