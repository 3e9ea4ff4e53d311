"""The flags every driver of the synthetic pipelines shares: ``--output_dir``, ``--seed`` and a
flag for each field of ``stages.Recipe``, defined once here (as Model Garden defines its common
flags in ``official/common/flags.py``). ``realm-demo``, ``experiments.synthetic.tables``,
``experiments.diagnose`` and ``experiments.accelerator_smoke`` import this module; their
``main`` reads the flags and hands ``recipe(FLAGS)`` down to the stages.
"""

import dataclasses

from absl import flags

from experiments.pipeline import stages
from realm_tf import train_lib


flags.DEFINE_string("output_dir", "demo_out", "Where everything is written.")
flags.DEFINE_integer("seed", 0, "realm-demo: the synthetic world's seed. "
                     "experiments.synthetic.tables: the seed of this seed's runs (the world's is "
                     "--world_seed).")
flags.DEFINE_integer("progress_seconds", 30,
                     "A progress line (steps, steps/s, ETA) every this many seconds of a long "
                     "stage (0: none).")
for _field in dataclasses.fields(stages.Recipe):
  if _field.name == "precision":
    flags.DEFINE_enum("precision", _field.default, ["float32", "bfloat16"],
                      _field.metadata["help"])
  else:
    {int: flags.DEFINE_integer, float: flags.DEFINE_float, bool: flags.DEFINE_bool}[
        _field.type](_field.name, _field.default, _field.metadata["help"])


def recipe(values: flags.FlagValues) -> stages.Recipe:
  """The recipe that the parsed flags ``values`` give (a driver's ``main`` passes its
  ``FLAGS``); ``--precision=bfloat16`` is refused up front (ConfigError) where the CPU would
  train it without bfloat16 arithmetic (``train_lib.check_bfloat16_device``)."""
  given = stages.Recipe(**{f.name: values[f.name].value
                           for f in dataclasses.fields(stages.Recipe)})
  if given.precision == "bfloat16":
    train_lib.check_bfloat16_device()
  return given
