"""End to end at tiny scale: data_prep -> ICT -> refresher process + REALM trainer.

Checks that the trainer and the refresher work together (indexes swapped in, staleness
logged), that a preempted run resumes at its step, that the stale-index ablation runs, and
that a missing index, an index of another corpus and examples longer than the query length
fail with clear errors.

The world and the warm starts (ICT, the reader's reading) are conftest's session fixtures. One
REALM run (``realm_run``: train_and_eval beside ``realm-refresh`` as a process of its own)
serves the tests of the refreshed run; the other runs keep their refresher in a thread.
"""

import contextlib
import gc
import json
import logging
import os
import shutil
import subprocess
import tempfile
import sys
import threading

from absl.testing import flagsaver
import numpy as np
import pytest
import tensorflow as tf

from data_prep import synthetic_world
from realm_tf import configs
from realm_tf import hardware
from realm_tf import model_dir as model_dir_lib
from realm_tf import train_lib
from realm_tf.data import loaders
from realm_tf.data import manifests
from realm_tf.retrieval import errors
from realm_tf.retrieval.publication import publish
from realm_tf.retrieval.publication import refresher as refresher_lib
from realm_tf.tasks import ict
from realm_tf.tasks import realm_pretrain
from realm_tf.tokenization import load_vocab

import helpers


def overrides(p, **extra):
  size = len(load_vocab(p["vocab"]))
  items = {
      "task.model.vocab_file": p["vocab"],
      "task.model.retriever.encoder.vocab_size": size,
      "task.model.reader.encoder.vocab_size": size,
      "task.model.retriever.encoder.hidden_size": 32,
      "task.model.reader.encoder.hidden_size": 32,
      "task.model.retriever.encoder.intermediate_size": 64,
      "task.model.reader.encoder.intermediate_size": 64,
      "task.model.retriever.projection_size": 16,
      "task.train_data.input_path": os.path.join(p["pretrain"], "train-*"),
      "task.train_data.blocks_dir": p["blocks"],
      "task.train_data.global_batch_size": 4,
      "task.validation_data.input_path": os.path.join(p["pretrain"], "eval-*"),
      "task.validation_data.blocks_dir": p["blocks"],
      "task.index_wait_seconds": 120,
      "trainer.checkpoint_interval": 3,
      "trainer.summary_interval": 3,
      "trainer.steps_per_loop": 3,
      "trainer.validation_interval": 3,
  }
  items.update(extra)
  return ",".join(f"{k}={v}" for k, v in items.items())


