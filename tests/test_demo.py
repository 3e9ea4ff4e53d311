"""``realm-demo``: its data and its stages' experiments; end to end at the smallest size (slow).

The end-to-end run is in the slow tier. Its fast sibling checks the demo's own pieces on the
data ``demo.prepare_data`` makes at the same world scale; the stages it trains (the warm
starts, REALM beside its refresher, the stale ablation, Open-QA fine-tuning and evaluation) run
at smaller sizes in test_realm_training and test_openqa.
"""

import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from data_prep import synthetic_world
from experiments import assets
from experiments.pipeline import stages
from experiments.pipeline.common import Clock
from experiments.synthetic import demo
from realm_tf import embedder_api
from realm_tf import export
from realm_tf import model_dir as model_dir_lib
from realm_tf.data import manifests
from realm_tf.data import qa as qa_lib
from realm_tf.modeling import factory
from realm_tf.modeling.models import RealmPretrainer
from realm_tf.openqa import inputs
from realm_tf.tasks import openqa as openqa_task
from realm_tf.tasks import realm_pretrain

import helpers

ASSET = str(assets.ROOT / "demo_reader")   # realm-demo's --reader_asset_dir by default
ICT_ASSET = str(assets.ROOT / "demo_ict")  # and its --ict_asset_dir


def _manifest(directory):
  with open(os.path.join(directory, "manifest.json"), encoding="utf-8") as f:
    return json.load(f)


def test_demo_data_and_stage_experiments(demo_world, tmp_path):
  """test_demo_runs_every_stage's fast sibling: the demo's data (its world, the held-out
  sentences, ICT pairs and a reading world in the same vocabulary) and its REALM and Open-QA
  experiments (the __demo.yaml files with the overrides the demo builds) fit that data."""
  files, prepared = demo_world["files"], demo_world["prepared"]
  dirs, vocab = prepared["dirs"], files["vocab"]
  blocks = manifests.load_blocks_manifest(dirs["blocks"])
  assert blocks["num_blocks"] >= len(demo_world["world"].articles) > 0
  assert blocks["block_seq_length"] == 32
  pretrain = prepared["pretrain"]
  assert pretrain["examples_per_sentence"] == 2 and pretrain["query_seq_length"] == 32
  assert pretrain["num_train"] > 0 and pretrain["num_eval"] > 0 and prepared["ict"]["num_train"]
  for name in ("sentences", "pretrain", "ict"):
    assert prepared[name]["blocks_fingerprint"] == blocks["fingerprint"], name
  [reading] = demo_world["reading"]
  reading_blocks = manifests.load_blocks_manifest(reading["blocks"])
  assert reading_blocks["vocab_sha1"] == blocks["vocab_sha1"]
  assert reading_blocks["fingerprint"] != blocks["fingerprint"]
  assert _manifest(reading["pretrain"])["num_train"] > 0

  out = str(tmp_path)
  recipe = stages.Recipe()
  realm = stages.realm_params(
      recipe, vocab, stages.PretrainData(dirs["pretrain"], dirs["blocks"], dirs["pretrain"]),
      os.path.join(out, "realm_index"), os.path.join(out, "ict"), os.path.join(out, "reader_read"))
  model = realm.task.model
  assert model.retriever.query_seq_length == pretrain["query_seq_length"]
  assert model.retriever.block_seq_length == blocks["block_seq_length"]
  assert realm.task.train_data.blocks_dir == dirs["blocks"]
  task = realm_pretrain.RealmPretrainTask(realm.task)
  assert task.model_dir_config()[0].reader.encoder.vocab_size == stages.vocab_size(vocab)
  assert task.build_model().checkpoint_items

  qa = stages.openqa_params(recipe, vocab, os.path.join(out, "openqa_index"), files["qa_train"],
                            files["qa_dev"], os.path.join(out, "realm"), os.path.join(out, "realm"))
  assert qa.task.train_data.input_path == files["qa_train"]
  assert qa.task.validation_data.input_path == files["qa_dev"]
  assert openqa_task.OpenQaTask(qa.task).build_model().reader.span_scorer is not None


