"""experiments/pipeline/stages.py: the scheduler (progress lines from checkpoint files, processes
run side by side that fail loudly) and the settings that reach a trainer as a config object."""

import os
import time

import numpy as np
import pytest

from experiments import assets
from experiments.pipeline import stages
from experiments.pipeline.common import Clock
from realm_tf import configs


def _checkpoint(model_dir, step):
  os.makedirs(model_dir, exist_ok=True)
  with open(os.path.join(model_dir, "checkpoint"), "w") as f:
    f.write(f'model_checkpoint_path: "ckpt-{step}"\nall_model_checkpoint_paths: "ckpt-0"\n')


def test_checkpoint_step_reads_the_newest(tmp_path):
  assert stages.checkpoint_step(str(tmp_path / "none")) == 0
  _checkpoint(str(tmp_path / "a"), 275)
  assert stages.checkpoint_step(str(tmp_path / "a")) == 275


def test_progress_line_counts_steps_since_the_stage_began(tmp_path):
  a, b = str(tmp_path / "a"), str(tmp_path / "b")
  _checkpoint(a, 100)
  clock = Clock("t")
  progress = stages.Progress(clock, "REALM", {"a": (a, 1000), "b": (b, 1000)}, seconds=0)
  with progress:
    assert "ETA after the first checkpoint" in progress.line()
    _checkpoint(a, 300)
    _checkpoint(b, 200)
    t0 = progress._t0   # pylint: disable=protected-access
    # 400 steps in 100 s: 4 steps/s; 700 + 800 left -> 375 s.
    line = progress.line(now=t0 + 100)
  assert line == "REALM: a 300/1000, b 200/1000 | 4.00 steps/s | ETA 6.2 min"


def test_a_failing_job_stops_the_others_and_shows_its_log(tmp_path):
  clock = Clock("t")
  slow = stages.Job("slow", ["timeit", "-n1", "-r1", "import time; time.sleep(60)"],
                    str(tmp_path / "slow.log"))
  bad = stages.Job("bad", ["no_such_module_here"], str(tmp_path / "bad.log"))
  t = time.time()
  with pytest.raises(RuntimeError, match=r"(?s)bad failed \(exit 1\).*No module named"):
    stages.run_side_by_side(clock, "test", [slow, bad])
  assert time.time() - t < 30   # the slow job was killed, not waited for


def test_runs_wait_for_their_followers_and_respect_the_limit(tmp_path):
  clock = Clock("t")
  jobs = []
  for name in ("one", "two", "three"):
    jobs += [stages.Job(f"{name} follower", ["platform"], str(tmp_path / f"{name}.f.log"),
                        follower=True),
             stages.Job(name, ["platform"], str(tmp_path / f"{name}.log"))]
  stages.run_side_by_side(clock, "test", jobs, parallel=1)
  assert all((tmp_path / f"{n}.log").read_text().strip() for n in ("one", "two", "three"))
  assert all((tmp_path / f"{n}.f.log").read_text().strip() for n in ("one", "two", "three"))
  # One run at a time: each run's processes started after the previous run's ended.
  ends = [os.path.getmtime(tmp_path / f"{n}.log") for n in ("one", "two", "three")]
  assert ends == sorted(ends)


def test_settings_nest_and_reach_the_config_as_typed_values():
  assert stages.nested({"a.b": 1, "a.c.d": [2], "e": "x"}) == {"a": {"b": 1, "c": {"d": [2]}},
                                                                "e": "x"}
  params = stages.experiment_params("openqa_cpu", [stages.config("openqa_cpu")], dict(
      stages.schedule(7, 2e-5), **stages.intervals(3), **stages.runtime(stages.Recipe())))
  assert params.trainer.train_steps == 7 and params.trainer.checkpoint_interval == 3
  rate = params.trainer.optimizer_config.learning_rate.polynomial
  assert rate.initial_learning_rate == 2e-5 and rate.decay_steps == 7
  with pytest.raises(Exception, match="no_such_key"):
    stages.experiment_params("openqa_cpu", [], {"task.no_such_key": 1})


def test_a_config_written_for_a_process_loads_back_equal(tmp_path):
  """What a trainer process reads (``write_params``'s YAML through ``realm-train
  --config_file``) is the config object the stage built, field for field."""
  recipe = stages.Recipe(realm_steps=12, refresh_every=4, precision="bfloat16")
  data = stages.PretrainData("/d/pretrain", "/d/blocks", "/d/eval")
  params = stages.realm_params(recipe, os.path.join(assets.ROOT, "vocab",
                                                    "bert-base-uncased-vocab.txt"),
                               data, "/d/index", "/d/ict", "/d/reader", validate_every=8, seed=3,
                               qa_eval="/d/qa.jsonl", more={"task.lr_retriever": 0.5})
  path = stages.write_params(params, str(tmp_path / "run.yaml"))
  back = configs.load_experiment("realm_pretrain_cpu", [path])
  assert back.as_dict() == params.as_dict()
  assert back.task.lr_retriever == 0.5 and back.trainer.validation_interval == 8
  assert back.runtime.mixed_precision_dtype == "bfloat16" and back.task.train_data.seed == 3


def test_retriever_recall_is_what_answering_retrieves(tmp_path):
  """Each retriever's zero-shot recall@k (the demo's retriever line) counts the questions whose
  top k blocks hold an answer, the blocks ``OpenQA`` retrieves for that retriever."""
  # pylint: disable=g-import-not-at-top
  import json
  from realm_tf.openqa import inputs
  from realm_tf.openqa import predict
  from test_serve import serve_dirs
  # pylint: enable=g-import-not-at-top
  dirs = serve_dirs(tmp_path)
  bodies = dirs["bodies"]
  qa_file = tmp_path / "qa.jsonl"
  questions = [" ".join(b.split()[:6]) + "?" for b in bodies[::2]]
  answers = [[b.split()[-1].strip(".")] for b in bodies[1::2]][:len(questions)]
  with open(qa_file, "w") as f:
    for q, a in zip(questions, answers):
      f.write(json.dumps({"question": q, "answers": a}) + "\n")
  got = stages.retriever_recall(dirs["model"], dirs["index"], dirs["blocks"], str(qa_file), k=3)
  assert set(got) == {"dense", "bm25", "hybrid"}
  for retriever, recall in got.items():
    qa = predict.OpenQA.load(dirs["model"], dirs["index"], reader_beam_size=3,
                             retriever_beam_size=3, retriever=retriever)
    hits = [any(inputs.has_answer(e.text, a) for e in answer.evidence)
            for answer, a in zip(qa.answer(questions[:len(answers)]), answers)]
    assert recall == pytest.approx(np.mean(hits)), retriever
  assert 0 < got["bm25"] < 1  # The questions are blocks' words: BM25 finds some, not all.
