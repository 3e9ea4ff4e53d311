r"""Retrieval on real text: BM25 and the untrained MiniLM tower, on Wikipedia and SQuAD.

  python -m experiments.real_text --output_dir=real_text_out            # the real size
  python -m experiments.real_text --output_dir=tiny --max_articles=4 --max_paragraphs=4 \
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

Stages, each skipped when its output exists (delete a stage's directory to redo it), each
printing one line with the time it took:

1. ``corpus/``: the SQuAD paragraphs as JSON lines, with the dump through ``data_prep.blocks``
   into ``blocks/``; then salient spans (``data_prep.salient_spans``, spaCy) into
   ``sentences/`` unless ``--nosalient_spans``;
2. ``qa/``: ``squad-{train,dev,test}.jsonl`` and ``split.json`` (the articles of each split);
3. ``bm25/``: the top 20 blocks of each test question and its recall;
4. ``minilm_model/`` (the converted model directory), ``minilm/``: embeddings, top 20, recall
   (``--nominilm`` leaves them out: the encoder over every block is the slow part on a CPU);
5. ``results/real_text_retrieval.md`` and ``.csv``: one row per retriever.

Pending: ICT, REALM and Open-QA on this corpus (trained retrievers and the reader); only the
untrained baselines above run now.
"""

import csv
import json
import os
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from absl import flags
import numpy as np

from experiments import assets
from realm_tf import errors
from realm_tf.binaries import cli

FLAGS = flags.FLAGS

TOP_K = (1, 5, 20)
BM25 = "BM25"
MINILM = "MiniLM (untrained REALM tower)"
MINILM_MEAN = "MiniLM (mean-pooled, as trained)"
RESULTS_NAME = "real_text_retrieval"
CSV_FIELDS = ("retriever", "recall@1", "recall@5", "recall@20", "test_questions", "blocks",
              "seconds")


class RealTextError(errors.RealmError):
  """An input of the real-text experiment is missing or unusable; the message names it."""


def _say(message: str) -> None:
  print(f"[real_text {time.strftime('%H:%M:%S')}] {message}", flush=True)


def _read_json(path: str) -> Dict:
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def _write_json(path: str, obj) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(obj, f, indent=2, sort_keys=True)
  os.replace(tmp, path)


def stage(name: str, done_file: str, fn: Callable[[], Dict]) -> Dict:
  """Runs ``fn`` unless ``done_file`` exists; returns its summary (``seconds`` included) and
  prints one line: the stage, what it made, the time it took (or that it was skipped)."""
  if os.path.exists(done_file):
    summary = _read_json(done_file)
    _say(f"{name}: skipped, {done_file} exists ({summary.get('seconds', 0.0):.1f} s when made)")
    return summary
  _say(f"{name}: running")
  start = time.time()
  summary = dict(fn())
  summary["seconds"] = round(time.time() - start, 1)
  os.makedirs(os.path.dirname(done_file), exist_ok=True)
  _write_json(done_file, summary)
  shown = {k: v for k, v in summary.items() if not isinstance(v, (list, dict))}
  _say(f"{name}: done in {summary['seconds']:.1f} s {shown}")
  return summary


# ---------------------------------------------------------------------------------- corpus --

def slice_dump(path: str, max_pages: int, out_path: str) -> str:
  """The first ``max_pages`` pages of a MediaWiki XML dump as a small dump of its own.

  Cuts the XML text after the ``max_pages``-th ``</page>`` and closes the root element, so the
  pipeline reads real pages, header included, without the rest of the dump.
  """
  from data_prep import wiki  # pylint: disable=g-import-not-at-top
  kept, count = [], 0
  with wiki._open_maybe_compressed(path) as f:  # pylint: disable=protected-access
    for raw in f:
      line = raw.decode("utf-8")
      kept.append(line)
      if "</page>" in line:
        count += 1
        if count >= max_pages:
          break
  if count < max_pages:
    return path  # The dump is no longer than that.
  with open(out_path, "w", encoding="utf-8") as f:
    f.write("".join(kept) + "</mediawiki>\n")
  return out_path


