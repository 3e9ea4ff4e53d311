"""The paper-scale recipe: YAMLs that name their init checkpoints, the random-init refusal, and a
BERT-base-shaped TF1 checkpoint in Google's names initializing ICT's towers and REALM's reader."""

import os

import numpy as np
import pytest

from realm_tf import checkpoint_convert
from realm_tf import configs
from realm_tf import model_dir as model_dir_lib
from realm_tf import tasks  # noqa: F401  (registers the tasks)
from official.core import task_factory

import helpers

CONFIG_DIR = os.path.join(os.path.dirname(__file__), os.pardir, "experiments", "configs")
PAPER = {
    "ict_paper": ["task.init_checkpoint"],
    "realm_pretrain_paper": ["task.retriever_init_checkpoint", "task.reader_init_checkpoint"],
    "openqa_nq_paper": ["task.init_checkpoint"],
    "openqa_wq_paper": ["task.init_checkpoint"],
    "openqa_ct_paper": ["task.init_checkpoint"],
}
# BERT-base's layer shapes; 2 of its 12 layers and a small vocabulary keep the test quick.
HIDDEN, INTER, HEADS, LAYERS = 768, 3072, 12, 2
WORDS = ["the", "city", "river", "born", "in", "was", "paris", "france", ".", "1843"]


def _value(params, key):
  obj = params
  for part in key.split(".")[:-1]:
    obj = getattr(obj, part)
  return getattr(obj, key.split(".")[-1])


@pytest.mark.parametrize("name", sorted(PAPER))
def test_paper_yaml_names_its_init_checkpoints_and_is_refused_until_filled(name):
  yaml = os.path.join(CONFIG_DIR, f"{name}__tpu.yaml")
  params = configs.load_experiment(name, [yaml])
  first = PAPER[name][0]
  for key in PAPER[name]:
    assert _value(params, key).startswith(configs.PLACEHOLDER), key
  with pytest.raises(configs.ConfigError, match=rf"{first}.*placeholder.*--allow_random_init"):
    configs.check_init_checkpoints(name, params)
  configs.check_init_checkpoints(name, params, allow_random_init=True)
  # The registered experiment alone: unset.
  with pytest.raises(configs.ConfigError, match=rf"{first}.* is not set"):
    configs.check_init_checkpoints(name, configs.load_experiment(name))
  # Filled in: accepted.
  filled = ",".join(f"{k}=/ckpt/{i}" for i, k in enumerate(PAPER[name]))
  configs.check_init_checkpoints(name, configs.load_experiment(name, [yaml], filled))


def test_realm_needs_both_towers_and_openqa_accepts_a_tower_pair():
  params = configs.load_experiment("realm_pretrain_paper", [],
                                   "task.retriever_init_checkpoint=/ict")
  with pytest.raises(configs.ConfigError, match="task.reader_init_checkpoint is not set"):
    configs.check_init_checkpoints("realm_pretrain_paper", params)
  pair = "task.retriever_init_checkpoint=/ict,task.reader_init_checkpoint=/bert"
  configs.check_init_checkpoints("openqa_nq_paper",
                                 configs.load_experiment("openqa_nq_paper", [], pair))
  half = configs.load_experiment("openqa_nq_paper", [], "task.retriever_init_checkpoint=/ict")
  with pytest.raises(configs.ConfigError, match=r"task.init_checkpoint \(or "
                     r"task.retriever_init_checkpoint and task.reader_init_checkpoint\)"):
    configs.check_init_checkpoints("openqa_nq_paper", half)
  # CPU scale is never checked.
  configs.check_init_checkpoints("ict_cpu", configs.load_experiment("ict_cpu"))


def test_realm_train_refuses_random_init_on_one_line(tmp_path):
  proc = helpers.run_cli("realm_tf.binaries.train", "--experiment=ict_paper", "--mode=train",
                         f"--model_dir={tmp_path / 'ict'}")
  assert proc.returncode == 2, proc.stderr[-2000:]
  errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and "task.init_checkpoint is not set" in errors[0], proc.stderr[-2000:]
  assert not (tmp_path / "ict").exists()


def _random_google_bert(rng, vocab_size):
  """A random BERT in google-research's TF1 names (``bert/...``, ``cls/predictions/...``)."""
  w = helpers.random_bert(rng, "bert/", vocab_size, HIDDEN, INTER, LAYERS)
  for name, shape in (("transform/dense/kernel", (HIDDEN, HIDDEN)),
                      ("transform/dense/bias", (HIDDEN,)),
                      ("transform/LayerNorm/gamma", (HIDDEN,)),
                      ("transform/LayerNorm/beta", (HIDDEN,)), ("output_bias", (vocab_size,))):
    w["cls/predictions/" + name] = (rng.standard_normal(shape) * 0.02).astype(np.float32)
  return w


