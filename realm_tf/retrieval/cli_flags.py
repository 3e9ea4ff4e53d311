"""Flags shared by ``realm-index`` and ``realm-refresh`` for how an index is built."""

import math

from absl import flags

from realm_tf.retrieval import mips_index
from realm_tf.retrieval import refresher


def define_build_flags() -> None:
  """Defines the index-building flags (call once, at import time of a binary)."""
  defaults = mips_index.ScannSettings()
  flags.DEFINE_enum("index_type", "scann", ["scann", "brute_force"],
                    "scann (exact scoring below --brute_force_below blocks) or brute_force.")
  flags.DEFINE_integer("batch_size", 128, "Global batch size of the corpus embedding.")
  flags.DEFINE_integer("recall_queries", 200,
                       "Sample queries for the recall@10 check of each index (0: skip).")
  flags.DEFINE_integer("brute_force_below", defaults.brute_force_below,
                       "Corpora smaller than this are scored exactly by ScaNN.")
  flags.DEFINE_integer("tree_above", defaults.tree_above,
                       "Corpora at least this large get a k-means tree.")
  flags.DEFINE_integer("num_leaves", 0, "Tree leaves (0: round(sqrt(num_blocks))).")
  flags.DEFINE_integer("num_leaves_to_search", 0,
                       "Leaves searched per query (0: tuned to --target_recall).")
  flags.DEFINE_float("target_recall", defaults.target_recall,
                     "Recall@10 against exact search that each ScaNN build tunes its leaves "
                     "and reordering depth to reach (0: no tuning; 10% of the leaves).")
  flags.DEFINE_float("soar_lambda", defaults.soar_lambda,
                     "SOAR spilling strength for the tree (nan: no spilling).")
  flags.DEFINE_integer("dimensions_per_block", defaults.dimensions_per_block,
                       "Dimensions per asymmetric-hashing code block.")
  flags.DEFINE_float("anisotropic_quantization_threshold",
                     defaults.anisotropic_quantization_threshold,
                     "Anisotropic quantization threshold (nan: off).")
  flags.DEFINE_integer("reordering_num_neighbors", defaults.reordering_num_neighbors,
                       "Candidates reordered after hashing (default: tuned).")
  flags.DEFINE_integer("training_sample_size", defaults.training_sample_size,
                       "Points used to train the tree and the codebooks.")
  flags.DEFINE_string("tensorboard_dir", None,
                      "Summaries of each build (default: <index_dir>/tensorboard).")
  flags.DEFINE_bool("progress", True, "Show progress bars.")


def build_options_from_flags(keep: int = 3) -> refresher.BuildOptions:
  f = flags.FLAGS
  soar = None if f.soar_lambda is None or math.isnan(f.soar_lambda) else f.soar_lambda
  scann = mips_index.ScannSettings(
      brute_force_below=f.brute_force_below, tree_above=f.tree_above,
      num_leaves=f.num_leaves or None, num_leaves_to_search=f.num_leaves_to_search or None,
      soar_lambda=soar, training_sample_size=f.training_sample_size,
      dimensions_per_block=f.dimensions_per_block,
      anisotropic_quantization_threshold=f.anisotropic_quantization_threshold,
      reordering_num_neighbors=f.reordering_num_neighbors or None,
      target_recall=f.target_recall or None)
  return refresher.BuildOptions(index_type=f.index_type, scann=scann, batch_size=f.batch_size,
                                recall_queries=f.recall_queries, keep=keep,
                                tensorboard_dir=f.tensorboard_dir, progress=f.progress)
