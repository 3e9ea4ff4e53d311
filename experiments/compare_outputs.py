r"""Two output directories of the same experiment, compared number for number.

  python -m experiments.compare_outputs OLD_DIR NEW_DIR [--old_tree=A --new_tree=B]

For a refactor that must change no number (experiments/NOTES.md section 29): every ``.npy``
array must be equal bit for bit, every ``.json`` summary and ``.csv`` table equal once times
(keys and columns naming seconds or a time) are left out and each directory's own path is
replaced by a placeholder (so is the source tree that ran each side, ``--old_tree`` and
``--new_tree``, whose assets' paths the summaries record), and every ``.jsonl`` (predictions,
question files) equal byte for byte.
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
import re
from typing import Optional, Sequence, Tuple

from absl import app
from absl import flags
import numpy as np

flags.DEFINE_string("old_tree", None, "The source tree that wrote OLD_DIR (its paths match).")
flags.DEFINE_string("new_tree", None, "The source tree that wrote NEW_DIR.")

FLAGS = flags.FLAGS
SKIPPED = (".log", ".index", ".data-00000-of-00001", ".bin", ".tmp")
# (path, placeholder) pairs, the output directory first (a tree may hold it).
Roots = Sequence[Tuple[str, str]]


def _placed(text: str, roots: Roots) -> str:
  """``text`` with each root's path, where it ends a name (``/out``, not ``/out_src``), as its
  placeholder."""
  for path, placeholder in roots:
    text = re.sub(re.escape(path) + r"(?![\w.-])", placeholder, text)
  return text


def _timeless(value, roots: Roots):
  """``value`` without times, and with each root's path as its placeholder."""
  if isinstance(value, dict):
    return {k: _timeless(v, roots) for k, v in value.items()
            if "second" not in k and "time" not in k}
  if isinstance(value, list):
    return [_timeless(v, roots) for v in value]
  return _placed(value, roots) if isinstance(value, str) else value


def same(old_path: str, new_path: str, old: Roots, new: Roots) -> bool:
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
    return _placed(f.read().decode("utf-8", "surrogateescape"), old) == _placed(
        g.read().decode("utf-8", "surrogateescape"), new)


def compare(old: str, new: str, old_tree: Optional[str] = None,
            new_tree: Optional[str] = None) -> int:
  """Prints a line per compared file; returns the number of differences."""
  old, new = os.path.abspath(old), os.path.abspath(new)
  old_roots = [(old, "<OUT>")] + ([(os.path.abspath(old_tree), "<TREE>")] if old_tree else [])
  new_roots = [(new, "<OUT>")] + ([(os.path.abspath(new_tree), "<TREE>")] if new_tree else [])
  differences = 0
  for old_path in sorted(glob.glob(os.path.join(old, "**", "*"), recursive=True)):
    rel = os.path.relpath(old_path, old)
    if (os.path.isdir(old_path) or "events.out" in rel or "block_store" in rel
        or rel.endswith(SKIPPED) or not rel.endswith((".npy", ".json", ".csv", ".jsonl"))):
      continue
    new_path = os.path.join(new, rel)
    ok = os.path.exists(new_path) and same(old_path, new_path, old_roots, new_roots)
    print(f"{'same' if ok else 'DIFFERENT'}\t{rel}")
    differences += not ok
  print(f"{differences} differences")
  return differences


def main(argv):
  """``argv``: the program, OLD_DIR and NEW_DIR (absl leaves the positional arguments)."""
  if len(argv) != 3:
    return __doc__
  return 1 if compare(argv[1], argv[2], FLAGS.old_tree, FLAGS.new_tree) else 0


if __name__ == "__main__":
  app.run(main)
