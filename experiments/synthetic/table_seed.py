r"""One seed of the CPU-scale Tables 1-3: every run, from the warm starts to the test numbers.

``python -m experiments.synthetic.tables --seed=N`` calls :func:`run_seed`; that driver renders
the tables from the seed files it writes. A seed is self-contained: on the one synthetic world
that every seed and row shares (``--world_seed``; its questions and blocks), it trains its own
warm starts (the "BERT" reading reader and the ICT retriever), its REALM pre-training runs each
beside its refresher, and its Open-QA fine-tunes, all seeded with ``N`` (data order, mask
draws, ICT pairs; fresh heads and dropout are not seeded), and writes one small JSON file,
``seed<N>.json``, under ``--results_dir``. Its settings are the demo's ``stages.Recipe`` and a
:class:`TableSettings`, which ``synthetic/tables.py`` builds from its flags. Everything else
goes under ``--output_dir``; a rerun into the same directory skips every finished stage
(``TRAINING_DONE``, ``prepared.json``).

Pre-training runs (``PRETRAIN_RUNS``), side by side, each beside its refresher:

* ``realm``: salient spans of the encyclopedia's own sentences (X = Z), index refreshed at every
  checkpoint; ``stale``: the same with the index at most every ``staleness x refresh_every``
  steps; ``random_span`` and ``uniform``: the other maskings;
* ``news``: salient spans of the world's news items (``synthetic_world.generate_news``), which
  are not blocks of the encyclopedia (X != Z: ``data_prep --source_corpus news``), so nothing
  is excluded from their candidates: the paper's CC-News setting.

Open-QA rows (``ROWS``): each from a (retriever, reader) pair of those runs or the warm starts,
fine-tuned for the same steps on the same questions against a frozen brute-force index of its
retriever's block tower; EM and top-5 match on the test questions after fine-tuning, and
zero-shot recall@5 (before fine-tuning) per question, split by whether the news covers the
question's subject. Table 3's probabilities come from the ``realm`` run.

``fingerprints`` are what ``synthetic/report.py`` compares before mixing seeds: ``code``, the
SHA-256 of the source files that compute a seed's numbers (``CODE_FILES``), and ``config``,
that of every setting and of the YAML files the runs load.
"""

import dataclasses
import glob
import hashlib
import json
import os
import subprocess
from typing import Dict, List, Sequence

import numpy as np
from official.core import task_factory

from data_prep import pipeline
from data_prep import pretrain_examples
from data_prep import synthetic_world
from data_prep import useful_examples
from experiments.pipeline import stages
from experiments.pipeline.common import Clock
from experiments.pipeline.common import write_json
from realm_tf import hardware
from realm_tf import model_dir as model_dir_lib
from realm_tf.data import answers
from realm_tf.modeling import losses
from realm_tf.tasks.realm_pretrain import DEVICE_FEATURES

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Pre-training runs: name -> (examples, refreshed at every checkpoint (1) or staleness x staler).
PRETRAIN_RUNS = {"realm": ("salient", 1), "stale": ("salient", None),
                 "random_span": ("random_span", 1), "uniform": ("uniform", 1),
                 "news": ("news", 1)}
