"""Is a rebuilt real-text start the committed one? (NOTES 37: issue 53's test directory was lost
with its machine, and REALM test seeds 1-3 start from a rebuild at fc79c9e.)

    python -m experiments.dev.rebuild_check WORK [OUT.json] [--same_start]

WORK is the rebuilt run's ``work/``. Compared with what is committed:
- the salient-span pre-training data's counts against ``real_text_dev/pretrain_done.json``;
- each retriever's per-question first-hit rank on the test questions (``first_hits`` of its
  saved top 20) against its column of ``results/real_text/real_text_questions.csv``, the questions
  themselves first;
- each reader phase's validation curve and masked-span accuracy against the dev run that
  chose the recipe (``results/real_text/real_text_dev/minilm_mlm_800*_dev.json``);
- the ORQA row's per-question exact match, once the rebuild has its Open-QA evaluation.
Only stages the rebuild has finished are compared. Prints a summary; OUT.json keeps it all.
``--same_start``: exit 1 unless the questions, every retriever's ranks and the pre-training
counts are the committed ones (:func:`start_differences`; the readers may be retrained).
"""

import json
import os
from typing import Dict, List, Mapping, Sequence

from absl import app
from absl import flags
import numpy as np

from experiments.pipeline.common import read_json
from experiments.real_text import report
from experiments.real_text import text_stages as ts
from experiments.real_text.merge import read_csv
from realm_tf.data import manifests

RESULTS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "results", "real_text")
# Committed column -> the rebuilt stage's saved top blocks (``report.retrieval_rows``).
RETRIEVERS = {"bm25": "bm25/top_ids.npy", "minilm": "minilm/realm_top_ids.npy",
              "minilm_mean": "minilm/mean_top_ids.npy", "ict": "ict/top_ids.npy",
              "hybrid": "hybrid/top_ids.npy"}
# Rebuilt reader phase (``text_realm``'s directories) -> (committed dev file, its part).
READERS = {"minilm_mlm": ("minilm_mlm_800_dev.json", "mlm"),
           "mlm_reader": ("minilm_mlm_800_dev.json", "reading"),
           "mlm_reader_distract": ("minilm_mlm_800_read_d2_dev.json", "train")}


def compare_ranks(committed: Sequence[int], rebuilt: Sequence[int]) -> Dict:
  """Two retrievers' first-hit ranks on the same questions: how many are equal, each one's
  recall@5, and the questions the rebuild gains and loses at 5."""
  a, b = np.asarray(committed), np.asarray(rebuilt)
  if a.shape != b.shape:
    raise ValueError(f"{a.size} committed questions, {b.size} rebuilt")
  return {"questions": int(a.size), "equal_ranks": int((a == b).sum()),
          "committed_recall@5": round(float((a < 5).mean()), 4),
          "rebuilt_recall@5": round(float((b < 5).mean()), 4),
          "gained@5": int(((b < 5) & (a >= 5)).sum()), "lost@5": int(((a < 5) & (b >= 5)).sum())}


def compare_em(committed: Sequence[int], rebuilt: Sequence[int]) -> Dict:
  """Two rows' exact matches (0/1) on the same questions: how many agree, each one's EM, and
  the questions the rebuild gains and loses."""
  a, b = np.asarray(committed, bool), np.asarray(rebuilt, bool)
  if a.shape != b.shape:
    raise ValueError(f"{a.size} committed questions, {b.size} rebuilt")
  return {"questions": int(a.size), "equal": int((a == b).sum()),
          "committed_em": round(float(a.mean()), 4), "rebuilt_em": round(float(b.mean()), 4),
          "gained": int((b & ~a).sum()), "lost": int((a & ~b).sum())}


def compare_curves(committed: Mapping[str, Sequence], rebuilt: Mapping[str, Sequence]) -> Dict:
  """Validation curves (``{metric: [[step, value], ...]}``) of the metrics both have, timing
  aside: the largest absolute difference at a shared step, and whether the steps agree."""
  out = {}
  for metric in sorted(set(committed) & set(rebuilt) - {"steps_per_second"}):
    a, b = dict(map(tuple, committed[metric])), dict(map(tuple, rebuilt[metric]))
    shared = sorted(set(a) & set(b))
    out[metric] = {"steps_agree": sorted(a) == sorted(b),
                   "max_abs_difference": round(max((abs(a[s] - b[s]) for s in shared),
                                                   default=float("nan")), 4),
                   "committed": [[s, a[s]] for s in sorted(a)],
                   "rebuilt": [[s, b[s]] for s in sorted(b)]}
  return out


