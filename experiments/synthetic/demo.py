r"""realm-demo (``make demo``): the whole REALM pipeline at toy size on the synthetic world.

An experiment, not a library: it drives the data pipelines, ``realm-train`` and
``realm-refresh`` exactly as a user would, at the sizes that fit 2 CPU cores in 20 minutes.
Its stages live in ``experiments/pipeline/stages.py``:

1. data: the synthetic knowledge world and a WordPiece vocabulary learned from it (every name
   word and year one wordpiece); blocks, salient-span annotation, masked examples, ICT examples;
2. the reader's start, which plays BERT's part: by default the committed asset
   ``assets/demo_reader`` (a checkpoint of the reader this demo's own recipe trains, checksummed,
   built by ``realm-demo --build_reader_asset``), as a user starts from released BERT weights.
   ``--reader_start=train`` trains it instead: it reads on ``--reading_worlds`` counterfactual
   worlds (the same names, other facts; ``tasks/reader_read.py``), then learns, beside
   distractor blocks, to predict from the query alone when a block does not help;
3. the retriever's start: ICT on the demo world, with a masked span in half of its queries; by
   default the committed asset ``assets/demo_ict`` (those towers as this demo's recipe trains
   them, checksummed, built by ``realm-demo --build_ict_asset``), as REALM starts from ORQA's
   released ICT checkpoint; ``--ict_start=train`` trains it instead;
4. REALM pre-training with ``realm-train`` and ``realm-refresh`` side by side as processes (the
   refresher re-embeds the corpus from each new checkpoint), and at the same time the
   stale-index ablation: the same run with the index built once and never refreshed;
5. held-out evaluation (``realm-train --mode=eval``: the REALM task's validation) of the
   starting point (the ICT towers and the reader's start) and of both runs;
6. Open-QA fine-tuning (ORQA's recipe, ``tasks/openqa.py``) on the world's training questions,
   from the ICT towers + the reader's start (the ORQA baseline) and from the refreshed REALM
   run, each against a frozen index of its own block tower; test-question EM and zero-shot
   recall@5 (a top-5 block holds an answer, before fine-tuning) side by side, and that recall
   for each retriever a user can choose (dense, BM25 and the hybrid of the two).

Everything goes under ``--output_dir``; a summary is printed and saved as ``results.json``.
"""

import json
import os
import pathlib
import shutil
import subprocess
from typing import Container

from absl import flags
import tensorflow as tf

from data_prep import pipeline
from data_prep import synthetic_world
from experiments import assets
from experiments.pipeline import recipe_flags
from experiments.pipeline import stages
from experiments.pipeline.common import Clock
from realm_tf import embedder_api
from realm_tf import model_dir as model_dir_lib
from realm_tf import train_lib
from realm_tf.binaries import cli
from realm_tf.data import manifests
from realm_tf.modeling import factory

FLAGS = flags.FLAGS
flags.DEFINE_bool("stale_ablation", True, "Also run the never-refreshed index ablation.")
flags.DEFINE_enum("reader_start", "asset", ["asset", "train"],
                  "The reader's start (BERT's part): the committed asset assets/demo_reader "
                  "(when it was built with this run's vocabulary and settings; else trained), "
                  "or trained here (~8 min).")
flags.DEFINE_bool("build_reader_asset", False,
                  "Train the reader's start with this run's settings and write it to "
                  "--reader_asset_dir, then stop.")
flags.DEFINE_string("reader_asset_dir",
                    str(pathlib.Path(__file__).resolve().parents[2] / "assets" / "demo_reader"),
                    "The reader asset's folder.")
flags.DEFINE_enum("ict_start", "asset", ["asset", "train"],
                  "The retriever's warm start: the committed asset assets/demo_ict (when it was "
                  "built with this run's vocabulary and settings; else trained), or ICT trained "
                  "here.")
flags.DEFINE_bool("build_ict_asset", False,
                  "Train the ICT start with this run's settings and write it to "
                  "--ict_asset_dir, then stop.")
flags.DEFINE_string("ict_asset_dir",
                    str(pathlib.Path(__file__).resolve().parents[2] / "assets" / "demo_ict"),
                    "The ICT asset's folder.")

# The settings each start depends on: an asset is used only where they all match.
READER_SETTINGS = ("seed", "world_scale", "reading_worlds", "reading_steps", "distractor_steps",
                   "distractors", "precision")
ICT_SETTINGS = ("seed", "world_scale", "ict_steps", "ict_learning_rate", "ict_from_reader",
                "precision")


