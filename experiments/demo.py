r"""realm-demo (``make demo``): the whole REALM pipeline at toy size on the synthetic world.

An experiment, not a library: it drives the data pipelines, ``realm-train`` and
``realm-refresh`` exactly as a user would, at the sizes that fit 2 CPU cores in 20 minutes.

1. generate the synthetic knowledge world and learn a WordPiece vocabulary from it (every name
   word and year one wordpiece), and ``--reading_worlds`` counterfactual worlds: the same names,
   other facts;
2. data_prep: blocks, salient-span annotation, masked examples, ICT examples, for each world;
3. warm starts (``warm_start_stages``): the reader learns to read on the counterfactual worlds
   (the toy stand-in for its BERT initialization, ``tasks/reader_read.py``), then learns,
   beside distractor blocks, to predict from the query alone when a block does not help; ICT
   trains the retriever on the demo world, with a masked span in half of its queries;
4. REALM pre-training with ``realm-train`` and ``realm-refresh`` running side by side as two
   processes (the refresher re-embeds the corpus from each new checkpoint);
5. at the same time, the stale-index ablation: the same run with the index built once and
   never refreshed;
6. held-out evaluation (``realm-train --mode=eval``: the REALM task's validation) of the
   starting point (the ICT towers and the reading reader) and of both runs;
7. Open-QA fine-tuning (ORQA's recipe, ``tasks/openqa.py``) on the world's training questions,
   from the ICT towers + the reading reader (the ORQA baseline) and from the refreshed REALM
   run, each against a frozen index of its own block tower; test-question EM and zero-shot
   recall@5 (a top-5 block holds an answer, before fine-tuning) side by side.

Everything goes under ``--output_dir``; a summary is printed and saved as ``results.json``.
"""

import json
import os
import subprocess
import sys
import time

from absl import flags

from realm_tf.binaries import cli

FLAGS = flags.FLAGS
flags.DEFINE_string("output_dir", "demo_out", "Where everything is written.")
flags.DEFINE_integer("seed", 0, "Seed of the synthetic world.")
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
flags.DEFINE_bool("stale_ablation", True, "Also run the never-refreshed index ablation.")
flags.DEFINE_integer("openqa_steps", 600, "Open-QA fine-tuning steps (each run).")
flags.DEFINE_float("openqa_learning_rate", 1e-4, "Open-QA peak learning rate.")

CONFIG_DIR = os.path.join(os.path.dirname(__file__), "configs")


def _say(message: str) -> None:
  print(f"[demo {time.strftime('%H:%M:%S')}] {message}", flush=True)


def start_binary(args, log_path):
  """Starts a realm_tf binary as its own process, logging to ``log_path`` (unbuffered: its
  printed lines and its log lines reach the file in the order they happen)."""
  log = open(log_path, "w")  # pylint: disable=consider-using-with
  return subprocess.Popen([sys.executable, "-u", "-m", *args], stdout=log,
                          stderr=subprocess.STDOUT)


def _wait(proc, name, log_path):
  if proc.wait() != 0:
    with open(log_path) as f:
      tail = f.read()[-3000:]
    raise RuntimeError(f"{name} failed (exit {proc.returncode}); last log lines:\n{tail}")


def wait_all(procs):
  """Waits for each ``(process, name, log)`` in order; on a failure, kills the rest."""
  try:
    for proc, name, log in procs:
      _wait(proc, name, log)
  finally:
    for proc, _, _ in procs:
      if proc.poll() is None:
        proc.kill()


def make_world(seed: int, name_seed: int, scale: float = 1.0):
  """The synthetic world of ``seed`` (names of ``name_seed``), ``scale`` times the demo's."""
  from data_prep import synthetic_world  # pylint: disable=g-import-not-at-top
  return synthetic_world.generate_world(
      seed=seed, name_seed=name_seed, num_regions=round(6 * scale),
      num_cities=round(30 * scale), num_people=round(100 * scale),
      num_organizations=round(24 * scale), num_works=round(50 * scale))