PLOTTED = ("realm", "stale", "news")  # validated every validation_every steps: the curves
NEWS_STYLE = "teaching"   # synthetic_world.generate_news's style: each fact four times
NEWS_ROW = "REALM, news pre-training (X != Z)"
# Open-QA rows: label -> (retriever source, reader source); "ict"/"bert" are the warm starts.
ROWS = {
    "REALM": ("realm", "realm"),
    "REALM retriever + baseline encoder": ("realm", "bert"),
    "baseline retriever + REALM encoder": ("ict", "realm"),
    "baseline (ORQA)": ("ict", "bert"),
    "random uniform masks": ("uniform", "uniform"),
    "random span masks": ("random_span", "random_span"),
    "30x staler index": ("stale", "stale"),
    NEWS_ROW: ("news", "news"),
}
# The source files whose code computes a seed's numbers. Not in it: serving, index storage,
# publication and live updates (tested against brute force; the runs use exact indexes), the
# binaries' argument parsing, and the rendering of the tables.
CODE_FILES = ("data_prep/*.py", "realm_tf/modeling/*.py", "realm_tf/tasks/*.py",
              "realm_tf/openqa/*.py", "realm_tf/configs.py", "realm_tf/tokenization.py",
              "realm_tf/train_lib.py", "realm_tf/data/features.py", "realm_tf/data/loaders.py",
              "realm_tf/data/answers.py", "realm_tf/data/block_store.py",
              "realm_tf/data/qa.py", "realm_tf/retrieval/index/brute_force.py",
              "realm_tf/retrieval/publication/corpus_embedding.py",
              "experiments/pipeline/stages.py",
              "experiments/synthetic/table_seed.py")
CONFIG_FILES = ("reader_read_cpu__demo.yaml", "ict_cpu__demo.yaml",
                "realm_pretrain_cpu__demo.yaml", "openqa_cpu__demo.yaml")
# The settings a seed's numbers depend on (the recipe's and the tables' own).
SETTINGS = ("world_seed", "world_scale", "reading_worlds", "reading_steps", "distractor_steps",
            "distractors", "ict_steps", "ict_learning_rate", "ict_from_reader", "realm_steps",
            "realm_learning_rate", "refresh_every", "openqa_steps", "openqa_learning_rate",
            "qa_test_fraction", "eval_fraction", "staleness", "validation_every", "news_share",
            "lr_retriever", "table3_examples", "precision")


@dataclasses.dataclass(frozen=True)
class TableSettings:
  """The tables' own settings beside the recipe (``synthetic/tables.py`` makes a flag of each)."""
  world_seed: int = 0             # the one synthetic world every seed and row shares
  qa_test_fraction: float = 0.4   # share of the world's questions held out as test
  eval_fraction: float = 0.2      # share of blocks whose masked sentences are held out
  staleness: int = 30             # how many times staler the stale-index ablation's index is
  validation_every: int = 100     # validation interval of the plotted runs
  table3_examples: int = 5        # held-out sentences kept for Table 3's examples
  news_share: float = 1.0         # share of the entities whose facts the news restates
  lr_retriever: float = 1.0       # task.lr_retriever of every REALM run


# --------------------------------------------------------------------------- fingerprints --
def code_fingerprint(root: str = REPO) -> str:
  """SHA-256 over ``CODE_FILES``' paths and contents (sorted), 16 hex digits."""
  h = hashlib.sha256()
  for path in sorted({p for pattern in CODE_FILES for p in glob.glob(os.path.join(root, pattern))}):
    with open(path, "rb") as f:
      h.update(os.path.relpath(path, root).encode() + b"\0" + hashlib.sha256(f.read()).digest())
  return h.hexdigest()[:16]


def settings(recipe: stages.Recipe, table: TableSettings) -> Dict:
  """Every setting of a seed's runs: ``SETTINGS``' values (of ``recipe`` and ``table``),
  the rows and runs, and the YAML files' contents."""
  given = dict(dataclasses.asdict(recipe), **dataclasses.asdict(table))
  out = {name: given[name] for name in SETTINGS}
  out["rows"] = {k: list(v) for k, v in ROWS.items()}
  out["pretrain_runs"] = {k: list(v) for k, v in PRETRAIN_RUNS.items()}
  out["news_style"] = NEWS_STYLE
  for name in CONFIG_FILES:
    with open(os.path.join(stages.CONFIG_DIR, name)) as f:
      out[f"yaml:{name}"] = f.read()
  return out


def config_fingerprint(config: Dict) -> str:
  return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


def git_commit() -> str:
  try:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                          text=True, check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return "unknown"


