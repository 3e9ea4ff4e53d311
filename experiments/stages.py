r"""The stages of ``make demo`` and of a table seed, and the scheduler that runs them.

``experiments/demo.py`` and ``experiments/table_seed.py`` are short sequences of the stages
here; a stage's output directory is decided in one place, its caller's. Each stage skips what
an earlier run into the same directory finished (``TRAINING_DONE``, a published index).

* data: :func:`make_world`, :func:`prepare_reading_worlds`, :func:`reading_corpora`;
* warm starts (:func:`warm_start_stages`, :func:`train_warm_starts`): the reading reader that
  stands in for BERT, and ICT;
* REALM pre-training (:func:`realm_jobs`): ``realm-train`` beside its ``realm-refresh``;
* Open-QA (:func:`openqa_rows`): ORQA's fine-tuning of a (retriever, reader) pair against a
  frozen index of the retriever's block tower, evaluated before and after.

The scheduler (:func:`run_side_by_side`) starts trainers and refreshers as processes of their
own, all at once by default (``--parallel_runs`` caps the runs at a time): two runs side by
side finished 1.14x sooner than one after the other, and a REALM step cost 0.69 CPU-s with five
trainers side by side against 0.66 with two (experiments/NOTES.md sections 20 and 21).
:class:`Progress` prints one line per ``--progress_seconds`` for every long stage (steps done,
steps/s, ETA), and :class:`Clock` times the stages and prints the total at the end.
"""

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from typing import Dict, List, NamedTuple, Optional, Sequence

from absl import flags

FLAGS = flags.FLAGS
CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")

# The recipe, shared by the demo and the tables (NOTES section 17: the tables are the demo's
# runs, a seed at a time).
flags.DEFINE_string("output_dir", "demo_out", "Where everything is written.")
flags.DEFINE_integer("seed", 0, "realm-demo: the synthetic world's seed. experiments.tables: "
                     "the seed of this seed's runs (the world's is --world_seed).")
flags.DEFINE_float("world_scale", 1.0, "Size of the synthetic world (1.0: 210 articles).")
flags.DEFINE_integer("reading_worlds", 4, "Counterfactual worlds the reader learns to read on.")
flags.DEFINE_integer("reading_steps", 6000, "Reading warm-start steps of the reader.")
flags.DEFINE_integer("distractor_steps", 1500,
                     "Steps of the reader's fine-tuning beside distractor blocks, after its "
                     "reading warm start (0: none; experiments/NOTES.md section 15).")
flags.DEFINE_integer("distractors", 2, "Distractor blocks per sentence in that fine-tuning.")
flags.DEFINE_integer("ict_steps", 400, "ICT warm-start steps.")
flags.DEFINE_float("ict_learning_rate", 5e-4, "ICT peak learning rate.")
flags.DEFINE_integer("realm_steps", 1000, "REALM pre-training steps (each run).")
flags.DEFINE_float("realm_learning_rate", 3e-5,
                   "REALM peak learning rate (the paper's; at 1e-4 the dev questions' recall "
                   "swings by 0.1 between checkpoints: experiments/NOTES.md section 15).")
flags.DEFINE_integer("refresh_every", 25, "Checkpoint (and so index refresh) interval.")
flags.DEFINE_integer("openqa_steps", 600, "Open-QA fine-tuning steps (each run).")
flags.DEFINE_float("openqa_learning_rate", 1e-4, "Open-QA peak learning rate.")
flags.DEFINE_enum("precision", "float32", ["float32", "bfloat16"],
                  "runtime.mixed_precision_dtype of every training run.")
flags.DEFINE_integer("parallel_runs", 0,
                     "At most this many REALM or Open-QA training runs at once, each a process "
                     "(0: all at once).")
flags.DEFINE_integer("progress_seconds", 30,
                     "A progress line (steps, steps/s, ETA) every this many seconds of a long "
                     "stage (0: none).")


