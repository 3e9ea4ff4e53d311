"""The table runner: its statistics against direct computations, the seed files and their
fingerprints, the rendering, and a smallest seed.

The smallest seed is in the slow tier; by default Table 3's probabilities run through the same
code on the demo's data with random-weight models.
"""

import csv
import json
import math
import os
import statistics

import pytest

from experiments.pipeline import recipe_flags
from experiments.pipeline import stages
from experiments.synthetic import report
from experiments.synthetic import table_seed
from experiments.synthetic import tables
from realm_tf import model_dir as model_dir_lib
from realm_tf.modeling.models import RealmPretrainer

import helpers


def test_mean_ci_is_student_t():
  values = [0.30, 0.36, 0.27]
  m, h = report.mean_ci(values)
  assert m == pytest.approx(sum(values) / 3)
  assert h == pytest.approx(4.303 * statistics.stdev(values) / math.sqrt(3), rel=1e-4)
  assert math.isnan(report.mean_ci([0.5])[1])
  assert report.fmt(values) == f"{100 * m:.1f} +- {100 * h:.1f}"


def test_paired_difference_against_numpy():
  import numpy as np  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(3)
  a, b = rng.random((3, 50)) < 0.6, rng.random((3, 50)) < 0.5
  as_str = lambda m: ["".join("1" if x else "0" for x in row) for row in m]
  d = report.paired_difference(as_str(a), as_str(b), resamples=2000)
  per_seed = a.mean(axis=1) - b.mean(axis=1)
  np.testing.assert_allclose(d["per_seed"], per_seed)
  half = 4.303 * per_seed.std(ddof=1) / math.sqrt(3)  # t_{0.975, 2} to 3 decimals
  np.testing.assert_allclose(d["seeds_ci"], (per_seed.mean() - half, per_seed.mean() + half),
                             atol=1e-4)
  lo, hi = d["questions_ci"]
  assert lo < per_seed.mean() < hi and hi - lo < 0.5
  # Every question found by a and none by b: no uncertainty left over the questions.
  d = report.paired_difference(["11", "11"], ["00", "00"], resamples=100)
  assert d["questions_ci"] == (1.0, 1.0) and d["seeds_ci"] == (1.0, 1.0)
  with pytest.raises(ValueError, match="same questions"):
    report.paired_difference(["101"], ["10"])


def test_write_table_markdown_and_csv(tmp_path):
  text = report.write_table(str(tmp_path), "t", ["a", "b"], [["x", "1.0 +- 0.2"]], "note")
  assert text.splitlines()[:3] == ["| a | b |", "|---|---|", "| x | 1.0 +- 0.2 |"]
  with open(tmp_path / "t.csv") as f:
    assert list(csv.reader(f)) == [["a", "b"], ["x", "1.0 +- 0.2"]]


def _bits(rng, p, n=200):
  return "".join("1" if x else "0" for x in rng.random(n) < p)


def _fake_seed(rng, seed, fingerprints=("c0de", "c0f1"), **settings):
  """A seed file as table_seed.run_seed writes it, with random per-question records and the
  summaries they give."""
  zero_shot = {}
  for r, _ in report.ROWS.values():
    hits = _bits(rng, rng.uniform(0.1, 0.5))
    zero_shot[r] = dict(overall=hits.count("1") / 200, covered=rng.uniform(),
                        never_covered=rng.uniform(), covered_questions=90,
                        never_covered_questions=110, questions=200, hits=hits)
  openqa = {}
  for label, (retriever, _) in report.ROWS.items():
    em = _bits(rng, rng.uniform(0.2, 0.6))
    openqa[label] = dict(em=em.count("1") / 200, em_by_question=em,
                         predictions=["x"] * 200,
                         zero_shot_recall_at_5=zero_shot[retriever]["overall"],
                         top_5_match=0.5, questions=200)
  examples = [dict(sentence=f"s{i}", answer="a", bert_null=0.01, realm_null=0.02,
                   realm_gold=0.7, realm_marginal=0.3) for i in range(3)]
  medians = {k: rng.uniform() for k, _ in table_seed.TABLE3_COLUMNS}
  curves = {name: {tag: [[step, rng.uniform()] for step in (0, 100, 200)]
                   for tag in ("recall@5", "qa_recall@5", "retrieval_utility")}
            for name in table_seed.PLOTTED}
  base = dict(world_seed=0, world_scale=1.0, ict_steps=400, realm_steps=1000,
              realm_learning_rate=3e-5, lr_retriever=1.0, openqa_steps=600, refresh_every=25,
              staleness=30)
  return dict(seed=seed, fingerprints=dict(zip(("code", "config"), fingerprints)),
              settings=dict(base, **settings), git_commit=f"{seed}" * 40, minutes=70.0,
              world=dict(num_blocks=388, test_questions=200, held_out_sentences=230,
                         news_sentences=300),
              openqa=openqa, zero_shot=zero_shot,
              test_questions=[f"Where was Nyny Ost{i} born?" if i < 100 else
                              f"Who wrote The Book{i}?" for i in range(200)],
              table3=dict(examples=examples, count=3, medians=medians), curves=curves)


