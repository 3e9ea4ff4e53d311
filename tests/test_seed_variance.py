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

