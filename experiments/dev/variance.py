r"""Dev only (issue 54): where the spread of REALM's gain over its ICT start comes from.

A grid of runs on the tables' world and settings, each an ICT seed ``a`` (its warm start) and a
REALM seed ``b`` (REALM's data order and masks), one reader for all (seed ``reader_seed``), with
repeats of the first cell, gives the gain ``g[a, b]``: zero-shot recall@5 at REALM's last
validation minus its step 0 (the ICT start's), on the world's questions outside its test split
(world 0: 315, its dev and train; pre-training reads no QA file; NOTES 36), paired by question
from each run's ``validation_hits.jsonl``. ``components`` splits the gain's run-to-run variance
as a two-way random-effects model without interaction, ``g = mu + A_a + B_b + e``: the ICT
start's share ``var(A)``, REALM's own ``var(B)``, and the rest (interaction, the unseeded
refresher, question noise), with the repeats' within-cell variance apart as the floor that no
seed explains.

usage: python -m experiments.dev.variance OUT ICT_SEEDS REALM_SEEDS [repeats=N]
           [reader_seed=S] [parallel=P] [recipe_field=value ...]
  e.g. OUT 100,101,102 200,201,202 repeats=2 (seeds 100 or more: dev); results in
  OUT/variance.json (one REALM seed or one ICT seed: the gains without components).
       python -m experiments.dev.variance summarize OUT   (its summary again, from its runs)
"""
import dataclasses
import itertools
import json
import os
import statistics
from typing import Dict, Hashable, List, Sequence, Tuple

from absl import app

from experiments.pipeline import stages
from experiments.pipeline.common import Clock
from experiments.synthetic import table_seed
from realm_tf import model_dir as model_dir_lib


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


def nontest_questions(files: Dict[str, str], path: str) -> str:
  """The world's dev and train questions in one file (``path``), none of them a test question."""
  with open(files["qa_test"]) as f:
    test = {json.loads(line)["question"] for line in f if line.strip()}
  lines = []
  for split in ("qa_dev", "qa_train"):
    with open(files[split]) as f:
      lines += [line for line in f if line.strip()]
  if any(json.loads(line)["question"] in test for line in lines):
    raise ValueError(f"{files['qa_dev']} or {files['qa_train']} holds a test question")
  with open(path, "w") as f:
    f.writelines(line if line.endswith("\n") else line + "\n" for line in lines)
  return path


def gain(model_dir: str) -> Dict:
  """A run's zero-shot recall@5 at step 0 and at its last validation, per question and as the
  mean difference (``read_validation_hits``; both passes on the same QA file)."""
  hits = model_dir_lib.read_validation_hits(model_dir)
  if 0 not in hits or len(hits) < 2:
    raise ValueError(f"{model_dir}: validation hits at step 0 and a later step are needed, "
                     f"found steps {sorted(hits)}")
  first, last = hits[0], hits[max(hits)]
  if first["qa_sha256"] != last["qa_sha256"]:
    raise ValueError(f"{model_dir}: steps 0 and {max(hits)} scored different QA files")
  share = lambda bits: bits.count("1") / len(bits)
  return {"step": max(hits), "start": share(first["qa"]), "end": share(last["qa"]),
          "gain": share(last["qa"]) - share(first["qa"]), "start_hits": first["qa"],
          "end_hits": last["qa"]}


def question_noise(start_hits: str, end_hits: str) -> float:
  """The sampling variance of one run's gain from its questions alone: the per-question paired
  differences' variance over their count (the square of the paired standard error)."""
  if len(start_hits) != len(end_hits) or len(start_hits) < 2:
    raise ValueError(f"paired hits of lengths {len(start_hits)} and {len(end_hits)}")
  diffs = [int(e) - int(s) for s, e in zip(start_hits, end_hits)]
  return statistics.variance(diffs) / len(diffs)


def summarize(runs: Sequence[Dict]) -> Dict:
  """The gains' mean and SD over runs and, with at least 2 x 2 seeds, their ``components``
  (else None), beside what reads them (NOTES 37): the question noise (``question_noise``
  averaged over the runs) and each ICT start's step-0 recall with its cells' mean gain."""
  grid: Dict[Tuple[int, int], List[float]] = {}
  starts: Dict[int, Dict] = {}
  for run in runs:
    grid.setdefault((run["ict_seed"], run["realm_seed"]), []).append(run["gain"])
    start = starts.setdefault(run["ict_seed"], {"start": run["start"], "gains": []})
    if start["start"] != run["start"]:
      raise ValueError(f"ICT seed {run['ict_seed']}: two step-0 recalls, {start['start']} and "
                       f"{run['start']}")
    start["gains"].append(run["gain"])
  values = [run["gain"] for run in runs]
  full = len({a for a, _ in grid}) > 1 and len({b for _, b in grid}) > 1
  return {"components": components(grid) if full else None,
          "gains": {"mean": statistics.fmean(values), "n": len(values),
                    "sd": statistics.stdev(values) if len(values) > 1 else float("nan")},
          "question_noise": statistics.fmean(
              question_noise(r["start_hits"], r["end_hits"]) for r in runs),
          "ict_starts": {str(a): {"start": s["start"], "mean_gain": statistics.fmean(s["gains"])}
                         for a, s in sorted(starts.items())}}


def check_dev_seeds(seeds: Sequence[int]) -> None:
  if min(seeds) < 100:
    raise ValueError("dev seeds are 100 or more (0-11 are the tables' test seeds)")


