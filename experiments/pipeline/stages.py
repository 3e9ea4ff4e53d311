r"""The stages of every experiment driver, and the scheduler that runs them.

``experiments/synthetic/demo.py``, ``experiments/synthetic/table_seed.py`` and
``experiments/real_text/main.py`` are short sequences of the stages here and in
``experiments/real_text/text_stages.py`` (real text's data, retrieval and evaluation). A stage is a
function of its arguments: a typed recipe (:class:`Recipe`, ``text_stages.Budget``) and paths; only
a driver's ``main`` reads flags. A stage's output directory is decided by its caller; each skips
what an earlier run into the same directory finished (``TRAINING_DONE``, a published index).

* data: :func:`make_world`, :func:`prepare_reading_worlds`, :func:`reading_corpora`;
* training in this process (:func:`train`): the warm starts (:func:`reader_stages`,
  :func:`ict_stage`, :func:`train_warm_starts`), real text's ICT and Open-QA;
* REALM pre-training (:func:`realm_jobs`): ``realm-train`` beside its ``realm-refresh``;
* indexes: :func:`build_index`, a frozen brute-force index of a block tower;
* Open-QA (:func:`openqa_rows`): ORQA's fine-tuning of a (retriever, reader) pair against a
  frozen index of the retriever's block tower, evaluated before and after.

Settings reach a trainer as a config object (:func:`experiment_params`: a registered
experiment, its YAML files, then a mapping of dotted keys to typed values); a trainer run as a
process of its own reads the YAML written from that object (:func:`write_params`).

The scheduler (:func:`run_side_by_side`) starts trainers and refreshers as processes of their
own, all at once by default (``Recipe.parallel_runs`` caps the runs at a time): two runs side
by side finished 1.14x sooner than one after the other, and a REALM step cost 0.69 CPU-s with
five trainers side by side against 0.66 with two (experiments/NOTES.md sections 20 and 21).
:class:`Progress` prints one line per ``Clock.progress_seconds`` for every long stage (steps
done, steps/s, ETA), and ``Clock`` times the stages and prints the total at the end.
"""

import dataclasses
import json
import os
import re
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence

from official.core import task_factory
from official.modeling import hyperparams
import numpy as np
import tensorflow as tf
import tf_keras

from data_prep import pipeline
from data_prep import synthetic_world
from experiments.pipeline.common import Clock
from experiments.pipeline.common import flag_field
from realm_tf import configs
from realm_tf import embedder_api
from realm_tf import model_dir as model_dir_lib
from realm_tf import tasks  # noqa: F401  pylint: disable=unused-import (registers the tasks)
from realm_tf import tokenization
from realm_tf import train_lib
from realm_tf.data import manifests
from realm_tf.data import qa as qa_lib
from realm_tf.openqa import inputs
from realm_tf.retrieval.publication import index_io
from realm_tf.retrieval.publication import publish
from realm_tf.retrieval.publication import refresher
from realm_tf.retrieval.sparse import hybrid

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


@dataclasses.dataclass(frozen=True)
class Recipe:
  """The synthetic pipelines' recipe, shared by the demo and the tables (NOTES section 17: the
  tables are the demo's runs, a seed at a time); ``experiments/pipeline/recipe_flags.py``
  makes a flag of each field, its help the field's."""
  world_scale: float = flag_field(1.0, "Size of the synthetic world (1.0: 210 articles).")
  reading_worlds: int = flag_field(4, "Counterfactual worlds the reader learns to read on.")
  reading_steps: int = flag_field(6000, "Reading warm-start steps of the reader.")
  distractor_steps: int = flag_field(
      1500, "Steps of the reader's fine-tuning beside distractor blocks, after its reading warm "
      "start (0: none; experiments/NOTES.md section 15).")
  distractors: int = flag_field(2, "Distractor blocks per sentence in that fine-tuning.")
  # Frozen for test seeds 6-13 (NOTES 42).
  ict_steps: int = flag_field(2400, "ICT warm-start steps.")
  ict_learning_rate: float = flag_field(5e-4, "ICT peak learning rate.")
  ict_from_reader: bool = flag_field(
      False, "ICT's towers start from the reader's start's encoder (BERT's part in the CPU "
      "recipe), as ICT starts from BERT in the paper.")
  realm_steps: int = flag_field(1000, "REALM pre-training steps (each run).")
  realm_learning_rate: float = flag_field(
      3e-5, "REALM peak learning rate (the paper's; at 1e-4 the dev questions' recall swings by "
      "0.1 between checkpoints: experiments/NOTES.md section 15).")
  refresh_every: int = flag_field(25, "Checkpoint (and so index refresh) interval.")
  openqa_steps: int = flag_field(600, "Open-QA fine-tuning steps (each run).")
  openqa_learning_rate: float = flag_field(1e-4, "Open-QA peak learning rate.")
  precision: str = flag_field("float32", "runtime.mixed_precision_dtype of every training run.")
  parallel_runs: int = flag_field(
      0, "At most this many REALM or Open-QA training runs at once, each a process (0: all at "
      "once).")


