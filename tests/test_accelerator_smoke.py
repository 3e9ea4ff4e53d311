"""``experiments/accelerator_smoke.py``: its health report, and (slow) a whole run on the CPU."""

import dataclasses
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from experiments import accelerator_smoke
from realm_tf import tpu_readiness


def write_run(model_dir, losses, done=True):
  """Training summaries of 3 loops of 10 steps as orbit writes them: the first loop 10 s
  (tracing and compiling), the others 2 s."""
  writer = tf.summary.create_file_writer(str(model_dir / "train"))
  with writer.as_default():
    for i, (rate, loss) in enumerate(zip((1.0, 5.0, 5.0), losses)):
      step = 10 * (i + 1)
      tf.summary.scalar("steps_per_second", rate, step=step)
      tf.summary.scalar("examples_per_second", 16 * rate, step=step)
      tf.summary.scalar("training_loss", loss, step=step)
      tf.summary.scalar("index_age", 7.0, step=step)
      tf.summary.scalar("health_alarms", float(i), step=step)
      tf.summary.scalar("alarm/query_cosine", float(i > 1), step=step)
      tf.summary.scalar("alarm/p_null", float(i == 1), step=step)
  writer.flush()
  if done:
    (model_dir / "TRAINING_DONE").write_text("30\n")


def test_health_of_a_run_from_its_summaries(tmp_path):
  log = tmp_path / "refresh.log"
  log.write_text("".join(f"[realm-refresh] published step-{s}\n" for s in (0, 10, 20)))
  healthy = tmp_path / "healthy"
  write_run(healthy, (3.0, 2.5, 2.0))
  lines, problems = accelerator_smoke.health(str(healthy), 10, (0, str(log)), waited=3.0)
  assert not problems
  assert lines == [
      "speed: 5.00 steps/s, 80.0 examples/s (median of the 2 loops of 10 steps after the first)",
      "compile: the first loop took 10.0 s against 2.0 s for the others, 3.0 s of it waiting "
      "for the refresher's first index: ~5.0 s of tracing and compiling",
      "loss: 3 at step 10 -> 2 at step 30, finite at all 3 summaries",
      "retrieval health alarms at the end (not judged here): query_cosine",
      "refresher: 3 index(es) built, exit status 0; index age 7 steps at step 30"]

  sick = tmp_path / "sick"
  write_run(sick, (3.0, np.nan, 2.0), done=False)
  log.write_text("[realm-refresh] published step-0\n")
  _, problems = accelerator_smoke.health(str(sick), 10, (1, str(log)))
  assert [p.split(":")[0] for p in problems] == ["training losses not all finite",
                                                 "no TRAINING_DONE", "refresher"]
  assert "exit status 1, 1 build(s)" in problems[2]


def _step(loss, weights, margin):
  return tpu_readiness.StepResult(
      loss=loss, weights=weights, updates=[0.1, 0.05], seconds=1.0,
      metrics={"retrieval_margin": margin, "mlm_accuracy": 0.25, "index_age": 3.0})


def test_xla_check_judges_loss_and_weights_tightly_and_metrics_by_their_spread(tmp_path):
  """A healthy step seen on a CPU: the loss equal to 6 digits, the weights within 1.2e-7, the
  retrieval margin (a difference of close logits) 0.006422 compiled and 0.006410 not. It
  passes, as the margin's gap is far inside its spread over the run; a real difference of the
  loss, of a weight or of a metric beyond its spread fails."""
  writer = tf.summary.create_file_writer(str(tmp_path / "train"))
  with writer.as_default():
    for step, margin in zip((5, 10, 15, 20), (0.002, 0.004, 0.012, 0.02)):
      tf.summary.scalar("retrieval_margin", margin, step=step)
      tf.summary.scalar("mlm_accuracy", 0.25, step=step)
  writer.flush()
  spreads = accelerator_smoke.metric_spreads(str(tmp_path))
  assert spreads["retrieval_margin"] == pytest.approx(np.std([0.002, 0.004, 0.012, 0.02]))
  assert spreads["mlm_accuracy"] == 0.0
  rng = np.random.default_rng(0)
  weights = [rng.normal(size=[4, 3]), rng.normal(size=[5])]
  eager = _step(2.3456781, weights, 0.006410)
  xla = _step(2.3456789, [w + 1.2e-7 for w in weights], 0.006422)
  # tpu_readiness's absolute 1e-5 on every metric called it a difference.
  assert [d.split(":")[0] for d in tpu_readiness.differences(eager, xla)] == [
      "metric retrieval_margin"]
  assert accelerator_smoke.step_differences(eager, xla, spreads) == []

  def judged(**changes):
    got = dataclasses.replace(xla, **changes)
    return [d.split(":")[0] for d in accelerator_smoke.step_differences(eager, got, spreads)]
  assert judged(loss=2.347) == ["loss 2.347 != 2.3456781"]                # 6e-4 relative
  assert judged(weights=[weights[0], weights[1] + 1e-3]) == ["weight 1 (5,)"]
  assert judged(metrics={**xla.metrics, "retrieval_margin": 0.0064 + 0.002}) == [
      "metric retrieval_margin"]                       # 0.002 > 0.1 x its spread 0.0071
  assert judged(metrics={**xla.metrics, "mlm_accuracy": 0.26}) == ["metric mlm_accuracy"]
  assert judged(metrics={"mlm_accuracy": 0.25}) == ["metric index_age",
                                                    "metric retrieval_margin"]


