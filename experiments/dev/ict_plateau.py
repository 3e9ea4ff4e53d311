r"""Dev only (issue 54, NOTES 37): does the ICT start stop moving, and do its seeds then agree?

Trains ICT on the tables' world for ``STEPS`` steps per seed (the tables' recipe otherwise, its
schedule over ``STEPS``), keeping the untrained start and a checkpoint every ``every`` steps, in
``OUT/ict_<seed>/ict`` (where ``experiments.dev.variance`` looks for its ICT starts, so a grid
with ``ict_steps=STEPS`` in the same OUT starts REALM from these), and scores every checkpoint's
zero-shot recall@5 on the world's non-test questions (``OUT/qa-nontest.jsonl``), per question.
Results in ``OUT/ict_plateau.json``: ``{seed: [[step, recall, hits], ...]}``.

usage: python -m experiments.dev.ict_plateau OUT STEPS SEEDS [every=400] [reader_seed=100]
           [recipe_field=value ...]
  e.g. OUT 2400 100,101,102 (seeds 100 or more: dev). With ict_from_reader, ICT starts from the
  reader of seed reader_seed, trained in OUT/reader_<seed> as experiments.dev.variance does.
"""
import dataclasses
import json
import os
from typing import Dict, List

from absl import app
import tensorflow as tf

from experiments.dev import variance
from experiments.pipeline import stages
from experiments.pipeline.common import Clock
from experiments.synthetic import table_seed
from realm_tf import model_dir as model_dir_lib


def checkpoints(model_dir: str) -> List[str]:
  """Every checkpoint ``model_dir`` keeps, oldest first."""
  state = tf.train.get_checkpoint_state(model_dir)
  if state is None or not state.all_model_checkpoint_paths:
    raise model_dir_lib.ModelDirError(f"no checkpoint in {model_dir}")
  return list(state.all_model_checkpoint_paths)


def run(out: str, steps: int, seeds: List[int], every: int = 400,
        recipe: stages.Recipe = stages.Recipe(), reader_seed: int = 100) -> Dict:
  variance.check_dev_seeds(seeds + [reader_seed])
  clock = Clock("ict_plateau")
  recipe = dataclasses.replace(recipe, ict_steps=steps)
  data = table_seed.prepare(clock, out, table_seed.TableSettings(), recipe)
  questions = variance.nontest_questions(data["files"], os.path.join(out, "qa-nontest.jsonl"))
  task = table_seed.realm_task(data, questions)
  model = task.build_model()
  reader = (variance.train_reader(clock, out, data, recipe, reader_seed)
            if recipe.ict_from_reader else "")
  stage = stages.ict_stage(recipe, data["files"]["vocab"], data["dirs"]["ict"], reader)["ict"]
  stage = stage._replace(settings=dict(
      stage.settings, **{"trainer.checkpoint_interval": every,
                         "trainer.max_to_keep": steps // every + 1}))
  curves = {}
  for seed in seeds:
    model_dir = stages.train_warm_starts(clock, os.path.join(out, f"ict_{seed}"),
                                         {"ict": stage}, seed=seed)["ict"][0]
    curve = []
    for path in checkpoints(model_dir):
      model_dir_lib.restore(path, query_embedder=model.query_embedder,
                            block_embedder=model.block_embedder)
      hits = task.qa_hits(model, task.corpus_index(model), task.validation_builder(), k=5)
      bits = "".join("1" if h else "0" for h in hits)
      step = model_dir_lib.checkpoint_step(path)
      curve.append([step, bits.count("1") / len(bits), bits])
      clock.say(f"ICT seed {seed}, step {step}: dev recall@5 {curve[-1][1]:.3f}")
    curves[str(seed)] = curve
  with open(os.path.join(out, "ict_plateau.json"), "w") as f:
    json.dump({"steps": steps, "every": every, "questions": questions, "curves": curves}, f,
              indent=1)
  return curves


def main(argv):
  options = dict(arg.split("=", 1) for arg in argv[4:])
  every = int(options.pop("every", 400))
  reader_seed = int(options.pop("reader_seed", 100))
  run(argv[1], int(argv[2]), [int(s) for s in argv[3].split(",")], every=every,
      recipe=variance.recipe_with(options), reader_seed=reader_seed)


if __name__ == "__main__":
  app.run(main)
