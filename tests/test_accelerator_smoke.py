"""``experiments/accelerator_smoke.py``: its health report, and (slow) a whole run on the CPU."""

import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from experiments import accelerator_smoke


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