# -------------------------------------------------------------------------------- assets --
def _settings(names, seed: int, recipe: stages.Recipe) -> dict:
  """``names``' values in a run of world ``seed`` and ``recipe``."""
  return {name: seed if name == "seed" else getattr(recipe, name) for name in names}


def reader_settings(seed: int, recipe: stages.Recipe) -> dict:
  """``READER_SETTINGS``' values in a run of world ``seed`` and ``recipe``."""
  return _settings(READER_SETTINGS, seed, recipe)


def ict_settings(seed: int, recipe: stages.Recipe, reader: str = "") -> dict:
  """``ICT_SETTINGS``' values in a run of world ``seed`` and ``recipe``; with
  ``recipe.ict_from_reader``, also the sha256 of the reader start's weights (``reader``: its
  checkpoint or model directory), which ICT starts from."""
  out = _settings(ICT_SETTINGS, seed, recipe)
  if recipe.ict_from_reader:
    prefix = model_dir_lib.resolve_checkpoint(reader)
    out["reader_sha256"] = assets.sha256(f"{prefix}.data-00000-of-00001")
  return out


def asset_mismatch(asset_dir: str, vocab: str, settings: dict) -> str:
  """Why the asset in ``asset_dir`` cannot stand in for the start of a run with ``settings``
  (``reader_settings`` or ``ict_settings``) and ``vocab`` ("" when it can): missing, a file
  of its manifest missing or whose sha256 differs, another vocabulary, or other settings."""
  manifest_path = os.path.join(asset_dir, "MANIFEST.json")
  if not os.path.exists(manifest_path):
    return f"no {manifest_path}"
  with open(manifest_path) as f:
    manifest = json.load(f)
  for name, digest in manifest["sha256"].items():
    path = os.path.join(asset_dir, name)
    if not os.path.exists(path):
      return f"{path} is missing"
    if assets.sha256(path) != digest:
      return f"{path}: sha256 differs from {manifest_path} (`git checkout` restores it)"
  if assets.sha256(vocab) != manifest["vocab_sha256"]:
    return f"it was built with another vocabulary than {vocab}"
  differ = {k: (v, manifest["settings"].get(k)) for k, v in settings.items()
            if manifest["settings"].get(k) != v}
  if "reader_sha256" in differ:
    return ("it was built from another reader start (ICT starts from the reader's; the "
            "asset goes with the reader asset)")
  if differ:
    return "it was built with other settings: " + ", ".join(
        f"--{k}={theirs} (this run: {ours})" for k, (ours, theirs) in differ.items())
  return ""


def write_manifest(asset_dir: str, what: str, flag: str, settings: dict, vocab: str,
                   files, metrics: dict, flag_names: Container[str] = ()) -> None:
  """``asset_dir/MANIFEST.json``: what the asset is, the command that builds it (``flag`` and
  the ``settings`` that are flags, ``flag_names``: main passes its parsed flags), the commit,
  ``settings``, the vocabulary's sha256 and each of ``files``' (names in ``asset_dir``), and
  the start's last training logs."""
  commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                          cwd=os.path.dirname(__file__), check=False).stdout.strip()
  manifest = dict(
      what=what, built_by=f"realm-demo {flag} " + " ".join(
          f"--{k}={v}" for k, v in settings.items() if k in flag_names),
      commit=commit, settings=settings, vocab_sha256=assets.sha256(vocab),
      sha256={name: assets.sha256(os.path.join(asset_dir, name)) for name in files},
      metrics={k: round(float(v), 4) for k, v in metrics.items()})
  with open(os.path.join(asset_dir, "MANIFEST.json"), "w") as f:
    json.dump(manifest, f, indent=1)


def model_variables(path: str, prefixes) -> dict:
  """``{name: shape}`` of a checkpoint's model variables under ``prefixes`` (no optimizer
  slots)."""
  return {name: shape for name, shape in tf.train.list_variables(path)
          if name.startswith(tuple(prefixes)) and "OPTIMIZER_SLOT" not in name}