def prepare_data(out: str):
  """World -> vocab -> blocks, sentences, masked examples, ICT examples; then the same for the
  counterfactual reading worlds, with the demo world's vocabulary."""
  from data_prep import pipeline  # pylint: disable=g-import-not-at-top
  from data_prep import synthetic_world  # pylint: disable=g-import-not-at-top
  world = make_world(FLAGS.seed, FLAGS.seed, FLAGS.world_scale)
  files = synthetic_world.write_world(world, os.path.join(out, "world"), vocab_size=3000,
                                      whole_word_names=True)
  common = dict(block_seq_length=32, query_seq_length=32, examples_per_sentence=2)
  prepared = pipeline.prepare_all(files["articles"], files["vocab"], os.path.join(out, "data"),
                                  patterns_file=files["patterns"], eval_fraction=0.2,
                                  seed=FLAGS.seed, **common)
  reading = prepare_reading_worlds(
      out, files["vocab"], [make_world(FLAGS.seed + i, FLAGS.seed, FLAGS.world_scale)
                            for i in range(1, FLAGS.reading_worlds + 1)], FLAGS.seed, **common)
  return world, files, prepared, reading


def prepare_reading_worlds(out: str, vocab: str, worlds, seed: int, **prepare_args):
  """Each counterfactual world (the i-th, from 1) written to ``reading_world_i`` and prepared
  with ``vocab`` into ``reading_data_i`` (seed ``seed + i``); their output dirs."""
  from data_prep import pipeline  # pylint: disable=g-import-not-at-top
  from data_prep import synthetic_world  # pylint: disable=g-import-not-at-top
  reading = []
  for i, world in enumerate(worlds, 1):
    other = synthetic_world.write_world(world, os.path.join(out, f"reading_world_{i}"))
    reading.append(pipeline.prepare_all(
        other["articles"], vocab, os.path.join(out, f"reading_data_{i}"),
        patterns_file=other["patterns"], eval_fraction=0.02, seed=seed + i,
        **prepare_args)["dirs"])
  return reading


def reading_corpora(out: str, reading) -> str:
  """A YAML (JSON is YAML) naming the reading worlds' examples and blocks, for the reading
  warm starts' ``train_data``; its path."""
  path = os.path.join(out, "reading_corpora.yaml")
  with open(path, "w") as f:
    json.dump({"task": {"train_data": {
        "input_path": [os.path.join(d["pretrain"], "train-*") for d in reading],
        "blocks_dir": [d["blocks"] for d in reading]}}}, f)
  return path


def vocab_size(vocab):
  from realm_tf import tokenization  # pylint: disable=g-import-not-at-top
  return len(tokenization.load_vocab(vocab))


def schedule(steps, learning_rate, prefix="trainer.optimizer_config.learning_rate.polynomial"):
  return [f"trainer.train_steps={steps}", f"{prefix}.decay_steps={steps}",
          f"{prefix}.initial_learning_rate={learning_rate}"]


def warm_start_stages(vocab: str, reading_corpora: str, ict_examples: str) -> dict:
  """The warm starts, in order: ``{name: (experiment, steps, learning rate, YAML files,
  overrides)}`` (``{out}`` in an override is the output directory).

  * ``reader_read``: the reading warm start on the counterfactual worlds
    (``reading_corpora``: a YAML of their examples and blocks), the toy stand-in for BERT;
  * ``reader``: that reader fine-tuned beside ``--distractors`` blocks without the answer, so
    that it reads as BERT would from a block that does not help, predicting from the query
    rather than copying a name from the block (``ReaderReadTaskConfig.distractors``; without
    it REALM's retriever collapses: experiments/NOTES.md section 15). REALM and the baseline
    start from it;
  * ``ict``: ICT on ``ict_examples`` (``ict_cpu__demo.yaml``: a masked span in half of the
    queries).
  """
  n = vocab_size(vocab)
  reader = [f"task.model.vocab_file={vocab}", f"task.model.reader.encoder.vocab_size={n}",
            f"task.model.retriever.encoder.vocab_size={n}"]
  stages = {"reader_read": ("reader_read_cpu", FLAGS.reading_steps, 1e-3, [reading_corpora],
                            reader)}
  if FLAGS.distractor_steps:
    stages["reader"] = ("reader_read_cpu", FLAGS.distractor_steps, 3e-4, [reading_corpora],
                        reader + [f"task.distractors={FLAGS.distractors}",
                                  "task.init_checkpoint={out}/reader_read"])
  stages["ict"] = ("ict_cpu", FLAGS.ict_steps, FLAGS.ict_learning_rate, [],
                   [f"task.vocab_file={vocab}", f"task.model.encoder.vocab_size={n}",
                    f"task.train_data.input_path={os.path.join(ict_examples, 'train-*')}"])
  return stages


