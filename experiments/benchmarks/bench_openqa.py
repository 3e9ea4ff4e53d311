r"""Benchmark: Open-QA answering latency, and the cost of a fine-tuning step over the reader's.

    python -m experiments.benchmarks.bench_openqa --repeats=5 --steps=10 --batch_size=8
    python -m experiments.benchmarks.bench_openqa --model_dir=demo_out/openqa_realm \
        --index_dir=demo_out/realm_index --questions=<qa-train.jsonl>

By default everything is built in a temporary directory: a small synthetic world, its blocks
(two sentences each), an untrained ``openqa_cpu`` model (2-layer, 64-wide towers, query 32
and reader 64 wordpieces) saved as a model directory, and a brute-force index of its block
tower. Weights do not change the time of a step, so an untrained model times as a trained
one. ``--model_dir`` and ``--index_dir`` benchmark a fine-tuned model instead; it then needs
``--questions``, a QA file of questions with answers.

Two measurements, in one process:

1. **Answering latency** (``OpenQA.answer``) at batch 1 and at batch ``--latency_batch``,
   over the same ``--latency_batch`` questions (at batch 1, one call per question), after one
   warm-up pass at each batch size (tracing; the blocks it reads are tokenized once and then
   cached, as in a long-running server). Per question: retrieval (tokenizing and embedding
   the question, the index search, building the reader inputs on the host, from
   ``OpenQA.timings``), reading (the reader's forward and the span prediction, one
   ``tf.function`` call) and the total wall time of ``answer``, whose rest is building the
   ``Answer`` objects. The two batch sizes alternate, ``--repeats`` times; medians.

2. **Fine-tuning step / reader-only step** on one batch of ``--batch_size`` questions, taken
   once from the task's own input pipeline (``OpenQaTask.build_inputs``) and reused: the
   Open-QA task's ``train_step`` (query tower forward and backward through the beam's
   retriever logits, the reader over ``R x Lr`` tokens per question, the span scorer, ORQA's
   loss, metrics, the optimizer's update) against the reader's encoder alone doing forward
   and backward on the same ``reader_word_ids/mask/type_ids`` with a trivial loss (the sum of
   its sequence output) and an optimizer of the same config (a second instance: one
   optimizer's slots are built for one set of variables). Both are ``tf.function``\ s, traced
   before timing; ``--steps`` steps per run, the two alternating ``--repeats`` times. Also
   timed, in the same rotation: the host's input building for that batch (question
   tokenization and packing, the query tower's embedding, ``OpenQaInputBuilder.features``,
   each timed on its own and summed; ``features`` reuses the tokenized blocks' cache), which
   the pipeline runs between steps without prefetch, so a training iteration costs host +
   step.

Prints a table of medians (all repeats in brackets), the ratio fine-tune step / reader-only
step, and a one-line summary.
"""

import contextlib
import io
import os
import shutil
import statistics
import tempfile
import time

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf
import tf_keras

from realm_tf import configs
from realm_tf import model_dir as model_dir_lib
from realm_tf.binaries import cli
from realm_tf.data import manifests
from realm_tf.modeling import models
from realm_tf.openqa import inputs as inputs_lib
from realm_tf.openqa import predict
from realm_tf.retrieval.publication import refresher
from realm_tf.tasks import openqa as openqa_task
from realm_tf.tokenization import RealmTokenizer
from realm_tf.tokenization import load_vocab

FLAGS = flags.FLAGS
EXPERIMENT = "openqa_cpu"


def define_flags():
  """Only when run as a program, so that importing this module defines no flags."""
  flags.DEFINE_string("model_dir", None, "A fine-tuned Open-QA model directory (default: an "
                      "untrained openqa_cpu model over a synthetic world).")
  flags.DEFINE_string("index_dir", None, "The index of --model_dir.")
  flags.DEFINE_string("questions", None, "QA file (JSON lines) of the questions; needed with "
                      "--model_dir (default: the synthetic world's qa-train.jsonl).")
  flags.DEFINE_integer("repeats", 5, "Interleaved runs of each measurement.")
  flags.DEFINE_integer("steps", 10, "Training steps (and host input builds) per run.")
  flags.DEFINE_integer("batch_size", 8, "Questions per fine-tuning batch (openqa_cpu: 8).")
  flags.DEFINE_integer("latency_batch", 32, "The larger answering batch, and the number of "
                       "questions answered per run at each batch size.")
  flags.DEFINE_integer("reader_beam_size", 5, "Blocks read per question (ORQA: 5).")
  flags.DEFINE_float("world_scale", 0.3, "Size of the synthetic world.")
  flags.DEFINE_string("work_dir", None, "Scratch directory (default: a temporary one).")


