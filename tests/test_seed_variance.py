"""Issue 54's split of the run-to-run spread of REALM's gain into its sources
(``experiments/dev/variance.py``), on constructed grids checked against NumPy."""

import numpy as np
import pytest

from experiments.dev import variance


def test_variance_components_of_a_seed_grid():
  """Issue 54's decomposition on constructed grids: purely additive gains give each seed's
  sample variance and no residual; an interaction term is the residual, equal to a least-squares
  fit's residual mean square; repeats give their pooled variance."""
  ict, realm = np.array([0.0, 0.1, -0.05]), np.array([0.02, -0.04, 0.06, 0.0])
  additive = {(a, b): [0.05 + ict[a] + realm[b]] for a in range(3) for b in range(4)}
  got = variance.components(additive)
  assert got["ict"] == pytest.approx(np.var(ict, ddof=1))
  assert got["realm"] == pytest.approx(np.var(realm, ddof=1))
  assert got["residual"] == pytest.approx(0.0, abs=1e-15) and got["repeats"] is None
  # With an interaction, MS_res is the residual of the additive least-squares fit over its
  # (3 - 1) x (4 - 1) degrees of freedom, and each seed's component loses MS_res / n.
  rng = np.random.default_rng(0)
  noise = rng.normal(0, 0.03, (3, 4))
  grid = {(a, b): [additive[a, b][0] + noise[a, b]] for a in range(3) for b in range(4)}
  design = np.array([[1.0] + [a == i for i in (1, 2)] + [b == j for j in (1, 2, 3)]
                     for a in range(3) for b in range(4)], np.float64)
  y = np.array([grid[a, b][0] for a in range(3) for b in range(4)])
  residual = y - design @ np.linalg.lstsq(design, y, rcond=None)[0]
  ms_res = residual @ residual / 6
  got = variance.components(grid)
  assert got["residual"] == pytest.approx(ms_res)
  row_means = y.reshape(3, 4).mean(1)
  assert got["ict"] == pytest.approx(np.var(row_means, ddof=1) - ms_res / 4)
  # Repeats of one cell: the cell counts by its mean, its spread is the floor.
  grid[0, 0] = [grid[0, 0][0] - 0.01, grid[0, 0][0] + 0.01]
  again = variance.components(grid)
  assert again["repeats"] == pytest.approx(np.var([-0.01, 0.01], ddof=1))
  assert again["residual"] == pytest.approx(ms_res)
  with pytest.raises(ValueError, match=r"missing \[\(2, 3\)\]"):
    variance.components({k: v for k, v in grid.items() if k != (2, 3)})


def test_question_noise_and_summary_of_runs():
  """A run's question noise is its paired per-question differences' variance over their count
  (NumPy); the summary's components are those of the runs' gains; each ICT start has one step-0
  recall, and a run that disagrees with its start's is refused."""
  rng = np.random.default_rng(1)
  bits = lambda p: "".join("1" if x else "0" for x in rng.random(315) < p)
  runs, start_hits = [], {a: bits(0.6) for a in (100, 101)}
  for a in (100, 101):
    for b in (200, 201):
      end = bits(0.65)
      runs.append({"ict_seed": a, "realm_seed": b, "start_hits": start_hits[a], "end_hits": end,
                   "start": start_hits[a].count("1") / 315,
                   "gain": (end.count("1") - start_hits[a].count("1")) / 315})
  d = [np.array([int(c) for c in r["end_hits"]]) - np.array([int(c) for c in r["start_hits"]])
       for r in runs]
  for r, diff in zip(runs, d):
    assert variance.question_noise(r["start_hits"], r["end_hits"]) == pytest.approx(
        np.var(diff, ddof=1) / diff.size)
  got = variance.summarize(runs)
  assert got["question_noise"] == pytest.approx(np.mean([np.var(x, ddof=1) / x.size for x in d]))
  assert got["components"] == pytest.approx(variance.components(
      {(r["ict_seed"], r["realm_seed"]): [r["gain"]] for r in runs}), nan_ok=True)
  assert got["ict_starts"]["101"]["mean_gain"] == pytest.approx(
      np.mean([r["gain"] for r in runs[2:]]))
  gains = [r["gain"] for r in runs]
  assert got["gains"] == pytest.approx({"mean": np.mean(gains), "sd": np.std(gains, ddof=1),
                                        "n": 4})
  # One REALM seed: the gains over the ICT starts, no components.
  one = variance.summarize(runs[::2])
  assert one["components"] is None and one["gains"]["sd"] == pytest.approx(
      np.std(gains[::2], ddof=1))
  runs[1] = dict(runs[1], start=runs[1]["start"] + 0.01)
  with pytest.raises(ValueError, match="ICT seed 100: two step-0 recalls"):
    variance.summarize(runs)