def train_warm_starts(out: str, stages: dict) -> dict:
  """Trains each stage of ``warm_start_stages`` (or more of that form) into ``out/<name>``,
  skipping those already trained; returns ``{name: (model_dir, last training logs)}``."""
  from realm_tf import configs  # pylint: disable=g-import-not-at-top
  from realm_tf import model_dir as model_dir_lib  # pylint: disable=g-import-not-at-top
  from realm_tf import train_lib  # pylint: disable=g-import-not-at-top
  from realm_tf import tasks  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  done = {}
  for name, (experiment, steps, learning_rate, yaml_files, overrides) in stages.items():
    model_dir = os.path.join(out, name)
    if model_dir_lib.training_done(model_dir):
      _say(f"{name}: already trained in {model_dir}")
      done[name] = (model_dir, {})
      continue
    params = configs.load_experiment(
        experiment, [os.path.join(CONFIG_DIR, f"{experiment}__demo.yaml"), *yaml_files],
        ",".join([o.format(out=out) for o in overrides] + schedule(steps, learning_rate)))
    _say(f"{name} warm start ({steps} steps) -> {model_dir}")
    metrics = train_lib.run_experiment(params, model_dir, mode="train")
    _say(f"{name} done: { {k: round(v, 4) for k, v in metrics.items()} }")
    done[name] = (model_dir, metrics)
  return done


def intervals(every):
  """Checkpoints, summaries and host round trips every ``every`` steps."""
  return [f"trainer.checkpoint_interval={every}", f"trainer.summary_interval={every}",
          f"trainer.steps_per_loop={every}", f"trainer.validation_interval={every}"]


def realm_overrides(vocab, dirs, index_dir, steps, refresh, ict_dir, reader_dir):
  return ",".join([
      f"task.model.vocab_file={vocab}",
      f"task.model.retriever.encoder.vocab_size={vocab_size(vocab)}",
      f"task.model.reader.encoder.vocab_size={vocab_size(vocab)}",
      f"task.train_data.input_path={os.path.join(dirs['pretrain'], 'train-*')}",
      f"task.train_data.blocks_dir={dirs['blocks']}",
      f"task.validation_data.input_path={os.path.join(dirs['pretrain'], 'eval-*')}",
      f"task.validation_data.blocks_dir={dirs['blocks']}",
      f"task.index_dir={index_dir}",
      f"task.refresh_index={str(refresh).lower()}",
      f"task.retriever_init_checkpoint={ict_dir}",
      f"task.reader_init_checkpoint={reader_dir}",
  ] + intervals(FLAGS.refresh_every) + schedule(steps, FLAGS.realm_learning_rate))


def pretrain(runs, vocab, dirs, ict_dir, reader_dir, out):
  """REALM pre-training runs ``{name: refresh}``, each beside its refresher, all side by side.

  Every trainer and refresher is its own process. One tiny trainer keeps only part of two
  cores busy, so the runs finish sooner together than one after the other. Returns
  ``{name: (model_dir, indexes built)}``.
  """
  procs = []
  for name, refresh in runs.items():
    model_dir = os.path.join(out, name)
    index_dir = os.path.join(out, f"{name}_index")
    refresher_args = ["realm_tf.binaries.refresh", f"--model_dir={model_dir}",
                      f"--index_dir={index_dir}", f"--blocks_dir={dirs['blocks']}",
                      "--poll_seconds=1", "--model_dir_wait_seconds=600", "--keep=2",
                      "--index_type=brute_force"]
    if not refresh:
      refresher_args.append("--max_builds=1")   # one index, from the ICT starting point
    trainer_args = ["realm_tf.binaries.train", "--experiment=realm_pretrain_cpu", "--mode=train",
                    f"--config_file={os.path.join(CONFIG_DIR, 'realm_pretrain_cpu__demo.yaml')}",
                    f"--model_dir={model_dir}",
                    "--params_override=" + realm_overrides(vocab, dirs, index_dir,
                                                           FLAGS.realm_steps, refresh, ict_dir,
                                                           reader_dir)]
    _say(f"REALM pre-training '{name}' ({FLAGS.realm_steps} steps, index "
         f"{'refreshed every checkpoint' if refresh else 'built once, never refreshed'}); "
         f"logs in {out}/{name}.*.log")
    for binary, args in (("realm-refresh", refresher_args), ("realm-train", trainer_args)):
      log = os.path.join(out, f"{name}.{binary.split('-')[1]}.log")
      procs.append((start_binary(args, log), binary, log))
  # Trainers first: a refresher exits only after its trainer has finished.
  wait_all(sorted(procs, key=lambda p: p[1] == "realm-refresh"))
  results = {}
  for name in runs:
    with open(os.path.join(out, f"{name}.refresh.log")) as f:
      builds = sum(line.startswith("[realm-refresh] published") for line in f)
    results[name] = (os.path.join(out, name), builds)
  return results