# ------------------------------------------------------------------------ time and progress --
class Clock:
  """Says timestamped lines under a prefix and times named stages."""

  def __init__(self, prefix: str):
    self.prefix, self.start, self.laps = prefix, time.time(), {}

  def say(self, message: str) -> None:
    print(f"[{self.prefix} {time.strftime('%H:%M:%S')}] {message}", flush=True)

  @contextlib.contextmanager
  def stage(self, name: str):
    """Times the block as stage ``name`` (minutes in ``laps``), saying when it is done."""
    t = time.time()
    yield
    self.laps[name] = round((time.time() - t) / 60, 2)
    self.say(f"{name} done in {self.laps[name]:.1f} min")

  def minutes(self) -> float:
    return (time.time() - self.start) / 60

  def summary(self) -> str:
    """Each stage's minutes and the total, one line."""
    parts = ", ".join(f"{name} {m:.1f}" for name, m in self.laps.items())
    return f"finished in {self.minutes():.1f} min ({parts})"


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
    self.seconds = FLAGS.progress_seconds if seconds is None else seconds
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
  from data_prep import synthetic_world  # pylint: disable=g-import-not-at-top
  return synthetic_world.generate_world(
      seed=seed, name_seed=name_seed, num_regions=round(6 * scale),
      num_cities=round(30 * scale), num_people=round(100 * scale),
      num_organizations=round(24 * scale), num_works=round(50 * scale))


# Sequence lengths and examples per sentence of every world's data_prep.
PREPARE_ARGS = dict(block_seq_length=32, query_seq_length=32, examples_per_sentence=2)


def reading_worlds(world_seed: int) -> List:
  """The ``--reading_worlds`` counterfactual worlds of ``world_seed``: the same names, other
  facts (the i-th, from 1, has seed ``world_seed + i``)."""
  return [make_world(world_seed + i, world_seed, FLAGS.world_scale)
          for i in range(1, FLAGS.reading_worlds + 1)]


def prepare_reading_worlds(out: str, vocab: str, worlds: Sequence, seed: int,
                           **prepare_args) -> List[Dict]:
  """Each counterfactual world (the i-th, from 1) written to ``out/reading_world_i`` and
  prepared with ``vocab`` into ``out/reading_data_i`` (seed ``seed + i``; ``prepare_args``:
  data_prep's, default ``PREPARE_ARGS``); their output dirs."""
  from data_prep import pipeline  # pylint: disable=g-import-not-at-top
  from data_prep import synthetic_world  # pylint: disable=g-import-not-at-top
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
  from realm_tf import tokenization  # pylint: disable=g-import-not-at-top
  return len(tokenization.load_vocab(vocab))


# ----------------------------------------------------------------------------- settings --
def schedule(steps, learning_rate, prefix="trainer.optimizer_config.learning_rate.polynomial"):
  return [f"trainer.train_steps={steps}", f"{prefix}.decay_steps={steps}",
          f"{prefix}.initial_learning_rate={learning_rate}"]


def intervals(every: int, validate_every: Optional[int] = None) -> List[str]:
  """Checkpoints, summaries and host round trips every ``every`` steps; validation every
  ``validate_every`` (default ``every``; it runs only in ``train_and_eval``)."""
  return [f"trainer.checkpoint_interval={every}", f"trainer.summary_interval={every}",
          f"trainer.steps_per_loop={every}",
          f"trainer.validation_interval={validate_every or every}"]


def runtime() -> List[str]:
  """``--precision`` as every run's ``runtime.mixed_precision_dtype``."""
  return [f"runtime.mixed_precision_dtype={FLAGS.precision}"]


def towers(vocab: str) -> List[str]:
  """The vocabulary and its size in the model's towers (retriever and reader)."""
  n = vocab_size(vocab)
  return [f"task.model.vocab_file={vocab}", f"task.model.retriever.encoder.vocab_size={n}",
          f"task.model.reader.encoder.vocab_size={n}"]