# ---------------------------------------------------------------------------------- data --
def prepare(clock: Clock, out: str, table: TableSettings, recipe: stages.Recipe) -> Dict:
  """The shared world and its data (kept in ``out/prepared.json``; a rerun reuses them): the
  encyclopedia's blocks, masked sentences (three maskings) and ICT examples, the news's masked
  sentences (X != Z), the reading worlds, and each test question's subject."""
  done = os.path.join(out, "prepared.json")
  if os.path.exists(done):
    with open(done) as f:
      return json.load(f)
  seed = table.world_seed
  world = stages.make_world(seed, seed, recipe.world_scale)
  files = synthetic_world.write_world(world, os.path.join(out, "world"), vocab_size=3000,
                                      whole_word_names=True,
                                      qa_test_fraction=table.qa_test_fraction,
                                      news_seed=seed, news_share=table.news_share,
                                      news_style=NEWS_STYLE)
  common = dict(block_seq_length=32, query_seq_length=32, examples_per_sentence=2,
                eval_fraction=table.eval_fraction, seed=seed)
  prepared = pipeline.prepare_all(files["articles"], files["vocab"], os.path.join(out, "data"),
                                  patterns_file=files["patterns"], **common)
  dirs = dict(prepared["dirs"], pretrain_salient=prepared["dirs"]["pretrain"])
  for masking in ("random_span", "uniform"):
    d = os.path.join(out, "data", f"pretrain_{masking}")
    pretrain_examples.run_pretrain_examples(
        dirs["sentences"], files["vocab"], d, masking=masking, query_seq_length=32,
        examples_per_sentence=2, eval_fraction=table.eval_fraction, seed=seed)
    dirs[f"pretrain_{masking}"] = d
  # Nothing reads a news eval split (the news run validates on the encyclopedia's held-out
  # sentences): every news item trains.
  news = pipeline.prepare_all(files["news"], files["vocab"], os.path.join(out, "news"),
                              patterns_file=files["patterns"], source_corpus="news",
                              **dict(common, eval_fraction=0.0))
  dirs["pretrain_news"] = news["dirs"]["pretrain"]
  check = news_check(clock, files, dirs["sentences"], news["dirs"]["sentences"], table)
  reading = stages.prepare_reading_worlds(out, files["vocab"],
                                          stages.reading_worlds(seed, recipe), seed)
  subject = {q["question"]: f["subject"] for q, f in synthetic_world.qa_facts(world)}
  with open(files["qa_test"]) as f:
    test = [json.loads(line)["question"] for line in f if line.strip()]
  prepared = dict(files=files, dirs=dirs, reading=reading, num_test_questions=len(test),
                  num_blocks=prepared["blocks"]["num_blocks"],
                  num_held_out_sentences=prepared["pretrain"]["num_eval"],
                  num_news_sentences=news["pretrain"]["num_train"],
                  test_subjects={q: subject[q] for q in test}, news_check=check)
  clock.say(f"world: {len(world.articles)} articles, {prepared['num_blocks']} blocks, "
      f"{prepared['num_held_out_sentences']} held-out masked sentences, {len(test)} test "
      f"questions; news: {prepared['num_news_sentences']} masked training sentences")
  with open(done, "w") as f:
    json.dump(prepared, f)
  return prepared


class NewsCannotTeachError(RuntimeError):
  """The news corpus has fewer useful examples than X = Z (``data_prep.useful_examples``)."""


