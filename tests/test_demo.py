"""``realm-demo`` end to end at the smallest size: every stage runs and the table is written."""

import json
import subprocess
import sys


def test_demo_runs_every_stage(tmp_path):
  out = tmp_path / "demo"
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.demo", f"--output_dir={out}",
       "--world_scale=0.3", "--reading_worlds=1", "--reading_steps=4", "--distractor_steps=3",
       "--ict_steps=4", "--realm_steps=6", "--refresh_every=3", "--openqa_steps=3"],
      capture_output=True, text=True, timeout=900, check=False)
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