def _write_seeds(directory, seeds):
  directory.mkdir(parents=True, exist_ok=True)
  for s in seeds:
    (directory / f"seed{s['seed']}.json").write_text(json.dumps(s))


def test_render_every_table_and_the_plot_from_seed_files(tmp_path):
  import numpy as np  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  seeds = [_fake_seed(rng, s) for s in range(3)]
  _write_seeds(tmp_path / "results", seeds)
  loaded = report.load_seeds(str(tmp_path / "results"))
  assert list(loaded) == [0, 1, 2]
  text = report.render(str(tmp_path), loaded, ["1", "2", "3"], "experiments/results/set")
  assert "Seed files experiments/results/set: 3 seed(s) (0, 1, 2); synthetic world" in text
  assert "; ICT 400 steps; REALM 1000 steps" in text
  em = [s["openqa"]["REALM"]["em"] for s in seeds]
  assert f"| REALM | {report.fmt(em)} |" in text
  news = [s["openqa"][report.NEWS_ROW]["em"] for s in seeds]
  assert f"| REALM, X = news, Z = the encyclopedia | {report.fmt(news)} |" in text
  with open(tmp_path / "table2.csv") as f:
    assert [r[0] for r in list(csv.reader(f))[1:]] == list(report.ROWS)
  covered = [s["zero_shot"]["realm"]["covered"] for s in seeds]
  assert f"| REALM | " in (tmp_path / "table2.md").read_text()
  assert report.fmt(covered) in (tmp_path / "table2.md").read_text()
  medians = [s["table3"]["medians"]["realm_gold"] for s in seeds]
  assert f"{statistics.fmean(medians):.3g}" in (tmp_path / "table3.md").read_text()
  d = report.paired_difference([s["zero_shot"]["realm"]["hits"] for s in seeds],
                               [s["zero_shot"]["ict"]["hits"] for s in seeds])
  table2 = (tmp_path / "table2.md").read_text()
  assert f"- (a) REALM - ICT, zero-shot recall@5: {100 * d['mean']:+.1f} points" in table2
  for label, *_ in report.PRIMARY + report.SECONDARY:
    assert f"- {label}: " in table2
  assert "disjoint" not in table2
  assert "3 seed(s) (0, 1, 2)" in (tmp_path / "table1.md").read_text()
  assert (tmp_path / "staleness.png").read_bytes()[:4] == b"\x89PNG"


def test_the_committed_tables_render_from_the_committed_seed_files(tmp_path):
  """`--render` over experiments/results/tables/ gives the committed Tables 1-3 exactly, at one
  code fingerprint for every seed file."""
  seeds = report.load_seeds(os.path.join(tables.RESULTS, "tables"))
  assert seeds and len({s["fingerprints"]["code"] for s in seeds.values()}) == 1
  report.render(str(tmp_path), seeds, ["1", "2", "3"], "experiments/results/tables")
  for name in ("table1.md", "table1.csv", "table2.md", "table2.csv", "table3.md", "table3.csv"):
    with open(os.path.join(tables.RESULTS, "synthetic", name)) as f:
      assert (tmp_path / name).read_text() == f.read(), name


def test_render_refuses_to_mix_fingerprints(tmp_path):
  import numpy as np  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(1)
  _write_seeds(tmp_path / "a", [_fake_seed(rng, 0), _fake_seed(rng, 1),
                                _fake_seed(rng, 2, ("c0de", "other"), realm_steps=500)])
  with pytest.raises(report.MixedSeedsError,
                     match=r"seed 2's config fingerprint other differs from seed 0's c0f1 "
                           r"\(settings: realm_steps\)"):
    report.load_seeds(str(tmp_path / "a"))
  _write_seeds(tmp_path / "b", [_fake_seed(rng, 0), _fake_seed(rng, 4, ("beef", "c0f1"))])
  with pytest.raises(report.MixedSeedsError, match=r"seed 4's code fingerprint beef differs.*"
                                                  r"commits 0000000000 and 4444444444"):
    report.load_seeds(str(tmp_path / "b"))
  with pytest.raises(FileNotFoundError, match="no seed"):
    report.load_seeds(str(tmp_path / "empty"))