def news_check(clock: Clock, files: Dict, z_sentences: str, news_sentences: str,
               table: TableSettings) -> Dict:
  """The model-free check (``data_prep.useful_examples``) of the news against X = Z on this
  world; raises ``NewsCannotTeachError`` when the news has fewer useful examples per fact or a
  smaller share of facts with one, since its rows would then measure a corpus that cannot
  teach. Returns both counts (without the per-fact lists)."""
  with open(files["facts"]) as f:
    facts = [json.loads(line) for line in f if line.strip()]
  result = useful_examples.compare(
      z_sentences, facts, table.eval_fraction, news_sentences, 0.0,
      useful_examples.test_fact_indices(files["qa"], files["qa_test"]))
  for line in useful_examples.lines(result):
    clock.say("useful examples: " + line)
  lacking = useful_examples.shortfall(result)
  if lacking:
    raise NewsCannotTeachError(
        "refusing to run the news rows: the news corpus teaches less than X = Z ("
        + "; ".join(lacking) + f"); see python -m experiments.synthetic.tables --check_news "
        f"(news_share {table.news_share:g}, style {NEWS_STYLE!r})")
  return {k: {n: v for n, v in r.items() if n != "counts"} for k, r in result.items()}


# ---------------------------------------------------------------------------- warm starts --
def warm_start_stages(recipe: stages.Recipe, data: Dict, out: str) -> Dict:
  """The warm starts of a seed trained in ``out``: the reader's, then ICT."""
  corpora = stages.reading_corpora(out, data["reading"])
  vocab = data["files"]["vocab"]
  readers = stages.reader_stages(recipe, vocab, corpora, out)
  return dict(readers, **stages.ict_stage(recipe, vocab, data["dirs"]["ict"],
                                          os.path.join(out, stages.final_reader(readers))))


def warm_starts(clock: Clock, out: str, data: Dict, seed: int,
                recipe: stages.Recipe) -> Dict[str, str]:
  """This seed's "BERT" reader and ICT retriever (``warm_start_stages``, each stage's
  data order and TensorFlow's global seed set to ``seed``), under ``out``: ``{"bert": the
  reader REALM and the baseline start from, "ict": ..., and the stages}``."""
  done = stages.train_warm_starts(clock, out, warm_start_stages(recipe, data, out), seed=seed)
  dirs = {name: model_dir for name, (model_dir, _) in done.items()}
  dirs["bert"] = dirs[stages.final_reader(dirs)]
  return dirs


# ------------------------------------------------------------------------- pre-training --
def pretrain(clock: Clock, base: str, data: Dict, warm: Dict[str, str], seed: int,
             recipe: stages.Recipe, table: TableSettings) -> Dict[str, str]:
  """This seed's REALM pre-training runs (``PRETRAIN_RUNS``) side by side, each beside its
  refresher (the stale run's builds at most every ``staleness x refresh_every`` steps); the
  ``PLOTTED`` runs validate every ``validation_every`` steps, dev questions included.
  Returns their dirs."""
  vocab, dirs = data["files"]["vocab"], data["dirs"]
  jobs, out = [], {}
  for name, (examples, interval) in PRETRAIN_RUNS.items():
    model_dir = out[name] = os.path.join(base, name)
    plotted = name in PLOTTED
    where = stages.PretrainData(dirs[f"pretrain_{examples}"], dirs["blocks"],
                                dirs["pretrain_salient"])
    params = stages.realm_params(
        recipe, vocab, where, model_dir + "_index", warm["ict"], warm["bert"],
        validate_every=table.validation_every if plotted else None, seed=seed,
        qa_eval=data["files"]["qa_dev"] if plotted else "",
        more={"task.lr_retriever": table.lr_retriever})
    jobs += stages.realm_jobs(
        model_dir, params, dirs["blocks"], validate=plotted,
        min_interval=0 if interval == 1 else recipe.refresh_every * table.staleness)
  if jobs:
    clock.say(f"seed {seed}: REALM pre-training {', '.join(PRETRAIN_RUNS)} "
              f"({recipe.realm_steps} steps each, side by side); logs in {base}/<run>.*.log")
    stages.run_side_by_side(clock, "REALM", jobs, recipe.parallel_runs)
  return out


# ------------------------------------------------------------------------------ Open-QA --
def slug(label: str) -> str:
  return "openqa_" + "".join(c if c.isalnum() else "_" for c in label.lower()).strip("_")


