r"""Benchmark: a short table seed the old way and the new way, in the same run (issue 43).

    python -m experiments.benchmarks.bench_table_seed --output_dir=/tmp/bench_seed

A table seed's workload at a tenth of its steps (``--scale``; the world, the warm starts, the
five REALM runs beside their refreshers, the eight Open-QA rows and the validations as in
``experiments.synthetic.tables``; validation every tenth of the REALM steps, as the seed's 100 of
1,000), run twice by ``python -m experiments.synthetic.tables`` in processes of their own, one
after the other:

* **old**: the code of ``--old_commit`` (default: 4ab9de3, where issue 43 measured it),
  extracted with ``git archive`` into ``--output_dir``, with ``--old_flags``;
* **new**: this checkout, with ``--new_flags``.

Each way prepares its own data (the same world; not compared). ``--order=new_first`` runs them
the other way round. Prints each stage's minutes and steps/s (training steps of every run of
the stage over its wall time) for both, and the ratio old/new per stage and for the seed. The
seed files and logs stay under ``--output_dir``. At a tenth of the steps, what every process
costs whatever its steps (starting, evaluating, exiting) weighs ten times more than in a seed.
"""

import json
import os
import shutil
import subprocess
import sys
import time

from absl import app
from absl import flags

FLAGS = flags.FLAGS
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
flags.DEFINE_string("output_dir", "/tmp/bench_table_seed", "Where both runs write.")
flags.DEFINE_float("scale", 0.1, "Steps of every stage, as a share of a table seed's.")
flags.DEFINE_string("old_commit", "4ab9de3", "The old way's code.")
flags.DEFINE_list("old_flags", [], "experiments.synthetic.tables flags of the old way.")
flags.DEFINE_list("new_flags", [], "experiments.synthetic.tables flags of the new way.")
flags.DEFINE_enum("order", "old_first", ["old_first", "new_first"], "Which way runs first.")

# A table seed's steps (experiments/pipeline/stages.py and experiments/synthetic/tables.py
# defaults).
SEED_STEPS = dict(reading_steps=6000, distractor_steps=1500, ict_steps=400, realm_steps=1000,
                  validation_every=100, openqa_steps=600)
PRETRAIN_RUNS, OPENQA_ROWS = 5, 8


def steps_flags(scale: float) -> dict:
  steps = {k: max(1, round(v * scale)) for k, v in SEED_STEPS.items()}
  steps["refresh_every"] = 25   # the refresh cadence in steps is the recipe's
  return steps


def stage_steps(steps: dict) -> dict:
  """Training steps of every run of each timed stage."""
  return {"warm starts": steps["reading_steps"] + steps["distractor_steps"] + steps["ict_steps"],
          "pre-training": PRETRAIN_RUNS * steps["realm_steps"],
          "Open-QA": OPENQA_ROWS * steps["openqa_steps"]}


def source(out: str, commit: str) -> str:
  """This checkout (``commit`` empty), or ``commit``'s files extracted under ``out``."""
  if not commit:
    return REPO
  src = os.path.join(out, f"src_{commit}")
  if not os.path.isdir(src):
    os.makedirs(src + ".tmp", exist_ok=True)
    archive = subprocess.run(["git", "-C", REPO, "archive", commit], capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", src + ".tmp"], input=archive, check=True)
    os.replace(src + ".tmp", src)
  return src


def run_way(name: str, out: str, src: str, steps: dict, extra) -> dict:
  """One seed the ``name`` way (the code in ``src``) into ``out/name``, from scratch; its seed
  file (``stages``: minutes)."""
  results = os.path.join(out, f"{name}_results")
  for path in (results, os.path.join(out, name)):
    shutil.rmtree(path, ignore_errors=True)
  cmd = [sys.executable, "-m", "experiments.synthetic.tables", "--seed=0",
         f"--output_dir={os.path.join(out, name)}", f"--results_dir={results}",
         *[f"--{k}={v}" for k, v in steps.items()], *extra]
  print(f"[bench {time.strftime('%H:%M:%S')}] {name} ({src}): {' '.join(cmd[1:])}", flush=True)
  start = time.time()
  with open(os.path.join(out, f"{name}.log"), "w") as log:
    # The code of ``src``: Python looks in the working directory first.
    code = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=src)
  wall = (time.time() - start) / 60
  if code:
    raise RuntimeError(f"the {name} run failed (exit {code}); see {out}/{name}.log")
  with open(os.path.join(results, "seed0.json")) as f:
    return dict(json.load(f), process_minutes=wall)


def main(argv):
  del argv
  out = os.path.abspath(FLAGS.output_dir)
  os.makedirs(out, exist_ok=True)
  steps = steps_flags(FLAGS.scale)
  ways = {"old": FLAGS.old_flags, "new": FLAGS.new_flags}
  sources = {"old": source(out, FLAGS.old_commit), "new": source(out, "")}
  order = ["old", "new"] if FLAGS.order == "old_first" else ["new", "old"]
  seeds = {name: run_way(name, out, sources[name], steps, ways[name]) for name in order}
  work = stage_steps(steps)
  print(f"\nA table seed at {FLAGS.scale:g} of its steps ({steps}); old: {FLAGS.old_commit} "
        f"{' '.join(ways['old'])}; new: this checkout {' '.join(ways['new'])}; {FLAGS.order}")
  print(f"{'stage':24s} {'steps':>6s} {'old min':>8s} {'new min':>8s} {'old steps/s':>11s} "
        f"{'new steps/s':>11s} {'old/new':>8s}")
  total = {"old": 0.0, "new": 0.0}
  for stage, n in work.items():
    m = {w: seeds[w]["stages"][stage] for w in ways}
    for w in ways:
      total[w] += m[w]
    print(f"{stage:24s} {n:6d} {m['old']:8.2f} {m['new']:8.2f} {n / 60 / m['old']:11.2f} "
          f"{n / 60 / m['new']:11.2f} {m['old'] / m['new']:8.2f}")
  rest = {w: sum(v for k, v in seeds[w]["stages"].items() if k not in work and k != "data")
          for w in ways}
  print(f"{'evaluations after':24s} {'':6s} {rest['old']:8.2f} {rest['new']:8.2f}")
  old, new = total["old"] + rest["old"], total["new"] + rest["new"]
  print(f"{'seed (without data)':24s} {'':6s} {old:8.2f} {new:8.2f} {'':11s} {'':11s} "
        f"{old / new:8.2f}")
  wall = {w: seeds[w]["process_minutes"] - seeds[w]["stages"]["data"] for w in ways}
  print(f"{'process, start to exit':24s} {'':6s} {wall['old']:8.2f} {wall['new']:8.2f} "
        f"{'':11s} {'':11s} {wall['old'] / wall['new']:8.2f}   (without data)")
  for w in ways:   # dev questions only (the test questions choose nothing)
    curve = seeds[w]["curves"]["realm"]["qa_recall@5"]
    print(f"{w}: the refreshed REALM run's dev-question recall@5 {curve[0][1]:.3f} at step "
          f"{curve[0][0]} -> {curve[-1][1]:.3f} at step {curve[-1][0]}")


if __name__ == "__main__":
  app.run(main)
