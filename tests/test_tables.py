"""The table runner: its statistics against direct computations, its outputs, and a smallest run.

The smallest runs (Table 3 alone, every table) are in the slow tier; by default Table 3's
probabilities run through the same code on the demo's data with random-weight models.
"""

import csv
import json
import math
import os
import statistics

import pytest

from experiments import demo
from experiments import tables
from realm_tf import configs
from realm_tf import model_dir as model_dir_lib
from realm_tf.modeling.models import RealmPretrainer

import helpers


def test_mean_ci_is_student_t():
  values = [0.30, 0.36, 0.27]
  m, h = tables.mean_ci(values)
  assert m == pytest.approx(sum(values) / 3)
  assert h == pytest.approx(4.303 * statistics.stdev(values) / math.sqrt(3))
  assert math.isnan(tables.mean_ci([0.5])[1])
  assert tables.fmt(values) == f"{100 * m:.1f} +- {100 * h:.1f}"


def test_separated_needs_disjoint_intervals():
  assert tables.separated([0.50, 0.52, 0.51], [0.30, 0.31, 0.29]) == ">"
  assert tables.separated([0.30, 0.31, 0.29], [0.50, 0.52, 0.51]) == "<"
  # Means 0.05 apart but seed noise of the same size: not separated.
  assert tables.separated([0.40, 0.50, 0.45], [0.38, 0.45, 0.37]) == "not separated"


def test_write_table_markdown_and_csv(tmp_path):
  text = tables.write_table(str(tmp_path), "t", ["a", "b"], [["x", "1.0 +- 0.2"]], "note")
  assert text.splitlines()[:3] == ["| a | b |", "|---|---|", "| x | 1.0 +- 0.2 |"]
  with open(tmp_path / "t.csv") as f:
    assert list(csv.reader(f)) == [["a", "b"], ["x", "1.0 +- 0.2"]]


def _fake_runs(rng):
  """Three seeds of every row, Table 3 rows and validation curves, as main() collects them."""
  seeds = {}
  for seed in range(3):
    openqa = {label: dict(em=rng.uniform(0.2, 0.6), zero_shot_recall_at_5=rng.uniform(0.1, 0.5),
                          top_5_match=0.5, questions=1000) for label in tables.TABLE2_ROWS}
    table3 = [dict(sentence=f"s{i}", answer="a", bert_null=rng.uniform(0, 0.1),
                   realm_null=rng.uniform(0, 0.1), realm_gold=rng.uniform(0.5, 1),
                   realm_marginal=rng.uniform(0.1, 0.5)) for i in range(7)]
    curves = {name: {tag: [(step, rng.uniform()) for step in (0, 100, 200)]
                     for tag in ("recall@5", "qa_recall@5", "retrieval_utility")}
              for name in ("realm", "stale")}
    seeds[seed] = dict(openqa=openqa, table3=table3, curves=curves)
  return {"seeds": seeds}


def test_render_every_table_and_the_plot(tmp_path):
  import numpy as np  # pylint: disable=g-import-not-at-top
  if not tables.FLAGS.is_parsed():
    tables.FLAGS(["tables"])
  runs = _fake_runs(np.random.default_rng(0))
  text = tables.render(str(tmp_path), runs, ["1", "2", "3"], "setting line")
  em = [runs["seeds"][s]["openqa"]["REALM"]["em"] for s in range(3)]
  assert f"| REALM | {tables.fmt(em)} |" in text
  with open(tmp_path / "table2.csv") as f:
    rows = list(csv.reader(f))
  assert [r[0] for r in rows[1:]] == list(tables.TABLE2_ROWS)
  medians = [np.median([r["realm_gold"] for r in runs["seeds"][s]["table3"]]) for s in range(3)]
  assert f"{statistics.fmean(medians):.3g}" in (tmp_path / "table3.md").read_text()
  assert "REALM vs baseline (EM)" in (tmp_path / "table2.md").read_text()
  # Without the trainable-block-tower row (--trainable_row=false): the paper's seven rows.
  for seed in runs["seeds"].values():
    del seed["openqa"][tables.TRAINABLE_ROW]
  tables.render(str(tmp_path), runs, ["2"], "setting line")
  with open(tmp_path / "table2.csv") as f:
    assert [r[0] for r in list(csv.reader(f))[1:]] == list(tables.PAPER_TABLE2)[:7]
  assert (tmp_path / "staleness.png").read_bytes()[:4] == b"\x89PNG"