def _accuracy(d: Dict) -> Dict[str, float]:
  """A masked-span accuracy record's token accuracies by setting (``null``, ``own_block``)."""
  return {k: round(v["token"]["value"], 4) for k, v in d.items() if isinstance(v, dict)
          and "token" in v}


def check(work: str, results: str = RESULTS) -> Dict:
  out = {"work": os.path.abspath(work)}
  _, committed = read_csv(os.path.join(results, "real_text_questions.csv"))
  if os.path.exists(os.path.join(work, "qa", "squad-test.jsonl")):
    records = ts.test_questions(work, 0)
    same = [r.question for r in records] == [c["question"] for c in committed]
    out["questions"] = {"committed": len(committed), "rebuilt": len(records), "same": same}
    if same:
      bodies = [b["body"] for b in manifests.read_blocks(os.path.join(work, "blocks"))]
      for column, top in RETRIEVERS.items():
        if os.path.exists(os.path.join(work, top)):
          ranks = ts.first_hits(np.load(os.path.join(work, top)), bodies, records)
          out[column] = compare_ranks([int(c[column]) for c in committed], ranks)
  pretrain = os.path.join(work, "pretrain_done.json")
  if os.path.exists(pretrain):
    dev = read_json(os.path.join(results, "real_text_dev", "pretrain_done.json"))
    rebuilt = read_json(pretrain)
    counts = [k for k in dev if k not in ("seconds", "stats")]
    out["pretrain_counts"] = {"same": all(dev[k] == rebuilt.get(k) for k in counts),
                              "differing": {k: [dev[k], rebuilt.get(k)] for k in counts
                                            if dev[k] != rebuilt.get(k)}}
  for name, (dev_file, part) in READERS.items():
    done = os.path.join(work, f"{name}_done.json")
    if not os.path.exists(done):
      continue
    dev, rebuilt = read_json(os.path.join(results, "real_text_dev", dev_file)), read_json(done)
    out[name] = {"curves": compare_curves(dev[part]["validation"], rebuilt["validation"])}
    accuracy = os.path.join(work, f"{name}_accuracy.json")
    if os.path.exists(accuracy):
      # The dev files record the masked-span accuracy of the reading phases only.
      out[name]["accuracy"] = {"committed": _accuracy(dev["accuracy"]) if part != "mlm" else {},
                               "rebuilt": _accuracy(read_json(accuracy))}
  openqa = os.path.join(work, "openqa_eval", "done.json")
  if os.path.exists(openqa):
    _, committed = read_csv(os.path.join(results, "real_text_openqa_questions.csv"))
    test_file = read_json(openqa)["test_file"]
    with open(test_file, encoding="utf-8") as f:
      questions = [json.loads(line)["question"] for line in f if line.strip()]
    if questions != [c["question"] for c in committed]:
      raise ValueError(f"{test_file}: not the committed Open-QA test questions")
    rebuilt_em = [e for e, _ in report.openqa_answers(
        work, report.openqa_sources({})["orqa"], test_file)]
    out["orqa_em"] = compare_em([int(c["orqa_em"]) for c in committed], rebuilt_em)
  return out


def start_differences(result: Dict) -> List[str]:
  """What in :func:`check`'s ``result`` keeps the rebuilt start from being the committed one:
  the test questions, a retriever's per-question ranks or the pre-training counts, differing
  or not compared."""
  out = [k for k in ("questions", "pretrain_counts") if not result.get(k, {}).get("same")]
  return out + [k for k in RETRIEVERS
                if k not in result or result[k]["equal_ranks"] != result[k]["questions"]]


def define_flags() -> None:
  """The flag (defined only when run as a program: the tests import this module)."""
  flags.DEFINE_bool("same_start", False, "Exit 1 if the rebuilt start differs from the "
                    "committed records.")


def main(argv: Sequence[str]) -> None:
  same_start = flags.FLAGS.same_start
  if len(argv) not in (2, 3):
    raise SystemExit(__doc__)
  result = check(argv[1])
  for key, value in result.items():
    if isinstance(value, dict) and "curves" in value:
      for metric, c in value["curves"].items():
        print(f"{key} {metric}: steps agree {c['steps_agree']}, largest difference "
              f"{c['max_abs_difference']}")
      if "accuracy" in value:
        print(f"{key} accuracy: {value['accuracy']}")
    else:
      print(f"{key}: {value}")
  if len(argv) == 3:
    with open(argv[2], "w", encoding="utf-8") as f:
      json.dump(result, f, indent=1)
  differences = start_differences(result)
  if same_start and differences:
    raise SystemExit(f"the rebuilt start differs from the committed records: {differences}")


if __name__ == "__main__":
  define_flags()
  app.run(main)
