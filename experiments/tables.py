r"""realm-tables: the paper's Tables 1-3 (Guu et al. 2020), at CPU scale with seeds and intervals.

  python -m experiments.tables --table=2 --scale=cpu --seeds=3 --output_dir=tables_out
  python -m experiments.tables --table=1,2,3 ...     # one set of runs feeds every table
  python -m experiments.tables --scale=paper          # prints the paper-scale command sequence

CPU scale runs the demo's pipeline (``experiments/demo.py``: the synthetic world, the reading
warm start that stands in for BERT, ICT, REALM pre-training beside its refresher, Open-QA
fine-tuning) on a larger world, so that at least 1,000 test questions and 1,000 held-out masked
sentences are scored. The warm starts (the "BERT" reader and the ICT retriever) are trained once,
as the paper starts from one BERT and one ICT run; each seed then re-runs everything after them
(data order, the refresher's timing, fine-tuning).

* **Table 1**: Open-QA EM on the test questions of the ORQA baseline (ICT retriever + "BERT"
  reader, fine-tuned) and of REALM (pre-trained, then fine-tuned), the paper's numbers beside.
* **Table 2**: EM and zero-shot recall@5 (before fine-tuning, a top-5 block holds an answer) of
  REALM; REALM retriever + baseline encoder; baseline retriever + REALM encoder; the baseline;
  random uniform masks; random span masks; a 30x staler index (the refresher builds at most
  every ``staleness x refresh_every`` steps). The towers of two model directories are mixed with
  the Open-QA task's ``retriever_init_checkpoint`` / ``reader_init_checkpoint``. One more row,
  not in the paper (its listed limitation): REALM fine-tuned with its block tower trained
  (``task.trainable_blocks``: the top ``--trainable_blocks`` of each beam embedded with the
  current block tower) and a refresher re-embedding the corpus beside the fine-tuner.
* **Table 3**: for held-out masked sentences, ``p(answer | x)`` from a reader given the null
  block only (the "BERT" row: the reading warm start; and REALM's own reader), given the block
  that holds the answer, and marginalized over REALM's candidates (the null block and its top
  k - 1); a few examples and the medians.

Every cell is the mean over seeds +- the 95% confidence half-width (Student t, n - 1 degrees of
freedom). Written to ``--output_dir``: ``table{1,2,3}.md``, ``table{1,2,3}.csv``,
``runs.json`` (every run's numbers) and ``staleness.png`` (masked-sentence recall@5, QA recall@5
and retrieval utility over pre-training steps, refreshed vs 30x staler index).
"""

import csv
import json
import math
import os
import statistics
import time
from typing import Dict, List, Optional, Sequence

from absl import app
from absl import flags

from experiments import demo
from realm_tf.binaries import cli

FLAGS = flags.FLAGS
flags.DEFINE_list("table", ["1", "2", "3"], "Which tables: any of 1, 2, 3.")
flags.DEFINE_enum("scale", "cpu", ["cpu", "paper"],
                  "cpu: run here on the synthetic world; paper: print the TPU recipe.")
flags.DEFINE_integer("seeds", 3, "Seeds per cell (CPU scale).")
flags.DEFINE_float("qa_test_fraction", 0.4, "Share of the world's questions held out as test.")
flags.DEFINE_float("eval_fraction", 0.4, "Share of blocks whose masked sentences are held out.")
flags.DEFINE_integer("staleness", 30, "How many times staler the stale-index ablation's index is.")
flags.DEFINE_integer("validation_every", 100,
                     "Validation interval of the refreshed and stale runs (the plot's points).")
flags.DEFINE_integer("table3_examples", 5, "Held-out sentences printed in Table 3.")
flags.DEFINE_bool("trainable_row", True,
                  "Table 2 also runs the row not in the paper: a trainable block tower in "
                  "fine-tuning, beside a refresher (about 8 more minutes a seed).")
flags.DEFINE_integer("trainable_blocks", 16,
                     "The trainable-block-tower row: top blocks of each beam embedded with the "
                     "current block tower (task.trainable_blocks).")

TRAINABLE_ROW = "REALM, block tower fine-tuned + refresher"
# The paper's numbers (EM on test; Table 2 on NQ dev: EM / zero-shot recall@5).
PAPER_TABLE1 = {"REALM (Wikipedia)": (39.2, 40.2, 46.8), "REALM (CC-News)": (40.4, 40.7, 42.9),
                "ORQA": (33.3, 36.4, 30.1)}