@pytest.mark.slow
def test_grid_at_the_smallest_size(tmp_path):
  """The grid end to end on a small world: 2 ICT seeds x 2 REALM seeds and a repeat of the
  first cell, each run's gain from its own validation hits, on the non-test questions only."""
  import json  # pylint: disable=g-import-not-at-top
  import helpers  # pylint: disable=g-import-not-at-top
  out = tmp_path / "grid"
  proc = helpers.run_process(
      "experiments.dev.variance", str(out), "100,101", "200,201", "repeats=2",
      "world_scale=0.3", "reading_worlds=1", "reading_steps=4", "distractor_steps=3",
      "ict_steps=4", "realm_steps=6", "refresh_every=3", timeout=1800)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  result = json.loads((out / "variance.json").read_text())
  assert len(result["runs"]) == 5
  test = {json.loads(line)["question"]
          for line in (out / "world" / "qa-test.jsonl").read_text().splitlines() if line}
  nontest = [json.loads(line)["question"]
             for line in (out / "qa-nontest.jsonl").read_text().splitlines() if line]
  assert nontest and not test & set(nontest) and result["questions"] == len(nontest)
  for run in result["runs"]:
    assert run["step"] == 6 and len(run["start_hits"]) == len(run["end_hits"]) == len(nontest)
    assert run["gain"] == pytest.approx(
        (run["end_hits"].count("1") - run["start_hits"].count("1")) / len(nontest))
  # One ICT start, one step-0 recall, whatever REALM's seed.
  starts = {}
  for run in result["runs"]:
    starts.setdefault(run["ict_seed"], set()).add(run["start_hits"])
  assert all(len(s) == 1 for s in starts.values())
  grid = {}
  for run in result["runs"]:
    grid.setdefault((run["ict_seed"], run["realm_seed"]), []).append(run["gain"])
  assert result["components"] == pytest.approx(variance.components(grid), nan_ok=True)
  assert result["question_noise"] == pytest.approx(
      variance.summarize(result["runs"])["question_noise"])
  # A rerun in the same directory with another recipe is refused, not silently mixed.
  again = helpers.run_process("experiments.dev.variance", str(out), "100,101", "200,201",
                              "world_scale=0.3", "realm_steps=7")
  assert again.returncode != 0 and "records another recipe" in again.stderr


@pytest.mark.slow
def test_ict_plateau_at_the_smallest_size(tmp_path):
  """The ICT curve scores every kept checkpoint on the non-test questions; its last point is
  the tables' own zero-shot scoring of the finished start on the same questions."""
  import json  # pylint: disable=g-import-not-at-top
  import helpers  # pylint: disable=g-import-not-at-top
  from experiments.synthetic import table_seed  # pylint: disable=g-import-not-at-top
  out = tmp_path / "plateau"
  proc = helpers.run_process(
      "experiments.dev.ict_plateau", str(out), "4", "100", "every=2", "world_scale=0.3",
      "reading_worlds=1", "reading_steps=4", "distractor_steps=3", "ict_from_reader=1",
      timeout=1200)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  result = json.loads((out / "ict_plateau.json").read_text())
  curve = result["curves"]["100"]
  # Checkpoints fall on the trainer's loop boundaries: the untrained start and the last step
  # at least, in order.
  steps = [step for step, _, _ in curve]
  assert steps[0] == 0 and steps[-1] == 4 and steps == sorted(set(steps))
  nontest = (out / "qa-nontest.jsonl").read_text().splitlines()
  for _, recall, bits in curve:
    assert len(bits) == len(nontest) and recall == pytest.approx(bits.count("1") / len(bits))
  data = json.loads((out / "prepared.json").read_text())
  data["files"]["qa_test"] = str(out / "qa-nontest.jsonl")
  hits = table_seed.zero_shot_by_question(data, str(out / "ict_100" / "ict"))
  assert "".join("1" if h else "0" for h in hits) == curve[-1][2]
