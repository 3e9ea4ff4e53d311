r"""Real text: BM25, MiniLM untrained and ICT-trained, and Open-QA, on Wikipedia and SQuAD.

  python -m experiments.real_text.main --output_dir=real_text_out            # the real size
  python -m experiments.real_text.main --output_dir=tiny --max_articles=4 --max_paragraphs=4 \
      --max_pages=2 --nosalient_spans                                    # a quick look

The corpus is the enwiki dump slice (``assets/wikipedia``, 106 articles) and every paragraph of
SQuAD v1.1 dev (``assets/squad``, 2,067 paragraphs of 48 articles; a document per paragraph,
titled by its article), made into 288-wordpiece blocks with BERT's uncased vocabulary by the
project's own pipelines. The questions are SQuAD dev's, split by article (MD5 of the title:
60/20/20 train/dev/test, ``data_prep.squad``), so no article of a test question has a training
question. Two retrievers are scored on the test questions:

* **BM25** (``bm25s``, Lucene's variant, k1 = 1.5, b = 0.75, English stop words, no stemming)
  over ``title + body`` of every block;
* **MiniLM (untrained)**: all-MiniLM-L6-v2 converted by ``realm-convert --hf_dir``
  (``checkpoint_convert.convert_hf``) into REALM's retriever, as REALM would start from a BERT
  before ICT: its BERT real, its 128-wide projection freshly initialized (seeded by ``--seed``),
  queries ``[CLS] q [SEP]`` and blocks ``[CLS] title [SEP] body [SEP]``, exact inner-product
  search. From the same encoder pass, a third row shows what the weights do with the mean
  pooling and cosine they were trained with (sentence-transformers' recipe, not REALM's tower).

Recall@k: the share of test questions for which one of the top k blocks holds an answer, by
ORQA's ``HasAnswer`` on the block body (``realm_tf.openqa.inputs.has_answer``: the test of
``realm-eval``'s ``top_k_match``), so the numbers compare with ours.

Stages, each skipped when its output exists (delete a stage's directory to redo it):

1. ``corpus/``: the SQuAD paragraphs as JSON lines, with the dump through ``data_prep.blocks``
   into ``blocks/``; then salient spans (``data_prep.salient_spans``, spaCy) into
   ``sentences/`` unless ``--nosalient_spans``;
2. ``qa/``: ``squad-{train,dev,test}.jsonl`` and ``split.json`` (the articles of each split);
3. ``bm25/``: the top 20 blocks of each test question and its recall;
4. ``minilm_model/`` (the converted model directory), ``minilm/``: embeddings, top 20, recall
   (``--nominilm`` leaves them out: the encoder over every block is the slow part on a CPU);
5. ``ict_examples/``, ``ict_model/`` (ICT from the converted MiniLM: ``ict_params``),
   ``ict/`` and ``ict_index/``: the ICT tower's recall and its frozen index (``--noict``: not run);
6. ``minilm_reader_model/``, ``gold_reader/`` (stage A, ``gold_reader.py``: the
   reader trained on the train articles' questions with their own paragraphs, its dev EM and
   F1, and its EM on the Open-QA test sample read in each question's own paragraph: the
   gold-paragraph row), ``openqa/`` (ORQA's fine-tuning from it, best checkpoint on dev:
   ``openqa_params``), ``openqa_eval/`` (``realm-eval``'s evaluation on the test sample)
   (``--noopenqa``: not run);
7. with ``--realm_seeds``, REALM (``text_realm.py``): ``pretrain/`` (salient-span
   masked sentences of every block, whole blocks held out), ``minilm_mlm/`` (BERT's masked LM
   for the MiniLM reader, its fresh MLM head tied to the word embeddings), ``mlm_reader/`` (its
   reading warm start) and ``mlm_reader_distract/`` (the distractor phase), each with its
   masked-span accuracy, then per seed ``realm_<seed>/`` (REALM beside ``realm-refresh``),
   ``realm_<seed>_test/`` (its tower's test recall, as ICT's) and, with the Open-QA stages,
   the mixed row (ORQA's model reading the REALM tower's blocks) and REALM's own Open-QA row
   (stage A from REALM's reader, ORQA's fine-tuning from REALM's towers):
   ``realm_<seed>_{mixed_eval,gold_reader,openqa,openqa_eval}/``; ``--norealm_test`` (dev
   runs) stops after pre-training;
8. ``results/real_text_retrieval.{md,csv}`` (one row per retriever, 95% Wilson intervals over
   the questions), ``results/real_text_openqa.{md,csv}``, the per-question records
   ``results/real_text_questions.csv`` (each retriever's first-hit rank) and
   ``results/real_text_openqa_questions.csv`` (each Open-QA row's EM and prediction), and
   ``results/real_text_realm.md`` (REALM's data, reader, curves and the pre-registered
   analysis).

The stages live in ``text_stages.py`` and ``text_realm.py`` beside this file (and the shared
``experiments/pipeline/stages.py``: training, configs, the frozen index); this driver reads the
flags and runs the stages in order, then ``report.py`` writes the tables. (``python -m
experiments.real_text``, the old command, still runs this.) The trained stages' sizes are
``text_stages.Budget``'s (flags ``--ict_*``, ``--openqa_*``, ...): ORQA's recipe cut to fit about
100 minutes on 2 cores (experiments/NOTES.md section 18); REALM's are ``text_realm.RealmBudget``'s
(section 30).
"""

