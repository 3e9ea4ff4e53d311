r"""REALM vs ICT at CPU scale: one switch at a time, on the tables' world, with health curves.

  python -m experiments.diagnose --output_dir=tables_out --variants=recipe,before
  python -m experiments.diagnose --list           # the variants and what each changes

Each variant is a set of config overrides (every switch is a config field) applied to the
tables' REALM pre-training run (``experiments/tables.py``: the same world, data, warm starts
and schedule; a rerun into a tables output directory reuses them). Every run validates every
``--validation_every`` steps, step 0 included, on the held-out masked sentences and on the
**dev** questions (``qa_recall@5``; the test questions are never read here), beside its
refresher. The summary table compares each variant's dev QA recall@5 at the end with its
start (the ICT retriever's), with the retrieval-health signals (``realm_tf.health``) at the
start and the end; ``diagnose.md``/``diagnose.csv``/``diagnose.png`` in ``--output_dir``.
"""

import json
import os
import time
from typing import Dict, List

from absl import flags

from experiments import demo
from experiments import tables
from realm_tf.binaries import cli

FLAGS = flags.FLAGS
flags.DEFINE_list("variants", ["recipe"], "Which variants to run (see --list).")
flags.DEFINE_integer("diagnose_seeds", 1, "Seeds per variant (0, 1, ...).")
flags.DEFINE_bool("list", False, "Print the variants and exit.")
flags.DEFINE_integer("parallel", 2, "Runs side by side (each with its refresher).")
flags.DEFINE_bool("warm_only", False, "Only train the variants' warm starts.")

# name -> (what it changes, overrides of the REALM run, warm starts replaced: {"bert"|"ict":
# an existing warm start's name, or (a new one's name, the stage it varies, its overrides)}).
_ICT_UNMASKED = ("ict_unmasked", "ict", ["task.train_data.query_mask_prob=0.0"])
VARIANTS: Dict[str, tuple] = {
    "recipe": ("the CPU recipe (demo and tables): reader fine-tuned beside distractors, ICT "
               "with masked queries, 16 candidates, lr 3e-5, BERT's warm-up", [], {}),
    "before": ("the recipe before issue 22: the reading reader alone, ORQA's ICT, 8 "
               "candidates, lr 1e-4, 30 warm-up steps",
               ["task.model.num_candidates=8",
                "trainer.optimizer_config.learning_rate.polynomial.initial_learning_rate=1e-4",
                "trainer.optimizer_config.warmup.linear.warmup_steps=30"],
               {"bert": "reader_read", "ict": _ICT_UNMASKED}),
    "no_distractors": ("the reading reader without its fine-tuning beside distractors", [],
                       {"bert": "reader_read"}),
    "ict_unmasked": ("ORQA's ICT: no masked span in its queries", [], {"ict": _ICT_UNMASKED}),
    "k8": ("the paper's 8 candidates (7 retrieved)", ["task.model.num_candidates=8"], {}),
    "freeze_100": ("the retriever frozen for the first 100 steps (Atlas)",
                   ["task.retriever_freeze_steps=100"], {}),
    "warmup_30": ("a 30-step warm-up instead of BERT's formula",
                  ["trainer.optimizer_config.warmup.linear.warmup_steps=30"], {}),
    "dropout": ("ORQA's projection dropout 0.1 on the retriever during REALM",
                ["task.model.retriever.projection_dropout=0.1"], {}),
    "lr_1e-4": ("REALM's learning rate 1e-4 (the recipe's is the paper's 3e-5)",
                ["trainer.optimizer_config.learning_rate.polynomial.initial_learning_rate=1e-4"],
                {}),
}


def variant_warm(name: str, warm: Dict[str, str]) -> Dict[str, str]:
  """The warm starts of a variant: the tables' own, or the variant's replacements."""
  return dict(warm, **{stage: warm[r if isinstance(r, str) else r[0]]
                       for stage, r in VARIANTS[name][2].items()})


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
  text = tables.write_table(out, "diagnose", header, rows,
                            "Validation at step 0 -> the last step; qa_recall@5 on the dev "
                            "questions.")
  return text


def plot(out: str, runs: Dict[str, Dict[int, Dict[str, List]]]) -> str:
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
  if FLAGS.list:
    for name, (what, overrides, warm) in VARIANTS.items():
      print(f"{name:16s} {what}\n{'':16s} {' '.join(overrides) or '(no override)'} "
            f"{warm or ''}")
    return
  unknown = [v for v in FLAGS.variants if v not in VARIANTS]
  if unknown:
    raise ValueError(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
  from realm_tf import model_dir as model_dir_lib  # pylint: disable=g-import-not-at-top
  from realm_tf import tasks  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  start = time.time()
  out = os.path.abspath(FLAGS.output_dir)
  os.makedirs(out, exist_ok=True)
  data = tables.prepare(out)
  extra_warm = {r[0]: r[1:] for name in FLAGS.variants for r in VARIANTS[name][2].values()
                if not isinstance(r, str)}
  warm = tables.warm_starts(out, data, extra_warm)
  if FLAGS.warm_only:
    return
  jobs = [(name, seed) for name in FLAGS.variants for seed in range(FLAGS.diagnose_seeds)]
  todo = [(n, s) for n, s in jobs
          if not model_dir_lib.training_done(os.path.join(out, "diagnose", f"{n}_s{s}"))]
  for i in range(0, len(todo), FLAGS.parallel):
    procs = []
    for name, seed in todo[i:i + FLAGS.parallel]:
      procs += tables.start_pretrain(os.path.join(out, "diagnose", f"{name}_s{seed}"), data,
                                     variant_warm(name, warm), seed, extra=VARIANTS[name][1])
    tables.say(f"diagnose: {', '.join(f'{n} (seed {s})' for n, s in todo[i:i + FLAGS.parallel])}")
    demo.wait_all(sorted(procs, key=lambda p: "refresh" in p[1]))
  runs: Dict[str, Dict[int, Dict[str, List]]] = {}
  for name, seed in jobs:
    runs.setdefault(name, {})[seed] = tables.read_validation_curves(
        os.path.join(out, "diagnose", f"{name}_s{seed}"))
  with open(os.path.join(out, "diagnose.json"), "w") as f:
    json.dump(runs, f, indent=1)
  print(summarize(out, runs))
  plot(out, runs)
  tables.say(f"diagnose finished in {(time.time() - start) / 60:.1f} min")


def run():
  for name, value in (("world_scale", 5.0), ("realm_steps", 500), ("openqa_steps", 300),
                      ("reading_steps", 6000), ("refresh_every", 10),
                      ("output_dir", "tables_out")):
    FLAGS.set_default(name, value)
  cli.run_main(main)


if __name__ == "__main__":
  run()