# ------------------------------------------------------------------------------ progress --
_CHECKPOINT = re.compile(r'^model_checkpoint_path: ".*?(\d+)"', re.M)


def checkpoint_step(model_dir: str) -> int:
  """The step of ``model_dir``'s newest checkpoint (from its ``checkpoint`` file), 0 if none."""
  try:
    with open(os.path.join(model_dir, "checkpoint")) as f:
      match = _CHECKPOINT.search(f.read())
  except OSError:
    return 0
  return int(match.group(1)) if match else 0


class Progress:
  """While a stage runs, one line every ``seconds``: each run's checkpointed step of its total,
  the stage's steps/s (all runs together, since it began) and its ETA at that rate.

  Use as a context manager around the stage; ``runs``: ``{name: (model_dir, total steps)}``.
  """

  def __init__(self, clock: Clock, label: str, runs: Dict[str, tuple],
               seconds: Optional[float] = None):
    self.clock, self.label, self.runs = clock, label, runs
    self.seconds = clock.progress_seconds if seconds is None else seconds
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._loop, daemon=True)
    self._t0, self._start = time.time(), {}

  def __enter__(self):
    self._t0 = time.time()
    self._start = {n: checkpoint_step(d) for n, (d, _) in self.runs.items()}
    if self.seconds > 0 and self.runs:
      self._thread.start()
    return self

  def __exit__(self, *exc):
    self._stop.set()
    if self._thread.is_alive():
      self._thread.join()

  def line(self, now: Optional[float] = None) -> str:
    elapsed = max((now or time.time()) - self._t0, 1e-9)
    steps = {n: min(checkpoint_step(d), total) for n, (d, total) in self.runs.items()}
    rate = sum(steps[n] - self._start[n] for n in steps) / elapsed
    left = sum(total - steps[n] for n, (_, total) in self.runs.items())
    if len(self.runs) <= 5:
      where = ", ".join(f"{n} {steps[n]}/{total}" for n, (_, total) in self.runs.items())
    else:
      where = (f"{len(self.runs)} runs at steps {min(steps.values())}-{max(steps.values())} "
               f"of {max(total for _, total in self.runs.values())}")
    eta = f"ETA {left / rate / 60:.1f} min" if rate > 0 else "ETA after the first checkpoint"
    return f"{self.label}: {where} | {rate:.2f} steps/s | {eta}"

  def _loop(self):
    while not self._stop.wait(self.seconds):
      self.clock.say(self.line())


# --------------------------------------------------------------------------- processes --
class Job(NamedTuple):
  """A realm_tf binary run as its own process: ``args`` after ``python -m``, its log file;
  for a trainer, its model directory and steps (for progress lines). A ``follower`` (a
  refresher) ends after its trainer and is waited for last."""
  name: str
  args: List[str]
  log: str
  model_dir: str = ""
  steps: int = 0
  follower: bool = False


def start(job: Job) -> subprocess.Popen:
  """Starts ``job`` unbuffered (its printed and logged lines reach the log in order)."""
  log = open(job.log, "w")  # pylint: disable=consider-using-with
  return subprocess.Popen([sys.executable, "-u", "-m", *job.args], stdout=log,
                          stderr=subprocess.STDOUT)