PAPER_TABLE2 = {
    "REALM": (38.2, 38.5), "REALM retriever + baseline encoder": (37.4, 38.5),
    "baseline retriever + REALM encoder": (35.3, 13.9), "baseline (ORQA)": (31.3, 13.9),
    "random uniform masks": (32.3, 24.2), "random span masks": (35.3, 26.1),
    "30x staler index": (28.7, 15.1), TRAINABLE_ROW: None}

# Pre-training runs: name -> (masking, refreshed every refresh_every, or staleness x staler).
PRETRAIN_RUNS = {"realm": ("salient", 1), "stale": ("salient", None),
                 "random_span": ("random_span", 1), "uniform": ("uniform", 1)}
# Table 2's rows: label -> (retriever source, reader source); "ict"/"bert" are the warm starts.
TABLE2_ROWS = {
    "REALM": ("realm", "realm"),
    "REALM retriever + baseline encoder": ("realm", "bert"),
    "baseline retriever + REALM encoder": ("ict", "realm"),
    "baseline (ORQA)": ("ict", "bert"),
    "random uniform masks": ("uniform", "uniform"),
    "random span masks": ("random_span", "random_span"),
    "30x staler index": ("stale", "stale"),
    # Not in the paper (its listed limitation): REALM fine-tuned with its block tower trained
    # and the refresher re-embedding the corpus beside the fine-tuner.
    TRAINABLE_ROW: ("realm", "realm"),
}
TABLE1_ROWS = ("baseline (ORQA)", "REALM")

# Student t quantiles t_{0.975, df}.
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
         9: 2.262, 10: 2.228, 15: 2.131, 20: 2.086, 30: 2.042}


def mean_ci(values: Sequence[float]):
  """``(mean, 95% half-width)`` over seeds (Student t); half-width nan for one value."""
  values = [float(v) for v in values]
  m = statistics.fmean(values)
  if len(values) < 2:
    return m, float("nan")
  df = len(values) - 1
  t = _T975.get(df) or _T975[max(k for k in _T975 if k <= df)]
  return m, t * statistics.stdev(values) / math.sqrt(len(values))


def fmt(values: Sequence[float], scale: float = 100.0, digits: int = 1) -> str:
  m, h = mean_ci(values)
  if math.isnan(h):
    return f"{m * scale:.{digits}f}"
  return f"{m * scale:.{digits}f} +- {h * scale:.{digits}f}"


def separated(a: Sequence[float], b: Sequence[float]) -> str:
  """Whether two cells' 95% intervals are disjoint: '>' / '<' / 'not separated'."""
  (ma, ha), (mb, hb) = mean_ci(a), mean_ci(b)
  if math.isnan(ha) or math.isnan(hb):
    return "one seed: no interval"
  if ma - ha > mb + hb:
    return ">"
  if ma + ha < mb - hb:
    return "<"
  return "not separated"


def say(message: str) -> None:
  print(f"[tables {time.strftime('%H:%M:%S')}] {message}", flush=True)


# ---------------------------------------------------------------------------------- data --
def prepare(out: str) -> Dict:
  """The world, its three maskings' examples, ICT examples and the reading worlds (kept in
  ``out/prepared.json``: a rerun into the same directory reuses them)."""
  done = os.path.join(out, "prepared.json")
  if os.path.exists(done):
    with open(done) as f:
      return json.load(f)
  from data_prep import pipeline  # pylint: disable=g-import-not-at-top
  from data_prep import pretrain_examples  # pylint: disable=g-import-not-at-top
  from data_prep import synthetic_world  # pylint: disable=g-import-not-at-top
  world = demo.make_world(FLAGS.seed, FLAGS.seed)
  files = synthetic_world.write_world(world, os.path.join(out, "world"), vocab_size=3000,
                                      whole_word_names=True,
                                      qa_test_fraction=FLAGS.qa_test_fraction)
  common = dict(block_seq_length=32, query_seq_length=32)
  prepared = pipeline.prepare_all(files["articles"], files["vocab"], os.path.join(out, "data"),
                                  patterns_file=files["patterns"],
                                  eval_fraction=FLAGS.eval_fraction, seed=FLAGS.seed, **common)
  dirs = dict(prepared["dirs"], pretrain_salient=prepared["dirs"]["pretrain"])
  for masking in ("random_span", "uniform"):
    d = os.path.join(out, "data", f"pretrain_{masking}")
    pretrain_examples.run_pretrain_examples(
        dirs["sentences"], files["vocab"], d, masking=masking, query_seq_length=32,
        eval_fraction=FLAGS.eval_fraction, seed=FLAGS.seed)
    dirs[f"pretrain_{masking}"] = d
  reading = []
  for i in range(1, FLAGS.reading_worlds + 1):
    other = synthetic_world.write_world(demo.make_world(FLAGS.seed + i, FLAGS.seed),
                                        os.path.join(out, f"reading_world_{i}"))
    reading.append(pipeline.prepare_all(
        other["articles"], files["vocab"], os.path.join(out, f"reading_data_{i}"),
        patterns_file=other["patterns"], eval_fraction=0.02, seed=FLAGS.seed + i,
        examples_per_sentence=2, **common)["dirs"])
  num_questions = sum(1 for _ in open(files["qa_test"]))
  held_out = prepared["pretrain"]["num_eval"]
  say(f"world: {len(world.articles)} articles, "
       f"{prepared['blocks']['num_blocks']} blocks, {held_out} held-out masked sentences, "
       f"{num_questions} test questions")
  prepared = dict(files=files, dirs=dirs, reading=reading, num_test_questions=num_questions,
                  num_held_out_sentences=held_out)
  with open(done, "w") as f:
    json.dump(prepared, f)
  return prepared