def finetune(clock: Clock, base: str, data: Dict, sources: Dict[str, str], seed: int,
             recipe: stages.Recipe) -> Dict:
  """The Open-QA rows (``ROWS``) side by side (``stages.openqa_rows``); label -> {"em",
  "top_5_match" (fine-tuned), "zero_shot_recall_at_5" (the initialization's top-5 match),
  "questions", and per test question in file order: "em_by_question" (a 0/1 string: the
  prediction is an exact match) and "predictions" (the predicted answers)}."""
  runs = {slug(label): pair for label, pair in ROWS.items()}
  done = stages.openqa_rows(clock, recipe, base, runs, sources, data["files"],
                            data["dirs"]["blocks"], seed=seed)
  results = {}
  for label in ROWS:
    before, after = done[slug(label)]["before"], done[slug(label)]["after"]
    records = after["question_records"]
    results[label] = dict(em=after["official_exact_match"], top_5_match=after["top_5_match"],
                          zero_shot_recall_at_5=before["top_5_match"],
                          questions=after["questions"],
                          em_by_question="".join("1" if r["correct"] else "0" for r in records),
                          predictions=[r["prediction"] for r in records])
    clock.say(f"seed {seed} {label}: EM {results[label]['em']:.3f}, zero-shot R@5 "
              f"{results[label]['zero_shot_recall_at_5']:.3f}")
  return results


# ---------------------------------------------------------------- zero-shot, per question --
def realm_task(data: Dict, qa_path: str = ""):
  """A REALM pre-training task over the world's blocks (the demo's model shapes)."""
  vocab, dirs = data["files"]["vocab"], data["dirs"]
  params = stages.experiment_params(
      "realm_pretrain_cpu", [stages.config("realm_pretrain_cpu")], dict(stages.towers(vocab), **{
          "task.validation_data.input_path": os.path.join(dirs["pretrain"], "eval-*"),
          "task.validation_data.blocks_dir": dirs["blocks"], "task.qa_eval_path": qa_path}))
  return task_factory.get_task(params.task)


def zero_shot_by_question(data: Dict, retriever_dir: str) -> List[bool]:
  """Per test question, in file order: does one of the 5 blocks that ``retriever_dir``'s towers
  retrieve exactly hold an answer (the REALM task's ``qa_recall@5``, per question)?"""
  task = realm_task(data, data["files"]["qa_test"])
  model = task.build_model()
  model_dir_lib.restore(model_dir_lib.latest_checkpoint(retriever_dir),
                        query_embedder=model.query_embedder, block_embedder=model.block_embedder)
  return task.qa_hits(model, task.corpus_index(model), task.validation_builder(), k=5)


def split_by_coverage(hits: Sequence[bool], data: Dict) -> Dict:
  """Recall overall and over the test questions whose subject the news covers / never covers."""
  with open(data["files"]["news_coverage"]) as f:
    covered = set(json.load(f)["covered"])
  subjects = list(data["test_subjects"].values())
  out = {"overall": sum(hits) / len(hits), "questions": len(hits)}
  for name, keep in (("covered", True), ("never_covered", False)):
    chosen = [h for h, s in zip(hits, subjects) if (s in covered) == keep]
    out[name] = sum(chosen) / len(chosen) if chosen else float("nan")
    out[f"{name}_questions"] = len(chosen)
  return out