def run_side_by_side(clock: Clock, label: str, jobs: Sequence[Job],
                     parallel: Optional[int] = None) -> None:
  """Runs the jobs side by side, at most ``parallel`` trainers at a time (each with its
  followers; default: all at once), starting the next run as soon as one ends, and printing
  progress lines. Trainers are waited for before their followers. A job that fails stops the
  others and raises with the end of its log."""
  runs = []   # [trainer, its followers]: a follower precedes its trainer in ``jobs``
  waiting = []
  for job in jobs:
    if job.follower:
      waiting.append(job)
    else:
      runs.append([job] + waiting)
      waiting = []
  runs += [[job] for job in waiting]
  parallel = parallel or len(runs)
  trainers = {r[0].name: (r[0].model_dir, r[0].steps) for r in runs
              if r[0].model_dir and r[0].steps}
  started = []   # (process, job)

  def failed(proc, job):
    with open(job.log) as f:
      tail = f.read()[-3000:]
    return RuntimeError(f"{job.name} failed (exit {proc.returncode}); its log {job.log} "
                        f"ends:\n{tail}")

  try:
    with Progress(clock, label, trainers):
      queue, active = list(runs), []
      while queue or active:
        while queue and len(active) < parallel:
          run = queue.pop(0)
          procs = [(start(job), job) for job in run]
          started.extend(procs)
          active.append(procs)
        time.sleep(0.5)
        for procs in list(active):
          trainer, job = procs[0]
          code = trainer.poll()
          if code is None:
            continue
          if code != 0:
            raise failed(trainer, job)
          for proc, follower in procs[1:]:   # a refresher ends after its trainer
            if proc.wait() != 0:
              raise failed(proc, follower)
          active.remove(procs)
  finally:
    for proc, _ in started:
      if proc.poll() is None:
        proc.kill()


# -------------------------------------------------------------------------------- data --
def make_world(seed: int, name_seed: int, scale: float = 1.0):
  """The synthetic world of ``seed`` (names of ``name_seed``), ``scale`` times the demo's."""
  return synthetic_world.generate_world(
      seed=seed, name_seed=name_seed, num_regions=round(6 * scale),
      num_cities=round(30 * scale), num_people=round(100 * scale),
      num_organizations=round(24 * scale), num_works=round(50 * scale))


# Sequence lengths and examples per sentence of every world's data_prep.
PREPARE_ARGS = dict(block_seq_length=32, query_seq_length=32, examples_per_sentence=2)


def reading_worlds(world_seed: int, recipe: Recipe) -> List:
  """The recipe's ``reading_worlds`` counterfactual worlds of ``world_seed``: the same names,
  other facts (the i-th, from 1, has seed ``world_seed + i``)."""
  return [make_world(world_seed + i, world_seed, recipe.world_scale)
          for i in range(1, recipe.reading_worlds + 1)]


def prepare_reading_worlds(out: str, vocab: str, worlds: Sequence, seed: int,
                           **prepare_args) -> List[Dict]:
  """Each counterfactual world (the i-th, from 1) written to ``out/reading_world_i`` and
  prepared with ``vocab`` into ``out/reading_data_i`` (seed ``seed + i``; ``prepare_args``:
  data_prep's, default ``PREPARE_ARGS``); their output dirs."""
  reading = []
  for i, world in enumerate(worlds, 1):
    other = synthetic_world.write_world(world, os.path.join(out, f"reading_world_{i}"))
    reading.append(pipeline.prepare_all(
        other["articles"], vocab, os.path.join(out, f"reading_data_{i}"),
        patterns_file=other["patterns"], eval_fraction=0.02, seed=seed + i,
        **(prepare_args or PREPARE_ARGS))["dirs"])
  return reading


def reading_corpora(out: str, reading: Sequence[Dict]) -> str:
  """A YAML (JSON is YAML) naming the reading worlds' examples and blocks, for the reading
  warm starts' ``train_data``; its path."""
  path = os.path.join(out, "reading_corpora.yaml")
  with open(path, "w") as f:
    json.dump({"task": {"train_data": {
        "input_path": [os.path.join(d["pretrain"], "train-*") for d in reading],
        "blocks_dir": [d["blocks"] for d in reading]}}}, f)
  return path


def vocab_size(vocab: str) -> int:
  return len(tokenization.load_vocab(vocab))


# ----------------------------------------------------------------------------- settings --
# A stage's settings: dotted config keys to typed values, applied by ``experiment_params``.
Settings = Dict[str, Any]