# ---------------------------------------------------------------------------- warm starts --
def warm_starts(out: str, data: Dict, variants: Optional[Dict[str, tuple]] = None
                ) -> Dict[str, str]:
  """The "BERT" reader and the ICT retriever (``demo.warm_start_stages``), trained once each:
  ``{"bert": the reader REALM and the baseline start from, "ict": ..., and the stages before
  them}``.

  ``variants``: more warm starts, ``{name: (stage, overrides)}`` (``stage`` one of the
  stages' names), each trained into ``out/<name>`` with the stage's settings and the extra
  overrides.
  """
  stages = demo.warm_start_stages(data["files"]["vocab"], demo.reading_corpora(
      out, data["reading"]), data["dirs"]["ict"])
  for name, (stage, extra) in (variants or {}).items():
    experiment, steps, lr, yamls, overrides = stages[stage]
    stages[name] = (experiment, steps, lr, yamls, list(overrides) + list(extra))
  dirs = {name: model_dir for name, (model_dir, _) in demo.train_warm_starts(out, stages).items()}
  dirs["bert"] = dirs["reader" if "reader" in dirs else "reader_read"]
  return dirs


# ------------------------------------------------------------------------- pre-training --
def pretrain_overrides(data, masking, index_dir, seed, warm, plotted, extra=()):
  vocab, dirs = data["files"]["vocab"], data["dirs"]
  n = demo.vocab_size(vocab)
  every = FLAGS.refresh_every
  overrides = [
      f"task.model.vocab_file={vocab}", f"task.model.retriever.encoder.vocab_size={n}",
      f"task.model.reader.encoder.vocab_size={n}",
      f"task.train_data.input_path={os.path.join(dirs[f'pretrain_{masking}'], 'train-*')}",
      f"task.train_data.blocks_dir={dirs['blocks']}", f"task.train_data.seed={seed}",
      f"task.validation_data.input_path={os.path.join(dirs['pretrain_salient'], 'eval-*')}",
      f"task.validation_data.blocks_dir={dirs['blocks']}", f"task.index_dir={index_dir}",
      f"task.retriever_init_checkpoint={warm['ict']}",
      f"task.reader_init_checkpoint={warm['bert']}",
      f"trainer.checkpoint_interval={every}", f"trainer.summary_interval={every}",
      f"trainer.steps_per_loop={every}",
      f"trainer.validation_interval={FLAGS.validation_every if plotted else every}",
  ]
  if plotted:
    overrides.append(f"task.qa_eval_path={data['files']['qa_dev']}")
  return ",".join(overrides + demo.schedule(FLAGS.realm_steps, FLAGS.realm_learning_rate) +
                  list(extra))


def start_pretrain(model_dir, data, warm, seed, masking="salient", min_interval=0,
                   plotted=True, extra=()):
  """Starts one REALM pre-training run in ``model_dir`` beside its refresher (its index in
  ``model_dir + "_index"``; at most every ``min_interval`` steps); ``plotted``: validate
  every ``validation_every`` steps, with the dev questions' QA recall; ``extra``: more
  overrides. Returns the ``(process, name, log)`` triples for ``demo.wait_all``."""
  index_dir = model_dir + "_index"
  name = os.path.basename(model_dir)
  refresher_args = ["realm_tf.binaries.refresh", f"--model_dir={model_dir}",
                    f"--index_dir={index_dir}", f"--blocks_dir={data['dirs']['blocks']}",
                    "--poll_seconds=1", "--model_dir_wait_seconds=900", "--keep=2",
                    "--index_type=brute_force", "--progress=false",
                    f"--min_step_interval={min_interval}"]
  trainer_args = [
      "realm_tf.binaries.train", "--experiment=realm_pretrain_cpu",
      "--mode=" + ("train_and_eval" if plotted else "train"),
      f"--config_file={os.path.join(demo.CONFIG_DIR, 'realm_pretrain_cpu__demo.yaml')}",
      f"--model_dir={model_dir}",
      "--params_override=" + pretrain_overrides(data, masking, index_dir, seed, warm, plotted,
                                                extra)]
  os.makedirs(os.path.dirname(model_dir), exist_ok=True)
  procs = []
  for binary, args in (("refresh", refresher_args), ("train", trainer_args)):
    log = f"{model_dir}.{binary}.log"
    procs.append((demo.start_binary(args, log), f"realm-{binary} ({name}, seed {seed})", log))
  return procs


