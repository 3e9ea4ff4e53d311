r"""Dev only (issue 54): where the spread of REALM's gain over its ICT start comes from.

A grid of runs, each an ICT seed ``a`` (its warm start) and a REALM seed ``b`` (REALM's data
order and masks), with repeats of some cells, gives the gain ``g[a, b]`` (REALM's dev recall
minus its start's). ``components`` splits its run-to-run variance as a two-way random-effects
model without interaction, ``g = mu + A_a + B_b + e``: the ICT start's share ``var(A)``, REALM's
own ``var(B)``, and the rest (interaction, the unseeded refresher, question noise), with the
repeats' within-cell variance apart as the floor that no seed explains.
"""
import itertools
import statistics
from typing import Dict, Hashable, Sequence, Tuple


def components(gains: Dict[Tuple[Hashable, Hashable], Sequence[float]]) -> Dict:
  """Variance components of ``gains[(a, b)]`` (one value per run of that cell; every cell of
  the full grid present) from the cells' means, by the expected mean squares of a two-way
  layout with one value a cell: ``ict = (MS_a - MS_res) / n_b``, ``realm = (MS_b - MS_res) /
  n_a``, ``residual = MS_res`` (negative estimates are reported as they are, and ``*_clipped``
  at 0); ``repeats``: the pooled within-cell variance of cells run more than once (None
  without repeats)."""
  rows = sorted({a for a, _ in gains})
  cols = sorted({b for _, b in gains})
  missing = [cell for cell in itertools.product(rows, cols) if not gains.get(cell)]
  if len(rows) < 2 or len(cols) < 2 or missing:
    raise ValueError(f"a full grid of at least 2 x 2 cells is needed; missing {missing}")
  mean = {cell: statistics.fmean(gains[cell]) for cell in itertools.product(rows, cols)}
  n_a, n_b = len(rows), len(cols)
  grand = statistics.fmean(mean.values())
  row_mean = {a: statistics.fmean(mean[a, b] for b in cols) for a in rows}
  col_mean = {b: statistics.fmean(mean[a, b] for a in rows) for b in cols}
  ms_a = n_b * sum((row_mean[a] - grand) ** 2 for a in rows) / (n_a - 1)
  ms_b = n_a * sum((col_mean[b] - grand) ** 2 for b in cols) / (n_b - 1)
  ms_res = sum((mean[a, b] - row_mean[a] - col_mean[b] + grand) ** 2
               for a in rows for b in cols) / ((n_a - 1) * (n_b - 1))
  repeated = [v for v in gains.values() if len(v) > 1]
  within = (sum((len(v) - 1) * statistics.variance(v) for v in repeated)
            / sum(len(v) - 1 for v in repeated)) if repeated else None
  out = {"ict": (ms_a - ms_res) / n_b, "realm": (ms_b - ms_res) / n_a, "residual": ms_res,
         "repeats": within, "mean": grand, "n_ict": n_a, "n_realm": n_b,
         "total": statistics.variance(mean.values())}
  out.update({f"{k}_clipped": max(0.0, out[k]) for k in ("ict", "realm")})
  return out
