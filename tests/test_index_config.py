"""IndexConfig: ScaNN/index settings round-trip through YAML, the binaries' flags override the
YAML files, and each build records the settings it used."""

import os

from absl import flags
import pytest
import yaml

from realm_tf import configs
from realm_tf.binaries import index  # noqa: F401  Defines realm-index's flags.
from realm_tf.binaries import index_flags
from realm_tf.retrieval.index import mips_index
from realm_tf.retrieval.publication import publish
from realm_tf.retrieval.publication import refresher
from realm_tf.retrieval.publication import testing

FLAGS = flags.FLAGS


def test_yaml_round_trip(tmp_path):
  config = configs.IndexConfig()
  config.override({"recall_queries": 50, "scann": {"target_recall": 0.9, "num_leaves": 40,
                                                   "soar_lambda": 1.5,
                                                   "rebalance_imbalance": 0.2}})
  path = tmp_path / "index.yaml"
  path.write_text(yaml.dump(config.as_dict()))
  again = configs.IndexConfig()
  again.override(yaml.safe_load(path.read_text()))
  assert again == config and isinstance(again.scann, mips_index.ScannSettings)
  assert again.scann.resolve(30_000)["num_leaves"] == 40
  # Every ScaNN setting is a YAML key (the dataclass is the config), unknown keys refused.
  assert set(config.as_dict()["scann"]) == set(mips_index.ScannSettings().as_dict())
  with pytest.raises(KeyError):
    configs.IndexConfig().override({"scann": {"target_recal": 0.9}})


def _parse(args):
  FLAGS.unparse_flags()
  FLAGS(["realm-index", *args])


def test_flags_override_the_yaml_files(tmp_path):
  first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
  first.write_text("index_type: brute_force\nscann: {target_recall: 0.9, num_leaves: 30}\n")
  second.write_text("recall_queries: 7\nscann: {num_leaves: 50}\n")
  try:
    _parse([f"--index_config={first}", f"--index_config={second}", "--num_leaves=70",
            "--target_recall=0", "--index_type=scann"])
    config = index_flags.index_config_from_flags(flags.FLAGS)
    assert (config.index_type, config.recall_queries) == ("scann", 7)  # flag, 2nd YAML
    assert config.scann.num_leaves == 70  # the flag over both files
    assert config.scann.target_recall is None  # 0 on the command line: no tuning
    assert config.scann.dimensions_per_block == 3  # the default
    _parse([f"--index_config={first}"])
    config = index_flags.index_config_from_flags(flags.FLAGS)
    assert (config.index_type, config.scann.target_recall, config.scann.num_leaves) == (
        "brute_force", 0.9, 30)  # flags not given do not override
    options = index_flags.build_options_from_flags(flags.FLAGS, keep=2)
    assert options.index_config() == config and options.keep == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("scann: {leaves: 3}\n")
    _parse([f"--index_config={bad}"])
    with pytest.raises(configs.ConfigError, match="bad.yaml"):
      index_flags.index_config_from_flags(flags.FLAGS)
  finally:
    FLAGS.unparse_flags()


def test_a_build_records_its_config(tmp_path):
  vocab = testing.write_vocab(str(tmp_path / "vocab.txt"))
  blocks, model, index_dir = (str(tmp_path / n) for n in ("blocks", "model", "index"))
  testing.make_corpus(blocks, vocab, 60)
  testing.TinyTrainer(model, vocab).save(1)
  config = configs.IndexConfig(recall_queries=0)
  config.override({"scann": {"brute_force_below": 50, "tuning_queries": 30}})
  options = refresher.BuildOptions.from_config(config, progress=False, tensorboard_dir="")
  refresher.build_index_for_checkpoint(None, model, blocks, index_dir, options)
  manifest = mips_index.read_manifest(publish.read_latest(index_dir))
  recorded = configs.IndexConfig()
  recorded.override(manifest["index_config"])
  assert recorded == config
  assert manifest["settings"]["mode"] == "ah"  # 60 blocks, exact only below 50
  assert manifest["block_tower"]["step"] == 1 and len(manifest["block_tower"]["fingerprint"]) == 40
  assert os.path.isdir(os.path.join(publish.read_latest(index_dir), "scann"))