def test_fingerprints_follow_the_code_and_the_settings(tmp_path):
  """The code fingerprint changes with a file of CODE_FILES, not with serving code; the config
  fingerprint with any setting."""
  for rel in ("data_prep/a.py", "realm_tf/tasks/t.py", "realm_tf/serving/app.py"):
    (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / rel).write_text("x = 1\n")
  before = table_seed.code_fingerprint(str(tmp_path))
  (tmp_path / "realm_tf/serving/app.py").write_text("x = 2\n")
  assert table_seed.code_fingerprint(str(tmp_path)) == before
  (tmp_path / "realm_tf/tasks/t.py").write_text("x = 2\n")
  assert table_seed.code_fingerprint(str(tmp_path)) != before
  config = table_seed.settings(stages.Recipe(), table_seed.TableSettings())
  assert config["realm_steps"] == 1000 and "yaml:ict_cpu__demo.yaml" in config
  other = table_seed.settings(stages.Recipe(), table_seed.TableSettings(lr_retriever=0.5))
  assert table_seed.config_fingerprint(other) != table_seed.config_fingerprint(config)
  assert table_seed.config_fingerprint(dict(config)) == table_seed.config_fingerprint(config)
  # The six committed seeds 0-5 ran the default recipe and table settings but for ICT's 400
  # steps (2,400 since NOTES 42), before ict_from_reader was a setting (the same fingerprint
  # without it).
  older = dict({k: v for k, v in config.items() if k != "ict_from_reader"}, ict_steps=400)
  with open(os.path.join(tables.RESULTS, "tables", "seed0.json")) as f:
    assert table_seed.config_fingerprint(older) == json.load(f)["fingerprints"]["config"]


def test_the_flags_give_the_default_recipe_and_table_settings():
  """Each flag of experiments/pipeline/recipe_flags.py and of experiments.synthetic.tables defaults
  to its field's default, so a seed run with no flag is the default recipe's."""
  if not tables.FLAGS.is_parsed():
    tables.FLAGS(["tables"])
  assert recipe_flags.recipe(tables.FLAGS) == stages.Recipe()
  assert tables.table_settings(tables.FLAGS) == table_seed.TableSettings()


def test_split_by_coverage_against_a_direct_count(tmp_path):
  coverage = tmp_path / "news_coverage.json"
  coverage.write_text(json.dumps({"covered": ["A", "C"]}))
  data = dict(files=dict(news_coverage=str(coverage)),
              test_subjects={"q1": "A", "q2": "B", "q3": "C", "q4": "B", "q5": "A"})
  out = table_seed.split_by_coverage([True, False, False, True, True], data)
  assert out["overall"] == pytest.approx(3 / 5)
  assert out["covered"] == pytest.approx(2 / 3) and out["covered_questions"] == 3
  assert out["never_covered"] == pytest.approx(1 / 2) and out["never_covered_questions"] == 2


def _random_model_dir(path, vocab):
  """A REALM model directory (model config, vocabulary, ckpt-1) of random weights in the
  demo's shapes (realm_pretrain_cpu with its __demo.yaml)."""
  params = stages.experiment_params("realm_pretrain_cpu", [stages.config("realm_pretrain_cpu")],
                                    stages.towers(vocab))
  model = RealmPretrainer.from_config_dataclass(params.task.model)
  for tower in (model.query_embedder, model.block_embedder, model.reader):
    tower.build_from_length()
  model_dir_lib.write_metadata(path, params.task.model, vocab)
  model_dir_lib.make_checkpoint(**model.checkpoint_items).save(os.path.join(path, "ckpt"))
  return path


def test_table3_probabilities_on_the_demo_data(demo_world, tmp_path):
  """test_one_seed_smallest_run's fast sibling: Table 3's probabilities (the same function) on the
  demo's data at the same world scale, from a REALM model and a "BERT" reader of random weights
  instead of trained ones (the training runs are test_realm_training's)."""
  data = dict(files=demo_world["files"], dirs=demo_world["prepared"]["dirs"])
  vocab = data["files"]["vocab"]
  rows = table_seed.table3_probabilities(data, _random_model_dir(str(tmp_path / "realm"), vocab),
                                     _random_model_dir(str(tmp_path / "bert"), vocab))
  assert rows and all(0 <= r[k] <= 1 for r in rows for k, _ in table_seed.TABLE3_COLUMNS)
  assert all(r["answer"] in r["sentence"] and r["answer"] in r["gold_block"] for r in rows)