def write_reader_asset(reader_dir: str, vocab: str, metrics: dict, asset_dir: str,
                       settings: dict, flag_names: Container[str] = ()) -> None:
  """The reader of ``reader_dir``'s newest checkpoint alone (no optimizer slots), as the
  checkpoint ``asset_dir/reader``, with its ``MANIFEST.json`` (``write_manifest``)."""
  source = model_dir_lib.latest_checkpoint(reader_dir)
  reader = factory.build_reader(model_dir_lib.load_config(reader_dir).reader)
  reader.build_from_length()
  model_dir_lib.restore(source, reader=reader)
  os.makedirs(asset_dir, exist_ok=True)
  prefix = model_dir_lib.make_checkpoint(reader=reader).write(os.path.join(asset_dir, "reader"))
  if model_variables(prefix, ["reader/"]) != model_variables(source, ["reader/"]):
    raise RuntimeError(f"the asset's reader variables differ from {source}'s")
  write_manifest(asset_dir, "realm-demo's reader start (reading warm start + distractor "
                 "fine-tuning)", "--build_reader_asset", settings, vocab,
                 ("reader.index", "reader.data-00000-of-00001"), metrics, flag_names)


def write_ict_asset(ict_dir: str, metrics: dict, asset_dir: str, settings: dict,
                    flag_names: Container[str] = ()) -> None:
  """The ICT towers of ``ict_dir``'s newest checkpoint (no optimizer slots) as a model
  directory of their own in ``asset_dir`` (its config, vocabulary and one checkpoint), with
  its ``MANIFEST.json`` (``write_manifest``)."""
  source = model_dir_lib.latest_checkpoint(ict_dir)
  towers = embedder_api.Embedder.load(ict_dir)
  if os.path.exists(asset_dir):
    shutil.rmtree(asset_dir)
  os.makedirs(asset_dir)
  for name in (model_dir_lib.CONFIG_NAME, model_dir_lib.VOCAB_NAME):
    shutil.copy(os.path.join(ict_dir, name), asset_dir)
  step = model_dir_lib.checkpoint_step(source)
  checkpoint = model_dir_lib.make_checkpoint(query_embedder=towers.query_embedder,
                                             block_embedder=towers.block_embedder)
  prefix = tf.train.CheckpointManager(checkpoint, asset_dir, max_to_keep=1).save(
      checkpoint_number=step)
  prefixes = ["query_embedder/", "block_embedder/"]
  if model_variables(prefix, prefixes) != model_variables(source, prefixes):
    raise RuntimeError(f"the asset's tower variables differ from {source}'s")
  files = sorted(os.listdir(asset_dir))
  write_manifest(asset_dir, "realm-demo's ICT start (the retriever's warm start)",
                 "--build_ict_asset", settings, os.path.join(ict_dir, model_dir_lib.VOCAB_NAME),
                 files, metrics, flag_names)


def reader_start(clock, out: str, vocab: str, world_seed: int, recipe: stages.Recipe,
                 asset_dir: str = ""):
  """The reader REALM and the baseline start from: ``(checkpoint or model dir, its metrics)``,
  from the asset in ``asset_dir`` when one is given and it fits, else trained into ``out``."""
  if asset_dir:
    why = asset_mismatch(asset_dir, vocab, reader_settings(world_seed, recipe))
    if not why:
      with open(os.path.join(asset_dir, "MANIFEST.json")) as f:
        metrics = json.load(f)["metrics"]
      clock.say(f"reader start: the asset {asset_dir} (checksums match; "
                f"--reader_start=train trains it, ~8 min)")
      return os.path.join(asset_dir, "reader"), metrics
    clock.say(f"reader start: not the asset ({why}); training it")
  with clock.stage("reader start"):
    reading = stages.prepare_reading_worlds(out, vocab, stages.reading_worlds(world_seed, recipe),
                                            world_seed)
    corpora = stages.reading_corpora(out, reading)
    done = stages.train_warm_starts(clock, out, stages.reader_stages(recipe, vocab, corpora, out))
  reader_dir, metrics = done[stages.final_reader(done)]
  return reader_dir, metrics


def ict_start(clock, out: str, vocab: str, ict_examples: str, world_seed: int,
              recipe: stages.Recipe, asset_dir: str = "", reader: str = ""):
  """The ICT towers REALM and the baseline start from: ``(model dir, its metrics)``, the
  asset in ``asset_dir`` copied to ``out/ict`` when one is given and it fits, else trained
  there (from ``reader``, the reader's start, with ``recipe.ict_from_reader``)."""
  ict_dir = os.path.join(out, "ict")
  if asset_dir and not os.path.isdir(asset_dir):
    clock.say(f"ICT start: trained here (no asset {asset_dir}; --build_ict_asset builds one)")
  elif asset_dir:
    why = asset_mismatch(asset_dir, vocab, ict_settings(world_seed, recipe, reader))
    if not why:
      with open(os.path.join(asset_dir, "MANIFEST.json")) as f:
        manifest = json.load(f)
      if os.path.exists(ict_dir):
        shutil.rmtree(ict_dir)
      shutil.copytree(asset_dir, ict_dir)
      clock.say(f"ICT start: the asset {asset_dir} (checksums match; --ict_start=train "
                f"trains it, {recipe.ict_steps} steps)")
      return ict_dir, manifest["metrics"]
    clock.say(f"ICT start: not the asset ({why}); training it")
  with clock.stage("ICT"):
    return stages.train_warm_starts(
        clock, out, stages.ict_stage(recipe, vocab, ict_examples, reader))["ict"]