def read_articles(squad_file: str, max_articles: int = 0, max_paragraphs: int = 0
                  ) -> List[Dict]:
  """SQuAD's articles, the first ``max_articles`` with their first ``max_paragraphs`` (0: all):
  the corpus and the questions of a quick run come from the same paragraphs."""
  from data_prep import squad  # pylint: disable=g-import-not-at-top
  articles = squad.read_squad(squad_file)
  if max_articles:
    articles = articles[:max_articles]
  if max_paragraphs:
    articles = [dict(a, paragraphs=a["paragraphs"][:max_paragraphs]) for a in articles]
  return articles


def make_corpus(work: str, squad_file: str, wiki_dump: str, vocab_file: str,
                block_seq_length: int, max_articles: int, max_paragraphs: int,
                max_pages: int) -> Dict:
  """SQuAD paragraphs (+ the dump) -> ``work/blocks`` through ``data_prep.blocks``."""
  from data_prep import blocks as blocks_lib  # pylint: disable=g-import-not-at-top
  from data_prep import squad  # pylint: disable=g-import-not-at-top
  corpus_dir = os.path.join(work, "corpus")
  os.makedirs(corpus_dir, exist_ok=True)
  articles = read_articles(squad_file, max_articles, max_paragraphs)
  documents = list(squad.documents(articles))
  squad_jsonl = os.path.join(corpus_dir, "squad_paragraphs.jsonl")
  with open(squad_jsonl, "w", encoding="utf-8") as f:
    for doc in documents:
      f.write(json.dumps(doc, ensure_ascii=False) + "\n")
  inputs = [squad_jsonl]
  if wiki_dump:
    if not os.path.exists(wiki_dump):
      raise RealTextError(f"dump not found: {wiki_dump} (pass --wiki_dump='' to leave it out)")
    inputs.append(slice_dump(wiki_dump, max_pages, os.path.join(corpus_dir, "dump_slice.xml"))
                  if max_pages else wiki_dump)
  manifest = blocks_lib.run_blocks(",".join(inputs), vocab_file, os.path.join(work, "blocks"),
                                   block_seq_length=block_seq_length)
  return {"squad_articles": len(articles), "squad_paragraphs": len(documents),
          "inputs": inputs, "blocks": manifest["num_blocks"],
          "documents": manifest["num_documents"], "counts": manifest["counts"]}


def annotate(work: str) -> Dict:
  """Salient spans of every block sentence (spaCy NER + the date regex) -> ``sentences/``."""
  from data_prep import salient_spans  # pylint: disable=g-import-not-at-top
  manifest = salient_spans.run_annotate(os.path.join(work, "blocks"),
                                        os.path.join(work, "sentences"))
  return {k: manifest[k] for k in ("num_sentences", "num_sentences_with_spans", "num_spans",
                                   "annotator", "labels")}


# ------------------------------------------------------------------------------- questions --

def make_questions(work: str, squad_file: str, max_articles: int, max_paragraphs: int,
                   fractions: Sequence[float]) -> Dict:
  """SQuAD questions -> ``qa/squad-{train,dev,test}.jsonl``, split by article."""
  from data_prep import open_qa  # pylint: disable=g-import-not-at-top
  from data_prep import squad  # pylint: disable=g-import-not-at-top
  articles = read_articles(squad_file, max_articles, max_paragraphs)
  splits = {name: [] for name in squad.SPLITS}
  titles = {name: [] for name in squad.SPLITS}
  for title, record in squad.questions(articles):
    name = squad.split_of(title, fractions)
    splits[name].append(record.to_json())
    if title not in titles[name]:
      titles[name].append(title)
  qa_dir = os.path.join(work, "qa")
  os.makedirs(qa_dir, exist_ok=True)
  counts = {name: open_qa.write_jsonl(os.path.join(qa_dir, f"squad-{name}.jsonl"), records)
            for name, records in splits.items()}
  if not counts["test"]:
    raise RealTextError(f"no test question: the {len(articles)} articles all hash into "
                        f"{[n for n, c in counts.items() if c]}; use more --max_articles")
  return {"questions": counts, "articles": titles, "fractions": list(fractions),
          "rule": "md5(display title) -> [0, 1) -> train | dev | test by the fractions"}


