r"""REALM vs ICT at CPU scale: one switch at a time, on the tables' world, with health curves.

  python -m experiments.diagnose --output_dir=tables_out --variants=recipe,before
  python -m experiments.diagnose --list           # the variants and what each changes

Each variant is a set of config overrides (every switch is a config field) applied to the tables'
REALM pre-training run (``experiments/synthetic/table_seed.py``: the same world, data, warm starts
and schedule; seed ``s`` of a variant starts from the tables' seed ``s`` warm starts in
``--output_dir/seed<s>``, and a rerun into a tables output directory reuses them). Every run
validates every ``--validation_every`` steps, step 0 included, on the held-out masked sentences and
on the **dev** questions (``qa_recall@5``; the test questions are never read here), beside its
refresher, ``--parallel`` runs at a time. The summary table compares each variant's dev QA recall@5
at the end with its start (the ICT retriever's), with the retrieval-health signals
(``realm_tf.health``) at the start and the end; ``diagnose.md``/``diagnose.csv``/``diagnose.png``
in ``--output_dir``.
"""

import json
import os
from typing import Dict, List

from absl import flags

from experiments.pipeline import recipe_flags
from experiments.pipeline import stages
from experiments.pipeline.common import Clock
from experiments.synthetic import report
from experiments.synthetic import table_seed
from experiments.synthetic import tables  # and its flags (--validation_every, --lr_retriever, ...)
from realm_tf import model_dir as model_dir_lib
from realm_tf.binaries import cli

FLAGS = flags.FLAGS
flags.DEFINE_list("variants", ["recipe"], "Which variants to run (see --list).")
flags.DEFINE_integer("diagnose_seeds", 1, "Seeds per variant (0, 1, ...).")
flags.DEFINE_bool("list", False, "Print the variants and exit.")
flags.DEFINE_integer("parallel", 2, "Runs side by side (each with its refresher).")
flags.DEFINE_bool("warm_only", False, "Only train the variants' warm starts.")

# name -> (what it changes, overrides of the REALM run, warm starts replaced: {"bert"|"ict":
# an existing warm start's name, or (a new one's name, the stage it varies, its overrides)}).
_ICT_UNMASKED = ("ict_unmasked", "ict", {"task.train_data.query_mask_prob": 0.0})
VARIANTS: Dict[str, tuple] = {
    "recipe": ("the CPU recipe (demo and tables): reader fine-tuned beside distractors, ICT "
               "with masked queries, 16 candidates, lr 3e-5, BERT's warm-up", {}, {}),
    "before": ("the recipe before issue 22: the reading reader alone, ORQA's ICT, 8 "
               "candidates, lr 1e-4, 30 warm-up steps",
               {"task.model.num_candidates": 8,
                "trainer.optimizer_config.learning_rate.polynomial.initial_learning_rate": 1e-4,
                "trainer.optimizer_config.warmup.linear.warmup_steps": 30},
               {"bert": "reader_read", "ict": _ICT_UNMASKED}),
    "no_distractors": ("the reading reader without its fine-tuning beside distractors", {},
                       {"bert": "reader_read"}),
    "ict_unmasked": ("ORQA's ICT: no masked span in its queries", {}, {"ict": _ICT_UNMASKED}),
    "k8": ("the paper's 8 candidates (7 retrieved)", {"task.model.num_candidates": 8}, {}),
    "freeze_100": ("the retriever frozen for the first 100 steps (Atlas)",
                   {"task.retriever_freeze_steps": 100}, {}),
    "warmup_30": ("a 30-step warm-up instead of BERT's formula",
                  {"trainer.optimizer_config.warmup.linear.warmup_steps": 30}, {}),
    "dropout": ("ORQA's projection dropout 0.1 on the retriever during REALM",
                {"task.model.retriever.projection_dropout": 0.1}, {}),
    "lr_1e-4": ("REALM's learning rate 1e-4 (the recipe's is the paper's 3e-5)",
                {"trainer.optimizer_config.learning_rate.polynomial.initial_learning_rate": 1e-4},
                {}),
}


def variant_warm(name: str, warm: Dict[str, str]) -> Dict[str, str]:
  """The warm starts of a variant: the tables' own, or the variant's replacements."""
  return dict(warm, **{stage: warm[r if isinstance(r, str) else r[0]]
                       for stage, r in VARIANTS[name][2].items()})


def warm_starts(clock: Clock, out: str, data: Dict, seed: int, recipe: stages.Recipe,
                variants: List[str]) -> Dict[str, str]:
  """Seed ``seed``'s warm starts in ``out/seed<seed>``: the tables' (``table_seed.warm_starts``)
  and the new ones of ``variants`` (a stage of ``table_seed.warm_start_stages`` with more
  settings), trained with the same seed."""
  base = os.path.join(out, f"seed{seed}")
  warm = table_seed.warm_starts(clock, base, data, seed, recipe)
  known = table_seed.warm_start_stages(recipe, data, base)
  more = {}
  for name in variants:
    for r in VARIANTS[name][2].values():
      if not isinstance(r, str):
        new, stage, settings = r
        more[new] = known[stage]._replace(settings=dict(known[stage].settings, **settings))
  done = stages.train_warm_starts(clock, base, more, seed=seed)
  return dict(warm, **{name: model_dir for name, (model_dir, _) in done.items()})


def run_dir(out: str, name: str, seed: int) -> str:
  return os.path.join(out, "diagnose", f"{name}_s{seed}")