def test_logit_differences_and_retrieved_shares_get_room_from_the_step_sizes():
  """Two healthy 20-step smoke runs that failed (2026-12-04), the loss equal both times: the
  margin 0.0034847 uncompiled, 0.0034661 compiled (its spread 9.2e-5; logits of size ~128);
  distinct_candidates 0.10833 against 0.1125 (1 of 240 retrieved blocks swapped at a tie)."""
  spreads = {"retrieval_margin": 9.2e-5, "distinct_candidates": 0.0036, "mlm_accuracy": 0.0}
  sizes = {"logits": 128.0, "retrieved": 240.0}
  weights = [np.ones([2, 2])]

  def judged(margin=0.0034661, distinct=0.1125, accuracy=0.25, **kw):
    eager = _step(2.5, weights, 0.0034847)
    eager.metrics["distinct_candidates"] = 0.10833334
    xla = _step(2.5, weights, margin)
    xla.metrics.update(distinct_candidates=distinct, mlm_accuracy=accuracy)
    return [d.split(":")[0] for d in accelerator_smoke.step_differences(eager, xla, spreads,
                                                                         **kw)]
  assert judged() == ["metric distinct_candidates", "metric retrieval_margin"]   # no sizes
  assert judged(sizes=sizes) == []
  # 2e-4 x 128 = 0.026 for the margin; 2.4 of 240 blocks (0.01) for a retrieved share.
  assert judged(margin=0.0034847 + 0.03, sizes=sizes) == ["metric retrieval_margin"]
  assert judged(distinct=0.10833334 + 3 / 240, sizes=sizes) == ["metric distinct_candidates"]
  # A small batch still allows one swapped block.
  assert judged(sizes={"logits": 128.0, "retrieved": 28.0}, distinct=0.10833334 + 1 / 28) == []
  # The others are judged as before.
  assert judged(accuracy=0.2501, sizes=sizes) == ["metric mlm_accuracy"]


class _Scorer:
  """A model scoring candidates by the logits it is given."""

  query_embedder = None

  def __init__(self, logits):
    self.logits = logits

  def __call__(self, features, training=None):
    del features, training
    return {"retrieval_logits": tf.constant(self.logits)}


def test_retrieval_sizes_of_a_step():
  batch = {"candidate_word_ids": tf.zeros([2, 2, 3], tf.int32)}
  task = object()   # host retrieval: the batch carries its candidates
  sizes = accelerator_smoke.retrieval_sizes(task, _Scorer([[1.0, -3.0], [0.5, 0.25]]), batch)
  assert sizes == {"logits": pytest.approx(1.75), "retrieved": 2.0}   # the null is not retrieved
  assert accelerator_smoke.retrieval_sizes(task, object(), batch) == {}          # no towers
  assert accelerator_smoke.retrieval_sizes(task, _Scorer([[1.0]]), {}) == {}     # no candidates


def test_experiment_params_from_arguments_not_flags(tmp_path):
  """The library functions take their parameters (only main reads absl's flags, which these
  tests never define)."""
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b"]) + "\n")
  dirs = {name: str(tmp_path / name) for name in ("pretrain", "blocks", "ict")}
  files = {"vocab": str(vocab), "qa_train": str(tmp_path / "qa-train.jsonl")}
  params = accelerator_smoke.experiment_params(
      {"files": files, "dirs": dirs}, str(tmp_path / "aux"),
      "realm_pretrain_cpu", 7, 3, retrieval="device",
      params_override="task.train_data.global_batch_size=2")
  assert params.trainer.train_steps == 7 and params.trainer.checkpoint_interval == 3
  assert params.trainer.steps_per_loop == 3 and params.task.retrieval == "device"
  assert params.task.train_data.global_batch_size == 2
  assert params.task.model.reader.encoder.vocab_size == 7
  assert params.task.index_dir == str(tmp_path / "aux" / "index")


@pytest.mark.slow
def test_smoke_run_on_the_cpu(tmp_path):
  """REALM with device retrieval beside the refresher, 20 steps on one CPU device: healthy,
  its inputs checked, and the trained step compiled with XLA equal to the uncompiled one."""
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.accelerator_smoke", "--experiment=realm_pretrain_cpu",
       "--retrieval=device", "--strategy=one_device", "--steps=20", "--refresh_every=5",
       "--world_scale=0.1", f"--output_dir={tmp_path}"],
      capture_output=True, text=True, timeout=1500, check=False)
  out = proc.stdout
  assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
  for expected in ("every feature of fully static shape and a TPU dtype", "steps/s",
                   "of tracing and compiling", "finite at all 4 summaries", "exit status 0",
                   "XLA check of the train step (one batch, tpu_readiness): the same",
                   "] healthy"):
    assert expected in out, expected