def pretrain(out: str, data: Dict, warm: Dict[str, str], seed: int, names: Sequence[str]):
  """REALM pre-training runs of one seed, each beside its refresher, all side by side.

  The refreshed and stale runs validate every ``validation_every`` steps (the plot's points).
  """
  from realm_tf import model_dir as model_dir_lib  # pylint: disable=g-import-not-at-top
  procs, dirs = [], {}
  for name in names:
    masking, interval = PRETRAIN_RUNS[name]
    model_dir = os.path.join(out, f"seed{seed}", name)
    dirs[name] = model_dir
    if model_dir_lib.training_done(model_dir):
      continue
    min_interval = FLAGS.refresh_every * (interval or FLAGS.staleness) if interval != 1 else 0
    procs += start_pretrain(model_dir, data, warm, seed, masking, min_interval,
                            plotted=name in ("realm", "stale"))
  if procs:
    say(f"seed {seed}: REALM pre-training {', '.join(names)} ({FLAGS.realm_steps} steps each, "
         "side by side)")
    demo.wait_all(sorted(procs, key=lambda p: "refresh" in p[1]))
  return dirs


# ------------------------------------------------------------------------------ Open-QA --
def finetune(out: str, data: Dict, sources: Dict[str, str], seed: int,
             rows: Dict[str, tuple], done: Dict[str, Dict]) -> Dict[str, Dict]:
  """Open-QA fine-tuning of ``rows`` (label -> (retriever, reader) source names) side by side;
  returns label -> {"em", "top_5_match" (fine-tuned), "zero_shot_recall@5", ...}. ``done``:
  this seed's results of an earlier invocation (``runs.json``), reused for the rows whose
  model directory is finished.

  Every row searches a frozen index of its retriever's block tower, except ``TRAINABLE_ROW``:
  it trains its block tower (``task.trainable_blocks``) with a refresher beside it that
  re-embeds the corpus every ``refresh_every`` steps into the row's own index directory, and
  is evaluated against the refresher's last index (of the final block tower)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from realm_tf import configs  # pylint: disable=g-import-not-at-top
  from realm_tf import model_dir as model_dir_lib  # pylint: disable=g-import-not-at-top
  from realm_tf import train_lib  # pylint: disable=g-import-not-at-top
  from realm_tf.retrieval import refresher  # pylint: disable=g-import-not-at-top
  files, vocab = data["files"], data["files"]["vocab"]
  config_file = os.path.join(demo.CONFIG_DIR, "openqa_cpu__demo.yaml")
  base = os.path.join(out, f"seed{seed}")
  indexes = {}
  for retriever, _ in rows.values():
    if retriever not in indexes:
      indexes[retriever] = os.path.join(base, f"openqa_index_{retriever}")
      if not tf.io.gfile.exists(os.path.join(indexes[retriever], "LATEST")):
        refresher.build_index_for_checkpoint(
            None, sources[retriever], data["dirs"]["blocks"], indexes[retriever],
            options=refresher.BuildOptions(index_type="brute_force", progress=False))

  def slug(label):
    return "openqa_" + "".join(c if c.isalnum() else "_" for c in label.lower()).strip("_")

  def overrides(label, split, frozen=False):
    retriever, reader = rows[label]
    index_dir = indexes[retriever]
    extra = [f"task.train_data.seed={seed}"]
    if label == TRAINABLE_ROW and not frozen:
      index_dir = os.path.join(base, slug(label)) + "_index"
      every = FLAGS.refresh_every    # a checkpoint, so a fresh index, every refresh_every
      loop = math.gcd(every, max(1, FLAGS.openqa_steps // 3))   # divides every interval
      extra += [f"task.trainable_blocks={FLAGS.trainable_blocks}",
                f"task.blocks_dir={data['dirs']['blocks']}",
                f"trainer.checkpoint_interval={every}", f"trainer.steps_per_loop={loop}"]
    return demo.openqa_overrides(vocab, index_dir, files["qa_train"], files[split],
                                 sources[retriever], sources[reader]) + "," + ",".join(extra)

  procs, trained_now = [], set()
  for label in rows:
    model_dir = os.path.join(base, slug(label))
    if model_dir_lib.training_done(model_dir):
      continue
    trained_now.add(label)
    log = model_dir + ".train.log"
    if label == TRAINABLE_ROW:
      refresh_log = model_dir + ".refresh.log"
      procs.append((demo.start_binary(
          ["realm_tf.binaries.refresh", f"--model_dir={model_dir}",
           f"--index_dir={model_dir}_index", f"--blocks_dir={data['dirs']['blocks']}",
           "--poll_seconds=1", "--model_dir_wait_seconds=900", "--keep=2",
           "--index_type=brute_force", "--progress=false"], refresh_log),
          f"realm-refresh ({label}, seed {seed})", refresh_log))
    procs.append((demo.start_binary(["realm_tf.binaries.train", "--experiment=openqa_cpu",
                                     "--mode=train_and_eval", f"--config_file={config_file}",
                                     f"--model_dir={model_dir}",
                                     "--params_override=" + overrides(label, "qa_dev")], log),
                  f"realm-train ({label}, seed {seed})", log))
  if procs:
    say(f"seed {seed}: Open-QA fine-tuning of {len(procs)} rows side by side "
         f"({FLAGS.openqa_steps} steps each)")
    demo.wait_all(sorted(procs, key=lambda p: "refresh" in p[1]))
  results, zero_shot = {}, {}
  for label, (retriever, _) in rows.items():
    if label in done and label not in trained_now:
      results[label] = done[label]
      continue
    params = configs.load_experiment("openqa_cpu", [config_file], overrides(label, "qa_test"))
    if retriever not in zero_shot:
      # An empty model directory evaluates the initialization: zero-shot retrieval.
      start_dir = os.path.join(base, f"openqa_start_{retriever}")
      tf.io.gfile.makedirs(start_dir)
      zero_shot[retriever] = train_lib.run_experiment(
          configs.load_experiment("openqa_cpu", [config_file],
                                  overrides(label, "qa_test", frozen=True)),
          start_dir, mode="eval")
    after = train_lib.run_experiment(params, os.path.join(base, slug(label)), mode="eval")
    results[label] = dict(em=after["official_exact_match"], top_5_match=after["top_5_match"],
                          zero_shot_recall_at_5=zero_shot[retriever]["top_5_match"],
                          questions=after["questions"])
    say(f"seed {seed} {label}: EM {results[label]['em']:.3f}, zero-shot R@5 "
         f"{results[label]['zero_shot_recall_at_5']:.3f}")
  return results


# ------------------------------------------------------------------------------- Table 3 --
def table3_probabilities(data: Dict, realm_dir: str, bert_dir: str) -> List[Dict]:
  """Per held-out masked sentence: ``p(y|x)`` of the span (the product over its masked tokens)
  from the "BERT" reader and from REALM's reader with the null block, REALM's reader given the
  best-ranked block that holds the answer, and REALM's marginal over its candidates (the null
  block and its top k - 1)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from realm_tf import configs  # pylint: disable=g-import-not-at-top
  from realm_tf import model_dir as model_dir_lib  # pylint: disable=g-import-not-at-top
  from realm_tf.data import answers  # pylint: disable=g-import-not-at-top
  from realm_tf.modeling import losses  # pylint: disable=g-import-not-at-top
  from realm_tf.tasks.realm_pretrain import DEVICE_FEATURES  # pylint: disable=g-import-not-at-top
  from official.core import task_factory  # pylint: disable=g-import-not-at-top
  vocab, dirs = data["files"]["vocab"], data["dirs"]
  n = demo.vocab_size(vocab)
  params = configs.load_experiment(
      "realm_pretrain_cpu", [os.path.join(demo.CONFIG_DIR, "realm_pretrain_cpu__demo.yaml")],
      ",".join([f"task.model.vocab_file={vocab}", f"task.model.retriever.encoder.vocab_size={n}",
                f"task.model.reader.encoder.vocab_size={n}",
                f"task.validation_data.input_path={os.path.join(dirs['pretrain'], 'eval-*')}",
                f"task.validation_data.blocks_dir={dirs['blocks']}"]))
  task = task_factory.get_task(params.task)
  realm = task.build_model()
  model_dir_lib.restore(model_dir_lib.latest_checkpoint(realm_dir), **realm.checkpoint_items)
  bert = task.build_model()
  model_dir_lib.restore(model_dir_lib.latest_checkpoint(bert_dir), allow_missing=True,
                        reader=bert.reader)
  builder = task.validation_builder()
  examples = task.loader(params.task.validation_data).read_all()
  top, ranked, _ = task.exact_candidates(realm, examples)
  gold = top.copy()
  keep = []
  for i, (row, uid, answer) in enumerate(zip(ranked, examples["source_uid"],
                                             examples["answer"])):
    holding = [b for b in builder.non_trivial(row, uid)
               if answers.holds_answer(builder.bodies_text[b], answer)]
    if holding:
      keep.append(i)
      gold[i, 1] = holding[0]

  def span_log_p(model, candidates, which):
    out = []
    for s in range(0, len(ranked), 64):
      sl = slice(s, s + 64)
      feats = builder.features({k: v[sl] for k, v in examples.items()}, candidates=candidates[sl])
      outputs = model({k: feats[k] for k in DEVICE_FEATURES}, training=False)
      m = losses.realm_metrics(outputs["retrieval_logits"], outputs["mlm_logits"],
                               feats["mlm_ids"], feats["mlm_weights"])
      w = feats["mlm_weights"]
      if which == "marginal":
        out.append((m["token_log_p"].numpy() * w).sum(1))
      else:
        out.append((m["token_log_p_given_z"].numpy()[:, which] * w).sum(1))
    return np.concatenate(out)

  bert_null = span_log_p(bert, top, 0)
  realm_null = span_log_p(realm, top, 0)
  realm_gold = span_log_p(realm, gold, 1)
  realm_marginal = span_log_p(realm, top, "marginal")
  rows = []
  for i in keep:
    rows.append(dict(sentence=examples["sentence"][i].decode(),
                     answer=examples["answer"][i].decode(),
                     gold_block=builder.bodies_text[gold[i, 1]],
                     gold_in_top8=bool(gold[i, 1] in top[i, 1:]),
                     bert_null=float(np.exp(bert_null[i])), realm_null=float(np.exp(realm_null[i])),
                     realm_gold=float(np.exp(realm_gold[i])),
                     realm_marginal=float(np.exp(realm_marginal[i]))))
  return rows