def test_questions(work: str, max_questions: int):
  from realm_tf.data import qa  # pylint: disable=g-import-not-at-top
  records, _ = qa.read_qa(os.path.join(work, "qa", "squad-test.jsonl"))
  return records[:max_questions] if max_questions else records


# ------------------------------------------------------------------------------- retrieval --

def recall_at(top_ids: np.ndarray, bodies: Sequence[str], records, ks=TOP_K) -> Dict[str, float]:
  """``recall@k``: the share of questions with an answer (``has_answer``) in a top-k body."""
  from realm_tf.openqa import inputs  # pylint: disable=g-import-not-at-top
  hits = np.array([[inputs.has_answer(bodies[b], r.answers, r.answer_type == "regex")
                    for b in row] for row, r in zip(top_ids, records)], bool)
  first = np.where(hits.any(1), hits.argmax(1), hits.shape[1])
  return {f"recall@{k}": float(np.mean(first < k)) for k in ks}


def bm25_tokens(texts: Sequence[str]) -> List[List[str]]:
  """``bm25s``'s word tokens (lower-cased, English stop words out, no stemming)."""
  import bm25s  # pylint: disable=g-import-not-at-top
  return bm25s.tokenize(list(texts), stopwords="en", return_ids=False, show_progress=False)


def bm25_search(documents: Sequence[str], queries: Sequence[str], k: int
                ) -> Tuple[np.ndarray, np.ndarray]:
  """Top ``k`` documents of each query by BM25 (``bm25s``, Lucene's variant, k1 1.5, b 0.75):
  ``(ids int64 [q, k], scores float32 [q, k])``, best first; ids index ``documents``."""
  import bm25s  # pylint: disable=g-import-not-at-top
  retriever = bm25s.BM25(method="lucene", k1=1.5, b=0.75)
  retriever.index(bm25_tokens(documents), show_progress=False)
  ids, scores = retriever.retrieve(bm25_tokens(queries), k=min(k, len(documents)),
                                   show_progress=False)
  return np.asarray(ids, np.int64), np.asarray(scores, np.float32)


def run_bm25(work: str, max_questions: int) -> Dict:
  from realm_tf.data import manifests  # pylint: disable=g-import-not-at-top
  blocks = manifests.read_blocks(os.path.join(work, "blocks"))
  records = test_questions(work, max_questions)
  ids, scores = bm25_search([f"{b['title']}\n{b['body']}" for b in blocks],
                            [r.question for r in records], max(TOP_K))
  block_ids = np.array([b["block_id"] for b in blocks])[ids]
  result = recall_at(block_ids, [b["body"] for b in blocks], records)
  out_dir = os.path.join(work, "bm25")
  os.makedirs(out_dir, exist_ok=True)
  np.save(os.path.join(out_dir, "top_ids.npy"), block_ids)
  np.save(os.path.join(out_dir, "top_scores.npy"), scores)
  return dict(result, test_questions=len(records), blocks=len(blocks))


def convert_minilm(minilm_dir: str, vocab_file: str, out: str, seed: int) -> Dict:
  """``realm-convert --hf_dir`` of the MiniLM weights; the projection seeded by ``seed``."""
  import tf_keras  # pylint: disable=g-import-not-at-top
  from realm_tf import checkpoint_convert  # pylint: disable=g-import-not-at-top
  for name in ("config.json", "model.safetensors"):
    if not os.path.exists(os.path.join(minilm_dir, name)):
      raise RealTextError(f"{minilm_dir} has no {name}: fetch the MiniLM weights with "
                          "`python -m experiments.assets` (or pass --minilm_dir)")
  tf_keras.utils.set_random_seed(seed)
  path = checkpoint_convert.convert_hf(minilm_dir, out, vocab_file, targets=["retriever"])
  return {"checkpoint": path, "seed": seed}


