r"""REALM vs ICT at CPU scale: one switch at a time, on the tables' world, with health curves.

  python -m experiments.diagnose --output_dir=tables_out --variants=baseline,freeze_100
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
flags.DEFINE_list("variants", ["baseline"], "Which variants to run (see --list).")
flags.DEFINE_integer("diagnose_seeds", 1, "Seeds per variant (0, 1, ...).")
flags.DEFINE_bool("list", False, "Print the variants and exit.")
flags.DEFINE_integer("parallel", 2, "Runs side by side (each with its refresher).")
flags.DEFINE_bool("warm_only", False, "Only train the variants' warm starts.")

# name -> (what it tests, overrides of the REALM run[, warm starts: {"bert"|"ict": (variant
# warm start's name, its extra overrides)}]).
VARIANTS: Dict[str, tuple] = {
    "baseline": ("the tables' recipe with the faithful defaults (BERT's warm-up and epsilon)",
                 []),
    "warmup_30": ("the earlier 30-step warm-up instead of BERT's formula",
                  ["trainer.optimizer_config.warmup.linear.warmup_steps=30"]),
    "dropout": ("the retriever's projection dropout 0.1 (ORQA's module) during REALM",
                ["task.model.retriever.projection_dropout=0.1"]),
    "lr_3e-5": ("the paper's learning rate", ["trainer.optimizer_config.learning_rate."
                                              "polynomial.initial_learning_rate=3e-5"]),
    "freeze_100": ("the retriever frozen for the first 100 steps (Atlas): the reader first "
                   "learns to read ICT's candidates", ["task.retriever_freeze_steps=100"]),
    "distractors_2": ("a reading warm start with 2 distractor blocks beside the answer block",
                      [], {"bert": ("bert_distractors_2", ["task.distractors=2"])}),
    "distractors_ft": ("the reading reader fine-tuned 1,500 steps (lr 3e-4) with 2 distractors",
                       [], {"bert": ("bert_distractors_ft", [
                           "task.distractors=2", "task.init_checkpoint={out}/bert",
                           "trainer.train_steps=1500",
                           "trainer.optimizer_config.learning_rate.polynomial.decay_steps=1500",
                           "trainer.optimizer_config.learning_rate.polynomial."
                           "initial_learning_rate=3e-4"])}),
}
_DISTRACTORS_FT = VARIANTS["distractors_ft"][2]["bert"]
VARIANTS.update({
    "dft_ict_masked": ("distractors_ft, and ICT queries with a masked span half the time",
                       [], {"bert": _DISTRACTORS_FT,
                            "ict": ("ict_masked_50", ["task.train_data.query_mask_prob=0.5"])}),
    "dft_ict_1600": ("distractors_ft, and ICT trained 4x longer (1,600 steps)",
                     [], {"bert": _DISTRACTORS_FT,
                          "ict": ("ict_1600", [
                              "trainer.train_steps=1600",
                              "trainer.optimizer_config.learning_rate.polynomial."
                              "decay_steps=1600"])}),
})


def variant_warm(name: str, warm: Dict[str, str]) -> Dict[str, str]:
  """The warm starts of a variant: the tables' own, or the variant's replacements."""
  replaced = VARIANTS[name][2] if len(VARIANTS[name]) > 2 else {}
  return dict(warm, **{stage: warm[replacement] for stage, (replacement, _) in
                       replaced.items()})


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
    for name, (what, overrides, *warm) in VARIANTS.items():
      print(f"{name:16s} {what}\n{'':16s} {' '.join(overrides) or '(no override)'} "
            f"{warm[0] if warm else ''}")
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
  extra_warm = {}
  for name in FLAGS.variants:
    for stage, (replacement, overrides) in (VARIANTS[name][2] if len(VARIANTS[name]) > 2
                                            else {}).items():
      extra_warm[replacement] = (stage, [o.format(out=out) for o in overrides])
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