# ------------------------------------------------------------------------------- setup --

def make_blocks(articles, sentences_per_block: int = 2):
  """``(titles, bodies)``: each article cut into blocks of a few sentences."""
  titles, bodies = [], []
  for article in articles:
    sentences = [s.strip() + "." for s in article["text"].replace("\n", " ").split(". ")
                 if s.strip()]
    sentences[-1] = sentences[-1].rstrip(".") + "."
    for i in range(0, len(sentences), sentences_per_block):
      titles.append(article["title"])
      bodies.append(" ".join(sentences[i:i + sentences_per_block]))
  return titles, bodies


def make_synthetic(work: str, values):
  """World -> blocks -> an untrained openqa_cpu model dir -> its brute-force index.

  Returns ``(model_dir, index_dir, questions_file)``.
  """
  # Pulls in Apache Beam (data_prep.beam_utils), needed only without --model_dir.
  from data_prep import synthetic_world  # pylint: disable=g-import-not-at-top
  s = values.world_scale
  world = synthetic_world.generate_world(
      seed=0, num_regions=max(1, round(6 * s)), num_cities=round(30 * s),
      num_people=round(100 * s), num_organizations=round(24 * s), num_works=round(50 * s))
  files = synthetic_world.write_world(world, os.path.join(work, "world"), vocab_size=3000,
                                      whole_word_names=True)
  vocab, n = files["vocab"], len(load_vocab(files["vocab"]))
  model_config = configs.load_experiment(EXPERIMENT, params_override=",".join([
      f"task.model.vocab_file={vocab}", f"task.model.retriever.encoder.vocab_size={n}",
      f"task.model.reader.encoder.vocab_size={n}"])).task.model
  blocks_dir = os.path.join(work, "blocks")
  titles, bodies = make_blocks(world.articles)
  manifests.write_blocks(blocks_dir, titles, bodies, RealmTokenizer(vocab),
                         model_config.retriever.block_seq_length)
  model_dir = os.path.join(work, "model")
  model_dir_lib.write_metadata(model_dir, model_config, vocab)
  tf_keras.utils.set_random_seed(0)
  model = models.OpenQaModel.from_config_dataclass(model_dir_lib.load_config(model_dir))
  # The towers are shared (openqa_cpu), so the query tower is also the block tower indexed.
  model_dir_lib.make_checkpoint(query_embedder=model.query_embedder,
                                block_embedder=model.query_embedder,
                                reader=model.reader).save(os.path.join(model_dir, "ckpt"))
  index_dir = os.path.join(work, "index")
  with contextlib.redirect_stdout(io.StringIO()):
    refresher.build_index_for_checkpoint(
        None, model_dir, blocks_dir, index_dir,
        refresher.BuildOptions(index_type="brute_force", recall_queries=0, progress=False,
                               tensorboard_dir=""))
  return model_dir, index_dir, files["qa_train"]


def read_questions(path: str):
  return inputs_lib.load_questions(path)


# ---------------------------------------------------------------------- 1. latency --

def answer_run(qa: predict.OpenQA, questions, batch_size: int):
  """One ``answer`` pass; per-question seconds ``(total, retrieval, reading)``."""
  qa.timings.update(retrieval_seconds=0.0, reading_seconds=0.0, questions=0)
  start = time.perf_counter()
  qa.answer(questions, batch_size=batch_size)
  total = time.perf_counter() - start
  n = qa.timings["questions"]
  return total / n, qa.timings["retrieval_seconds"] / n, qa.timings["reading_seconds"] / n