class TowerPass:
  """The converted retriever's encoder run once per batch, giving both of its embeddings:
  REALM's tower (``LayerNorm(Dense_128(pooled))``, exactly the embedder's own inference) and
  the encoder's masked mean, L2-normalized (sentence-transformers' pooling for MiniLM)."""

  def __init__(self, model_dir: str):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    import realm_tf  # pylint: disable=g-import-not-at-top
    self.embedder = realm_tf.Embedder.load(model_dir)
    tower = self.embedder.query_embedder

    spec = tf.TensorSpec([None, None], tf.int32)

    # One trace for every batch shape: the batches are padded to their own longest row.
    @tf.function(input_signature=[{"input_word_ids": spec, "input_mask": spec,
                                   "input_type_ids": spec}])
    def run(inputs):
      outputs = tower.encoder(inputs, training=False)
      realm = tower.layer_norm(tower.projection(outputs["pooled_output"]))
      mask = tf.cast(inputs["input_mask"], tf.float32)[:, :, None]
      mean = tf.reduce_sum(outputs["sequence_output"] * mask, 1) / tf.maximum(
          tf.reduce_sum(mask, 1), 1.0)
      return realm, tf.math.l2_normalize(mean, axis=-1)

    self._run = run

  def __call__(self, inputs) -> Tuple[np.ndarray, np.ndarray]:
    realm, mean = self._run(inputs)
    return realm.numpy(), mean.numpy()


