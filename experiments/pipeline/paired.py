"""Paired comparisons of per-question records over seeds: the statistics of every
pre-registered analysis (the tables' seeds, ``experiments/synthetic/tables.py``; REALM on real text,
``experiments/real_text/text_realm.py``). No flags, no TensorFlow.

A comparison pairs two rows' per-question 0/1 outcomes (a retriever's zero-shot hits, a
model's exact matches) on the same questions, seed by seed. Its intervals: Student t over the
per-seed mean differences, and a question-clustered bootstrap (each resampled question keeps
its values in every seed). The primary comparisons are judged together under Holm's
step-down procedure.
"""

import math
import statistics
from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np
from scipy import stats

# (label, outcome, row a, row b): a - b, in the paper's direction.
Comparison = Tuple[str, str, str, str]


def mean_ci(values: Sequence[float]):
  """``(mean, 95% half-width)`` over seeds (Student t); half-width nan for one value."""
  lo, hi = t_interval(values, 0.95)
  return statistics.fmean(float(v) for v in values), (hi - lo) / 2


def fmt(values: Sequence[float], scale: float = 100.0, digits: int = 1) -> str:
  m, h = mean_ci(values)
  if math.isnan(h):
    return f"{m * scale:.{digits}f}"
  return f"{m * scale:.{digits}f} +- {h * scale:.{digits}f}"


def paired_difference(hits_a: Sequence[str], hits_b: Sequence[str], resamples: int = 10000,
                      rng_seed: int = 0) -> Dict:
  """Per-question outcomes of row a minus row b on the same questions, paired (``hits_*[s]`` is
  seed s's per-question 0/1 string, the questions in one order in every seed).

  ``per_seed``: each seed's mean difference (a seed's rows share its warm starts); ``mean``;
  ``seeds_ci``: 95% Student t interval over seeds (n - 1 df; nan with one seed); ``questions_ci``:
  95% question-clustered bootstrap interval (``resamples`` resamples of the questions, each
  question keeping its values in every seed; percentiles); ``boot``: the resampled means;
  ``signs``: ``(seeds above 0, seeds below 0, seeds)``."""
  a = np.array([[c == "1" for c in h] for h in hits_a], dtype=np.float64)
  b = np.array([[c == "1" for c in h] for h in hits_b], dtype=np.float64)
  if a.shape != b.shape or a.ndim != 2:
    raise ValueError(f"per-question records of different shapes: {a.shape} and {b.shape} "
                     "(every seed must score the same questions)")
  per_seed = (a.mean(axis=1) - b.mean(axis=1)).tolist()
  per_question = (a - b).mean(axis=0)
  rng = np.random.default_rng(rng_seed)
  idx = rng.integers(0, per_question.size, size=(resamples, per_question.size))
  boot = per_question[idx].mean(axis=1)
  mean, half = mean_ci(per_seed)
  return dict(per_seed=per_seed, mean=mean, seeds_ci=(mean - half, mean + half),
              questions_ci=(float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))),
              boot=boot, signs=(sum(d > 0 for d in per_seed), sum(d < 0 for d in per_seed),
                                len(per_seed)))


def t_interval(values: Sequence[float], level: float):
  """The ``level`` Student t interval (n - 1 df) of the mean of ``values``; nans for one."""
  values = [float(v) for v in values]
  m = statistics.fmean(values)
  if len(values) < 2:
    return (float("nan"), float("nan"))
  half = stats.t.ppf(0.5 + level / 2, len(values) - 1) * statistics.stdev(values) / math.sqrt(
      len(values))
  return (m - half, m + half)


def p_values(d: Dict) -> Dict[str, float]:
  """Two-sided p-values of a :func:`paired_difference`: ``seeds`` (one-sample t over the
  per-seed differences; 1 with one seed) and ``questions`` (the bootstrap's: twice the smaller
  share of resampled means on either side of 0)."""
  x = np.asarray(d["per_seed"])
  if x.size < 2:
    p_seeds = 1.0
  elif x.std(ddof=1) == 0:
    p_seeds = 0.0 if x.mean() != 0 else 1.0
  else:
    p_seeds = float(2 * stats.t.sf(abs(x.mean()) / (x.std(ddof=1) / math.sqrt(x.size)),
                                   x.size - 1))
  boot = d["boot"]
  p_questions = float(min(1.0, 2 * min((boot <= 0).mean(), (boot >= 0).mean())))
  return {"seeds": p_seeds, "questions": p_questions}


def holm(p: Sequence[float], alpha: float = 0.05) -> List[Dict]:
  """Holm's step-down procedure over ``p``: for each, in the given order, ``rank`` (0 for the
  smallest p), ``level`` (the confidence level its intervals are judged at, 1 - alpha / (m -
  rank)) and ``rejected``."""
  m = len(p)
  order = sorted(range(m), key=lambda i: p[i])
  out = [None] * m
  going = True
  for rank, i in enumerate(order):
    threshold = alpha / (m - rank)
    going = going and p[i] <= threshold
    out[i] = dict(rank=rank, level=1 - threshold, rejected=going)
  return out