def nested(settings: Mapping[str, Any]) -> Dict:
  """``{"a.b": 1, "a.c": 2}`` -> ``{"a": {"b": 1, "c": 2}}``: the override a config takes."""
  out: Dict = {}
  for key, value in settings.items():
    *parents, leaf = key.split(".")
    node = out
    for part in parents:
      node = node.setdefault(part, {})
    node[leaf] = value
  return out


def experiment_params(experiment: str, yaml_files: Sequence[str], settings: Settings):
  """The registered ``experiment``, layered with ``yaml_files``, then ``settings``."""
  return configs.load_experiment(experiment, list(yaml_files), nested(settings))


def write_params(params, path: str) -> str:
  """``params`` as the YAML file ``path`` (what ``realm-train --config_file`` reads); its path."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  hyperparams.save_params_dict_to_yaml(params, path)
  return path


def schedule(steps: int, learning_rate: float) -> Settings:
  prefix = "trainer.optimizer_config.learning_rate.polynomial"
  return {"trainer.train_steps": steps, f"{prefix}.decay_steps": steps,
          f"{prefix}.initial_learning_rate": learning_rate}


def intervals(every: int, validate_every: Optional[int] = None) -> Settings:
  """Checkpoints, summaries and host round trips every ``every`` steps; validation every
  ``validate_every`` (default ``every``; it runs only in ``train_and_eval``)."""
  return {"trainer.checkpoint_interval": every, "trainer.summary_interval": every,
          "trainer.steps_per_loop": every,
          "trainer.validation_interval": validate_every or every}


def runtime(recipe: Recipe) -> Settings:
  return {"runtime.mixed_precision_dtype": recipe.precision}


def towers(vocab: str) -> Settings:
  """The vocabulary and its size in the model's towers (retriever and reader)."""
  n = vocab_size(vocab)
  return {"task.model.vocab_file": vocab, "task.model.retriever.encoder.vocab_size": n,
          "task.model.reader.encoder.vocab_size": n}


def config(experiment: str) -> str:
  """The ``__demo.yaml`` of ``experiment``: its toy-scale shapes."""
  return os.path.join(CONFIG_DIR, f"{experiment}__demo.yaml")


# ------------------------------------------------------------------------------ training --
def train(clock: Clock, name: str, params, model_dir: str, seed: Optional[int] = None,
          mode: str = "train", label: str = "") -> Dict[str, float]:
  """Trains ``params`` into ``model_dir`` in this process, at the cores' full width, with
  progress lines (``name``'s; ``label``: the first line's, default ``name``); with ``seed``,
  TensorFlow's global seed is set to it first. Its last logs."""
  if seed is not None:
    tf_keras.utils.set_random_seed(seed)
  steps = params.trainer.train_steps
  clock.say(f"{label or name} ({steps} steps) -> {model_dir}")
  with Progress(clock, name, {name: (model_dir, steps)}):
    return train_lib.run_experiment(params, model_dir, mode=mode)


class WarmStart(NamedTuple):
  """A warm start: its experiment, steps, peak learning rate, YAML files beside the
  ``__demo.yaml`` and settings."""
  experiment: str
  steps: int
  learning_rate: float
  yaml_files: List[str]
  settings: Settings


def reader_stages(recipe: Recipe, vocab: str, reading_corpora_yaml: str,
                  out: str) -> Dict[str, WarmStart]:
  """The reader's warm starts into ``out/<name>``, in order:

  * ``reader_read``: the reading warm start on the counterfactual worlds
    (``reading_corpora_yaml``: a YAML of their examples and blocks), the toy stand-in for BERT;
  * ``reader``: that reader fine-tuned beside ``distractors`` blocks without the answer, so
    that it reads as BERT would from a block that does not help, predicting from the query
    rather than copying a name from the block (``ReaderReadTaskConfig.distractors``; without
    it REALM's retriever collapses: experiments/NOTES.md section 15). REALM and the baseline
    start from it (none when ``distractor_steps`` is 0).
  """
  reader = dict(towers(vocab), **runtime(recipe))
  stages = {"reader_read": WarmStart("reader_read_cpu", recipe.reading_steps, 1e-3,
                                     [reading_corpora_yaml], reader)}
  if recipe.distractor_steps:
    stages["reader"] = WarmStart(
        "reader_read_cpu", recipe.distractor_steps, 3e-4, [reading_corpora_yaml],
        dict(reader, **{"task.distractors": recipe.distractors,
                        "task.init_checkpoint": os.path.join(out, "reader_read")}))
  return stages