@pytest.mark.slow
def test_demo_runs_every_stage(tmp_path):
  out = tmp_path / "demo"
  proc = helpers.run_process(
      "experiments.synthetic.demo", f"--output_dir={out}",
      "--world_scale=0.3", "--reading_worlds=1", "--reading_steps=4", "--distractor_steps=3",
      "--ict_steps=4", "--realm_steps=6", "--refresh_every=3", "--openqa_steps=3", timeout=900)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  results = json.loads((out / "results.json").read_text())
  rows = results["rows"]
  assert list(rows) == ["start (ICT, reading reader)", "REALM, refreshed index",
                        "REALM, stale index"]
  assert rows["start (ICT, reading reader)"]["step"] == 4          # the ICT checkpoint
  refreshed, stale = rows["REALM, refreshed index"], rows["REALM, stale index"]
  assert refreshed["step"] == stale["step"] == 6
  # The refreshed run rebuilt its index from newer checkpoints; the stale one built it once.
  assert refreshed["indexes_built"] >= 2 and stale["indexes_built"] == 1
  assert all(0 <= r["recall@5"] <= 1 and r["examples"] > 0 for r in rows.values())
  assert {"reading_gain", "distractor_gain"} <= set(results["reader_read"])   # + distractors
  # Open-QA: both fine-tuning runs, evaluated on the test questions before and after.
  qa = results["openqa"]
  assert list(qa) == ["ORQA baseline (ICT + reading reader)", "REALM (refreshed run)"]
  for row in qa.values():
    assert row["before"]["questions"] == row["after"]["questions"] > 0
    assert all(0 <= row[when][key] <= 1 for when in ("before", "after")
               for key in ("official_exact_match", "top_5_match", "exact_match"))
  assert (out / "openqa_realm" / "best_ckpt" / "info.json").exists()
  assert "Open-QA on the synthetic world" in proc.stdout
  assert "REALM demo on the synthetic world" in proc.stdout
  # The zero-shot line reports the two "before fine-tuning" top-5 matches of the table above.
  line = next(l for l in proc.stdout.splitlines() if l.startswith("Zero-shot QA recall@5"))
  before = [qa[k]["before"]["top_5_match"] for k in qa]
  assert f"ICT start {before[0]:.3f}, REALM {before[1]:.3f}" in line
  # The retriever line: its dense recall is the Open-QA task's zero-shot top-5 match (a float32
  # metric there: equal to float32's precision, far below one question's 1/n).
  retrievers = results["retrievers"]
  assert [retrievers[k]["dense"] for k in ("ICT", "REALM")] == pytest.approx(before, rel=1e-6)
  line = next(l for l in proc.stdout.splitlines() if l.startswith("The retriever choice"))
  assert f"hybrid of BM25 and the ICT tower {retrievers['ICT']['hybrid']:.3f}" in line
  # realm-export (issue 75): REALM's refreshed run and its Open-QA index out of realm_tf. The
  # test questions embedded by sentence-transformers from the exported query tower, searched
  # by exact inner product in NumPy over the exported block embeddings, give the dense
  # recall@5 printed above (a question whose 5th and 6th scores are within 1e-4 may go either
  # way: float32 in two libraries).
  exported = str(tmp_path / "exported")
  written = export.export(str(out / "realm"), exported,
                          index_dir=str(out / "openqa_index_realm"))["written"]
  records, _ = qa_lib.read_qa(str(out / "world" / "qa-test.jsonl"))
  hf = helpers.through_the_libraries(tmp_path, dict(export_dir=exported,
                                                    queries=[r.question for r in records]))
  emb = np.load(os.path.join(exported, "block_embeddings", "embeddings.npy"))
  with open(os.path.join(exported, "block_embeddings", "blocks.jsonl")) as f:
    live = np.array([json.loads(line)["live"] for line in f])
  scores = hf["query_embeddings"].astype(np.float64) @ emb.T.astype(np.float64)
  scores[:, ~live] = -np.inf
  order = np.argsort(-scores, axis=1, kind="stable")
  bodies = [b["body"] for b in manifests.read_blocks(written["block_embeddings"]["blocks_dir"])]
  hits = [any(inputs.has_answer(bodies[b], r.answers, r.answer_type == qa_lib.REGEX)
              for b in row[:5]) for r, row in zip(records, order)]
  fifth, sixth = np.take_along_axis(scores, order[:, 4:6], axis=1).T
  near = int(np.sum(fifth - sixth < 1e-4))
  assert abs(np.mean(hits) - retrievers["REALM"]["dense"]) <= near / len(records) + 1e-9