def recipe_with(fields: Dict[str, str]) -> stages.Recipe:
  """The tables' recipe with ``fields`` (``name: text`` from the command line, each converted
  to its field's type)."""
  default = stages.Recipe()

  def typed(name, text):
    kind = type(getattr(default, name))
    if kind is bool:
      if text not in ("0", "1", "false", "true", "False", "True"):
        raise ValueError(f"{name}={text}: give 1 or 0")
      return text in ("1", "true", "True")
    return kind(text)
  return dataclasses.replace(default, **{k: typed(k, v) for k, v in fields.items()})


def train_reader(clock: Clock, out: str, data: Dict, recipe: stages.Recipe, seed: int) -> str:
  """The reader's start of seed ``seed`` for the world ``data`` (``table_seed.prepare``),
  trained in ``out/reader_<seed>`` (skipped when trained): its model directory."""
  base = os.path.join(out, f"reader_{seed}")
  os.makedirs(base, exist_ok=True)
  reader = stages.train_warm_starts(
      clock, base, stages.reader_stages(recipe, data["files"]["vocab"], stages.reading_corpora(
          base, data["reading"]), base), seed=seed)
  return reader[stages.final_reader(reader)][0]


def run_grid(out: str, ict_seeds: Sequence[int], realm_seeds: Sequence[int], repeats: int = 1,
             reader_seed: int = 100, parallel: int = 2,
             recipe: stages.Recipe = stages.Recipe()) -> Dict:
  """Every (ICT seed, REALM seed) cell once, the first cell ``repeats`` times in all, each REALM
  run validated every ``TableSettings.validation_every`` steps on the non-test questions; the
  gains and their ``components`` into ``out/variance.json``."""
  check_dev_seeds(list(ict_seeds) + list(realm_seeds) + [reader_seed])
  clock, table = Clock("variance"), table_seed.TableSettings()
  os.makedirs(out, exist_ok=True)
  # Finished stages are skipped by directory: a rerun must be the same recipe.
  settings, recorded = dict(dataclasses.asdict(recipe), reader_seed=reader_seed), os.path.join(
      out, "grid_recipe.json")
  if os.path.exists(recorded):
    with open(recorded) as f:
      old = json.load(f)
    if old != settings:
      changed = sorted(k for k in settings if old.get(k) != settings[k])
      raise ValueError(f"{recorded} records another recipe ({changed}): use another OUT")
  else:
    with open(recorded, "w") as f:
      json.dump(settings, f, indent=1)
  data = table_seed.prepare(clock, out, table, recipe)
  vocab, dirs = data["files"]["vocab"], data["dirs"]
  questions = nontest_questions(data["files"], os.path.join(out, "qa-nontest.jsonl"))
  reader_dir = train_reader(clock, out, data, recipe, reader_seed)
  ict = {a: stages.train_warm_starts(clock, os.path.join(out, f"ict_{a}"), stages.ict_stage(
      recipe, vocab, dirs["ict"], reader_dir), seed=a)["ict"][0] for a in ict_seeds}
  cells: List[Tuple[int, int, int]] = [(a, b, 0) for a in ict_seeds for b in realm_seeds]
  cells += [(ict_seeds[0], realm_seeds[0], r) for r in range(1, repeats)]
  where = stages.PretrainData(dirs["pretrain_salient"], dirs["blocks"], dirs["pretrain_salient"])
  jobs, runs = [], {}
  for a, b, r in cells:
    model_dir = runs[a, b, r] = os.path.join(out, f"realm_ict{a}_realm{b}_{r}")
    params = stages.realm_params(
        recipe, vocab, where, model_dir + "_index", ict[a], reader_dir,
        validate_every=table.validation_every, seed=b, qa_eval=questions,
        more={"task.lr_retriever": table.lr_retriever})
    jobs += stages.realm_jobs(model_dir, params, dirs["blocks"], validate=True)
  if jobs:
    stages.run_side_by_side(clock, "REALM", jobs, parallel)
  gains = {cell: gain(model_dir) for cell, model_dir in runs.items()}
  result = {"recipe": dataclasses.asdict(recipe), "reader_seed": reader_seed,
            "questions": len(next(iter(gains.values()))["start_hits"]),
            "runs": [dict(g, ict_seed=a, realm_seed=b, repeat=r,
                          index_age=stages.index_ages(runs[a, b, r]))
                     for (a, b, r), g in sorted(gains.items())]}
  return write_summary(out, result, clock.say)


def write_summary(out: str, result: Dict, say=print) -> Dict:
  """``result`` with ``summarize``'s fields of its runs, into ``out/variance.json``."""
  result = dict(result, **summarize(result["runs"]))
  with open(os.path.join(out, "variance.json"), "w") as f:
    json.dump(result, f, indent=1)
  c, g = result["components"], result["gains"]
  say(f"gain {g['mean']:+.3f} (SD {g['sd']:.3f}) over {g['n']} runs; question noise "
      f"{result['question_noise']:.5f}" + (f"; variance: ICT start {c['ict']:.5f}, REALM seed "
      f"{c['realm']:.5f}, residual {c['residual']:.5f}, repeats {c['repeats']}" if c else ""))
  return result


def main(argv):
  if argv[1] == "summarize":  # a finished grid's summary again, from its runs (no training)
    with open(os.path.join(argv[2], "variance.json")) as f:
      write_summary(argv[2], json.load(f))
    return
  out, ict_seeds, realm_seeds = argv[1], argv[2], argv[3]
  options, fields = {}, {}
  for arg in argv[4:]:
    key, value = arg.split("=", 1)
    if key in ("repeats", "reader_seed", "parallel"):
      options[key] = int(value)
    else:
      fields[key] = value
  run_grid(out, [int(s) for s in ict_seeds.split(",")], [int(s) for s in realm_seeds.split(",")],
           recipe=recipe_with(fields), **options)


if __name__ == "__main__":
  app.run(main)