def final_reader(names) -> str:
  """Which of ``reader_stages``' names (or of a dict keyed by them) REALM and the baseline
  start from: the distractor fine-tune where there is one, else the reading warm start."""
  return "reader" if "reader" in names else "reader_read"


def ict_stage(recipe: Recipe, vocab: str, ict_examples: str,
              reader: str = "") -> Dict[str, WarmStart]:
  """``ict``: ICT on ``ict_examples`` (``ict_cpu__demo.yaml``: a masked span in half of the
  queries); with ``recipe.ict_from_reader``, its towers' encoders start from ``reader`` (the
  reader's start, a model directory or checkpoint, trained before this stage runs), as ICT
  starts from BERT in the paper."""
  settings = dict({
      "task.vocab_file": vocab, "task.model.encoder.vocab_size": vocab_size(vocab),
      "task.train_data.input_path": os.path.join(ict_examples, "train-*")}, **runtime(recipe))
  if recipe.ict_from_reader:
    if not reader:
      raise ValueError("recipe.ict_from_reader: ICT needs the reader's start")
    settings.update({"task.init_checkpoint": reader, "task.init_encoders_from_reader": True})
  return {"ict": WarmStart("ict_cpu", recipe.ict_steps, recipe.ict_learning_rate, [], settings)}


def train_warm_starts(clock: Clock, out: str, stages: Dict[str, WarmStart],
                      seed: Optional[int] = None) -> Dict:
  """Trains each warm start into ``out/<name>`` (``train``), skipping those already trained.
  With ``seed``, TensorFlow's global seed is set to it before each stage and it seeds the data
  order. Returns ``{name: (model_dir, last training logs)}``."""
  done = {}
  for name, stage in stages.items():
    model_dir = os.path.join(out, name)
    if model_dir_lib.training_done(model_dir):
      clock.say(f"{name}: already trained in {model_dir}")
      done[name] = (model_dir, {})
      continue
    settings = dict(stage.settings, **schedule(stage.steps, stage.learning_rate))
    if seed is not None:
      settings["task.train_data.seed"] = seed
    params = experiment_params(stage.experiment, [config(stage.experiment), *stage.yaml_files],
                               settings)
    metrics = train(clock, name, params, model_dir, seed, label=f"{name} warm start")
    clock.say(f"{name} done: { {k: round(v, 4) for k, v in metrics.items()} }")
    done[name] = (model_dir, metrics)
  return done


# ------------------------------------------------------------------------- pre-training --
class PretrainData(NamedTuple):
  """Where a REALM run reads: its masked sentences, the blocks, the held-out sentences."""
  train_examples: str
  blocks: str
  eval_examples: str


def realm_params(recipe: Recipe, vocab: str, data: PretrainData, index_dir: str, ict_dir: str,
                 reader_dir: str, validate_every: Optional[int] = None,
                 seed: Optional[int] = None, qa_eval: str = "",
                 more: Optional[Settings] = None):
  """A REALM pre-training run's config (``realm_pretrain_cpu`` and its __demo.yaml's shapes);
  ``more``: settings applied last."""
  settings = dict(towers(vocab), **{
      "task.train_data.input_path": os.path.join(data.train_examples, "train-*"),
      "task.train_data.blocks_dir": data.blocks,
      "task.validation_data.input_path": os.path.join(data.eval_examples, "eval-*"),
      "task.validation_data.blocks_dir": data.blocks,
      "task.index_dir": index_dir,
      "task.retriever_init_checkpoint": ict_dir,
      "task.reader_init_checkpoint": reader_dir,
  }, **intervals(recipe.refresh_every, validate_every), **runtime(recipe),
                  **schedule(recipe.realm_steps, recipe.realm_learning_rate))
  if seed is not None:
    settings["task.train_data.seed"] = seed
  if qa_eval:
    settings["task.qa_eval_path"] = qa_eval
  settings.update(more or {})
  return experiment_params("realm_pretrain_cpu", [config("realm_pretrain_cpu")], settings)