def openqa_overrides(vocab, index_dir, qa_file, dev_file, retriever_dir, reader_dir):
  n = vocab_size(vocab)
  return ",".join([
      f"task.model.vocab_file={vocab}", f"task.model.reader.encoder.vocab_size={n}",
      f"task.model.retriever.encoder.vocab_size={n}", f"task.index_dir={index_dir}",
      f"task.train_data.input_path={qa_file}", f"task.validation_data.input_path={dev_file}",
      f"task.retriever_init_checkpoint={retriever_dir}",
      f"task.reader_init_checkpoint={reader_dir}",
  ] + intervals(max(1, FLAGS.openqa_steps // 3)) + schedule(FLAGS.openqa_steps,
                                                            FLAGS.openqa_learning_rate))


def openqa(runs, out, dirs, files, vocab):
  """Open-QA fine-tuning runs ``{name: (retriever_dir, reader_dir)}``, side by side, each from
  the towers of ``retriever_dir`` and the reader of ``reader_dir`` against a frozen index of
  ``retriever_dir``'s block tower. Returns ``{name: (before, after)}``: the test questions'
  validation logs of the initialization (the span scorer untrained; ``top_5_match`` is the
  zero-shot recall@5) and of the fine-tuned model."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from realm_tf import configs  # pylint: disable=g-import-not-at-top
  from realm_tf import train_lib  # pylint: disable=g-import-not-at-top
  from realm_tf.retrieval import refresher  # pylint: disable=g-import-not-at-top
  config_file = os.path.join(CONFIG_DIR, "openqa_cpu__demo.yaml")

  def overrides(name, split):
    retriever_dir, reader_dir = runs[name]
    return openqa_overrides(vocab, os.path.join(out, f"{name}_index"), files["qa_train"],
                            files[split], retriever_dir, reader_dir)

  procs = []
  for name, (retriever_dir, _) in runs.items():
    refresher.build_index_for_checkpoint(
        None, retriever_dir, dirs["blocks"], os.path.join(out, f"{name}_index"),
        options=refresher.BuildOptions(index_type="brute_force", progress=False))
    log = os.path.join(out, f"{name}.train.log")
    _say(f"Open-QA fine-tuning '{name}' ({FLAGS.openqa_steps} steps); log in {log}")
    procs.append((start_binary(["realm_tf.binaries.train", "--experiment=openqa_cpu",
                                "--mode=train_and_eval", f"--config_file={config_file}",
                                f"--model_dir={os.path.join(out, name)}",
                                "--params_override=" + overrides(name, "qa_dev")], log),
                  f"realm-train ({name})", log))
  wait_all(procs)
  results = {}
  for name in runs:
    params = configs.load_experiment("openqa_cpu", [config_file], overrides(name, "qa_test"))
    # An empty model directory evaluates the initialization.
    start_dir = os.path.join(out, f"{name}_start")
    tf.io.gfile.makedirs(start_dir)
    results[name] = (train_lib.run_experiment(params, start_dir, mode="eval"),
                     train_lib.run_experiment(params, os.path.join(out, name), mode="eval"))
  return results


def evaluate(params, model_dir):
  """The REALM task's validation of ``model_dir`` (``realm-train --mode=eval``)."""
  from realm_tf import train_lib  # pylint: disable=g-import-not-at-top
  return train_lib.run_experiment(params, model_dir, mode="eval")


def main(argv):
  del argv
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from realm_tf import configs  # pylint: disable=g-import-not-at-top
  from realm_tf import model_dir as model_dir_lib  # pylint: disable=g-import-not-at-top
  from realm_tf import train_lib  # pylint: disable=g-import-not-at-top
  from realm_tf import tasks  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  from realm_tf.data import manifests  # pylint: disable=g-import-not-at-top

  start = time.time()
  out = os.path.abspath(FLAGS.output_dir)
  tf.io.gfile.makedirs(out)
  _say(f"writing everything under {out}")
  world, files, prepared, reading = prepare_data(out)
  dirs, vocab = prepared["dirs"], files["vocab"]
  num_blocks = manifests.load_blocks_manifest(dirs["blocks"])["num_blocks"]
  _say(f"world: {len(world.articles)} articles -> {num_blocks} blocks, "
       f"{prepared['pretrain']['num_train']} masked training sentences, "
       f"{prepared['pretrain']['num_eval']} held out, {prepared['ict']['num_train']} ICT blocks; "
       f"{len(reading)} reading worlds")

  warm = train_warm_starts(out, warm_start_stages(vocab, reading_corpora(out, reading),
                                                   dirs["ict"]))
  reader_dir, reader_metrics = warm["reader" if "reader" in warm else "reader_read"]
  ict_dir, ict_metrics = warm["ict"]

  wanted = {"realm": True, "realm_stale": False} if FLAGS.stale_ablation else {"realm": True}
  trained = pretrain(wanted, vocab, dirs, ict_dir, reader_dir, out)
  runs = {"refreshed" if wanted[name] else "stale": run for name, run in trained.items()}

  def eval_params(model_dir):
    return configs.load_experiment(
        "realm_pretrain_cpu", [os.path.join(CONFIG_DIR, "realm_pretrain_cpu__demo.yaml")],
        realm_overrides(vocab, dirs, os.path.join(out, "unused_index"), FLAGS.realm_steps,
                        True, ict_dir, reader_dir))

  # The starting point of REALM pre-training: evaluated in an empty model directory, the
  # REALM task initializes from the ICT towers and the warm-started reader.
  start_dir = os.path.join(out, "realm_start")
  tf.io.gfile.makedirs(start_dir)
  rows = {"start (ICT, reading reader)": dict(
      evaluate(eval_params(start_dir), start_dir),
      step=model_dir_lib.checkpoint_step(model_dir_lib.latest_checkpoint(ict_dir)))}
  for name, (model_dir, builds) in runs.items():
    result = evaluate(eval_params(model_dir), model_dir)
    result["step"] = model_dir_lib.checkpoint_step(model_dir_lib.latest_checkpoint(model_dir))
    result["indexes_built"] = builds
    rows[f"REALM, {name} index"] = result
  held_out = int(rows["REALM, refreshed index"]["examples"])

  print("\n" + "=" * 78)
  print(f"REALM demo on the synthetic world: {held_out} held-out masked sentences")
  print(f"{'model':28s} {'step':>6s} {'recall@5':>9s} {'retr. utility':>14s} "
        f"{'MLM acc':>8s}")
  for name, r in rows.items():
    print(f"{name:28s} {r['step']:6d} {r['recall@5']:9.3f} {r['retrieval_utility']:14.3f} "
          f"{r['mlm_accuracy']:8.3f}")
  print("=" * 78)

  realm_dir = runs["refreshed"][0]
  labels = {"openqa_orqa": "ORQA baseline (ICT + reading reader)",
            "openqa_realm": "REALM (refreshed run)"}
  finetuned = openqa({"openqa_orqa": (ict_dir, reader_dir),
                      "openqa_realm": (realm_dir, realm_dir)}, out, dirs, files, vocab)
  qa_rows = {labels[name]: dict(before=before, after=after)
             for name, (before, after) in finetuned.items()}
  num_test = int(next(iter(qa_rows.values()))["after"]["questions"])
  print(f"Open-QA on the synthetic world: {num_test} held-out test questions "
        f"({FLAGS.openqa_steps} fine-tuning steps each)")
  print(f"{'model':38s} {'zero-shot R@5':>13s} {'EM before':>10s} {'EM after':>9s} "
        f"{'top-5 after':>11s}")
  for label, r in qa_rows.items():
    print(f"{label:38s} {r['before']['top_5_match']:13.3f} "
          f"{r['before']['official_exact_match']:10.3f} "
          f"{r['after']['official_exact_match']:9.3f} {r['after']['top_5_match']:11.3f}")
  ict_r5, realm_r5 = (qa_rows[labels[k]]["before"]["top_5_match"]
                      for k in ("openqa_orqa", "openqa_realm"))
  print(f"Zero-shot QA recall@5 (a top-5 block holds an answer, before fine-tuning): "
        f"ICT start {ict_r5:.3f}, REALM {realm_r5:.3f} "
        f"({'REALM higher' if realm_r5 > ict_r5 else 'REALM not higher'}; {num_test} "
        f"questions, one run)")
  print("=" * 78)
  elapsed = time.time() - start
  _say(f"finished in {elapsed / 60:.1f} min; results in {out}/results.json")
  with open(os.path.join(out, "results.json"), "w") as f:
    json.dump(dict(rows=rows, openqa=qa_rows, seconds=elapsed, ict=ict_metrics,
                   reader_read=reader_metrics), f, indent=2, default=float)


def run():
  cli.run_main(main)


if __name__ == "__main__":
  run()