# -------------------------------------------------------------------------------- demo --
def prepare_data(out: str, seed: int, recipe: stages.Recipe):
  """World -> vocab -> blocks, sentences, masked examples, ICT examples."""
  world = stages.make_world(seed, seed, recipe.world_scale)
  files = synthetic_world.write_world(world, os.path.join(out, "world"), vocab_size=3000,
                                      whole_word_names=True)
  prepared = pipeline.prepare_all(files["articles"], files["vocab"], os.path.join(out, "data"),
                                  patterns_file=files["patterns"], eval_fraction=0.2,
                                  seed=seed, **stages.PREPARE_ARGS)
  return world, files, prepared


def print_tables(rows: dict, qa_rows: dict, openqa_steps: int, retrievers: dict) -> None:
  held_out = int(rows["REALM, refreshed index"]["examples"])
  print("\n" + "=" * 78)
  print(f"REALM demo on the synthetic world: {held_out} held-out masked sentences")
  print(f"{'model':28s} {'step':>6s} {'recall@5':>9s} {'retr. utility':>14s} "
        f"{'MLM acc':>8s}")
  for name, r in rows.items():
    print(f"{name:28s} {r['step']:6d} {r['recall@5']:9.3f} {r['retrieval_utility']:14.3f} "
          f"{r['mlm_accuracy']:8.3f}")
  print("=" * 78)
  num_test = int(next(iter(qa_rows.values()))["after"]["questions"])
  print(f"Open-QA on the synthetic world: {num_test} held-out test questions "
        f"({openqa_steps} fine-tuning steps each)")
  print(f"{'model':38s} {'zero-shot R@5':>13s} {'EM before':>10s} {'EM after':>9s} "
        f"{'top-5 after':>11s}")
  for label, r in qa_rows.items():
    print(f"{label:38s} {r['before']['top_5_match']:13.3f} "
          f"{r['before']['official_exact_match']:10.3f} "
          f"{r['after']['official_exact_match']:9.3f} {r['after']['top_5_match']:11.3f}")
  ict_r5, realm_r5 = (r["before"]["top_5_match"] for r in qa_rows.values())
  print(f"Zero-shot QA recall@5 (a top-5 block holds an answer, before fine-tuning): "
        f"ICT start {ict_r5:.3f}, REALM {realm_r5:.3f} "
        f"({'REALM higher' if realm_r5 > ict_r5 else 'REALM not higher'}; {num_test} "
        f"questions, one run)")
  ict, realm = retrievers["ICT"], retrievers["REALM"]
  print(f"The retriever choice (realm-answer, realm-serve: --retriever), zero-shot recall@5: "
        f"BM25 {realm['bm25']:.3f}; hybrid of BM25 and the ICT tower {ict['hybrid']:.3f}, of "
        f"BM25 and REALM's {realm['hybrid']:.3f} (dense alone: {ict['dense']:.3f}, "
        f"{realm['dense']:.3f})")
  print("=" * 78)


