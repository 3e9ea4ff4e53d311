"""Flags shared by ``realm-index`` and ``realm-refresh`` for how an index is built (moved here
from ``realm_tf/retrieval/cli_flags.py``: flags belong to the binaries).

The settings are an ``IndexConfig`` (``realm_tf.configs``): its defaults, then each
``--index_config`` YAML in order, then the flags given on the command line.
"""

import math

from absl import flags
from official.modeling import hyperparams

from realm_tf import configs
from realm_tf.retrieval.publication import refresher

# Flags whose value 0 (or nan) means "not set": chosen by size, or tuned.
_ZERO_IS_NONE = ("num_leaves", "num_leaves_to_search", "reordering_num_neighbors",
                 "target_recall", "build_memory_gib")
_TOP_LEVEL = ("index_type", "batch_size", "recall_queries")
_SCANN = ("brute_force_below", "tree_above", "num_leaves", "num_leaves_to_search",
          "target_recall", "soar_lambda", "dimensions_per_block",
          "anisotropic_quantization_threshold", "reordering_num_neighbors",
          "training_sample_size", "build_memory_gib")


def define_build_flags() -> None:
  """Defines the index-building flags (call once, at import time of a binary)."""
  defaults = configs.IndexConfig()
  scann = defaults.scann
  flags.DEFINE_multi_string("index_config", [],
                            "YAML of an IndexConfig (index_type, batch_size, recall_queries, "
                            "scann: {...}); later files and the flags below override it.")
  flags.DEFINE_enum("index_type", defaults.index_type, ["scann", "brute_force"],
                    "scann (exact scoring below --brute_force_below blocks) or brute_force.")
  flags.DEFINE_integer("batch_size", defaults.batch_size,
                       "Global batch size of the corpus embedding.")
  flags.DEFINE_integer("recall_queries", defaults.recall_queries,
                       "Sample queries for the recall@10 check of each index (0: skip).")
  flags.DEFINE_integer("brute_force_below", scann.brute_force_below,
                       "Corpora smaller than this are scored exactly by ScaNN.")
  flags.DEFINE_integer("tree_above", scann.tree_above,
                       "Corpora at least this large get a k-means tree.")
  flags.DEFINE_integer("num_leaves", 0, "Tree leaves (0: round(sqrt(num_blocks))).")
  flags.DEFINE_integer("num_leaves_to_search", 0,
                       "Leaves searched per query (0: tuned to --target_recall).")
  flags.DEFINE_float("target_recall", scann.target_recall,
                     "Recall@10 against exact search that each ScaNN build tunes its leaves "
                     "and reordering depth to reach (0: no tuning; 10% of the leaves).")
  flags.DEFINE_float("soar_lambda", float("nan"),
                     "SOAR spilling strength for the tree (nan: no spilling).")
  flags.DEFINE_integer("dimensions_per_block", scann.dimensions_per_block,
                       "Dimensions per asymmetric-hashing code block.")
  flags.DEFINE_float("anisotropic_quantization_threshold",
                     scann.anisotropic_quantization_threshold,
                     "Anisotropic quantization threshold (nan: off).")
  flags.DEFINE_integer("reordering_num_neighbors", 0,
                       "Candidates reordered after hashing (0: tuned).")
  flags.DEFINE_integer("training_sample_size", scann.training_sample_size,
                       "Points used to train the tree and the codebooks.")
  flags.DEFINE_float("build_memory_gib", scann.build_memory_gib,
                     "Memory (GiB) a ScaNN build may take; a larger corpus is built in shards "
                     "(0: never shard).")
  flags.DEFINE_string("tensorboard_dir", None,
                      "Summaries of each build (default: <index_dir>/tensorboard).")
  flags.DEFINE_bool("progress", True, "Show progress bars.")


def _flag_value(values: flags.FlagValues, name: str):
  value = values[name].value
  if name in _ZERO_IS_NONE and not value:
    return None
  if name == "soar_lambda" and math.isnan(value):
    return None
  return value


def index_config_from_flags(values: flags.FlagValues) -> configs.IndexConfig:
  """The ``IndexConfig`` of the parsed ``values``: defaults, ``--index_config`` YAMLs, then the
  flags given."""
  config = configs.IndexConfig()
  for path in values.index_config:
    try:
      config = hyperparams.override_params_dict(config, path, is_strict=True)
    except KeyError as e:
      raise configs.ConfigError(f"{path}: {e.args[0] if e.args else e}") from None
    except (OSError, ValueError) as e:
      raise configs.ConfigError(f"cannot read config file {path}: {e}") from None
  given = {name for name in _TOP_LEVEL + _SCANN if values[name].present}
  config.override({name: _flag_value(values, name) for name in given if name in _TOP_LEVEL})
  config.scann.override({name: _flag_value(values, name) for name in given if name in _SCANN})
  return config


def build_options_from_flags(values: flags.FlagValues, keep: int = 3) -> refresher.BuildOptions:
  return refresher.BuildOptions.from_config(index_config_from_flags(values), keep=keep,
                                            tensorboard_dir=values.tensorboard_dir,
                                            progress=values.progress)