# ------------------------------------------------------------------------------- Table 3 --
def table3_probabilities(data: Dict, realm_dir: str, bert_dir: str) -> List[Dict]:
  """Per held-out masked sentence whose answer another block holds: ``p(y|x)`` of the span
  (the product over its masked tokens) from the "BERT" reader and from REALM's reader with the
  null block, REALM's reader given the best-ranked block that holds the answer, and REALM's
  marginal over its candidates (the null block and its top k - 1)."""
  task = realm_task(data)
  realm = task.build_model()
  model_dir_lib.restore(model_dir_lib.latest_checkpoint(realm_dir), **realm.checkpoint_items)
  bert = task.build_model()
  model_dir_lib.restore(model_dir_lib.latest_checkpoint(bert_dir), reader=bert.reader)
  builder = task.validation_builder()
  examples = task.loader(task.task_config.validation_data).read_all()
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
  return [dict(sentence=examples["sentence"][i].decode(), answer=examples["answer"][i].decode(),
               gold_block=builder.bodies_text[gold[i, 1]],
               gold_in_top8=bool(gold[i, 1] in top[i, 1:]),
               bert_null=float(np.exp(bert_null[i])), realm_null=float(np.exp(realm_null[i])),
               realm_gold=float(np.exp(realm_gold[i])),
               realm_marginal=float(np.exp(realm_marginal[i]))) for i in keep]


TABLE3_COLUMNS = (("bert_null", "BERT stand-in, null block"),
                  ("realm_null", "REALM reader, null block"),
                  ("realm_gold", "REALM reader, given the block with the answer"),
                  ("realm_marginal", "REALM, marginalized over its candidates"))


# ---------------------------------------------------------------------------------- seed --
def run_seed(clock: Clock, out: str, results_dir: str, seed: int, recipe: stages.Recipe,
             table: TableSettings) -> str:
  """Runs (or finishes) seed ``seed`` under ``out``; writes ``results_dir/seed<seed>.json``
  and returns its path."""
  config = settings(recipe, table)
  fingerprints = {"code": code_fingerprint(), "config": config_fingerprint(config)}
  with clock.stage("data"):
    data = prepare(clock, out, table, recipe)
  base = os.path.join(out, f"seed{seed}")
  os.makedirs(base, exist_ok=True)
  with clock.stage("warm starts"):
    warm = warm_starts(clock, base, data, seed, recipe)
  with clock.stage("pre-training"):
    realm_dirs = pretrain(clock, base, data, warm, seed, recipe, table)
  sources = dict(warm, **realm_dirs)
  with clock.stage("Open-QA"):
    openqa = finetune(clock, base, data, sources, seed, recipe)
  with clock.stage("zero-shot by question"):
    zero_shot = {}
    for retriever in dict.fromkeys(r for r, _ in ROWS.values()):
      hits = zero_shot_by_question(data, sources[retriever])
      zero_shot[retriever] = dict(split_by_coverage(hits, data), hits="".join(
          "1" if h else "0" for h in hits))
  with clock.stage("Table 3"):
    table3 = table3_probabilities(data, realm_dirs["realm"], warm["bert"])
  curves = {name: model_dir_lib.read_summaries(realm_dirs[name], "validation")
            for name in PLOTTED}
  ages = {name: stages.index_ages(model_dir) for name, model_dir in realm_dirs.items()}
  result = dict(
      seed=seed, fingerprints=fingerprints, settings={k: v for k, v in config.items()
                                                      if not k.startswith("yaml:")},
      git_commit=git_commit(), minutes=round(clock.minutes(), 1), cpu=hardware.cpu_model(),
      stages=clock.laps,
      world=dict(num_blocks=data["num_blocks"], test_questions=data["num_test_questions"],
                 held_out_sentences=data["num_held_out_sentences"],
                 news_sentences=data["num_news_sentences"]),
      test_questions=list(data["test_subjects"]), news_check=data["news_check"],
      openqa=openqa, zero_shot=zero_shot, index_ages=ages,
      table3=dict(examples=table3[:table.table3_examples], count=len(table3),
                  medians={k: float(np.median([r[k] for r in table3])) if table3 else None
                           for k, _ in TABLE3_COLUMNS}),
      curves=curves)
  os.makedirs(results_dir, exist_ok=True)
  path = os.path.join(results_dir, f"seed{seed}.json")
  write_json(path, result, indent=1, default=float)
  clock.say(f"seed {seed}: {clock.summary()} -> {path}")
  return path