def config(experiment: str) -> str:
  """The ``__demo.yaml`` of ``experiment``: its toy-scale shapes."""
  return os.path.join(CONFIG_DIR, f"{experiment}__demo.yaml")


# -------------------------------------------------------------------------- warm starts --
def warm_start_stages(vocab: str, reading_corpora_yaml: str, ict_examples: str) -> Dict:
  """The warm starts, in order: ``{name: (experiment, steps, learning rate, YAML files,
  overrides)}`` (``{out}`` in an override is the output directory).

  * ``reader_read``: the reading warm start on the counterfactual worlds
    (``reading_corpora_yaml``: a YAML of their examples and blocks), the toy stand-in for BERT;
  * ``reader``: that reader fine-tuned beside ``--distractors`` blocks without the answer, so
    that it reads as BERT would from a block that does not help, predicting from the query
    rather than copying a name from the block (``ReaderReadTaskConfig.distractors``; without
    it REALM's retriever collapses: experiments/NOTES.md section 15). REALM and the baseline
    start from it;
  * ``ict``: ICT on ``ict_examples`` (``ict_cpu__demo.yaml``: a masked span in half of the
    queries).
  """
  reader = towers(vocab) + runtime()
  stages = {"reader_read": ("reader_read_cpu", FLAGS.reading_steps, 1e-3,
                            [reading_corpora_yaml], reader)}
  if FLAGS.distractor_steps:
    stages["reader"] = ("reader_read_cpu", FLAGS.distractor_steps, 3e-4, [reading_corpora_yaml],
                        reader + [f"task.distractors={FLAGS.distractors}",
                                  "task.init_checkpoint={out}/reader_read"])
  stages["ict"] = ("ict_cpu", FLAGS.ict_steps, FLAGS.ict_learning_rate, [],
                   [f"task.vocab_file={vocab}",
                    f"task.model.encoder.vocab_size={vocab_size(vocab)}",
                    f"task.train_data.input_path={os.path.join(ict_examples, 'train-*')}"]
                   + runtime())
  return stages


def train_warm_starts(clock: Clock, out: str, stages: Dict, seed: Optional[int] = None) -> Dict:
  """Trains each stage of ``warm_start_stages`` (or more of that form) into ``out/<name>``,
  in this process at the cores' full width, skipping those already trained. With ``seed``,
  TensorFlow's global seed is set to it before each stage and it seeds the data order.
  Returns ``{name: (model_dir, last training logs)}``."""
  import tf_keras  # pylint: disable=g-import-not-at-top
  from realm_tf import configs  # pylint: disable=g-import-not-at-top
  from realm_tf import model_dir as model_dir_lib  # pylint: disable=g-import-not-at-top
  from realm_tf import train_lib  # pylint: disable=g-import-not-at-top
  from realm_tf import tasks  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  done = {}
  for name, (experiment, steps, learning_rate, yaml_files, overrides) in stages.items():
    model_dir = os.path.join(out, name)
    if model_dir_lib.training_done(model_dir):
      clock.say(f"{name}: already trained in {model_dir}")
      done[name] = (model_dir, {})
      continue
    overrides = [o.format(out=out) for o in overrides] + schedule(steps, learning_rate)
    if seed is not None:
      tf_keras.utils.set_random_seed(seed)
      overrides.append(f"task.train_data.seed={seed}")
    params = configs.load_experiment(experiment, [config(experiment), *yaml_files],
                                     ",".join(overrides))
    clock.say(f"{name} warm start ({steps} steps) -> {model_dir}")
    with Progress(clock, name, {name: (model_dir, steps)}):
      metrics = train_lib.run_experiment(params, model_dir, mode="train")
    clock.say(f"{name} done: { {k: round(v, 4) for k, v in metrics.items()} }")
    done[name] = (model_dir, metrics)
  return done


# ------------------------------------------------------------------------- pre-training --
class PretrainData(NamedTuple):
  """Where a REALM run reads: its masked sentences, the blocks, the held-out sentences."""
  train_examples: str
  blocks: str
  eval_examples: str