import dataclasses
import os
from typing import Dict, Sequence

from absl import flags

from experiments import assets
from experiments.pipeline.common import Clock
from experiments.pipeline.common import interval_text
from experiments.pipeline.common import read_json
from experiments.pipeline.common import write_json
from experiments.real_text import report
from experiments.real_text import text_realm
from experiments.real_text import text_stages as ts
from realm_tf.binaries import cli

FLAGS = flags.FLAGS

# Names the tests and callers use, from the stages.
Budget, RealTextError, TOP_K = ts.Budget, ts.RealTextError, ts.TOP_K
RealmBudget = text_realm.RealmBudget


def check_options(clock: Clock, work: str, options: Dict) -> None:
  """Records the options of a work directory, or checks that they are the recorded ones: a
  stage is skipped when its output exists, so outputs of other options must not be reused.
  A recorded option this run does not pass (``realm.*`` in a run without ``--realm_seeds``)
  governs no stage of this run, so it is no conflict."""
  path = os.path.join(work, "options.json")
  if os.path.exists(path):
    recorded = read_json(path)
    changed = sorted(k for k in set(recorded) & set(options) if recorded[k] != options[k])
    if changed:
      raise RealTextError(
          f"{path} was made with other options ({', '.join(changed)}: "
          f"{[recorded.get(k) for k in changed]}, now {[options.get(k) for k in changed]}); "
          "pass another --output_dir, or delete that one to start again")
    added = sorted(set(options) - set(recorded))
    if added:
      # Options that did not exist when the directory was made: the stages they govern were
      # not run then, so they are recorded now and govern the stages still to run.
      clock.say(f"{path}: recording options it did not have: {', '.join(added)}")
      write_json(path, dict(recorded, **{k: options[k] for k in added}))
  else:
    write_json(path, options)