def main(argv):
  del argv
  recipe, seed = recipe_flags.recipe(FLAGS), FLAGS.seed
  clock = Clock("demo", FLAGS.progress_seconds)
  out = os.path.abspath(FLAGS.output_dir)
  tf.io.gfile.makedirs(out)
  clock.say(f"writing everything under {out}")
  with clock.stage("data"):
    world, files, prepared = prepare_data(out, seed, recipe)
  dirs, vocab = prepared["dirs"], files["vocab"]
  num_blocks = manifests.load_blocks_manifest(dirs["blocks"])["num_blocks"]
  clock.say(f"world: {len(world.articles)} articles -> {num_blocks} blocks, "
            f"{prepared['pretrain']['num_train']} masked training sentences, "
            f"{prepared['pretrain']['num_eval']} held out, {prepared['ict']['num_train']} ICT "
            "blocks")

  use_asset = FLAGS.reader_start == "asset" and not FLAGS.build_reader_asset
  reader_dir, reader_metrics = reader_start(clock, out, vocab, seed, recipe,
                                            FLAGS.reader_asset_dir if use_asset else "")
  if FLAGS.build_reader_asset:
    write_reader_asset(reader_dir, vocab, reader_metrics, FLAGS.reader_asset_dir,
                       reader_settings(seed, recipe), FLAGS)
    clock.say(f"reader asset written to {FLAGS.reader_asset_dir}; {clock.summary()}")
    return
  use_asset = FLAGS.ict_start == "asset" and not FLAGS.build_ict_asset
  ict_dir, ict_metrics = ict_start(clock, out, vocab, dirs["ict"], seed, recipe,
                                   FLAGS.ict_asset_dir if use_asset else "", reader_dir)
  if FLAGS.build_ict_asset:
    write_ict_asset(ict_dir, ict_metrics, FLAGS.ict_asset_dir,
                    ict_settings(seed, recipe, reader_dir), FLAGS)
    clock.say(f"ICT asset written to {FLAGS.ict_asset_dir}; {clock.summary()}")
    return

  data = stages.PretrainData(dirs["pretrain"], dirs["blocks"], dirs["pretrain"])
  runs = {"refreshed": os.path.join(out, "realm")}
  if FLAGS.stale_ablation:
    runs["stale"] = os.path.join(out, "realm_stale")
  jobs = []
  for name, model_dir in runs.items():
    params = stages.realm_params(recipe, vocab, data, f"{model_dir}_index", ict_dir, reader_dir)
    jobs += stages.realm_jobs(model_dir, params, dirs["blocks"], once=name == "stale")
  with clock.stage("REALM pre-training"):
    if jobs:
      clock.say(f"REALM pre-training {', '.join(runs)} side by side ({recipe.realm_steps} "
                f"steps each; the stale run's index is built once, never refreshed); logs in "
                f"{out}/realm*.log")
      stages.run_side_by_side(clock, "REALM", jobs, recipe.parallel_runs)

  with clock.stage("evaluation"):
    params = stages.realm_eval_params(recipe, vocab, data, ict_dir, reader_dir)
    # The starting point, evaluated in an empty model directory: the REALM task initializes
    # from the ICT towers and the reader's start.
    start_dir = os.path.join(out, "realm_start")
    tf.io.gfile.makedirs(start_dir)
    rows = {"start (ICT, reading reader)": dict(
        train_lib.run_experiment(params, start_dir, mode="eval"),
        step=model_dir_lib.checkpoint_step(model_dir_lib.latest_checkpoint(ict_dir)))}
    for name, model_dir in runs.items():
      result = train_lib.run_experiment(params, model_dir, mode="eval")
      result["step"] = model_dir_lib.checkpoint_step(model_dir_lib.latest_checkpoint(model_dir))
      result["indexes_built"] = stages.indexes_built(model_dir)
      rows[f"REALM, {name} index"] = result

  labels = {"openqa_orqa": "ORQA baseline (ICT + reading reader)",
            "openqa_realm": "REALM (refreshed run)"}
  with clock.stage("Open-QA"):
    finetuned = stages.openqa_rows(
        clock, recipe, out, {"openqa_orqa": ("ict", "reader"), "openqa_realm": ("realm", "realm")},
        {"ict": ict_dir, "reader": reader_dir, "realm": runs["refreshed"]}, files,
        dirs["blocks"])
    # The Open-QA indexes, each with its BM25 part: what realm-answer and realm-serve offer.
    retrievers = {name: stages.retriever_recall(
        tower, os.path.join(out, f"openqa_index_{key}"), dirs["blocks"], files["qa_test"])
                  for name, key, tower in (("ICT", "ict", ict_dir),
                                           ("REALM", "realm", runs["refreshed"]))}
  qa_rows = {labels[name]: r for name, r in finetuned.items()}
  print_tables(rows, qa_rows, recipe.openqa_steps, retrievers)
  clock.say(f"{clock.summary()}; results in {out}/results.json")
  with open(os.path.join(out, "results.json"), "w") as f:
    json.dump(dict(rows=rows, openqa=qa_rows, seconds=clock.minutes() * 60, stages=clock.laps,
                   retrievers=retrievers, ict=ict_metrics, reader_read=reader_metrics,
                   reader_start=str(reader_dir)), f, indent=2, default=float)


def run():
  cli.run_main(main)


if __name__ == "__main__":
  run()