def start_refresher(model_dir, index_dir, blocks_dir, *flags):
  """``realm-refresh`` as a process of its own."""
  return subprocess.Popen(
      [sys.executable, "-m", "realm_tf.binaries.refresh", f"--model_dir={model_dir}",
       f"--index_dir={index_dir}", f"--blocks_dir={blocks_dir}", "--poll_seconds=0.5",
       "--model_dir_wait_seconds=120", "--index_type=brute_force", "--noprogress", *flags],
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@contextlib.contextmanager
def refresher_thread(model_dir, index_dir, blocks_dir, max_builds=None):
  """The refresher's loop (what ``realm-refresh`` runs) in a thread of this process, beside a
  trainer run inside the ``with``; yields a list that holds its number of builds after."""
  result = []

  def loop():
    try:
      result.append(refresher_lib.refresh_loop(
          model_dir, index_dir, blocks_dir, poll_seconds=0.5, model_dir_wait_seconds=120,
          max_builds=max_builds,
          options=refresher_lib.BuildOptions(index_type="brute_force", progress=False)))
    except Exception as e:  # pylint: disable=broad-except
      result.append(e)

  thread = threading.Thread(target=loop, daemon=True)
  thread.start()
  yield result
  thread.join(timeout=120)
  assert not thread.is_alive() and result and isinstance(result[0], int), result


@pytest.fixture(scope="module")
def realm_run(realm_world, ict_dir, reader_dir):
  """Six REALM steps (--mode=train_and_eval, validated every 3 steps with the QA recall of the
  world's dev questions) from the ICT towers and the reader's warm start, beside
  ``realm-refresh`` as a process of its own."""
  p, root = realm_world, realm_world["root"]
  model_dir, index_dir = str(root / "realm"), str(root / "realm_index")
  override = overrides(p, **{"task.index_dir": index_dir,
                             "task.retriever_init_checkpoint": ict_dir,
                             "task.reader_init_checkpoint": reader_dir, "trainer.train_steps": 6,
                             "task.qa_eval_path": p["files"]["qa_dev"]})
  refresher = start_refresher(model_dir, index_dir, p["blocks"])
  try:
    params = configs.load_experiment("realm_pretrain_cpu", params_override=override)
    logs = train_lib.run_experiment(params, model_dir, mode="train_and_eval")
    output, _ = refresher.communicate(timeout=120)
  finally:
    refresher.kill()
  assert refresher.returncode == 0, output[-2000:]
  return dict(model_dir=model_dir, index_dir=index_dir, override=override, logs=logs)


def _variables(checkpoint, prefix):
  reader = tf.train.load_checkpoint(checkpoint)
  return {k: reader.get_tensor(k) for k, _ in tf.train.list_variables(checkpoint)
          if k.startswith(prefix) and k.endswith("VARIABLE_VALUE") and "OPTIMIZER" not in k}


def test_ict_then_realm_with_refresher(realm_world, realm_run, ict_dir, reader_dir, caplog):
  p, root = realm_world, realm_world["root"]
  size = len(load_vocab(p["vocab"]))
  metrics, model_dir = realm_run["logs"], realm_run["model_dir"]
  index_dir = realm_run["index_dir"]
  assert {"training_loss", "mlm_accuracy", "retrieval_utility", "retrieval_entropy",
          "index_age", "examples_per_second"} <= set(metrics)
  # Checkpoints are numbered by step and the refresher built one index per checkpoint,
  # the last one for the final checkpoint.
  assert model_dir_lib.checkpoint_step(model_dir_lib.latest_checkpoint(model_dir)) == 6
  assert publish.latest_step(index_dir) == 6
  assert model_dir_lib.training_done(model_dir)
  # The retriever started from the ICT towers, the reader from its warm start.
  config = model_dir_lib.load_config(model_dir)
  assert config.retriever.encoder.vocab_size == size
  start = os.path.join(model_dir, "ckpt-0")
  # (Shared towers are saved once, under block_embedder.)
  for prefix, source in (("block_embedder/", ict_dir), ("reader/", reader_dir)):
    want = _variables(model_dir_lib.latest_checkpoint(source), prefix)
    got = _variables(start, prefix)
    assert len(want) > 10 and set(want) <= set(got)
    for k, v in want.items():
      np.testing.assert_array_equal(got[k], v, err_msg=k)

  # Preempted: a second run with more steps resumes from step 6, not from scratch (in a copy
  # of the run, which test_train_and_eval_then_eval reads as it finished).
  model_dir, index_dir = str(root / "realm_resumed"), str(root / "realm_resumed_index")
  shutil.copytree(realm_run["model_dir"], model_dir)
  shutil.copytree(realm_run["index_dir"], index_dir)
  os.remove(os.path.join(model_dir, model_dir_lib.TRAINING_DONE))
  params = configs.load_experiment("realm_pretrain_cpu", params_override=overrides(
      p, **{"task.index_dir": index_dir, "trainer.train_steps": 9}))
  with refresher_thread(model_dir, index_dir, p["blocks"]):
    train_lib.run_experiment(params, model_dir)
  steps = sorted(model_dir_lib.checkpoint_step(c) for c in
                 tf.train.get_checkpoint_state(model_dir).all_model_checkpoint_paths)
  assert steps[-1] == 9 and 3 not in steps[-2:]   # continued 6 -> 9

  # Held-out evaluation (--mode=eval) runs on the result, without TensorFlow's list of the
  # optimizer's slots as unrestored values (an evaluation builds no optimizer slots).
  with caplog.at_level(logging.WARNING):
    result = train_lib.run_experiment(params, model_dir, mode="eval")
    gc.collect()
  assert not [r for r in caplog.records if "unrestored" in r.getMessage() or
              "could not be found in the restored object" in r.getMessage()]
  assert 0.0 <= result["recall@5"] <= 1.0
  held_out = len(manifests.read_examples(p["pretrain"], manifests.EVAL_SPLIT))
  assert result["examples"] == held_out > 0   # every held-out sentence, once
  assert {"retrieval_utility", "mlm_accuracy", "validation_loss"} <= set(result)

  # The stale-index ablation: one index, never refreshed; its age grows with the step.
  stale_dir, stale_index = str(root / "stale"), str(root / "stale_index")
  params = configs.load_experiment("realm_pretrain_cpu", params_override=overrides(
      p, **{"task.index_dir": stale_index, "task.refresh_index": "false",
            "task.retriever_init_checkpoint": ict_dir, "trainer.train_steps": 6}))
  with refresher_thread(stale_dir, stale_index, p["blocks"], max_builds=1):
    metrics = train_lib.run_experiment(params, stale_dir)
  assert publish.published_steps(stale_index) == [0]
  assert metrics["index_age"] > 3   # steps 4..6 all used the step-0 index


def test_device_retrieval_with_refresher(realm_world, ict_dir):
  """``task.retrieval: device``: the trainer retrieves in the step from the refresher's
  indexes (swapped in between loops); a bad value is refused by name."""
  p, root = realm_world, realm_world["root"]
  model_dir, index_dir = str(root / "realm_device"), str(root / "realm_device_index")
  params = configs.load_experiment("realm_pretrain_cpu", params_override=overrides(
      p, **{"task.index_dir": index_dir, "task.retriever_init_checkpoint": ict_dir,
            "task.retrieval": "device", "trainer.train_steps": 6}))
  with refresher_thread(model_dir, index_dir, p["blocks"]):
    metrics = train_lib.run_experiment(params, model_dir)
  assert {"training_loss", "mlm_accuracy", "retrieval_utility", "index_age"} <= set(metrics)
  assert np.isfinite(metrics["training_loss"]) and metrics["training_loss"] > 0
  # Steps 4-6 retrieved with the index of ckpt-0 or ckpt-3, never one newer than the step.
  assert 0 <= metrics["index_age"] <= 5
  assert publish.latest_step(index_dir) == 6
  params = configs.load_experiment("realm_pretrain_cpu", params_override=overrides(
      p, **{"task.retrieval": "tpu"}))
  with pytest.raises(ValueError, match="task.retrieval must be 'host' or 'device'"):
    realm_pretrain.RealmPretrainTask(params.task)


def test_clear_errors(realm_world, ict_dir):
  p, root = realm_world, realm_world["root"]
  # No index at all: a timeout that says what to run.
  params = configs.load_experiment("realm_pretrain_cpu", params_override=overrides(
      p, **{"task.index_dir": str(root / "no_index"), "task.index_wait_seconds": 1}))
  task = realm_pretrain.RealmPretrainTask(params.task)
  with pytest.raises(errors.IndexNotReadyError, match="realm-refresh"):
    task.candidate_builder()

  # Examples written for another query length.
  params = configs.load_experiment("realm_pretrain_cpu", params_override=overrides(
      p, **{"task.model.retriever.query_seq_length": 24}))
  with pytest.raises(loaders.InputError, match="query length 32 but the model"):
    realm_pretrain.RealmPretrainTask(params.task).build_inputs(params.task.train_data)

  # ICT blocks (ICT and the reader warm start read them) written shorter than the model's.
  params = configs.load_experiment("ict_cpu", params_override=",".join([
      f"task.train_data.input_path={os.path.join(p['ict'], 'train-*')}",
      "task.model.block_seq_length=96"]))
  with pytest.raises(ValueError, match="block_seq_length=64 but the model's is 96; rebuild"):
    ict.IctTask(params.task).build_inputs(params.task.train_data)

  # An index built for another corpus: refused by fingerprint.
  other = synthetic_world.generate_world(seed=7, num_regions=1, num_cities=4, num_people=6,
                                         num_organizations=2, num_works=2)
  files = synthetic_world.write_world(other, str(root / "other_world"))
  other_blocks = str(root / "other_blocks")
  from data_prep import blocks as blocks_pipeline  # pylint: disable=g-import-not-at-top
  blocks_pipeline.run_blocks(files["articles"], p["vocab"], other_blocks,
                             block_seq_length=64)
  from realm_tf.retrieval.publication import refresher  # pylint: disable=g-import-not-at-top
  other_index = str(root / "other_index")
  refresher.build_index_for_checkpoint(None, ict_dir, other_blocks, other_index)
  params = configs.load_experiment("realm_pretrain_cpu", params_override=overrides(
      p, **{"task.index_dir": other_index, "task.index_wait_seconds": 5}))
  with pytest.raises(errors.FingerprintMismatchError, match="another corpus|corpus"):
    realm_pretrain.RealmPretrainTask(params.task).candidate_builder()

  # A vocabulary that does not fit the towers.
  params = configs.load_experiment("realm_pretrain_cpu", params_override=overrides(
      p, **{"task.model.reader.encoder.vocab_size": 7}))
  with pytest.raises(configs.ConfigError, match="vocab_size"):
    model_dir_lib.write_metadata(
        str(root / "bad"), *realm_pretrain.RealmPretrainTask(params.task).model_dir_config())


def test_train_and_eval_then_eval(realm_world, realm_run):
  """--mode=train_and_eval writes validation summaries at validation_interval (with the QA
  recall of qa_eval_path); --mode=eval on the finished model dir prints them; the refresher
  restores the towers alone."""
  p, root = realm_world, realm_world["root"]
  model_dir, override, logs = realm_run["model_dir"], realm_run["override"], realm_run["logs"]
  qa_dev = p["files"]["qa_dev"]
  assert os.path.exists(os.path.join(model_dir, "params.yaml"))
  validation = helpers.scalars(os.path.join(model_dir, "validation"))
  # Validated before the first step too (the health alarms' step-0 recalls), then every 3.
  for tag in ("recall@5", "retrieval_utility", "mlm_accuracy", "validation_loss",
              "qa_recall@5", "qa_questions", "retrieval_entropy_ratio", "p_null",
              "reader_gain_answer", "query_cosine", "distinct_candidates", "health_alarms"):
    assert sorted(validation[tag]) == [0, 3, 6], (tag, validation.get(tag))
  assert 0.0 <= validation["recall@5"][6] <= 1.0
  assert logs["validation/recall@5"] == pytest.approx(validation["recall@5"][6])
  assert 0.0 <= validation["qa_recall@5"][6] <= 1.0
  assert logs["validation/qa_recall@5"] == pytest.approx(validation["qa_recall@5"][6])
  with open(qa_dev, encoding="utf-8") as f:
    assert validation["qa_questions"][6] == sum(1 for line in f if line.strip()) > 0
  # The step-0 recalls the health alarms compare against, kept for a resumed run.
  with open(os.path.join(model_dir, "health_baseline.json"), encoding="utf-8") as f:
    assert json.load(f) == pytest.approx({"recall@5": validation["recall@5"][0],
                                          "qa_recall@5": validation["qa_recall@5"][0]})
  train = helpers.scalars(os.path.join(model_dir, "train"))
  for tag in ("training_loss", "retrieval_entropy_ratio", "p_null", "retrieval_margin",
              "candidates_with_answer", "reader_gain_other", "block_cosine",
              "distinct_candidates", "skipped_duplicates", "health_alarms"):
    assert sorted(train[tag]) == [3, 6], (tag, train.get(tag))

  # --mode=eval on the finished model dir, as a user runs it: the same numbers, printed
  # (realm-train's smoke test as a process of its own).
  proc = helpers.run_process("realm_tf.binaries.train", "--experiment=realm_pretrain_cpu",
                             "--mode=eval", f"--model_dir={model_dir}",
                             f"--params_override={override}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  printed = proc.stdout.strip().splitlines()[-1]
  assert printed.startswith("done (eval)") and "'recall@5': " in printed
  assert "'qa_recall@5': " in printed
  recall = float(printed.split("'recall@5': ")[1].split(",")[0].rstrip("}"))
  assert recall == pytest.approx(validation["recall@5"][6], abs=1e-4)

  # The refresher restores only the towers from the new loop's checkpoint (which also holds
  # the whole model under model/ and the optimizer): its values, and nothing is missing.
  latest = model_dir_lib.latest_checkpoint(model_dir)
  names = [name for name, _ in tf.train.list_variables(latest)]
  assert any(n.startswith("model/") or n.startswith("reader/") for n in names)
  assert any(n.startswith("optimizer/") for n in names)
  towers = refresher_lib.Refresher(model_dir, p["blocks"], str(root / "unused_index"))
  towers._build_towers()   # pylint: disable=protected-access
  towers._restore(latest)  # pylint: disable=protected-access
  want = _variables(latest, "block_embedder/")
  got = {f"block_embedder/{k}": v for k, v in _object_values(towers.block_embedder).items()}
  assert len(want) > 10 and set(want) == set(got)
  for k, v in want.items():
    np.testing.assert_array_equal(got[k], v, err_msg=k)


def _object_values(module):
  """``{checkpoint key below the module: value}`` for every variable of ``module``."""
  path = os.path.join(tempfile.mkdtemp(), "ckpt")
  tf.train.Checkpoint(m=module).write(path)
  return {k[2:]: tf.train.load_checkpoint(path).get_tensor(k)
          for k, _ in tf.train.list_variables(path)
          if k.startswith("m/") and k.endswith("VARIABLE_VALUE")}


def test_bfloat16_runtime_trains(realm_world):
  """runtime.mixed_precision_dtype=bfloat16 through run_experiment: finite loss, float32
  variables in the checkpoint; on a CPU that does not compute bfloat16, refused before the
  model directory is written."""
  bf16 = ("task.model.projection_size=16", "runtime.mixed_precision_dtype=bfloat16")
  problem = hardware.cpu_bfloat16_problem()
  if problem:
    with pytest.raises(configs.ConfigError) as refused:
      helpers.train_ict(realm_world, "ict_bf16", 2, *bf16)
    assert str(refused.value) == problem
    assert not os.path.exists(realm_world["root"] / "ict_bf16")
    return
  path, logs = helpers.train_ict(realm_world, "ict_bf16", 2, *bf16)
  assert np.isfinite(logs["training_loss"])
  reader = tf.train.load_checkpoint(model_dir_lib.latest_checkpoint(path))
  dtypes = reader.get_variable_to_dtype_map()
  assert {dtypes[k] for k in dtypes if k.startswith("block_embedder/") and
          k.endswith("VARIABLE_VALUE")} == {tf.float32}


def test_bfloat16_is_refused_up_front_where_tensorflows_own_kernels_would_compute_it(
    realm_world, monkeypatch):
  """With oneDNN off (as on a CPU without bfloat16 instructions), run_experiment and the
  experiments' --precision=bfloat16 refuse in one line before anything is written; float32
  and a TPU or GPU strategy are not refused."""
  monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
  problem = hardware.cpu_bfloat16_problem()
  assert problem.startswith("bfloat16 training on the CPU is refused: ") and "\n" not in problem
  assert problem.endswith("float32 is the default")
  with pytest.raises(configs.ConfigError) as refused:
    helpers.train_ict(realm_world, "ict_bf16_refused", 2, "runtime.mixed_precision_dtype=bfloat16")
  assert str(refused.value) == problem
  assert not os.path.exists(realm_world["root"] / "ict_bf16_refused")
  with pytest.raises(configs.ConfigError, match="refused"):
    train_lib.check_bfloat16_device(tf.distribute.OneDeviceStrategy("/cpu:0"))
  gpu = type("Gpu", (), {"extended": type("E", (), {"worker_devices": ("/device:GPU:0",)})})
  train_lib.check_bfloat16_device(gpu)   # a GPU computes bfloat16 itself
  from absl import flags  # pylint: disable=g-import-not-at-top
  from experiments.pipeline import recipe_flags  # pylint: disable=g-import-not-at-top
  with flagsaver.flagsaver(precision="bfloat16"):
    with pytest.raises(configs.ConfigError, match="refused"):
      recipe_flags.recipe(flags.FLAGS)