def run_experiment(output_dir: str, squad_file: str = str(assets.SQUAD_DEV),
                   wiki_dump: str = str(assets.ENWIKI_DUMP),
                   vocab_file: str = str(assets.BERT_VOCAB),
                   minilm_dir: str = str(assets.MINILM), block_seq_length: int = 288,
                   max_articles: int = 0, max_paragraphs: int = 0, max_pages: int = 0,
                   max_questions: int = 0,
                   split_fractions: Sequence[float] = (0.6, 0.2, 0.2),
                   salient_spans: bool = True, minilm: bool = True, seed: int = 0,
                   batch_size: int = 32, ict: bool = True, openqa: bool = True,
                   budget: Budget = Budget(), realm_seeds: Sequence[int] = (),
                   realm_budget: RealmBudget = RealmBudget(), realm_test: bool = True) -> Dict:
  """Every stage (module docstring); returns their summaries and the results' paths."""
  out = os.path.abspath(output_dir)
  work = os.path.join(out, "work")
  os.makedirs(work, exist_ok=True)
  for path, what in ((squad_file, "--squad_file"), (vocab_file, "--vocab_file")):
    if not os.path.exists(path):
      raise RealTextError(f"{what} not found: {path}")
  if ict and not minilm:
    raise RealTextError("the ICT stages start from the converted MiniLM: drop --nominilm or "
                        "pass --noict")
  if openqa and not ict:
    raise RealTextError("Open-QA fine-tunes from the ICT retriever: drop --noict or pass "
                        "--noopenqa")
  if realm_seeds and not (ict and salient_spans):
    raise RealTextError("REALM pre-trains from the ICT retriever on the salient spans: drop "
                        "--noict and --nosalient_spans, or pass --realm_seeds=''")
  budget.check()
  realm_budget.check()
  options = dict(
      squad_file=os.path.abspath(squad_file), vocab_file=os.path.abspath(vocab_file),
      wiki_dump=os.path.abspath(wiki_dump) if wiki_dump else "",
      minilm_dir=os.path.abspath(minilm_dir), block_seq_length=block_seq_length,
      max_articles=max_articles, max_paragraphs=max_paragraphs, max_pages=max_pages,
      max_questions=max_questions,
      split_fractions=list(split_fractions), seed=seed)
  if ict:
    options.update({k: v for k, v in dataclasses.asdict(budget).items()
                    if k.startswith("ict_")})
  if openqa:
    options.update({k: v for k, v in dataclasses.asdict(budget).items()
                    if not k.startswith("ict_")})
  if realm_seeds:
    # A REALM run's own settings are checked against its done file (run_realm).
    options.update({f"realm.{k}": v for k, v in realm_budget.shared().items()})
  clock = Clock("real_text")
  check_options(clock, work, options)
  once = clock.once
  stages = {"block_seq_length": block_seq_length, "budget": dataclasses.asdict(budget)}
  stages["corpus"] = once("corpus", os.path.join(work, "corpus", "done.json"), lambda: (
      ts.make_corpus(work, squad_file, wiki_dump, vocab_file, block_seq_length, max_articles,
                     max_paragraphs, max_pages)))
  if salient_spans:
    stages["spans"] = once("salient spans", os.path.join(work, "sentences_done.json"),
                           lambda: ts.annotate(work))
  stages["questions"] = once("questions", os.path.join(work, "qa", "split.json"), lambda: (
      ts.make_questions(work, squad_file, max_articles, max_paragraphs, split_fractions)))
  stages["bm25"] = once("BM25", os.path.join(work, "bm25", "done.json"),
                        lambda: ts.run_bm25(work, max_questions))
  if minilm:
    stages["convert"] = once("MiniLM conversion", os.path.join(work, "minilm_model_done.json"),
                             lambda: ts.convert_minilm(minilm_dir, vocab_file,
                                                       os.path.join(work, "minilm_model"), seed))
    stages["minilm"] = once("MiniLM retrieval", os.path.join(work, "minilm", "done.json"),
                            lambda: ts.run_minilm(work, max_questions, batch_size, clock.say))
  if ict:
    stages["ict_examples"] = once("ICT examples", os.path.join(work, "ict_examples_done.json"),
                                  lambda: ts.make_ict_examples(work, vocab_file,
                                                               block_seq_length))
    stages["ict_train"] = once("ICT training", os.path.join(work, "ict_model_done.json"),
                               lambda: ts.train_ict(clock, work, vocab_file, budget, seed))
    stages["ict"] = once("ICT retrieval", os.path.join(work, "ict", "done.json"), lambda: (
        ts.run_ict_retrieval(work, max_questions, batch_size, block_seq_length)))
    stages["hybrid"] = once("Hybrid retrieval (BM25 + ICT)",
                            os.path.join(work, "hybrid", "done.json"),
                            lambda: ts.run_hybrid(work, max_questions, batch_size))
  if openqa or realm_seeds:
    stages["reader_convert"] = once(
        "MiniLM reader conversion", os.path.join(work, "minilm_reader_model_done.json"),
        lambda: ts.convert_reader(minilm_dir, vocab_file,
                                  os.path.join(work, "minilm_reader_model")))
  if realm_seeds:
    stages.update(text_realm.run_realm(clock, work, vocab_file, realm_seeds, realm_budget,
                                       max_questions, batch_size, block_seq_length, seed,
                                       realm_test))
  if openqa:
    stages["gold_reader"] = once(
        "Gold-paragraph reader (stage A)", os.path.join(work, "gold_reader_done.json"),
        lambda: ts.train_gold_reader(work, squad_file, budget, seed, max_articles,
                                     max_paragraphs, clock.say))
    stages["gold_test"] = once(
        "Gold-paragraph test", os.path.join(work, "gold_reader", "test_done.json"),
        lambda: ts.evaluate_gold(work, squad_file, budget, seed, max_articles, max_paragraphs,
                                 max_questions))
    stages["openqa_train"] = once(
        "Open-QA training", os.path.join(work, "openqa_done.json"),
        lambda: ts.train_openqa(clock, work, vocab_file, budget, seed, block_seq_length))
    stages["openqa_eval"] = once(
        "Open-QA evaluation", os.path.join(work, "openqa_eval", "done.json"),
        lambda: ts.evaluate_openqa(work, budget, seed, max_questions))
    stages["bm25_reader"] = once(
        "BM25 + the reader", os.path.join(work, "bm25_reader_eval", "done.json"),
        lambda: ts.evaluate_bm25_reader(work, budget, seed, max_questions))
    if "hybrid" in stages:
      stages["hybrid_reader"] = once(
          "Hybrid + the reader", os.path.join(work, "hybrid_reader_eval", "done.json"),
          lambda: ts.evaluate_hybrid_reader(work, budget, seed, max_questions))
      # Dev said the hybrid reads better than the dense fine-tune (NOTES 32): fine-tune with it.
      stages["openqa_hybrid_train"] = once(
          "Open-QA training, hybrid beams", os.path.join(work, "openqa_hybrid_done.json"),
          lambda: ts.train_openqa(clock, work, vocab_file, budget, seed, block_seq_length,
                                  name="openqa_hybrid",
                                  index=os.path.basename(ts.sparse_index_dir(work)),
                                  beam="hybrid"))
      stages["openqa_hybrid_eval"] = once(
          "Open-QA evaluation, hybrid beams",
          os.path.join(work, "openqa_hybrid_eval", "done.json"),
          lambda: ts.evaluate_hybrid_reader(work, budget, seed, max_questions,
                                            name="openqa_hybrid", out="openqa_hybrid_eval"))
    if realm_seeds and realm_test:
      stages.update(text_realm.run_realm_openqa(clock, work, vocab_file, squad_file,
                                                realm_seeds, budget, seed, max_articles,
                                                max_paragraphs, max_questions,
                                                block_seq_length))
  stages["results"] = report.write_results(out, stages, max_questions)
  labels = [(report.BM25, stages["bm25"])]
  if "minilm" in stages:
    labels += [(report.MINILM, stages["minilm"]["realm"]),
               (report.MINILM_MEAN, stages["minilm"]["mean"])]
  if "ict" in stages:
    labels.append((report.MINILM_ICT, stages["ict"]))
  for label, r in labels:
    clock.say(f"{label}: recall@1 {r['recall@1']:.3f}, @5 {r['recall@5']:.3f}, "
              f"@20 {r['recall@20']:.3f}")
  if "openqa_eval" in stages:
    e = stages["openqa_eval"]
    clock.say(f"Open-QA: EM {interval_text(**e['after']['exact_match'])}, top-5 match before "
              f"{e['before']['top_5_match']['value']:.3f}, after "
              f"{e['after']['top_5_match']['value']:.3f} ({e['test_questions']} test questions)")
  clock.say(f"finished in {clock.minutes() * 60:.1f} s; tables in {stages['results']['md']}")
  return stages