def test_the_reader_asset_fits_the_demo(tmp_path):
  """``assets/demo_reader`` stands in for the reader ``make demo`` would train: its files
  match the checksums of its manifest, it was built with the vocabulary the demo's world makes
  at the default flags (made again here), and every variable of the demo's reader restores
  from it."""
  recipe = stages.Recipe()
  world = stages.make_world(0, 0, recipe.world_scale)
  files = synthetic_world.write_world(world, str(tmp_path / "world"), vocab_size=3000,
                                      whole_word_names=True)
  assert demo.asset_mismatch(ASSET, files["vocab"], demo.reader_settings(0, recipe)) == ""
  params = stages.experiment_params("realm_pretrain_cpu", [stages.config("realm_pretrain_cpu")],
                                    stages.towers(files["vocab"]))
  reader = RealmPretrainer.from_config_dataclass(params.task.model).reader
  reader.build_from_length()
  before = [v.numpy().copy() for v in reader.variables]
  model_dir_lib.restore(os.path.join(ASSET, "reader"), reader=reader)
  # Every variable now holds the asset's values, but the pooler's bias: zero-initialized, and
  # the reading warm start never uses the pooler.
  unchanged = [v.name for a, v in zip(before, reader.variables)
               if a.size > 1 and not (a != v.numpy()).any()]
  assert unchanged == ["reader_bert/pooler_transform/bias:0"], unchanged


def test_the_committed_ict_asset_fits_the_demo(tmp_path):
  """``assets/demo_ict`` stands in for the ICT start ``make demo`` would train at the tables'
  recipe (2,400 steps, NOTES 42): checksums, vocabulary and settings match the default run,
  and both towers restore from it strictly."""
  recipe = stages.Recipe()
  assert recipe.ict_steps == 2400
  world = stages.make_world(0, 0, recipe.world_scale)
  files = synthetic_world.write_world(world, str(tmp_path / "world"), vocab_size=3000,
                                      whole_word_names=True)
  assert demo.asset_mismatch(ICT_ASSET, files["vocab"], demo.ict_settings(0, recipe)) == ""
  embedder = embedder_api.Embedder.load(ICT_ASSET)
  assert embedder.step == recipe.ict_steps and embedder.block_embedder is not None


def test_a_reader_asset_that_does_not_fit_says_why(tmp_path):
  vocab = tmp_path / "vocab.txt"
  asset = tmp_path / "asset"
  shutil.copytree(ASSET, asset)
  settings = demo.reader_settings(0, stages.Recipe())
  manifest = json.loads((asset / "MANIFEST.json").read_text())
  vocab.write_text("[PAD]\n[UNK]\n")
  assert "another vocabulary" in demo.asset_mismatch(str(asset), str(vocab), settings)
  manifest["vocab_sha256"] = assets.sha256(vocab)
  (asset / "MANIFEST.json").write_text(json.dumps(manifest))
  assert demo.asset_mismatch(str(asset), str(vocab), settings) == ""
  other = demo.reader_settings(0, stages.Recipe(reading_steps=7))
  assert "--reading_steps=6000 (this run: 7)" in demo.asset_mismatch(str(asset), str(vocab),
                                                                     other)
  data = asset / "reader.data-00000-of-00001"
  flipped = bytearray(data.read_bytes())
  flipped[-1] ^= 1
  data.write_bytes(bytes(flipped))
  assert "sha256 differs" in demo.asset_mismatch(str(asset), str(vocab), settings)
  (asset / "MANIFEST.json").unlink()
  assert "no " in demo.asset_mismatch(str(asset), str(vocab), settings)