def realm_overrides(vocab: str, data: PretrainData, index_dir: str, ict_dir: str,
                    reader_dir: str, validate_every: Optional[int] = None,
                    seed: Optional[int] = None, qa_eval: str = "") -> str:
  """A REALM pre-training run's ``--params_override`` (the __demo.yaml's shapes)."""
  overrides = towers(vocab) + [
      f"task.train_data.input_path={os.path.join(data.train_examples, 'train-*')}",
      f"task.train_data.blocks_dir={data.blocks}",
      f"task.validation_data.input_path={os.path.join(data.eval_examples, 'eval-*')}",
      f"task.validation_data.blocks_dir={data.blocks}",
      f"task.index_dir={index_dir}",
      f"task.retriever_init_checkpoint={ict_dir}",
      f"task.reader_init_checkpoint={reader_dir}",
  ] + intervals(FLAGS.refresh_every, validate_every) + runtime() + schedule(
      FLAGS.realm_steps, FLAGS.realm_learning_rate)
  if seed is not None:
    overrides.append(f"task.train_data.seed={seed}")
  if qa_eval:
    overrides.append(f"task.qa_eval_path={qa_eval}")
  return ",".join(overrides)


def realm_jobs(model_dir: str, overrides: str, blocks: str, min_interval: int = 0,
               once: bool = False, validate: bool = False) -> List[Job]:
  """A REALM pre-training run in ``model_dir`` beside its refresher (its index in
  ``model_dir + "_index"``, built at most every ``min_interval`` steps, or ``once`` from the
  starting point); ``validate``: ``train_and_eval``. Nothing when the run is finished."""
  from realm_tf import model_dir as model_dir_lib  # pylint: disable=g-import-not-at-top
  if model_dir_lib.training_done(model_dir):
    return []
  name = os.path.basename(model_dir)
  os.makedirs(os.path.dirname(model_dir), exist_ok=True)
  refresher = ["realm_tf.binaries.refresh", f"--model_dir={model_dir}",
               f"--index_dir={model_dir}_index", f"--blocks_dir={blocks}", "--poll_seconds=1",
               "--model_dir_wait_seconds=1800", "--keep=2", "--index_type=brute_force",
               "--progress=false", f"--min_step_interval={min_interval}"]
  if once:
    refresher.append("--max_builds=1")
  trainer = ["realm_tf.binaries.train", "--experiment=realm_pretrain_cpu",
             "--mode=" + ("train_and_eval" if validate else "train"),
             f"--config_file={config('realm_pretrain_cpu')}", f"--model_dir={model_dir}",
             f"--params_override={overrides}"]
  return [Job(f"realm-refresh ({name})", refresher, f"{model_dir}.refresh.log", follower=True),
          Job(name, trainer, f"{model_dir}.train.log", model_dir, FLAGS.realm_steps)]


def indexes_built(model_dir: str) -> int:
  """How many indexes the refresher beside ``model_dir`` published (from its log)."""
  with open(f"{model_dir}.refresh.log") as f:
    return sum(line.startswith("[realm-refresh] published") for line in f)


def realm_eval_params(vocab: str, data: PretrainData, ict_dir: str, reader_dir: str):
  """The REALM task's validation config (``realm-train --mode=eval``) over ``data``."""
  from realm_tf import configs  # pylint: disable=g-import-not-at-top
  return configs.load_experiment(
      "realm_pretrain_cpu", [config("realm_pretrain_cpu")],
      realm_overrides(vocab, data, "unused_index", ict_dir, reader_dir))