def define_flags() -> None:
  """The command line's flags; defined only when the module runs as a program, so that the
  tests can import it beside the demo (which defines --output_dir and --seed too)."""
  flags.DEFINE_string("output_dir", None, "Where every stage writes (its work and results/).")
  flags.DEFINE_string("squad_file", str(assets.SQUAD_DEV), "SQuAD v1.1 JSON (or .json.gz).")
  flags.DEFINE_string("wiki_dump", str(assets.ENWIKI_DUMP),
                      "A MediaWiki XML dump added to the corpus ('' for none).")
  flags.DEFINE_string("vocab_file", str(assets.BERT_VOCAB), "WordPiece vocabulary (uncased).")
  flags.DEFINE_string("minilm_dir", str(assets.MINILM),
                      "The Hugging Face all-MiniLM-L6-v2 (config.json + model.safetensors).")
  flags.DEFINE_integer("block_seq_length", 288, "Wordpieces per block (the paper's 288).")
  flags.DEFINE_integer("max_articles", 0, "Keep only the first N SQuAD articles (0: all).")
  flags.DEFINE_integer("max_pages", 0, "Keep only the first N pages of the dump (0: all).")
  flags.DEFINE_integer("max_paragraphs", 0, "Keep only the first N paragraphs of each SQuAD "
                       "article, for the corpus and the questions alike (0: all).")
  flags.DEFINE_integer("max_questions", 0, "Score only the first N test questions (0: all).")
  flags.DEFINE_list("split_fractions", ["0.6", "0.2", "0.2"], "Train, dev, test shares of the "
                    "SQuAD articles.")
  flags.DEFINE_bool("salient_spans", True, "Also run the salient-span stage (spaCy NER) on the "
                    "blocks.")
  flags.DEFINE_bool("minilm", True, "Also run the MiniLM stages (the encoder over every block: "
                    "the slow part on a CPU).")
  flags.DEFINE_integer("seed", 0, "Seed of the MiniLM tower's fresh projection, of the data "
                       "order of the trained stages and of the Open-QA dev/test samples.")
  flags.DEFINE_integer("batch_size", 32, "Blocks per encoder call.")
  flags.DEFINE_bool("ict", True, "Also run the ICT stages (examples, training, retrieval).")
  flags.DEFINE_bool("openqa", True, "Also run the Open-QA stages (fine-tuning, test EM).")
  flags.DEFINE_list("realm_seeds", [], "REALM pre-training seeds (experiments/real_text/"
                    "text_realm.py): each a REALM run from the ICT tower beside its refresher, "
                    "and its tower's recall (empty: no REALM stage).")
  flags.DEFINE_bool("realm_test", True, "Score each REALM tower on the test questions (dev "
                    "runs pass --norealm_test: their choices see no test number).")
  defaults = dict(dataclasses.asdict(Budget()), **dataclasses.asdict(RealmBudget()))
  for field in dataclasses.fields(Budget) + dataclasses.fields(RealmBudget):
    default = defaults[field.name]
    define = (flags.DEFINE_bool if isinstance(default, bool) else
              flags.DEFINE_float if isinstance(default, float) else flags.DEFINE_integer)
    define(field.name, default, field.metadata["help"])


def main(argv):
  del argv
  if not FLAGS.output_dir:
    raise RealTextError("--output_dir is required")
  try:
    fractions = [float(x) for x in FLAGS.split_fractions]
  except ValueError as e:
    raise RealTextError(f"--split_fractions={FLAGS.split_fractions}: three numbers") from e
  run_experiment(FLAGS.output_dir, FLAGS.squad_file, FLAGS.wiki_dump, FLAGS.vocab_file,
                 FLAGS.minilm_dir, FLAGS.block_seq_length, FLAGS.max_articles,
                 FLAGS.max_paragraphs, FLAGS.max_pages, FLAGS.max_questions, fractions,
                 FLAGS.salient_spans, FLAGS.minilm, FLAGS.seed, FLAGS.batch_size,
                 FLAGS.ict, FLAGS.openqa,
                 Budget(**{f.name: FLAGS[f.name].value for f in dataclasses.fields(Budget)}),
                 [int(x) for x in FLAGS.realm_seeds],
                 RealmBudget(**{f.name: FLAGS[f.name].value
                                for f in dataclasses.fields(RealmBudget)}),
                 FLAGS.realm_test)


def run():
  define_flags()
  cli.run_main(main)



if __name__ == "__main__":
  run()
