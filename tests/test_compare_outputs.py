"""``experiments.compare_outputs``: equal outputs of two runs compare equal once times, the
output directories and the source trees are left out, and a changed number is a difference."""

import json

import numpy as np

from experiments import compare_outputs


def _write(out, tree, loss, seconds):
  (out / "run").mkdir(parents=True)
  np.save(out / "run" / "embeddings.npy", np.arange(6, dtype=np.float32).reshape(2, 3))
  (out / "run" / "summary.json").write_text(json.dumps(
      {"loss": loss, "seconds": seconds, "blocks_dir": str(out / "blocks"),
       "vocab_file": str(tree / "assets" / "vocab.txt")}))
  (out / "run" / "predictions.jsonl").write_text(
      json.dumps({"answer": "Paris", "file": str(out / "x")}) + "\n")


def test_equal_runs_compare_equal_and_a_changed_number_does_not(tmp_path, capsys):
  old_tree, new_tree = tmp_path / "old_src", tmp_path / "new_src"
  _write(tmp_path / "old", old_tree, 0.25, 10.0)
  _write(tmp_path / "new", new_tree, 0.25, 99.0)   # another time: not a difference
  assert compare_outputs.compare(tmp_path / "old", tmp_path / "new", old_tree, new_tree) == 0
  # Without the trees, the vocabulary's path differs.
  assert compare_outputs.compare(tmp_path / "old", tmp_path / "new") == 1
  assert "DIFFERENT\trun/summary.json" in capsys.readouterr().out
  _write(tmp_path / "changed", new_tree, 0.2500001, 10.0)
  assert compare_outputs.compare(tmp_path / "old", tmp_path / "changed", old_tree, new_tree) == 1
  array = np.load(tmp_path / "changed" / "run" / "embeddings.npy")
  array[1, 2] = np.nextafter(array[1, 2], np.float32(9))
  np.save(tmp_path / "changed" / "run" / "embeddings.npy", array)
  _write(tmp_path / "changed2", new_tree, 0.25, 10.0)
  np.save(tmp_path / "changed2" / "run" / "embeddings.npy", array)
  assert compare_outputs.compare(tmp_path / "old", tmp_path / "changed2", old_tree, new_tree) == 1