def _smallest_run(out, table, seeds):
  proc = helpers.run_process(
      "experiments.tables", f"--output_dir={out}", f"--table={table}",
      f"--seeds={seeds}", "--world_scale=0.3", "--reading_worlds=1", "--reading_steps=4",
      "--distractor_steps=3", "--ict_steps=4", "--realm_steps=6", "--refresh_every=3",
      "--validation_every=3", "--openqa_steps=3", "--qa_test_fraction=0.3",
      "--eval_fraction=0.3", timeout=1800)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  return json.loads((out / "runs.json").read_text())["seeds"]


def _random_model_dir(path, vocab):
  """A REALM model directory (model config, vocabulary, ckpt-1) of random weights in the
  demo's shapes (realm_pretrain_cpu with its __demo.yaml)."""
  params = configs.load_experiment(
      "realm_pretrain_cpu", [os.path.join(demo.CONFIG_DIR, "realm_pretrain_cpu__demo.yaml")],
      f"task.model.vocab_file={vocab},task.model.retriever.encoder.vocab_size="
      f"{demo.vocab_size(vocab)},task.model.reader.encoder.vocab_size={demo.vocab_size(vocab)}")
  model = RealmPretrainer.from_config_dataclass(params.task.model)
  for tower in (model.query_embedder, model.block_embedder, model.reader):
    tower.build_from_length()
  model_dir_lib.write_metadata(path, params.task.model, vocab)
  model_dir_lib.make_checkpoint(**model.checkpoint_items).save(os.path.join(path, "ckpt"))
  return path


def test_table3_probabilities_on_the_demo_data(demo_world, tmp_path):
  """test_table3_smallest_run's fast sibling: Table 3's probabilities (the same function) on the
  demo's data at the same world scale, from a REALM model and a "BERT" reader of random weights
  instead of trained ones (the training runs are test_realm_training's)."""
  data = dict(files=demo_world["files"], dirs=demo_world["prepared"]["dirs"])
  vocab = data["files"]["vocab"]
  rows = tables.table3_probabilities(data, _random_model_dir(str(tmp_path / "realm"), vocab),
                                     _random_model_dir(str(tmp_path / "bert"), vocab))
  assert rows and all(0 <= r[k] <= 1 for r in rows for k, _ in tables.TABLE3_COLUMNS)
  assert all(r["answer"] in r["sentence"] and r["answer"] in r["gold_block"] for r in rows)


@pytest.mark.slow
def test_table3_smallest_run(tmp_path):
  """Table 3 end to end at the smallest size: data, warm starts, REALM beside its refresher
  (validated during training: the plot's curves), the probabilities."""
  out = tmp_path / "tables"
  runs = _smallest_run(out, "3", 1)
  assert sorted(runs) == ["0"] and not runs["0"]["openqa"]
  rows = runs["0"]["table3"]
  assert rows and all(0 <= r[k] <= 1 for r in rows for k, _ in tables.TABLE3_COLUMNS)
  assert runs["0"]["curves"]["realm"]["recall@5"]
  assert (out / "table3.md").exists() and (out / "table3.csv").exists()


@pytest.mark.slow
def test_every_table_smallest_run(tmp_path):
  """All three tables at the smallest size, two seeds: every run, file and plot."""
  out = tmp_path / "tables"
  runs = _smallest_run(out, "1,2,3", 2)
  assert sorted(runs) == ["0", "1"]
  for seed in runs.values():
    assert set(seed["openqa"]) == set(tables.TABLE2_ROWS)
    for row in seed["openqa"].values():
      assert 0 <= row["em"] <= 1 and 0 <= row["zero_shot_recall_at_5"] <= 1
    assert seed["curves"]["stale"]["recall@5"]
  for name in ("table1", "table2", "table3"):
    assert "+-" in (out / f"{name}.md").read_text() or name == "table3"
    assert (out / f"{name}.csv").exists()
  assert (out / "staleness.png").exists()


def test_paper_scale_prints_the_recipe():
  """The table runner's smoke test as a process of its own."""
  proc = helpers.run_process("experiments.tables", "--scale=paper")
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "realm-convert" in proc.stdout and "33.3 / 36.4 / 30.1" in proc.stdout