def realm_jobs(model_dir: str, params, blocks: str, min_interval: int = 0, once: bool = False,
               validate: bool = False) -> List[Job]:
  """A REALM pre-training run of ``params`` (written to ``model_dir.yaml``) in ``model_dir``
  beside its refresher (its index in ``model_dir + "_index"``, built at most every
  ``min_interval`` steps, or ``once`` from the starting point); ``validate``:
  ``train_and_eval``. Nothing when the run is finished."""
  if model_dir_lib.training_done(model_dir):
    return []
  name = os.path.basename(model_dir)
  config_file = write_params(params, f"{model_dir}.yaml")
  refresher_args = [
      "realm_tf.binaries.refresh", f"--model_dir={model_dir}", f"--index_dir={model_dir}_index",
      f"--blocks_dir={blocks}", "--poll_seconds=1", "--model_dir_wait_seconds=1800", "--keep=2",
      "--index_type=brute_force", "--progress=false", f"--min_step_interval={min_interval}"]
  if once:
    refresher_args.append("--max_builds=1")
  trainer = ["realm_tf.binaries.train", "--experiment=realm_pretrain_cpu",
             "--mode=" + ("train_and_eval" if validate else "train"),
             f"--config_file={config_file}", f"--model_dir={model_dir}"]
  return [Job(f"realm-refresh ({name})", refresher_args, f"{model_dir}.refresh.log",
              follower=True),
          Job(name, trainer, f"{model_dir}.train.log", model_dir, params.trainer.train_steps)]


def indexes_built(model_dir: str) -> int:
  """How many indexes the refresher beside ``model_dir`` published (from its log)."""
  with open(f"{model_dir}.refresh.log") as f:
    return sum(line.startswith("[realm-refresh] published") for line in f)


def index_ages(model_dir: str) -> Dict:
  """A REALM run's index age: steps between the checkpoint whose block tower built the index a
  batch retrieved from and the trainer's step. ``by_interval``: ``[(step, mean age over the
  summary interval ending there)]`` (the trainer's ``index_age`` summaries; an interval is one
  refresh period); ``mean`` and ``max`` over them."""
  return age_summary(model_dir_lib.read_summaries(model_dir, "train").get("index_age", []))


def age_summary(series: List) -> Dict:
  """``[(step, age)]`` -> ``by_interval`` (the series), ``mean`` and ``max`` (None if empty)."""
  values = [v for _, v in series]
  return dict(by_interval=series, mean=sum(values) / len(values) if values else None,
              max=max(values) if values else None)


def realm_eval_params(recipe: Recipe, vocab: str, data: PretrainData, ict_dir: str,
                      reader_dir: str):
  """The REALM task's validation config (``realm-train --mode=eval``) over ``data``."""
  return realm_params(recipe, vocab, data, "unused_index", ict_dir, reader_dir)


# ------------------------------------------------------------------------------- indexes --
def build_index(model_dir: str, blocks_dir: str, index_dir: str, embeddings=None) -> str:
  """A frozen brute-force index of ``model_dir``'s block tower over ``blocks_dir`` in
  ``index_dir`` (the refresher's build: ``realm-index build``'s path), from ``embeddings`` when
  given (rows by block id); its path."""
  return refresher.build_index_for_checkpoint(
      None, model_dir, blocks_dir, index_dir, embeddings=embeddings,
      options=refresher.BuildOptions(index_type="brute_force", recall_queries=0,
                                     progress=False))


def retriever_recall(tower_dir: str, index_dir: str, blocks_dir: str, qa_file: str,
                     k: int = 5) -> Dict[str, float]:
  """Zero-shot recall@k of each retriever a user can choose (``retrieval.sparse.hybrid``: dense,
  bm25, hybrid) on ``qa_file``'s questions: a top-k block body holds an answer (ORQA's
  HasAnswer), over the index ``index_dir`` publishes (its BM25 part for bm25 and hybrid), the
  questions embedded by ``tower_dir``'s query tower."""
  records, _ = qa_lib.read_qa(qa_file)
  bodies = [b["body"] for b in manifests.read_blocks(blocks_dir)]
  index = index_io.load_index(publish.read_latest(index_dir))
  questions = [r.question for r in records]
  embeddings = embedder_api.Embedder.load(tower_dir).embed_queries(questions)
  out = {}
  for retriever in hybrid.RETRIEVERS:
    ids = hybrid.retrieve(index, retriever, embeddings, questions, k).ids
    out[retriever] = float(np.mean([
        any(inputs.has_answer(bodies[b], r.answers, r.answer_type == qa_lib.REGEX)
            for b in row if b >= 0) for r, row in zip(records, ids)]))
  return out