def measure_latency(model_dir: str, index_dir: str, questions, values):
  """``{batch_size: [(total, retrieval, reading) per question, one per repeat]}``."""
  qa = predict.OpenQA.load(model_dir, index_dir, reader_beam_size=values.reader_beam_size)
  texts = [q.question for q in questions]
  texts = (texts * (values.latency_batch // len(texts) + 1))[:values.latency_batch]
  sizes = (1, values.latency_batch)
  for b in sizes:   # warm-up: traces each shape, tokenizes the blocks read
    answer_run(qa, texts, b)
  runs = {b: [] for b in sizes}
  for _ in range(values.repeats):
    for b in sizes:
      runs[b].append(answer_run(qa, texts, b))
  return runs, qa


# --------------------------------------------------------------- 2. fine-tune step --

def build_task(model_dir: str, index_dir: str, questions_file: str, values):
  params = configs.load_experiment(EXPERIMENT)
  task_config = configs.OpenQaTaskConfig(
      model=model_dir_lib.load_config(model_dir), index_dir=index_dir,
      init_checkpoint=model_dir,
      train_data=configs.OpenQaDataConfig(input_path=questions_file,
                                          global_batch_size=values.batch_size, seed=0),
      retriever_beam_size=params.task.retriever_beam_size,
      reader_beam_size=values.reader_beam_size, top_k=params.task.top_k)
  return params, openqa_task.OpenQaTask(task_config)


def timed(fn, steps: int) -> float:
  """Seconds per call of ``fn`` (its result fetched to the host at the end)."""
  start = time.perf_counter()
  for _ in range(steps):
    out = fn()
  if out is not None:
    tf.nest.map_structure(lambda t: np.asarray(t), out)
  return (time.perf_counter() - start) / steps


def measure_steps(model_dir: str, index_dir: str, questions_file: str, values):
  """``({name: [seconds per step, one per repeat]}, batch shapes)``."""
  params, task = build_task(model_dir, index_dir, questions_file, values)
  model = task.build_model()
  task.initialize(model)
  optimizer = task.create_optimizer(params.trainer.optimizer_config, params.runtime)
  reader_optimizer = task.create_optimizer(params.trainer.optimizer_config, params.runtime)
  metrics = task.build_metrics(training=True)
  batch = next(iter(task.build_inputs(task.task_config.train_data)))

  finetune = tf.function(lambda x: task.train_step(x, model, optimizer, metrics))
  reader = model.reader

  @tf.function
  def reader_only(inputs):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(reader(inputs, training=True)["sequence_output"])
    variables = reader.trainable_variables
    grads = tape.gradient(loss, variables)
    # The span scorer and the MLM head get no gradient from the encoder's output.
    reader_optimizer.apply_gradients((g, v) for g, v in zip(grads, variables) if g is not None)
    return loss

  reader_inputs = models.tower_inputs(batch, "reader")   # [b * R, Lr]
  builder = task.builder()
  chosen = read_questions(questions_file)[:values.batch_size]   # the step's batch size
  texts = [q.question for q in chosen]
  question_inputs = builder.question_inputs(texts)
  embeddings = task._embed_questions(question_inputs)  # pylint: disable=protected-access
  runs = dict(
      finetune=lambda: finetune(batch),
      reader_only=lambda: reader_only(reader_inputs),
      # The host side of one batch, as the pipeline runs it, in its three parts.
      tokenize=lambda: builder.question_inputs(texts),
      embed=lambda: task._embed_questions(question_inputs),  # pylint: disable=protected-access
      features=lambda: builder.features(chosen, embeddings, question_inputs=question_inputs))
  for fn in runs.values():   # tracing, and the blocks' tokenization cache
    timed(fn, 2)
  times = {name: [] for name in runs}
  for _ in range(values.repeats):
    for name, fn in runs.items():
      times[name].append(timed(fn, values.steps))
  shapes = {k: list(batch[k].shape) for k in ("beam_emb", "reader_word_ids")}
  return times, shapes


# ----------------------------------------------------------------------------- main --

def _ms(values):
  return f"{1e3 * statistics.median(values):8.2f}"


def _all(values):
  return "[" + " ".join(f"{1e3 * v:.1f}" for v in values) + "]"


def main(argv):
  del argv
  if bool(FLAGS.model_dir) != bool(FLAGS.index_dir):
    raise app.UsageError("give both --model_dir and --index_dir, or neither")
  if FLAGS.model_dir and not FLAGS.questions:
    raise app.UsageError("--model_dir needs --questions (a QA file with answers)")
  work = FLAGS.work_dir or tempfile.mkdtemp(prefix="bench_openqa_")
  try:
    start = time.perf_counter()
    if FLAGS.model_dir:
      model_dir, index_dir, questions_file = FLAGS.model_dir, FLAGS.index_dir, FLAGS.questions
    else:
      model_dir, index_dir, questions_file = make_synthetic(work, FLAGS)
    questions = read_questions(FLAGS.questions or questions_file)
    setup = time.perf_counter() - start
    latency, qa = measure_latency(model_dir, index_dir, questions, FLAGS)
    steps, shapes = measure_steps(model_dir, index_dir, questions_file, FLAGS)
  finally:
    if not FLAGS.work_dir:
      shutil.rmtree(work, ignore_errors=True)

  b, beam, _ = shapes["beam_emb"]
  _, read, lr = shapes["reader_word_ids"]
  print(f"\nOpen-QA, {FLAGS.model_dir or 'untrained ' + EXPERIMENT + ' model'}: "
        f"{len(qa.titles)} blocks, {len(questions)} questions, setup {setup:.1f} s; "
        f"{FLAGS.repeats} interleaved repeats, medians [all repeats], ms")
  print(f"\n1. answering, {FLAGS.latency_batch} questions per run, read "
        f"{qa.builder.read} of a beam of {qa.builder.beam}, per question:")
  print(f"  {'batch':>5} {'total':>8} {'retrieve':>8} {'read':>8} {'other':>8} {'q/s':>8}  "
        "total per question [repeats]")
  for size, runs in latency.items():
    total, retrieval, reading = ([r[i] for r in runs] for i in range(3))
    other = [t - a - c for t, a, c in zip(total, retrieval, reading)]
    print(f"  {size:5d} {_ms(total)} {_ms(retrieval)} {_ms(reading)} {_ms(other)} "
          f"{1 / statistics.median(total):8.1f}  {_all(total)}")

  ft, ro = statistics.median(steps["finetune"]), statistics.median(steps["reader_only"])
  print(f"\n2. training, batch {b}: beam {beam}, reader {read} x {lr} tokens per question "
        f"({b * read * lr} reader tokens a step), {FLAGS.steps} steps per run:")
  print(f"  {'':38s} {'ms':>8} {'steps/s':>8}  [repeats]")
  rows = (("finetune", "fine-tune step (task.train_step)"),
          ("reader_only", "reader-only forward+backward"),
          ("tokenize", "host: question tokenize + pack"),
          ("embed", "host: query tower embedding"),
          ("features", "host: builder.features"))
  for name, label in rows:
    print(f"  {label:38s} {_ms(steps[name])} {1 / statistics.median(steps[name]):8.1f}  "
          f"{_all(steps[name])}")
  host = sum(statistics.median(steps[k]) for k in ("tokenize", "embed", "features"))
  print(f"  {'host input build, the three summed':38s} {1e3 * host:8.2f} {1 / host:8.1f}")
  print(f"  ratio fine-tune step / reader-only step: {ft / ro:.3f}")
  print(f"  host input build / fine-tune step: {host / ft:.3f} "
        f"({100 * host / (host + ft):.0f}% of a training iteration, host + step)")
  lat1 = statistics.median([r[0] for r in latency[1]])
  latn = statistics.median([r[0] for r in latency[FLAGS.latency_batch]])
  print(f"\nsummary: answering {1e3 * lat1:.1f} ms/question at batch 1, {1e3 * latn:.2f} at "
        f"batch {FLAGS.latency_batch}; fine-tune step {ft / ro:.2f}x the reader-only step "
        f"({1e3 * ft:.1f} vs {1e3 * ro:.1f} ms); host inputs {100 * host / (host + ft):.0f}% "
        "of an iteration")


if __name__ == "__main__":
  define_flags()
  cli.run_main(main)