def _by_suffix(model, suffix):
  found = [v for v in model.variables if v.name.endswith(suffix)]
  assert len(found) == 1, (suffix, [v.name for v in found])
  return found[0].numpy()


def test_converted_bert_base_initializes_ict_towers_and_realm_reader(tmp_path):
  import json  # pylint: disable=g-import-not-at-top
  vocab_file = tmp_path / "vocab.txt"
  vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
  vocab_file.write_text("\n".join(vocab) + "\n")
  bert_config = tmp_path / "bert_config.json"
  bert_config.write_text(json.dumps(dict(
      vocab_size=len(vocab), hidden_size=HIDDEN, num_hidden_layers=LAYERS,
      num_attention_heads=HEADS, intermediate_size=INTER, hidden_act="gelu",
      hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, max_position_embeddings=512,
      type_vocab_size=2, initializer_range=0.02)))
  w = _random_google_bert(np.random.default_rng(0), len(vocab))
  ckpt = helpers.write_tf1_checkpoint(w, str(tmp_path / "tf1" / "bert_model.ckpt"))
  converted = str(tmp_path / "converted")
  checkpoint_convert.convert([ckpt], str(bert_config), str(vocab_file), converted)

  shape = (f"encoder.vocab_size={len(vocab)},encoder.num_layers={LAYERS}")
  ict = configs.load_experiment("ict_paper", [os.path.join(CONFIG_DIR, "ict_paper__tpu.yaml")],
                                ",".join([f"task.init_checkpoint={converted}",
                                          f"task.vocab_file={vocab_file}"] +
                                         [f"task.model.{s}" for s in shape.split(",")]))
  configs.check_init_checkpoints("ict_paper", ict)
  task = task_factory.get_task(ict.task)
  model = task.build_model()
  fresh = _by_suffix(model.query_embedder, "word_embeddings/embeddings:0").copy()
  task.initialize(model)
  for tower in (model.query_embedder, model.block_embedder):
    got = _by_suffix(tower, "word_embeddings/embeddings:0")
    np.testing.assert_allclose(got, w["bert/embeddings/word_embeddings"])
    assert not np.allclose(got, fresh)
    np.testing.assert_allclose(
        _by_suffix(tower, "transformer/layer_1/intermediate/kernel:0"),
        w["bert/encoder/layer_1/intermediate/dense/kernel"])

  realm = configs.load_experiment(
      "realm_pretrain_paper", [os.path.join(CONFIG_DIR, "realm_pretrain_paper__tpu.yaml")],
      ",".join([f"task.retriever_init_checkpoint={converted}",
                f"task.reader_init_checkpoint={converted}", f"task.model.vocab_file={vocab_file}"]
               + [f"task.model.{t}.{s}" for t in ("retriever", "reader")
                  for s in shape.split(",")]))
  configs.check_init_checkpoints("realm_pretrain_paper", realm)
  task = task_factory.get_task(realm.task)
  model = task.build_model()
  task.initialize(model)
  np.testing.assert_allclose(_by_suffix(model.reader, "word_embeddings/embeddings:0"),
                             w["bert/embeddings/word_embeddings"])
  np.testing.assert_allclose(
      _by_suffix(model.reader, "transformer/layer_0/self_attention/query/kernel:0"),
      w["bert/encoder/layer_0/attention/self/query/kernel"].reshape(HIDDEN, HEADS, -1))
  assert model_dir_lib.latest_checkpoint(converted).endswith("ckpt-0")


def test_the_news_overlays_read_documents_and_retrieve_from_the_encyclopedia():
  """realm_pretrain_*_news: masked sentences from the news, blocks (Z) from the encyclopedia."""
  paper = configs.load_experiment("realm_pretrain_paper", [
      os.path.join(CONFIG_DIR, "realm_pretrain_paper__tpu.yaml"),
      os.path.join(CONFIG_DIR, "realm_pretrain_paper__tpu_news.yaml")])
  assert paper.task.train_data.input_path.endswith("ccnews/pretrain/train-*")
  assert paper.task.train_data.blocks_dir.endswith("data/blocks")
  assert paper.task.validation_data.blocks_dir == paper.task.train_data.blocks_dir
  assert paper.task.model.num_candidates == 8 and paper.trainer.train_steps == 200000
  cpu = configs.load_experiment("realm_pretrain_cpu", [
      os.path.join(CONFIG_DIR, "realm_pretrain_cpu__demo.yaml"),
      os.path.join(CONFIG_DIR, "realm_pretrain_cpu__demo_news.yaml")])
  assert cpu.task.train_data.input_path == "news/pretrain/train-*"
  assert cpu.task.train_data.blocks_dir == cpu.task.validation_data.blocks_dir == "data/blocks"
  assert cpu.task.model.num_candidates == 16
