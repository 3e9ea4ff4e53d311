"""What every experiment driver and stage shares, below them all: one way to say a line, time
stages, skip finished ones, keep small JSON summaries, and put an interval on a proportion.

Nothing here imports TensorFlow or another module of ``experiments``.
"""

import contextlib
import dataclasses
import json
import os
import time
from typing import Any, Callable, Dict, Sequence, Tuple

import numpy as np


class Clock:
  """Says timestamped lines under a prefix and times named stages. ``progress_seconds``: how
  often a long stage run under this clock prints a progress line (0: never)."""

  def __init__(self, prefix: str, progress_seconds: float = 30):
    self.prefix, self.progress_seconds = prefix, progress_seconds
    self.start, self.laps = time.time(), {}

  def say(self, message: str) -> None:
    print(f"[{self.prefix} {time.strftime('%H:%M:%S')}] {message}", flush=True)

  @contextlib.contextmanager
  def stage(self, name: str):
    """Times the block as stage ``name`` (minutes in ``laps``), saying when it is done."""
    t = time.time()
    yield
    self.laps[name] = round((time.time() - t) / 60, 2)
    self.say(f"{name} done in {self.laps[name]:.1f} min")

  def once(self, name: str, done_file: str, fn: Callable[[], Dict]) -> Dict:
    """Runs ``fn`` unless ``done_file`` exists, keeping its summary there (``seconds``
    included); says one line: what it made and the time it took, or that it was skipped."""
    if os.path.exists(done_file):
      summary = read_json(done_file)
      self.say(f"{name}: skipped, {done_file} exists ({summary.get('seconds', 0.0):.1f} s "
               "when made)")
      return summary
    self.say(f"{name}: running")
    start = time.time()
    summary = dict(fn())
    summary["seconds"] = round(time.time() - start, 1)
    os.makedirs(os.path.dirname(done_file), exist_ok=True)
    write_json(done_file, summary)
    shown = {k: v for k, v in summary.items() if not isinstance(v, (list, dict))}
    self.say(f"{name}: done in {summary['seconds']:.1f} s {shown}")
    return summary

  def minutes(self) -> float:
    return (time.time() - self.start) / 60

  def summary(self) -> str:
    """Each stage's minutes and the total, one line."""
    parts = ", ".join(f"{name} {m:.1f}" for name, m in self.laps.items())
    return f"finished in {self.minutes():.1f} min ({parts})"


def read_json(path: str) -> Any:
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def write_json(path: str, obj: Any, **dump_args) -> None:
  """``obj`` as JSON in ``path``, atomically (a reader never sees half a file); ``dump_args``:
  ``json.dump``'s, default ``indent=2, sort_keys=True``."""
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(obj, f, **(dump_args or dict(indent=2, sort_keys=True)))
  os.replace(tmp, path)


def wilson_interval(successes: int, n: int, z: float = 1.959964) -> Tuple[float, float]:
  """The 95% Wilson score interval of a binomial proportion ``successes / n`` (over
  questions): it always holds the point estimate and stays inside [0, 1]."""
  if n <= 0:
    raise ValueError("an interval over no question")
  p = successes / n
  denominator = 1 + z * z / n
  centre = (p + z * z / (2 * n)) / denominator
  half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
  return float(max(0.0, centre - half)), float(min(1.0, centre + half))


def proportion(flags_: Sequence[bool]) -> Dict[str, float]:
  """``{"value", "lo", "hi"}``: the share of true and its 95% Wilson interval."""
  n, k = len(flags_), int(np.sum(flags_))
  lo, hi = wilson_interval(k, n)
  return {"value": k / n, "lo": lo, "hi": hi}


def interval_text(value: float, lo: float, hi: float) -> str:
  return f"{value:.3f} [{lo:.3f}, {hi:.3f}]"


def flag_field(default: Any, help_text: str) -> Any:
  """A dataclass field that a driver makes a flag of: its help lives here, once, with the
  field (``metadata["help"]``), and the driver's flag reads it from there."""
  return dataclasses.field(default=default, metadata={"help": help_text})