def test_an_ict_asset_is_the_towers_alone_and_stands_in_for_ict(ict_dir, realm_world, tmp_path):
  """``write_ict_asset`` keeps every tower variable of the ICT run's newest checkpoint, with
  its values, and no optimizer slot; the asset is a model directory that REALM's strict
  tower restore accepts, and ``ict_start`` copies it into the run where it fits (and says why
  it does not where it does not)."""
  vocab, asset = realm_world["vocab"], tmp_path / "asset"
  settings = demo.ict_settings(0, stages.Recipe())
  demo.write_ict_asset(ict_dir, {"recall@5": 0.25}, str(asset), settings)
  assert demo.asset_mismatch(str(asset), vocab, settings) == ""
  manifest = json.loads((asset / "MANIFEST.json").read_text())
  assert "model_config.yaml" in manifest["sha256"] and manifest["settings"] == settings
  source = model_dir_lib.latest_checkpoint(ict_dir)
  copy = model_dir_lib.latest_checkpoint(str(asset))
  assert model_dir_lib.checkpoint_step(copy) == model_dir_lib.checkpoint_step(source) == 4
  stored = dict(tf.train.list_variables(copy))
  assert stored and not any("OPTIMIZER_SLOT" in name for name in stored)
  source_reader, copy_reader = tf.train.load_checkpoint(source), tf.train.load_checkpoint(copy)
  towers = demo.model_variables(source, ["query_embedder/", "block_embedder/"])
  assert set(stored) - set(towers) <= {"_CHECKPOINTABLE_OBJECT_GRAPH",
                                       "save_counter/.ATTRIBUTES/VARIABLE_VALUE"}
  for name in towers:
    np.testing.assert_array_equal(copy_reader.get_tensor(name), source_reader.get_tensor(name))
  query, block = factory.build_embedders(model_dir_lib.load_config(str(asset)).retriever)
  model_dir_lib.restore(copy, query_embedder=query, block_embedder=block)   # strict, as REALM's

  out = tmp_path / "run"
  ict, metrics = demo.ict_start(Clock("test", 0), str(out), vocab, "unused", 0,
                                stages.Recipe(), str(asset))
  assert (ict, metrics) == (str(out / "ict"), {"recall@5": 0.25})
  assert str(tmp_path) not in (out / "ict" / "checkpoint").read_text()   # relative paths
  questions = [r["question"] for r in realm_world["world"].qa[:4]]
  assert len(questions) == 4
  np.testing.assert_array_equal(embedder_api.Embedder.load(ict).embed_queries(questions),
                                embedder_api.Embedder.load(ict_dir).embed_queries(questions))
  other = demo.ict_settings(0, stages.Recipe(ict_steps=7))
  assert f"--ict_steps={settings['ict_steps']} (this run: 7)" in demo.asset_mismatch(
      str(asset), vocab, other)
  # ICT from the reader's start: the asset holds for that start alone.
  from_reader = demo.ict_settings(0, stages.Recipe(ict_from_reader=True),
                                  os.path.join(ASSET, "reader"))
  with open(os.path.join(ASSET, "MANIFEST.json")) as f:
    reader_data = json.load(f)["sha256"]["reader.data-00000-of-00001"]
  assert from_reader["reader_sha256"] == reader_data
  manifest["settings"] = from_reader
  (asset / "MANIFEST.json").write_text(json.dumps(manifest))
  assert demo.asset_mismatch(str(asset), vocab, from_reader) == ""
  assert "another reader start" in demo.asset_mismatch(
      str(asset), vocab, dict(from_reader, reader_sha256="0" * 64))
  (asset / "vocab.txt").write_text("[PAD]\n")
  assert "vocab.txt: sha256 differs" in demo.asset_mismatch(str(asset), vocab, settings)
