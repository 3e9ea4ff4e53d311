r"""realm-tables: the paper's Tables 1-3 (Guu et al. 2020) at CPU scale, built a seed at a time.

  python -m experiments.synthetic.tables --seed=0   # one seed -> results/tables/seed0.json
  python -m experiments.synthetic.tables --seed=1   # each seed on its own (one sitting, ~70 min)
  python -m experiments.synthetic.tables --render       # the tables from the committed seed files
  python -m experiments.synthetic.tables --scale=paper  # prints the paper-scale command sequence

(``python -m experiments.tables ...``, the old name, still runs this.) A seed (``table_seed.py``)
runs the demo's pipeline on one shared synthetic world, the demo's (``--world_seed``,
``--world_scale``): its own warm starts (the reading reader that stands in for BERT, ICT), five
REALM pre-training runs beside their refreshers (salient spans refreshed; the 30x staler index;
random spans; uniform masks; salient spans of the world's news, X != Z), and eight Open-QA
fine-tunes, then writes one small results file. ``--render`` reads every ``seed*.json`` of
``--results_dir`` and refuses to mix seeds whose code or config fingerprints differ (saying which
seeds and which settings).

* **Table 1**: Open-QA EM on the test questions of the ORQA baseline (ICT retriever + "BERT"
  reader, fine-tuned) and of REALM pre-trained on the encyclopedia itself (X = Z) and on the
  news (X != Z), the paper's numbers (Wikipedia and CC-News) beside.
* **Table 2**: EM and zero-shot recall@5 (before fine-tuning, a top-5 block holds an answer) of
  REALM; REALM retriever + baseline encoder; baseline retriever + REALM encoder; the baseline;
  random uniform masks; random span masks; a 30x staler index (the refresher builds at most
  every ``staleness x refresh_every`` steps); and REALM pre-trained on the news. Zero-shot
  recall@5 is also split by whether the news covers the question's subject.
* **Table 3**: for held-out masked sentences, ``p(answer | x)`` from a reader given the null
  block only (the "BERT" row: the reading warm start; and REALM's own reader), given the block
  that holds the answer, and marginalized over REALM's candidates (the null block and its top
  k - 1); a few examples and the medians.

Every cell is the mean over seeds +- the 95% confidence half-width (Student t, n - 1 degrees of
freedom). ``--render`` writes ``table{1,2,3}.md`` and ``.csv`` and ``staleness.png`` (QA
recall@5 on dev, masked-sentence recall@5 and retrieval utility over pre-training steps:
refreshed, 30x staler, news) to ``--render_dir``.
"""

import dataclasses
import os

from absl import app
from absl import flags

from data_prep import useful_examples
from experiments.pipeline import recipe_flags
from experiments.pipeline.common import Clock
from experiments.synthetic import report
from experiments.synthetic import table_seed
from realm_tf.binaries import cli

FLAGS = flags.FLAGS
RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")
# The recipe's flags (the demo's knobs) come from experiments/pipeline/recipe_flags.py; the
# tables' own settings (table_seed.TableSettings) are these.
flags.DEFINE_integer("world_seed", 0, "The one synthetic world every seed and row shares.")
flags.DEFINE_bool("render", False, "Render the tables from the seed files of --results_dir.")
flags.DEFINE_string("results_dir", os.path.join(RESULTS, "tables"),
                    "Where a seed writes seed<N>.json and --render reads them.")
flags.DEFINE_string("render_dir", os.path.join(RESULTS, "synthetic"),
                    "Where --render writes the tables and the plot.")
flags.DEFINE_list("table", ["1", "2", "3"], "Which tables --render writes: any of 1, 2, 3.")
flags.DEFINE_enum("scale", "cpu", ["cpu", "paper"],
                  "cpu: run here on the synthetic world; paper: print the TPU recipe.")
flags.DEFINE_float("qa_test_fraction", 0.4, "Share of the world's questions held out as test.")
flags.DEFINE_float("eval_fraction", 0.2, "Share of blocks whose masked sentences are held out.")
flags.DEFINE_integer("staleness", 30, "How many times staler the stale-index ablation's index is.")
flags.DEFINE_integer("validation_every", 100,
                     "Validation interval of the plotted runs (refreshed, stale, news).")
flags.DEFINE_integer("table3_examples", 5, "Held-out sentences kept for Table 3's examples.")
flags.DEFINE_float("news_share", 1.0, "Share of the entities whose facts the news restates "
                   "(every one: the news then has at least X = Z's useful examples).")
flags.DEFINE_bool("check_news", False, "Prepare the world (under --output_dir) and print the "
                  "model-free check of the news against X = Z (data_prep.useful_examples).")
flags.DEFINE_float("lr_retriever", 1.0, "task.lr_retriever of every REALM run.")


def table_settings(values: flags.FlagValues) -> table_seed.TableSettings:
  """The tables' own settings, from this module's flags as parsed (``values``: main's FLAGS)."""
  return table_seed.TableSettings(**{f.name: values[f.name].value
                                     for f in dataclasses.fields(table_seed.TableSettings)})


def main(argv):
  del argv
  # The demo's knobs are the tables' too (the demo's world and REALM steps: NOTES section 17);
  # --seed is the seed of this run, not of the world (--world_seed). Only the default output
  # directory differs (a flag given on the command line keeps its value).
  FLAGS.set_default("output_dir", "tables_out")
  if FLAGS.scale == "paper":
    report.paper_scale()
    return
  tables = sorted(set(FLAGS.table))
  if not set(tables) <= {"1", "2", "3"}:
    raise app.UsageError(f"--table takes 1, 2 and/or 3, got {FLAGS.table}")
  recipe, table = recipe_flags.recipe(FLAGS), table_settings(FLAGS)
  clock = Clock("tables", FLAGS.progress_seconds)
  if FLAGS.check_news:
    data = table_seed.prepare(clock, os.path.abspath(FLAGS.output_dir), table, recipe)
    print("\n".join(useful_examples.lines(data["news_check"])))
    return
  if FLAGS.render:
    os.makedirs(FLAGS.render_dir, exist_ok=True)
    source = os.path.relpath(os.path.abspath(FLAGS.results_dir), table_seed.REPO)
    print(report.render(FLAGS.render_dir, report.load_seeds(FLAGS.results_dir), tables,
                        source if not source.startswith("..") else FLAGS.results_dir))
    return
  out = os.path.abspath(FLAGS.output_dir)
  os.makedirs(out, exist_ok=True)
  path = table_seed.run_seed(clock, out, FLAGS.results_dir, FLAGS.seed, recipe, table)
  clock.say(f"seed {FLAGS.seed} written to {path}; render with --render once every seed is in")


def run():
  cli.run_main(main)


if __name__ == "__main__":
  run()