@pytest.mark.slow
def test_one_seed_smallest_run_and_render(tmp_path):
  """One seed end to end at the smallest size (every run, the seed file), then rendered."""
  results = tmp_path / "results"
  proc = helpers.run_process(
      "experiments.synthetic.tables", f"--output_dir={tmp_path / 'out'}", "--seed=0",
      f"--results_dir={results}", "--world_scale=0.3", "--reading_worlds=1",
      "--reading_steps=4", "--distractor_steps=3", "--ict_steps=4", "--realm_steps=6",
      "--refresh_every=3", "--validation_every=3", "--openqa_steps=3",
      "--qa_test_fraction=0.3", timeout=1800)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  seed = json.loads((results / "seed0.json").read_text())
  assert set(seed["openqa"]) == set(report.ROWS)
  for row in seed["openqa"].values():
    assert 0 <= row["em"] <= 1 and 0 <= row["zero_shot_recall_at_5"] <= 1
  for z in seed["zero_shot"].values():
    assert len(z["hits"]) == z["questions"] == seed["world"]["test_questions"]
    assert z["covered_questions"] + z["never_covered_questions"] == z["questions"]
    assert z["overall"] == pytest.approx(z["hits"].count("1") / z["questions"])
  assert seed["curves"]["news"]["qa_recall@5"] and seed["curves"]["stale"]["recall@5"]
  # Per-question records: every row's cells come back from them; every run's index ages.
  report.record_cells(seed)
  for row in seed["openqa"].values():
    assert len(row["em_by_question"]) == len(row["predictions"]) == len(seed["test_questions"])
  assert set(seed["index_ages"]) == set(table_seed.PRETRAIN_RUNS)
  for ages in seed["index_ages"].values():
    assert ages["by_interval"] and 0 <= ages["mean"] <= ages["max"]
  assert seed["news_check"]["x"]["per_fact"] >= seed["news_check"]["x_is_z"]["per_fact"]
  assert seed["fingerprints"]["code"] == table_seed.code_fingerprint()
  proc = helpers.run_process("experiments.synthetic.tables", "--render", f"--results_dir={results}",
                             f"--render_dir={tmp_path}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  for name in ("table1", "table2", "table3"):
    assert (tmp_path / f"{name}.md").exists() and (tmp_path / f"{name}.csv").exists()
  assert (tmp_path / "staleness.png").exists()


def test_paper_scale_prints_the_recipe():
  """The table runner's smoke test as a process of its own."""
  proc = helpers.run_process("experiments.synthetic.tables", "--scale=paper")
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "realm-convert" in proc.stdout and "33.3 / 36.4 / 30.1" in proc.stdout


def test_cells_are_recomputed_from_per_question_records():
  import numpy as np  # pylint: disable=g-import-not-at-top
  seed = _fake_seed(np.random.default_rng(5), 0)
  cells = report.record_cells(seed)
  for label in report.ROWS:
    assert cells[label]["em"] == pytest.approx(seed["openqa"][label]["em"])
    assert cells[label]["zero_shot_recall_at_5"] == pytest.approx(
        seed["openqa"][label]["zero_shot_recall_at_5"])
  seed["openqa"]["REALM"]["em"] += 0.01
  with pytest.raises(ValueError, match="seed 0 row 'REALM': EM of its 200 per-question"):
    report.record_cells(seed)
  seed = _fake_seed(np.random.default_rng(5), 0)
  seed["zero_shot"]["ict"]["hits"] = seed["zero_shot"]["ict"]["hits"][:-1]
  with pytest.raises(ValueError, match="zero-shot recall@5 of its 199"):
    report.record_cells(seed)


def test_holm_step_down_against_the_rule():
  # Thresholds 0.05/4, 0.05/3, 0.05/2, 0.05 in order of p: the second smallest (0.02 > 0.0167)
  # stops the procedure, so only the smallest is rejected.
  out = report.holm([0.3, 0.001, 0.04, 0.02])
  assert [o["rejected"] for o in out] == [False, True, False, False]
  assert [o["rank"] for o in out] == [3, 0, 2, 1]
  assert [round(o["level"], 5) for o in out] == [0.95, 0.9875, 0.975, round(1 - 0.05 / 3, 5)]
  assert [o["rejected"] for o in report.holm([0.01, 0.012, 0.02, 0.049])] == [True] * 4


def test_t_interval_and_p_values_against_scipy():
  from scipy import stats  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  x = [0.04, 0.07, 0.01, 0.05, -0.01, 0.03]
  lo, hi = report.t_interval(x, 0.95)
  ref = stats.t.interval(0.95, 5, loc=np.mean(x), scale=stats.sem(x))
  assert (lo, hi) == pytest.approx(ref)
  d = dict(per_seed=x, boot=np.array([-0.01] * 30 + [0.02] * 970))
  p = report.p_values(d)
  assert p["seeds"] == pytest.approx(stats.ttest_1samp(x, 0).pvalue)
  assert p["questions"] == pytest.approx(0.06)
  assert report.p_values(dict(per_seed=[0.1], boot=np.zeros(10)))["seeds"] == 1.0


def test_analysis_on_constructed_seeds_with_known_answers():
  """(a): REALM finds 30 more of 200 questions than ICT in every seed -> holds, +15 points
  with both intervals at that value. (b): the same per-question EM in both rows -> 0 and not
  established. (c): news REALM above ICT in three seeds and below in three by the same amount
  -> mean 0, signs 3/3, not established."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(7)
  seeds = []
  for s in range(6):
    seed = _fake_seed(rng, s)
    ict = "0" * 30 + "1" * 20 + _bits(rng, 0.4, 150)
    seed["zero_shot"]["ict"]["hits"] = ict
    seed["zero_shot"]["realm"]["hits"] = "1" * 30 + ict[30:]
    seed["zero_shot"]["news"]["hits"] = ("1" * 20 + ict[20:] if s % 2 else
                                         ict[:30] + "0" * 20 + ict[50:])
    same = _bits(rng, 0.5)
    seed["openqa"]["REALM"]["em_by_question"] = same
    seed["openqa"]["baseline (ORQA)"]["em_by_question"] = same
    seeds.append(seed)
  found = report.analysis(seeds)
  a, b, c, _ = found["primary"]
  assert a["mean"] == pytest.approx(0.15) and a["signs"] == (6, 0, 6)
  assert a["seeds_ci"] == pytest.approx((0.15, 0.15)) and a["verdict"] == "holds"
  assert a["questions_ci"][0] > 0.1
  assert b["mean"] == 0 and b["signs"] == (0, 0, 6) and b["verdict"] == "not established"
  assert c["mean"] == pytest.approx(0) and c["signs"] == (3, 3, 6)
  assert c["verdict"] == "not established"
  line = report.analysis_line(a)
  assert line.startswith("- (a) REALM - ICT, zero-shot recall@5: +15.0 points; 95% over seeds "
                         "[+15.0, +15.0]") and "6 of 6 seeds above 0" in line
  assert "Holm level" in line and line.endswith("-> **holds**")
  # Beneath the means: (a) gains questions 0-29 (all "Where was X born?") in every seed;
  # (c) gains 0-19 in odd seeds and loses 30-49 in even ones, which cancel within the form.
  t = report.turnover(seeds, "recall", "REALM", "baseline (ORQA)")
  assert (t["gained"], t["lost"]) == ([30] * 6, [0] * 6)
  assert (t["mostly_gained"], t["mostly_lost"], t["questions"]) == (30, 0, 200)
  assert t["by_form"] == {"Where was X born?": (100, pytest.approx(0.3)),
                          "Who wrote X?": (100, 0.0)}
  t = report.turnover(seeds, "recall", report.NEWS_ROW, "baseline (ORQA)")
  assert (t["gained"], t["lost"]) == ([0, 20] * 3, [20, 0] * 3)
  assert (t["mostly_gained"], t["mostly_lost"]) == (20, 20)
  assert t["by_form"]["Where was X born?"] == (100, 0.0)
  assert report.turnover_line("(c)", t).startswith(
      "- (c): questions gained/lost per seed +0/-20, +20/-0, +0/-20")
  assert report.question_form("In which city is the Belbogor Academy based?") == (
      "In which city is the X based?")
  # The first word is kept as it is, even when it starts with an X.
  assert report.question_form("Xenia Ostgorbel was born where?") == "Xenia X was born where?"
  # One seed: no interval over seeds, nothing established.
  one = report.analysis(seeds[:1])["primary"][0]
  assert one["verdict"] == "not established" and "none (one seed)" in report.analysis_line(one)