# ------------------------------------------------------------------------------ Open-QA --
def openqa_overrides(vocab, index_dir, qa_file, dev_file, retriever_dir, reader_dir,
                     seed: Optional[int] = None) -> str:
  overrides = towers(vocab) + [
      f"task.index_dir={index_dir}", f"task.train_data.input_path={qa_file}",
      f"task.validation_data.input_path={dev_file}",
      f"task.retriever_init_checkpoint={retriever_dir}",
      f"task.reader_init_checkpoint={reader_dir}",
  ] + intervals(max(1, FLAGS.openqa_steps // 3)) + runtime() + schedule(
      FLAGS.openqa_steps, FLAGS.openqa_learning_rate)
  if seed is not None:
    overrides.append(f"task.train_data.seed={seed}")
  return ",".join(overrides)


def openqa_rows(clock: Clock, base: str, rows: Dict[str, tuple], sources: Dict[str, str],
                files: Dict, blocks: str, seed: Optional[int] = None) -> Dict[str, Dict]:
  """Open-QA fine-tuning of ``rows`` (``{run: (retriever, reader)}``, keys of ``sources``,
  ``{key: model dir}``), side by side in ``base/<run>``, each against a frozen brute-force index
  of its retriever's block tower (``base/openqa_index_<retriever>``). Returns ``{run:
  {"before": ..., "after": ...}}``: the test questions' validation logs of the run's retriever
  before fine-tuning (the span scorer untrained; ``top_5_match`` is the zero-shot recall@5;
  evaluated once per retriever, with the first row's reader) and of the fine-tuned model, each
  with ``question_records``: per test question, ``{"question", "prediction", "correct"}``."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from official.core import task_factory  # pylint: disable=g-import-not-at-top
  from realm_tf import configs  # pylint: disable=g-import-not-at-top
  from realm_tf import model_dir as model_dir_lib  # pylint: disable=g-import-not-at-top
  from realm_tf import train_lib  # pylint: disable=g-import-not-at-top
  from realm_tf.retrieval import refresher  # pylint: disable=g-import-not-at-top
  vocab = files["vocab"]
  index = {r: os.path.join(base, f"openqa_index_{r}") for r, _ in rows.values()}
  for retriever, index_dir in index.items():
    if not tf.io.gfile.exists(os.path.join(index_dir, "LATEST")):
      refresher.build_index_for_checkpoint(
          None, sources[retriever], blocks, index_dir,
          options=refresher.BuildOptions(index_type="brute_force", progress=False))

  def overrides(run, split):
    retriever, reader = rows[run]
    return openqa_overrides(vocab, index[retriever], files["qa_train"], files[split],
                            sources[retriever], sources[reader], seed)

  jobs = []
  for run in rows:
    model_dir = os.path.join(base, run)
    if not model_dir_lib.training_done(model_dir):
      jobs.append(Job(run, ["realm_tf.binaries.train", "--experiment=openqa_cpu",
                            "--mode=train_and_eval", f"--config_file={config('openqa_cpu')}",
                            f"--model_dir={model_dir}",
                            f"--params_override={overrides(run, 'qa_dev')}"],
                      f"{model_dir}.train.log", model_dir, FLAGS.openqa_steps))
  if jobs:
    clock.say(f"Open-QA fine-tuning of {len(jobs)} runs side by side ({FLAGS.openqa_steps} "
              f"steps each): {', '.join(j.name for j in jobs)}; logs in {base}/<run>.train.log")
    run_side_by_side(clock, "Open-QA", jobs, FLAGS.parallel_runs)
  def evaluate(params, model_dir):
    task = task_factory.get_task(params.task, logging_dir=model_dir)
    logs = train_lib.run_experiment(params, model_dir, mode="eval", task=task)
    return dict(logs, question_records=task.question_records)

  results, before = {}, {}
  for run, (retriever, _) in rows.items():
    test = configs.load_experiment("openqa_cpu", [config("openqa_cpu")],
                                   overrides(run, "qa_test"))
    if retriever not in before:
      # An empty model directory evaluates the initialization: zero-shot retrieval.
      start_dir = os.path.join(base, f"openqa_start_{retriever}")
      tf.io.gfile.makedirs(start_dir)
      before[retriever] = evaluate(test, start_dir)
    results[run] = dict(before=before[retriever], after=evaluate(test, os.path.join(base, run)))
  return results