def embed_token_ids(tower: TowerPass, token_ids: Sequence[Sequence[int]], seq_length: int,
                    batch_size: int, type_ids: bool = True,
                    progress: Optional[Callable[[int], None]] = None
                    ) -> Tuple[np.ndarray, np.ndarray]:
  """Both embeddings of packed ``[CLS] ... [SEP] ...`` rows, in their order.

  Rows are batched by length and each batch is padded only to its longest row (at most
  ``seq_length``; a longer row is cut with a final ``[SEP]``): masked padding changes nothing,
  and most blocks are much shorter than 288.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from realm_tf.data import features  # pylint: disable=g-import-not-at-top
  sep_id = tower.embedder.tokenizer.sep_id
  order = np.argsort([len(t) for t in token_ids], kind="stable")
  realm = np.zeros([len(token_ids), tower.embedder.config.retriever.projection_size], np.float32)
  mean = None
  for start in range(0, len(order), batch_size):
    rows = order[start:start + batch_size]
    batch = [token_ids[i] for i in rows]
    width = min(seq_length, max(len(t) for t in batch))
    inputs = features.pack_block_ids(tf.ragged.constant(batch, tf.int32), width, sep_id,
                                     segment_ids=type_ids)
    r, m = tower(inputs)
    if mean is None:
      mean = np.zeros([len(token_ids), m.shape[1]], np.float32)
    realm[rows], mean[rows] = r, m
    if progress:
      progress(start + len(rows))
  return realm, mean


def top_k(queries: np.ndarray, embeddings: np.ndarray, k: int) -> np.ndarray:
  """Exact maximum inner product search (``BruteForceIndex``): ids ``[q, k]``, best first."""
  from realm_tf.retrieval import brute_force  # pylint: disable=g-import-not-at-top
  ids, _ = brute_force.BruteForceIndex(embeddings).search(queries, min(k, len(embeddings)))
  return ids


def run_minilm(work: str, max_questions: int, batch_size: int) -> Dict:
  from realm_tf.data import manifests  # pylint: disable=g-import-not-at-top
  blocks = manifests.read_blocks(os.path.join(work, "blocks"))
  records = test_questions(work, max_questions)
  tower = TowerPass(os.path.join(work, "minilm_model"))
  config = tower.embedder.config.retriever
  tokenizer = tower.embedder.tokenizer
  every = max(1, len(blocks) // 10)
  started = time.time()

  def progress(done):
    if done % every < batch_size or done == len(blocks):
      _say(f"  embedded {done}/{len(blocks)} blocks ({time.time() - started:.0f} s)")

  block_realm, block_mean = embed_token_ids(tower, [b["token_ids"] for b in blocks],
                                            config.block_seq_length, batch_size,
                                            progress=progress)
  question_ids = tokenizer.tokenize([r.question for r in records]).to_list()
  question_rows = [[tokenizer.cls_id] + q[:config.query_seq_length - 2] + [tokenizer.sep_id]
                   for q in question_ids]
  q_realm, q_mean = embed_token_ids(tower, question_rows, config.query_seq_length, batch_size,
                                    type_ids=False)
  bodies = [b["body"] for b in blocks]
  ids = np.array([b["block_id"] for b in blocks])
  out_dir = os.path.join(work, "minilm")
  os.makedirs(out_dir, exist_ok=True)
  summary = {"test_questions": len(records), "blocks": len(blocks)}
  for name, q, e in (("realm", q_realm, block_realm), ("mean", q_mean, block_mean)):
    top = ids[top_k(q, e, max(TOP_K))]
    np.save(os.path.join(out_dir, f"{name}_top_ids.npy"), top)
    summary[name] = recall_at(top, bodies, records)
  np.save(os.path.join(out_dir, "block_emb.npy"), block_realm)
  np.save(os.path.join(out_dir, "question_emb.npy"), q_realm)
  return summary


# --------------------------------------------------------------------------------- results --

def write_results(out: str, stages: Dict[str, Dict]) -> Dict[str, str]:
  """``results/real_text_retrieval.{md,csv}``: one row per retriever, then the stage times."""
  rows = [dict(stages["bm25"], retriever=BM25)]
  if "minilm" in stages:
    minilm, seconds = stages["minilm"], stages["minilm"]["seconds"] + stages["convert"]["seconds"]
    for key, label in (("realm", MINILM), ("mean", MINILM_MEAN)):
      rows.append(dict(minilm[key], retriever=label, test_questions=minilm["test_questions"],
                       blocks=minilm["blocks"], seconds=seconds))
  results = os.path.join(out, "results")
  os.makedirs(results, exist_ok=True)
  csv_path = os.path.join(results, RESULTS_NAME + ".csv")
  with open(csv_path, "w", newline="", encoding="utf-8") as f:
    writer = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
      writer.writerow({k: (f"{row[k]:.4f}" if k.startswith("recall") else row[k])
                       for k in CSV_FIELDS})
  corpus, questions = stages["corpus"], stages["questions"]
  lines = [
      "# Retrieval on real text: SQuAD v1.1 dev + an enwiki slice",
      "",
      f"{corpus['blocks']} blocks of at most {stages['block_seq_length']} wordpieces from "
      f"{corpus['documents']} documents ({corpus['squad_paragraphs']} SQuAD paragraphs of "
      f"{corpus['squad_articles']} articles, and the dump's articles); "
      f"{rows[0]['test_questions']} test questions (SQuAD dev, split by article: "
      f"{questions['questions']}). Recall@k: a top-k block body holds an answer "
      "(ORQA's HasAnswer). Seconds: the retriever's stage (MiniLM: conversion, embedding "
      "and search).",
      "",
      "| retriever | recall@1 | recall@5 | recall@20 | test questions | seconds |",
      "|---|---|---|---|---|---|"]
  for row in rows:
    lines.append(f"| {row['retriever']} | {row['recall@1']:.3f} | {row['recall@5']:.3f} | "
                 f"{row['recall@20']:.3f} | {row['test_questions']} | {row['seconds']:.1f} |")
  lines += ["", "| stage | seconds |", "|---|---|"]
  for name in ("corpus", "spans", "questions", "bm25", "convert", "minilm"):
    if name in stages:
      lines.append(f"| {name} | {stages[name]['seconds']:.1f} |")
  if "minilm" not in stages:
    lines += ["", "MiniLM not run (--nominilm)."]
  lines += ["", "Pending: ICT, REALM and Open-QA on this corpus.", ""]
  md_path = os.path.join(results, RESULTS_NAME + ".md")
  with open(md_path, "w", encoding="utf-8") as f:
    f.write("\n".join(lines))
  return {"md": md_path, "csv": csv_path}


def check_options(work: str, options: Dict) -> None:
  """Records the options of a work directory, or checks that they are the recorded ones: a
  stage is skipped when its output exists, so outputs of other options must not be reused."""
  path = os.path.join(work, "options.json")
  if os.path.exists(path):
    recorded = _read_json(path)
    changed = sorted(k for k in set(recorded) | set(options)
                     if recorded.get(k) != options.get(k))
    if changed:
      raise RealTextError(
          f"{path} was made with other options ({', '.join(changed)}: "
          f"{[recorded.get(k) for k in changed]}, now {[options.get(k) for k in changed]}); "
          "pass another --output_dir, or delete that one to start again")
  else:
    _write_json(path, options)


def run_experiment(output_dir: str, squad_file: str = str(assets.SQUAD_DEV),
                   wiki_dump: str = str(assets.ENWIKI_DUMP),
                   vocab_file: str = str(assets.BERT_VOCAB),
                   minilm_dir: str = str(assets.MINILM), block_seq_length: int = 288,
                   max_articles: int = 0, max_paragraphs: int = 0, max_pages: int = 0,
                   max_questions: int = 0,
                   split_fractions: Sequence[float] = (0.6, 0.2, 0.2),
                   salient_spans: bool = True, minilm: bool = True, seed: int = 0,
                   batch_size: int = 32) -> Dict:
  """Every stage (module docstring); returns their summaries and the results' paths."""
  out = os.path.abspath(output_dir)
  work = os.path.join(out, "work")
  os.makedirs(work, exist_ok=True)
  for path, what in ((squad_file, "--squad_file"), (vocab_file, "--vocab_file")):
    if not os.path.exists(path):
      raise RealTextError(f"{what} not found: {path}")
  check_options(work, dict(
      squad_file=os.path.abspath(squad_file), vocab_file=os.path.abspath(vocab_file),
      wiki_dump=os.path.abspath(wiki_dump) if wiki_dump else "",
      minilm_dir=os.path.abspath(minilm_dir), block_seq_length=block_seq_length,
      max_articles=max_articles, max_paragraphs=max_paragraphs, max_pages=max_pages,
      max_questions=max_questions,
      split_fractions=list(split_fractions), seed=seed))
  start = time.time()
  stages = {"block_seq_length": block_seq_length}
  stages["corpus"] = stage("corpus", os.path.join(work, "corpus", "done.json"),
                           lambda: make_corpus(work, squad_file, wiki_dump, vocab_file,
                                               block_seq_length, max_articles, max_paragraphs,
                                               max_pages))
  if salient_spans:
    stages["spans"] = stage("salient spans", os.path.join(work, "sentences_done.json"),
                            lambda: annotate(work))
  stages["questions"] = stage("questions", os.path.join(work, "qa", "split.json"),
                              lambda: make_questions(work, squad_file, max_articles,
                                                     max_paragraphs, split_fractions))
  stages["bm25"] = stage("BM25", os.path.join(work, "bm25", "done.json"),
                         lambda: run_bm25(work, max_questions))
  if minilm:
    stages["convert"] = stage("MiniLM conversion", os.path.join(work, "minilm_model_done.json"),
                              lambda: convert_minilm(minilm_dir, vocab_file,
                                                     os.path.join(work, "minilm_model"), seed))
    stages["minilm"] = stage("MiniLM retrieval", os.path.join(work, "minilm", "done.json"),
                             lambda: run_minilm(work, max_questions, batch_size))
  stages["results"] = write_results(out, stages)
  for name in (BM25, "realm", "mean"):
    if name != BM25 and "minilm" not in stages:
      continue
    r = stages["bm25"] if name == BM25 else stages["minilm"][name]
    label = {BM25: BM25, "realm": MINILM, "mean": MINILM_MEAN}[name]
    _say(f"{label}: recall@1 {r['recall@1']:.3f}, @5 {r['recall@5']:.3f}, "
         f"@20 {r['recall@20']:.3f}")
  _say(f"finished in {time.time() - start:.1f} s; tables in {stages['results']['md']}")
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
  flags.DEFINE_integer("seed", 0, "Seed of the MiniLM tower's fresh projection.")
  flags.DEFINE_integer("batch_size", 32, "Blocks per encoder call.")


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
                 FLAGS.salient_spans, FLAGS.minilm, FLAGS.seed, FLAGS.batch_size)


def run():
  define_flags()
  cli.run_main(main)


if __name__ == "__main__":
  run()