TABLE3_COLUMNS = (("bert_null", "BERT stand-in, null block"),
                  ("realm_null", "REALM reader, null block"),
                  ("realm_gold", "REALM reader, given the block with the answer"),
                  ("realm_marginal", "REALM, marginalized over its candidates"))


# ------------------------------------------------------------------------------- output --
def write_table(out: str, name: str, header: Sequence[str], rows: Sequence[Sequence],
                note: str = "") -> str:
  md = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  md += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
  text = "\n".join(md) + ("\n\n" + note if note else "") + "\n"
  with open(os.path.join(out, f"{name}.md"), "w") as f:
    f.write(text)
  with open(os.path.join(out, f"{name}.csv"), "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(header)
    writer.writerows(rows)
  return text


def read_validation_curves(model_dir: str) -> Dict[str, List]:
  """``{tag: [(step, value)]}`` from a run's ``validation/`` TensorBoard events."""
  from realm_tf import model_dir as model_dir_lib  # pylint: disable=g-import-not-at-top
  return model_dir_lib.read_summaries(model_dir, "validation")


def plot_staleness(out: str, curves: Dict[str, List[Dict]], tags: Sequence[str]) -> str:
  """Mean over seeds of each tag over steps, refreshed vs stale (one panel per tag)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  tags = [t for t in tags if any(t in c for runs in curves.values() for c in runs)]
  fig, axes = plt.subplots(1, len(tags), figsize=(4.5 * len(tags), 3.6), squeeze=False)
  labels = {"realm": f"refreshed every {FLAGS.refresh_every} steps",
            "stale": f"{FLAGS.staleness}x staler"}
  for ax, tag in zip(axes[0], tags):
    for name, runs in curves.items():
      series = [dict(c.get(tag, [])) for c in runs]
      steps = sorted(set.intersection(*[set(s) for s in series])) if series else []
      if not steps:
        continue
      values = np.array([[s[t] for t in steps] for s in series])
      mean = values.mean(0)
      ax.plot(steps, mean, marker="o", label=labels.get(name, name))
      if len(series) > 1:
        half = np.array([mean_ci(values[:, j])[1] for j in range(len(steps))])
        ax.fill_between(steps, mean - half, mean + half, alpha=0.2)
    ax.set_title(tag)
    ax.set_xlabel("pre-training step")
    ax.grid(alpha=0.3)
  axes[0][0].legend()
  fig.suptitle(f"REALM pre-training, mean and 95% CI over {FLAGS.seeds} seeds")
  fig.tight_layout()
  path = os.path.join(out, "staleness.png")
  fig.savefig(path, dpi=120)
  return path


def render(out: str, runs: Dict, tables: Sequence[str], setting: str) -> str:
  """Writes the requested tables (Markdown + CSV) and the staleness plot from ``runs``
  (``runs.json``: per seed, Open-QA rows, Table 3 rows and validation curves); returns the
  Markdown."""
  seeds = list(runs["seeds"].values())
  printed = []
  if "1" in tables:
    body = [[label, fmt([s["openqa"][label]["em"] for s in seeds]),
             " / ".join(f"{v:.1f}" for v in PAPER_TABLE1["ORQA" if "ORQA" in label else
                                                          "REALM (Wikipedia)"])]
            for label in TABLE1_ROWS]
    printed.append(write_table(out, "table1", ["model", "EM, synthetic world (%)",
                                               "paper EM NQ / WQ / CT"], body, setting))
  if "2" in tables:
    labels = [label for label in TABLE2_ROWS if label in seeds[0]["openqa"]]
    body = [[label, fmt([s["openqa"][label]["em"] for s in seeds]),
             fmt([s["openqa"][label]["zero_shot_recall_at_5"] for s in seeds]),
             f"{PAPER_TABLE2[label][0]:.1f} / {PAPER_TABLE2[label][1]:.1f}"
             if PAPER_TABLE2[label] else "not in the paper"]
            for label in labels]
    em = {label: [s["openqa"][label]["em"] for s in seeds] for label in labels}
    r5 = {label: [s["openqa"][label]["zero_shot_recall_at_5"] for s in seeds]
          for label in labels}
    orderings = [
        ("REALM vs baseline (EM)", separated(em["REALM"], em["baseline (ORQA)"])),
        ("salient vs random span (EM)", separated(em["REALM"], em["random span masks"])),
        ("random span vs uniform (EM)", separated(em["random span masks"],
                                                  em["random uniform masks"])),
        ("fresh vs 30x staler (EM)", separated(em["REALM"], em["30x staler index"])),
        ("fresh vs 30x staler (zero-shot R@5)", separated(r5["REALM"], r5["30x staler index"])),
        ("REALM vs baseline retriever (zero-shot R@5)", separated(r5["REALM"],
                                                                   r5["baseline (ORQA)"])),
    ]
    if TRAINABLE_ROW in em:
      orderings.append(("block tower fine-tuned + refresher vs frozen index (EM)",
                        separated(em[TRAINABLE_ROW], em["REALM"])))
    note = setting + "\n\nOrderings (95% intervals disjoint?):\n" + "\n".join(
        f"- {name}: {verdict}" for name, verdict in orderings)
    printed.append(write_table(out, "table2", ["row", "EM (%)", "zero-shot recall@5 (%)",
                                               "paper EM / R@5"], body, note))
    curves = {name: [s["curves"][name] for s in seeds if name in s["curves"]]
              for name in ("realm", "stale")}
    plot_staleness(out, curves, ["recall@5", "qa_recall@5", "retrieval_utility"])
  if "3" in tables:
    import numpy as np  # pylint: disable=g-import-not-at-top
    medians = []
    for key, _ in TABLE3_COLUMNS:
      medians.append([float(np.median([r[key] for r in s["table3"]])) for s in seeds])
    body = [[label, f"{statistics.fmean(m):.3g}",
             " / ".join(f"{v:.3g}" for v in m)] for (_, label), m in zip(TABLE3_COLUMNS, medians)]
    examples = seeds[0]["table3"][:FLAGS.table3_examples]
    lines = [f"- \"{r['sentence']}\" -> {r['answer']!r}: " + ", ".join(
        f"{key} {r[key]:.3g}" for key, _ in TABLE3_COLUMNS) for r in examples]
    note = (f"{setting}\n\nMedian over the held-out sentences whose answer some other block "
            f"holds ({len(seeds[0]['table3'])} in seed 0). Seed 0's first examples:\n" +
            "\n".join(lines))
    printed.append(write_table(out, "table3", ["p(answer | x)", "median (mean over seeds)",
                                               "per seed"], body, note))
  return "\n\n".join(printed)


def paper_scale() -> None:
  """The paper-scale sequence of commands (TPU; nothing runs here)."""
  print("""Paper scale (Cloud TPU; see README "On Cloud TPU"):
  1. realm-convert --tf1_checkpoint=uncased_L-12_H-768_A-12/bert_model.ckpt \\
       --bert_config=uncased_L-12_H-768_A-12/bert_config.json \\
       --vocab_file=uncased_L-12_H-768_A-12/vocab.txt --output_dir=$B/converted/bert_base
  2. python -m data_prep.pipeline --corpus=enwiki-20181220-pages-articles.xml.bz2 \\
       --vocab_file=$B/converted/bert_base/vocab.txt --output_dir=$B/data --runner=DataflowRunner
     (and --masking=random_span / uniform into other directories for Table 2's ablations)
  3. realm-train --experiment=ict_paper --config_file=experiments/configs/ict_paper__tpu.yaml \\
       --tpu=$TPU --model_dir=$B/ict          (task.init_checkpoint=$B/converted/bert_base)
  4. realm-refresh --model_dir=$B/realm --index_dir=$B/realm_index --blocks_dir=$B/data/blocks \\
       --min_step_interval=500 &   (x30 for the 30x staler index)
     realm-train --experiment=realm_pretrain_paper \\
       --config_file=experiments/configs/realm_pretrain_paper__tpu.yaml --tpu=$TPU \\
       --model_dir=$B/realm   (retriever_init_checkpoint=$B/ict, reader_init_checkpoint=bert)
  5. realm-index build --model_dir=$B/realm --blocks_dir=$B/data/blocks --index_dir=$B/qa_index
     realm-train --experiment=openqa_nq_paper \\
       --config_file=experiments/configs/openqa_nq_paper__tpu.yaml --mode=train_and_eval ...
     (wq, ct alike; Table 2 mixes towers with retriever_/reader_init_checkpoint)
  6. realm-eval --model_dir=$B/openqa_nq --index_dir=$B/qa_index --dataset=nq --qa_dir=$B/qa
Released-model route: realm-convert the orqa_{nq,wq}_model_from_realm checkpoints
(--block_emb_checkpoint), realm-index import / build, realm-eval (README).
Paper (EM, NQ / WQ / CT):""")
  for name, values in PAPER_TABLE1.items():
    print(f"  {name:20s} " + " / ".join(f"{v:.1f}" for v in values))


def main(argv):
  del argv
  if FLAGS.scale == "paper":
    paper_scale()
    return
  from realm_tf import tasks  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  tables = sorted(set(FLAGS.table))
  if not set(tables) <= {"1", "2", "3"}:
    raise app.UsageError(f"--table takes 1, 2 and/or 3, got {FLAGS.table}")
  start = time.time()
  out = os.path.abspath(FLAGS.output_dir)
  os.makedirs(out, exist_ok=True)
  data = prepare(out)
  warm = warm_starts(out, data)
  rows = {k: v for k, v in TABLE2_ROWS.items()
          if FLAGS.trainable_row or k != TRAINABLE_ROW} if "2" in tables else (
      {k: TABLE2_ROWS[k] for k in TABLE1_ROWS} if "1" in tables else {})
  needed = ["realm"] + [n for n in PRETRAIN_RUNS if n != "realm" and any(
      n in sources for sources in rows.values())]
  runs: Dict[str, Dict] = {"seeds": {}}
  earlier = {}
  if os.path.exists(os.path.join(out, "runs.json")):
    with open(os.path.join(out, "runs.json")) as f:
      earlier = json.load(f)["seeds"]
  for seed in range(FLAGS.seeds):
    realm_dirs = pretrain(out, data, warm, seed, needed)
    sources = dict(warm, **realm_dirs)
    done = earlier.get(str(seed), {}).get("openqa", {})
    seed_runs = {"openqa": finetune(out, data, sources, seed, rows, done) if rows else {}}
    if "3" in tables:
      seed_runs["table3"] = table3_probabilities(data, realm_dirs["realm"], warm["bert"])
    seed_runs["curves"] = {name: read_validation_curves(realm_dirs[name])
                           for name in ("realm", "stale") if name in realm_dirs}
    runs["seeds"][seed] = seed_runs
    with open(os.path.join(out, "runs.json"), "w") as f:
      json.dump(runs, f, indent=1, default=float)
  minutes = (time.time() - start) / 60
  setting = (f"{FLAGS.seeds} seeds; synthetic world x{FLAGS.world_scale:g} "
             f"({data['num_test_questions']} test questions, {data['num_held_out_sentences']} "
             f"held-out masked sentences); REALM {FLAGS.realm_steps} steps, Open-QA "
             f"{FLAGS.openqa_steps} steps; index refreshed every {FLAGS.refresh_every} steps; "
             f"{minutes:.0f} min on this machine")
  print(render(out, runs, tables, setting))
  say(f"finished in {minutes:.1f} min; tables in {out}")


def run():
  # The demo's knobs, at the tables' sizes.
  for name, value in (("world_scale", 5.0), ("realm_steps", 500), ("openqa_steps", 300),
                      ("reading_steps", 6000), ("refresh_every", 10),
                      ("output_dir", "tables_out")):
    FLAGS.set_default(name, value)
  cli.run_main(main)


if __name__ == "__main__":
  run()