def comparison(runs: Sequence[Dict], outcome: str, a: str, b: str,
               outcome_of: Callable[[Dict, str, str], str]) -> Dict:
  """:func:`paired_difference` of rows ``a`` and ``b`` (``outcome_of(run, outcome, row)``: a
  row's per-question 0/1 string in one run, None where the run lacks the row) with its ``p``
  values, over the runs that have both rows."""
  pairs = [(outcome_of(r, outcome, a), outcome_of(r, outcome, b)) for r in runs]
  pairs = [p for p in pairs if None not in p]
  if not pairs:
    raise ValueError(f"no run has both {a!r} and {b!r} for {outcome!r}")
  d = paired_difference(*zip(*pairs))
  d["p"] = p_values(d)
  return d


def measured(runs: Sequence[Dict], outcome: str, a: str, b: str,
             outcome_of: Callable[[Dict, str, str], str], label: str) -> Dict:
  """:func:`comparison` with its ``label``; where no run has both rows, only ``label``, an
  empty ``p`` and the verdict "not measured"."""
  if not any(None not in (outcome_of(r, outcome, a), outcome_of(r, outcome, b)) for r in runs):
    return {"label": label, "p": {}, "verdict": f"not measured: no run has both {a} and {b}"}
  return dict(comparison(runs, outcome, a, b, outcome_of), label=label)


def _interval(lo_hi) -> str:
  lo, hi = lo_hi
  return "none (one seed)" if math.isnan(lo) else f"[{100 * lo:+.1f}, {100 * hi:+.1f}]"


def analysis(runs: Sequence[Dict], primary: Sequence[Comparison],
             secondary: Sequence[Comparison],
             outcome_of: Callable[[Dict, str, str], str]) -> Dict[str, List]:
  """The pre-registered analysis: ``{"primary": [...], "secondary": [...]}``, each a dict with
  ``label``, the :func:`paired_difference` numbers, ``p`` and, for the primary ones, ``holm``,
  the intervals at Holm's level (``seeds_adjusted``, ``questions_adjusted``) and ``verdict``:
  "holds" when both adjusted intervals exclude 0 in the paper's direction (above), else "not
  established". ``primary``/``secondary``: ``(label, outcome, row a, row b)``, each in the
  paper's direction; ``outcome_of(run, outcome, row)``: a row's per-question 0/1 string. A
  comparison that no run measures is reported "not measured" (:func:`measured`) and, among the
  primary ones, counts in Holm's family with p = 1."""
  out = {"primary": [], "secondary": []}
  for label, outcome, a, b in primary:
    out["primary"].append(measured(runs, outcome, a, b, outcome_of, label))
  # A comparison that no run measures stays in Holm's family, as p = 1: it is not rejected, and
  # the others are judged at the levels the pre-registered family gives them.
  adjusted = holm([max(c["p"].values()) if c["p"] else 1.0 for c in out["primary"]])
  for c, h in zip(out["primary"], adjusted):
    if not c["p"]:
      continue
    tail = 100 * (1 - h["level"]) / 2
    c["holm"] = h
    c["seeds_adjusted"] = t_interval(c["per_seed"], h["level"])
    c["questions_adjusted"] = (float(np.percentile(c["boot"], tail)),
                               float(np.percentile(c["boot"], 100 - tail)))
    holds = (h["rejected"] and c["seeds_adjusted"][0] > 0 and c["questions_adjusted"][0] > 0)
    c["verdict"] = "holds" if holds else "not established"
  for label, outcome, a, b in secondary:
    c = measured(runs, outcome, a, b, outcome_of, label)
    if not c["p"]:
      out["secondary"].append(c)
      continue
    excludes = all(lo > 0 or hi < 0 for lo, hi in (c["seeds_ci"], c["questions_ci"]))
    c["verdict"] = ("both 95% intervals exclude 0" if excludes
                    else "not established (an interval includes 0)")
    out["secondary"].append(c)
  return out


def analysis_line(c: Dict) -> str:
  """One comparison as a Markdown list line: the number, both intervals, the signs and the
  verdict."""
  if not c["p"]:
    return f"- {c['label']}: **{c['verdict']}**"
  up, down, n = c["signs"]
  line = (f"- {c['label']}: {100 * c['mean']:+.1f} points; 95% over seeds "
          f"{_interval(c['seeds_ci'])}, over questions (clustered bootstrap) "
          f"{_interval(c['questions_ci'])}; {up} of {n} seeds above 0, {down} below")
  if "holm" in c:
    level = 100 * c["holm"]["level"]
    line += (f"; Holm level {level:.2f}%: over seeds {_interval(c['seeds_adjusted'])}, over "
             f"questions {_interval(c['questions_adjusted'])}")
  return line + f" -> **{c['verdict']}**"