# ------------------------------------------------------------------------------ Open-QA --
def openqa_params(recipe: Recipe, vocab: str, index_dir: str, qa_file: str, dev_file: str,
                  retriever_dir: str, reader_dir: str, seed: Optional[int] = None):
  """An Open-QA run's config (``openqa_cpu`` and its __demo.yaml's shapes), validated on
  ``dev_file``."""
  settings = dict(towers(vocab), **{
      "task.index_dir": index_dir, "task.train_data.input_path": qa_file,
      "task.validation_data.input_path": dev_file,
      "task.retriever_init_checkpoint": retriever_dir,
      "task.reader_init_checkpoint": reader_dir,
  }, **intervals(max(1, recipe.openqa_steps // 3)), **runtime(recipe),
                  **schedule(recipe.openqa_steps, recipe.openqa_learning_rate))
  if seed is not None:
    settings["task.train_data.seed"] = seed
  return experiment_params("openqa_cpu", [config("openqa_cpu")], settings)


def openqa_rows(clock: Clock, recipe: Recipe, base: str, rows: Dict[str, tuple],
                sources: Dict[str, str], files: Dict, blocks: str,
                seed: Optional[int] = None) -> Dict[str, Dict]:
  """Open-QA fine-tuning of ``rows`` (``{run: (retriever, reader)}``, keys of ``sources``,
  ``{key: model dir}``), side by side in ``base/<run>``, each against a frozen brute-force index
  of its retriever's block tower (``base/openqa_index_<retriever>``). Returns ``{run:
  {"before": ..., "after": ...}}``: the test questions' validation logs of the run's retriever
  before fine-tuning (the span scorer untrained; ``top_5_match`` is the zero-shot recall@5;
  evaluated once per retriever, with the first row's reader) and of the fine-tuned model, each
  with ``question_records``: per test question, ``{"question", "prediction", "correct"}``."""
  vocab = files["vocab"]
  index = {r: os.path.join(base, f"openqa_index_{r}") for r, _ in rows.values()}
  for retriever, index_dir in index.items():
    if not tf.io.gfile.exists(os.path.join(index_dir, "LATEST")):
      build_index(sources[retriever], blocks, index_dir)

  def params(run, split):
    retriever, reader = rows[run]
    return openqa_params(recipe, vocab, index[retriever], files["qa_train"], files[split],
                         sources[retriever], sources[reader], seed)

  jobs = []
  for run in rows:
    model_dir = os.path.join(base, run)
    if not model_dir_lib.training_done(model_dir):
      config_file = write_params(params(run, "qa_dev"), f"{model_dir}.yaml")
      jobs.append(Job(run, ["realm_tf.binaries.train", "--experiment=openqa_cpu",
                            "--mode=train_and_eval", f"--config_file={config_file}",
                            f"--model_dir={model_dir}"],
                      f"{model_dir}.train.log", model_dir, recipe.openqa_steps))
  if jobs:
    clock.say(f"Open-QA fine-tuning of {len(jobs)} runs side by side ({recipe.openqa_steps} "
              f"steps each): {', '.join(j.name for j in jobs)}; logs in {base}/<run>.train.log")
    run_side_by_side(clock, "Open-QA", jobs, recipe.parallel_runs)

  def evaluate(test_params, model_dir):
    task = task_factory.get_task(test_params.task, logging_dir=model_dir)
    logs = train_lib.run_experiment(test_params, model_dir, mode="eval", task=task)
    return dict(logs, question_records=task.question_records)

  results, before = {}, {}
  for run, (retriever, _) in rows.items():
    test = params(run, "qa_test")
    if retriever not in before:
      # An empty model directory evaluates the initialization: zero-shot retrieval.
      start_dir = os.path.join(base, f"openqa_start_{retriever}")
      tf.io.gfile.makedirs(start_dir)
      before[retriever] = evaluate(test, start_dir)
    results[run] = dict(before=before[retriever], after=evaluate(test, os.path.join(base, run)))
  return results