def variant_jobs(out: str, data: Dict, warm: Dict[str, str], name: str, seed: int,
                 recipe: stages.Recipe, table: table_seed.TableSettings) -> List[stages.Job]:
  """Variant ``name``'s REALM run of seed ``seed`` beside its refresher (the tables' ``realm``
  run, validating every ``validation_every`` steps, dev questions included, with the
  variant's warm starts and settings); nothing when it is finished."""
  vocab, dirs = data["files"]["vocab"], data["dirs"]
  model_dir = run_dir(out, name, seed)
  warm = variant_warm(name, warm)
  where = stages.PretrainData(dirs["pretrain_salient"], dirs["blocks"], dirs["pretrain_salient"])
  params = stages.realm_params(
      recipe, vocab, where, model_dir + "_index", warm["ict"], warm["bert"],
      validate_every=table.validation_every, seed=seed, qa_eval=data["files"]["qa_dev"],
      more=dict({"task.lr_retriever": table.lr_retriever}, **VARIANTS[name][1]))
  return stages.realm_jobs(model_dir, params, dirs["blocks"], validate=True)


SHOWN = ("qa_recall@5", "recall@5", "retrieval_utility", "retrieval_entropy_ratio", "p_null",
         "candidates_with_answer", "reader_gain_answer", "reader_gain_other", "query_cosine",
         "block_cosine", "distinct_candidates", "health_alarms")


def summarize(out: str, runs: Dict[str, Dict[int, Dict[str, List]]]) -> str:
  """The table (Markdown + CSV) of every variant and seed: each SHOWN tag at step 0 -> end."""
  header = ["variant", "seed"] + list(SHOWN)
  rows = []
  for name, seeds in runs.items():
    for seed, curves in sorted(seeds.items()):
      first = {tag: points[0][1] for tag, points in curves.items() if points}
      last = {tag: points[-1][1] for tag, points in curves.items() if points}
      rows.append([name, seed] + [
          f"{first[t]:.3f} -> {last[t]:.3f}" if t in first and t in last else "n/a"
          for t in SHOWN])
  text = report.write_table(out, "diagnose", header, rows,
                            "Validation at step 0 -> the last step; qa_recall@5 on the dev "
                            "questions.")
  return text


def plot(out: str, runs: Dict[str, Dict[int, Dict[str, List]]]) -> str:
  # Inside: matplotlib's backend is chosen before pyplot is imported, and only for the plot.
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  shown = ("qa_recall@5", "recall@5", "retrieval_entropy_ratio", "p_null",
           "reader_gain_other", "reader_gain_answer")
  fig, axes = plt.subplots(2, 3, figsize=(14, 7))
  for ax, tag in zip(axes.ravel(), shown):
    for name, seeds in runs.items():
      for seed, curves in seeds.items():
        points = curves.get(tag, [])
        if points:
          ax.plot(*zip(*points), marker="o", label=f"{name} s{seed}")
    ax.set_title(tag)
    ax.set_xlabel("pre-training step")
    ax.grid(alpha=0.3)
  axes[0][0].legend(fontsize=7)
  fig.tight_layout()
  path = os.path.join(out, "diagnose.png")
  fig.savefig(path, dpi=110)
  return path


def main(argv):
  del argv
  # The tables' settings (the demo's knobs: NOTES section 17) and their output directory.
  FLAGS.set_default("output_dir", "tables_out")
  if FLAGS.list:
    for name, (what, overrides, warm) in VARIANTS.items():
      shown = " ".join(f"{k}={v}" for k, v in overrides.items()) or "(no override)"
      print(f"{name:16s} {what}\n{'':16s} {shown} {warm or ''}")
    return
  unknown = [v for v in FLAGS.variants if v not in VARIANTS]
  if unknown:
    raise ValueError(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
  recipe = recipe_flags.recipe(FLAGS)
  table = tables.table_settings(FLAGS)
  clock = Clock("diagnose", FLAGS.progress_seconds)
  out = os.path.abspath(FLAGS.output_dir)
  os.makedirs(out, exist_ok=True)
  with clock.stage("data"):
    data = table_seed.prepare(clock, out, table, recipe)
  seeds = range(FLAGS.diagnose_seeds)
  with clock.stage("warm starts"):
    warm = {seed: warm_starts(clock, out, data, seed, recipe, FLAGS.variants) for seed in seeds}
  if FLAGS.warm_only:
    return
  runs = [(name, seed) for name in FLAGS.variants for seed in seeds]
  jobs = [job for name, seed in runs
          for job in variant_jobs(out, data, warm[seed], name, seed, recipe, table)]
  if jobs:
    clock.say(f"{', '.join(j.name for j in jobs if not j.follower)} ({recipe.realm_steps} "
              f"steps each, {FLAGS.parallel} at a time); logs in {out}/diagnose/<run>.*.log")
    with clock.stage("pre-training"):
      stages.run_side_by_side(clock, "diagnose", jobs, parallel=FLAGS.parallel)
  curves: Dict[str, Dict[int, Dict[str, List]]] = {}
  for name, seed in runs:
    curves.setdefault(name, {})[seed] = model_dir_lib.read_summaries(
        run_dir(out, name, seed), "validation")
  with open(os.path.join(out, "diagnose.json"), "w") as f:
    json.dump(curves, f, indent=1)
  print(summarize(out, curves))
  plot(out, curves)
  clock.say(clock.summary())


def run():
  cli.run_main(main)


if __name__ == "__main__":
  run()
