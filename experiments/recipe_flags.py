"""The flags every driver of the synthetic pipelines shares: ``--output_dir``, ``--seed`` and a
flag for each field of ``stages.Recipe``, defined once here (as Model Garden defines its common
flags in ``official/common/flags.py``). ``realm-demo``, ``experiments.tables``,
``experiments.diagnose`` and ``experiments.accelerator_smoke`` import this module; their
``main`` reads the flags and hands ``recipe()`` down to the stages.
"""

import dataclasses

from absl import flags

from experiments import stages
from realm_tf import train_lib

FLAGS = flags.FLAGS

HELP = {
    "world_scale": "Size of the synthetic world (1.0: 210 articles).",
    "reading_worlds": "Counterfactual worlds the reader learns to read on.",
    "reading_steps": "Reading warm-start steps of the reader.",
    "distractor_steps": "Steps of the reader's fine-tuning beside distractor blocks, after its "
                        "reading warm start (0: none; experiments/NOTES.md section 15).",
    "distractors": "Distractor blocks per sentence in that fine-tuning.",
    "ict_steps": "ICT warm-start steps.",
    "ict_learning_rate": "ICT peak learning rate.",
    "ict_from_reader": "ICT's towers start from the reader's start's encoder (BERT's part in "
                       "the CPU recipe), as ICT starts from BERT in the paper.",
    "realm_steps": "REALM pre-training steps (each run).",
    "realm_learning_rate": "REALM peak learning rate (the paper's; at 1e-4 the dev questions' "
                           "recall swings by 0.1 between checkpoints: experiments/NOTES.md "
                           "section 15).",
    "refresh_every": "Checkpoint (and so index refresh) interval.",
    "openqa_steps": "Open-QA fine-tuning steps (each run).",
    "openqa_learning_rate": "Open-QA peak learning rate.",
    "precision": "runtime.mixed_precision_dtype of every training run.",
    "parallel_runs": "At most this many REALM or Open-QA training runs at once, each a process "
                     "(0: all at once).",
}

flags.DEFINE_string("output_dir", "demo_out", "Where everything is written.")
flags.DEFINE_integer("seed", 0, "realm-demo: the synthetic world's seed. experiments.tables: "
                     "the seed of this seed's runs (the world's is --world_seed).")
flags.DEFINE_integer("progress_seconds", 30,
                     "A progress line (steps, steps/s, ETA) every this many seconds of a long "
                     "stage (0: none).")
for _field in dataclasses.fields(stages.Recipe):
  if _field.name == "precision":
    flags.DEFINE_enum("precision", _field.default, ["float32", "bfloat16"], HELP["precision"])
  else:
    {int: flags.DEFINE_integer, float: flags.DEFINE_float, bool: flags.DEFINE_bool}[
        _field.type](_field.name, _field.default, HELP[_field.name])


def recipe() -> stages.Recipe:
  """The recipe the flags give; ``--precision=bfloat16`` is refused up front (ConfigError)
  where the CPU would train it without bfloat16 arithmetic (``train_lib.check_bfloat16_device``)."""
  given = stages.Recipe(**{f.name: FLAGS[f.name].value for f in dataclasses.fields(stages.Recipe)})
  if given.precision == "bfloat16":
    train_lib.check_bfloat16_device()
  return given
