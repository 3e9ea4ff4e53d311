r"""Two output directories of the same experiment, compared number for number.

  python -m experiments.compare_outputs OLD_DIR NEW_DIR

For a refactor that must change no number (experiments/NOTES.md section 29): every ``.npy``
array must be equal bit for bit, every ``.json`` summary and ``.csv`` table equal once times
(keys and columns naming seconds or a time) are left out and each directory's own path is
replaced by a placeholder, and every ``.jsonl`` (predictions, question files) equal byte for byte.
Checkpoints, logs and TensorBoard events are not compared (they hold times); the arrays and
predictions made from them are. A file of one directory missing from the other counts as a
difference, except under ``block_store/`` (named by a hash over the corpus manifest, whose input
paths name the output directory). Prints each compared file and the count of differences; exit
status 1 when there is one.
"""

import csv
import glob
import json
import os

from absl import app
import numpy as np

SKIPPED = (".log", ".index", ".data-00000-of-00001", ".bin", ".tmp")


def _timeless(value, root: str):
  """``value`` without times, and with ``root`` (an output directory) as ``<OUT>``."""
  if isinstance(value, dict):
    return {k: _timeless(v, root) for k, v in value.items()
            if "second" not in k and "time" not in k}
  if isinstance(value, list):
    return [_timeless(v, root) for v in value]
  return value.replace(root, "<OUT>") if isinstance(value, str) else value


def same(old_path: str, new_path: str, old: str, new: str) -> bool:
  if old_path.endswith(".npy"):
    a, b = np.load(old_path), np.load(new_path)
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b)
  if old_path.endswith(".json"):
    with open(old_path) as f, open(new_path) as g:
      return _timeless(json.load(f), old) == _timeless(json.load(g), new)
  if old_path.endswith(".csv"):
    with open(old_path) as f, open(new_path) as g:
      return ([_timeless(r, old) for r in csv.DictReader(f)]
              == [_timeless(r, new) for r in csv.DictReader(g)])
  with open(old_path, "rb") as f, open(new_path, "rb") as g:
    return f.read().replace(old.encode(), b"") == g.read().replace(new.encode(), b"")


def compare(old: str, new: str) -> int:
  """Prints a line per compared file; returns the number of differences."""
  old, new = os.path.abspath(old), os.path.abspath(new)
  differences = 0
  for old_path in sorted(glob.glob(os.path.join(old, "**", "*"), recursive=True)):
    rel = os.path.relpath(old_path, old)
    if (os.path.isdir(old_path) or "events.out" in rel or "block_store" in rel
        or rel.endswith(SKIPPED) or not rel.endswith((".npy", ".json", ".csv", ".jsonl"))):
      continue
    new_path = os.path.join(new, rel)
    ok = os.path.exists(new_path) and same(old_path, new_path, old, new)
    print(f"{'same' if ok else 'DIFFERENT'}\t{rel}")
    differences += not ok
  print(f"{differences} differences")
  return differences


def main(argv):
  """``argv``: the program, OLD_DIR and NEW_DIR (absl leaves the positional arguments)."""
  if len(argv) != 3:
    return __doc__
  return 1 if compare(argv[1], argv[2]) else 0


if __name__ == "__main__":
  app.run(main)
