r"""Real text: BM25, MiniLM untrained and ICT-trained, and Open-QA, on Wikipedia and SQuAD.

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
5. ``ict_examples/``, ``ict_model/`` (ICT from the converted MiniLM: ``ict_params``),
   ``ict/`` and ``ict_index/``: the ICT tower's recall and its frozen index (``--noict``: not run);
6. ``minilm_reader_model/``, ``gold_reader/`` (stage A, ``experiments/gold_reader.py``: the
   reader trained on the train articles' questions with their own paragraphs, its dev EM and
   F1, and its EM on the Open-QA test sample read in each question's own paragraph: the
   gold-paragraph row), ``openqa/`` (ORQA's fine-tuning from it, best checkpoint on dev:
   ``openqa_params``), ``openqa_eval/`` (``realm-eval``'s evaluation on the test sample)
   (``--noopenqa``: not run);
7. ``results/real_text_retrieval.{md,csv}`` (one row per retriever, 95% Wilson intervals over
   the questions) and ``results/real_text_openqa.{md,csv}``.

The trained stages' sizes are ``Budget``'s (flags ``--ict_*``, ``--openqa_*``, ...): ORQA's
recipe cut to fit about 100 minutes on 2 cores (experiments/NOTES.md section 18). REALM
pre-training is not run on this corpus.
"""

import csv
import dataclasses
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
MINILM_ICT = "MiniLM + ICT (REALM tower)"
RESULTS_NAME = "real_text_retrieval"
OPENQA_NAME = "real_text_openqa"
CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")
CSV_FIELDS = ("retriever", "recall@1", "recall@1_lo", "recall@1_hi", "recall@5", "recall@5_lo",
              "recall@5_hi", "recall@20", "recall@20_lo", "recall@20_hi", "test_questions",
              "blocks", "seconds")


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

def first_hits(top_ids: np.ndarray, bodies: Sequence[str], records) -> np.ndarray:
  """Per question, the rank of the first top block whose body holds an answer
  (``has_answer``), or the number of top blocks when none does."""
  from realm_tf.openqa import inputs  # pylint: disable=g-import-not-at-top
  hits = np.array([[inputs.has_answer(bodies[b], r.answers, r.answer_type == "regex")
                    for b in row] for row, r in zip(top_ids, records)], bool)
  return np.where(hits.any(1), hits.argmax(1), hits.shape[1])


def recall_at(top_ids: np.ndarray, bodies: Sequence[str], records, ks=TOP_K) -> Dict[str, float]:
  """``recall@k``: the share of questions with an answer (``has_answer``) in a top-k body."""
  first = first_hits(top_ids, bodies, records)
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
  q_realm, q_mean = embed_token_ids(tower, question_rows(tokenizer, records,
                                                        config.query_seq_length),
                                    config.query_seq_length, batch_size, type_ids=False)
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


# --------------------------------------------------------------------------------- budget --

@dataclasses.dataclass(frozen=True)
class Budget:
  """The sizes of the trained stages (flags of the same names), ORQA's recipe cut to fit.

  ORQA's ICT: BERT-base towers, batch 4096, queries of 64 and blocks of 288 wordpieces, lr 1e-4,
  100k steps. ORQA's Open-QA: batch 1, retriever beam 5000, reader beam 5, reader input 320,
  lr 1e-5, 100k steps, the checkpoint by dev exact match. Here (defaults, chosen from measured
  per-step times on 2 CPU cores; experiments/NOTES.md section 18): MiniLM-L6 towers and reader,
  and what is cut is what the flags say.

  Measured (a few steps each, 2 cores shared with another CPU-bound run, so the wall times
  there were 2-4x an idle machine's): an ICT step of these defaults 7.3 CPU-seconds (batch 32,
  blocks 128, queries 64), an Open-QA step 6.0 CPU-seconds (batch 4, beam 5, reader 192),
  i.e. ~4.4 and ~3.6 s of wall time on 2 idle cores (CPU seconds / 2, plus 20% for what does
  not parallelize). The plan and its totals: experiments/NOTES.md section 18.
  """
  ict_steps: int = 250
  ict_batch_size: int = 32
  ict_query_seq_length: int = 64
  ict_block_seq_length: int = 128
  ict_learning_rate: float = 1e-4
  gold_learning_rate: float = 3e-4
  gold_epochs: float = 2.0
  gold_batch_size: int = 16
  openqa_steps: int = 300
  openqa_batch_size: int = 4
  openqa_learning_rate: float = 5e-5
  reader_seq_length: int = 192
  reader_beam_size: int = 5
  retriever_beam_size: int = 100
  openqa_validations: int = 2
  openqa_dev_questions: int = 200
  openqa_test_questions: int = 500
  eval_batch_size: int = 16

  def check(self) -> None:
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if value <= 0:
        raise RealTextError(f"--{field.name}={value}: must be positive")
    if self.reader_beam_size > self.retriever_beam_size:
      raise RealTextError(f"--reader_beam_size={self.reader_beam_size} is above "
                          f"--retriever_beam_size={self.retriever_beam_size}")
    if self.openqa_validations > self.openqa_steps:
      raise RealTextError(f"--openqa_validations={self.openqa_validations} is above "
                          f"--openqa_steps={self.openqa_steps}")


# ------------------------------------------------------------------------------ intervals --

def wilson_interval(successes: int, n: int, z: float = 1.959964) -> Tuple[float, float]:
  """The 95% Wilson score interval of a binomial proportion ``successes / n`` (over
  questions): it always holds the point estimate and stays inside [0, 1]."""
  if n <= 0:
    raise RealTextError("an interval over no question")
  p = successes / n
  denominator = 1 + z * z / n
  centre = (p + z * z / (2 * n)) / denominator
  half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
  return float(max(0.0, centre - half)), float(min(1.0, centre + half))


def proportion(flags_: Sequence[bool]) -> Dict[str, float]:
  """``{"value", "lo", "hi"}``: the share of true and its 95% Wilson interval."""
  n, k = len(flags_), int(np.sum(flags_))
  lo, hi = wilson_interval(k, n)
  return {"value": k / n, "lo": lo, "hi": hi}


# -------------------------------------------------------------------------------- ICT --

def encoder_yaml(work: str, kind: str) -> str:
  """A YAML (JSON is YAML) giving the converted MiniLM's encoder shape to the ICT task's towers
  (``kind="ict"``) or to the Open-QA task's retriever and reader (``"openqa"``); its path."""
  from realm_tf import model_dir as model_dir_lib  # pylint: disable=g-import-not-at-top
  encoder = model_dir_lib.load_config(os.path.join(work, "minilm_model")).retriever.encoder
  encoder = encoder.as_dict()
  model = ({"encoder": encoder} if kind == "ict"
           else {"retriever": {"encoder": encoder}, "reader": {"encoder": encoder}})
  path = os.path.join(work, f"minilm_encoder_{kind}.yaml")
  _write_json(path, {"task": {"model": model}})
  return path


def make_ict_examples(work: str, vocab_file: str, block_seq_length: int) -> Dict:
  """The corpus's own blocks -> ICT examples (``data_prep.ict_examples``) in ``ict_examples/``;
  every block trains (no held-out ICT split: the test is on the questions)."""
  from data_prep import ict_examples  # pylint: disable=g-import-not-at-top
  manifest = ict_examples.run_ict_examples(
      os.path.join(work, "blocks"), vocab_file, os.path.join(work, "ict_examples"),
      block_seq_length=block_seq_length, eval_fraction=0.0)
  return {k: manifest[k] for k in ("num_train", "num_sentences", "remove_prob")}


def train_lengths(steps: int, validations: int = 1) -> List[str]:
  """The trainer's intervals: a checkpoint (and validation) every ``steps // validations``
  steps, host round trips and summaries every ``min(20, that)``."""
  every = max(1, steps // validations)
  loop = min(20, every)
  return [f"trainer.train_steps={steps}", f"trainer.checkpoint_interval={every}",
          f"trainer.validation_interval={every}", f"trainer.steps_per_loop={loop}",
          f"trainer.summary_interval={loop}"]


def ict_params(work: str, vocab_file: str, budget: Budget, seed: int,
               extra: Sequence[str] = ()):
  """The ICT experiment (``realm-train --experiment=ict_cpu``) from the converted MiniLM
  (``task.init_checkpoint``): both towers the one MiniLM, its projection the untrained row's,
  on ``ict_examples/``, at ``budget``'s sizes; ``extra``: more overrides, last."""
  from realm_tf import configs  # pylint: disable=g-import-not-at-top
  overrides = [
      f"task.vocab_file={vocab_file}",
      f"task.init_checkpoint={os.path.join(work, 'minilm_model')}",
      f"task.train_data.input_path={os.path.join(work, 'ict_examples', 'train-*')}",
      f"task.train_data.global_batch_size={budget.ict_batch_size}",
      f"task.train_data.seed={seed}",
      f"task.model.query_seq_length={budget.ict_query_seq_length}",
      f"task.model.block_seq_length={budget.ict_block_seq_length}",
      "trainer.optimizer_config.learning_rate.polynomial.initial_learning_rate="
      f"{budget.ict_learning_rate}"] + train_lengths(budget.ict_steps) + list(extra)
  return configs.load_experiment(
      "ict_cpu", [os.path.join(CONFIG_DIR, "ict_cpu__real_text.yaml"), encoder_yaml(work, "ict")],
      ",".join(overrides))


def train_ict(work: str, vocab_file: str, budget: Budget, seed: int) -> Dict:
  """ICT (``ict_params``: the ICT task and trainer of ``realm-train``, in this process) into
  ``ict_model/``."""
  import tf_keras  # pylint: disable=g-import-not-at-top
  from realm_tf import model_dir as model_dir_lib  # pylint: disable=g-import-not-at-top
  from realm_tf import tasks  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  from realm_tf import train_lib  # pylint: disable=g-import-not-at-top
  model_dir = os.path.join(work, "ict_model")
  params = ict_params(work, vocab_file, budget, seed)
  tf_keras.utils.set_random_seed(seed)
  start = time.time()
  logs = train_lib.run_experiment(params, model_dir, mode="train")
  seconds = time.time() - start
  return {"model_dir": model_dir, "steps": budget.ict_steps,
          "checkpoint": model_dir_lib.latest_checkpoint(model_dir),
          "seconds_per_step": round(seconds / budget.ict_steps, 3),
          "last_logs": {k: round(float(v), 4) for k, v in logs.items()}}


def question_rows(tokenizer, records, length: int) -> List[List[int]]:
  """``[CLS] question [SEP]`` wordpiece ids of each record, cut to ``length``."""
  ids = tokenizer.tokenize([r.question for r in records]).to_list()
  return [[tokenizer.cls_id] + q[:length - 2] + [tokenizer.sep_id] for q in ids]


def run_ict_retrieval(work: str, max_questions: int, batch_size: int,
                      block_seq_length: int) -> Dict:
  """The ICT-trained tower's recall, as the untrained row's (the same blocks at their full
  ``block_seq_length``, the same questions at the converted model's query length, exact
  search); then its frozen index for Open-QA (``ict_index/``, brute force, from the same
  embeddings through the refresher's build: ``realm-index build``'s path)."""
  from realm_tf import model_dir as model_dir_lib  # pylint: disable=g-import-not-at-top
  from realm_tf.data import manifests  # pylint: disable=g-import-not-at-top
  from realm_tf.retrieval import refresher  # pylint: disable=g-import-not-at-top
  blocks_dir = os.path.join(work, "blocks")
  blocks = manifests.read_blocks(blocks_dir)
  records = test_questions(work, max_questions)
  model_dir = os.path.join(work, "ict_model")
  tower = TowerPass(model_dir)
  query_length = model_dir_lib.load_config(
      os.path.join(work, "minilm_model")).retriever.query_seq_length
  started = time.time()
  block_emb, _ = embed_token_ids(tower, [b["token_ids"] for b in blocks], block_seq_length,
                                 batch_size)
  embed_seconds = time.time() - started
  q_emb, _ = embed_token_ids(tower, question_rows(tower.embedder.tokenizer, records,
                                                  query_length), query_length, batch_size,
                             type_ids=False)
  ids = np.array([b["block_id"] for b in blocks])
  if sorted(ids.tolist()) != list(range(len(blocks))):
    raise RealTextError(f"{blocks_dir}: block ids are not 0..{len(blocks) - 1}")
  top = ids[top_k(q_emb, block_emb, max(TOP_K))]
  out_dir = os.path.join(work, "ict")
  os.makedirs(out_dir, exist_ok=True)
  np.save(os.path.join(out_dir, "top_ids.npy"), top)
  np.save(os.path.join(out_dir, "question_emb.npy"), q_emb)
  by_id = np.zeros_like(block_emb)
  by_id[ids] = block_emb
  index_path = refresher.build_index_for_checkpoint(
      None, model_dir, blocks_dir, os.path.join(work, "ict_index"),
      options=refresher.BuildOptions(index_type="brute_force", recall_queries=0,
                                     progress=False), embeddings=by_id)
  result = recall_at(top, [b["body"] for b in blocks], records)
  return dict(result, test_questions=len(records), blocks=len(blocks), index=index_path,
              embed_seconds=round(embed_seconds, 1))


# ---------------------------------------------------------------------------- Open-QA --

def convert_reader(minilm_dir: str, vocab_file: str, out: str) -> Dict:
  """``realm-convert --hf_dir --targets=reader``: MiniLM as the reader's BERT (its span scorer
  starts fresh in Open-QA fine-tuning)."""
  from realm_tf import checkpoint_convert  # pylint: disable=g-import-not-at-top
  return {"checkpoint": checkpoint_convert.convert_hf(minilm_dir, out, vocab_file,
                                                      targets=["reader"])}


def qa_subset(work: str, split: str, count: int, seed: int,
              max_questions: int = 0) -> Tuple[str, List[int]]:
  """``qa/openqa-<split>.jsonl``: ``count`` questions of ``squad-<split>.jsonl`` (the first
  ``max_questions`` of it, 0: all) drawn with ``seed``, in file order (all when fewer); its
  path and the chosen lines' indices."""
  with open(os.path.join(work, "qa", f"squad-{split}.jsonl"), encoding="utf-8") as f:
    lines = [line for line in f if line.strip()]
  if max_questions:
    lines = lines[:max_questions]
  chosen = list(range(len(lines)))
  if count < len(lines):
    chosen = sorted(np.random.RandomState(seed).choice(len(lines), count, replace=False).tolist())
  path = os.path.join(work, "qa", f"openqa-{split}.jsonl")
  with open(path, "w", encoding="utf-8") as f:
    f.writelines(lines[i] for i in chosen)
  return path, chosen


def gold_settings(budget: Budget, seed: int):
  """Stage A's settings (``gold_reader.Settings``) from the budget: the Open-QA reader's input
  length, so stage B reads rows of the length stage A trained on."""
  from experiments import gold_reader  # pylint: disable=g-import-not-at-top
  return gold_reader.Settings(
      learning_rate=budget.gold_learning_rate, epochs=budget.gold_epochs,
      batch_size=budget.gold_batch_size, seq_length=budget.reader_seq_length,
      max_query_length=min(64, budget.reader_seq_length // 2),
      eval_batch_size=budget.eval_batch_size, seed=seed)


def train_gold_reader(work: str, squad_file: str, budget: Budget, seed: int,
                      max_articles: int, max_paragraphs: int) -> Dict:
  """Stage A (``experiments/gold_reader.py``): the converted MiniLM reader fine-tuned on the
  train articles' questions with their own paragraphs, scored on every dev question's."""
  from experiments import gold_reader  # pylint: disable=g-import-not-at-top
  out = os.path.join(work, "gold_reader")
  os.makedirs(out, exist_ok=True)
  summary = gold_reader.train(os.path.join(work, "minilm_reader_model"), out, squad_file,
                              gold_settings(budget, seed), max_articles, max_paragraphs,
                              say=_say)
  return dict(summary, model_dir=out)


def reader_start(work: str) -> str:
  """The reader Open-QA fine-tunes from: stage A's when it ran, else MiniLM's (fresh head)."""
  gold = os.path.join(work, "gold_reader")
  return gold if os.path.exists(os.path.join(work, "gold_reader_done.json")) else (
      os.path.join(work, "minilm_reader_model"))


def evaluate_gold(work: str, squad_file: str, budget: Budget, seed: int, max_articles: int,
                  max_paragraphs: int, max_questions: int) -> Dict:
  """Stage A's reader on the Open-QA test sample (``qa_subset``'s questions), each question
  read in its own paragraph: the gold-paragraph row, the ceiling of the reading."""
  from experiments import gold_reader  # pylint: disable=g-import-not-at-top
  from realm_tf.data import qa  # pylint: disable=g-import-not-at-top
  test_file, chosen = qa_subset(work, "test", budget.openqa_test_questions, seed, max_questions)
  result = gold_reader.evaluate(
      os.path.join(work, "gold_reader"), squad_file, "test", gold_settings(budget, seed),
      chosen, max_articles, max_paragraphs,
      os.path.join(work, "gold_reader", "test_predictions.jsonl"))
  records, _ = qa.read_qa(test_file)
  if [r["question"] for r in result["rows"]] != [r.question for r in records]:
    raise RealTextError(f"{test_file}: its questions are not the test split's in "
                        f"{squad_file} (was the file or a --max_* option changed?)")
  return {"test_file": test_file, "test_questions": result["questions"],
          "exact_match": result["exact_match"], "f1": result["f1"]}


def openqa_params(work: str, vocab_file: str, budget: Budget, seed: int, dev_file: str,
                  block_seq_length: int, extra: Sequence[str] = ()):
  """The Open-QA experiment (``realm-train --experiment=openqa_cpu``): the ICT towers' query
  tower, MiniLM's reader, the frozen ``ict_index/``, SQuAD's training questions, ``dev_file``
  for validation (the best checkpoint by dev exact match in ``best_ckpt/``); ``extra``: more
  overrides, last."""
  from realm_tf import configs  # pylint: disable=g-import-not-at-top
  from realm_tf import model_dir as model_dir_lib  # pylint: disable=g-import-not-at-top
  query_length = model_dir_lib.load_config(
      os.path.join(work, "minilm_model")).retriever.query_seq_length
  overrides = [
      f"task.model.vocab_file={vocab_file}",
      f"task.index_dir={os.path.join(work, 'ict_index')}",
      f"task.blocks_dir={os.path.join(work, 'blocks')}",
      f"task.retriever_init_checkpoint={os.path.join(work, 'ict_model')}",
      f"task.reader_init_checkpoint={reader_start(work)}",
      f"task.train_data.input_path={os.path.join(work, 'qa', 'squad-train.jsonl')}",
      f"task.train_data.global_batch_size={budget.openqa_batch_size}",
      f"task.train_data.seed={seed}",
      f"task.validation_data.input_path={dev_file}",
      f"task.validation_data.global_batch_size={budget.eval_batch_size}",
      f"task.model.retriever.query_seq_length={query_length}",
      f"task.model.retriever.block_seq_length={block_seq_length}",
      f"task.model.reader.openqa_seq_length={budget.reader_seq_length}",
      f"task.retriever_beam_size={budget.retriever_beam_size}",
      f"task.reader_beam_size={budget.reader_beam_size}",
      "trainer.optimizer_config.learning_rate.polynomial.initial_learning_rate="
      f"{budget.openqa_learning_rate}",
  ] + train_lengths(budget.openqa_steps, budget.openqa_validations) + list(extra)
  return configs.load_experiment(
      "openqa_cpu", [os.path.join(CONFIG_DIR, "openqa_cpu__real_text.yaml"),
                     encoder_yaml(work, "openqa")], ",".join(overrides))


def train_openqa(work: str, vocab_file: str, budget: Budget, seed: int,
                 block_seq_length: int) -> Dict:
  """ORQA's fine-tuning (``tasks/openqa.py``, ``--mode=train_and_eval``) into ``openqa/``,
  validated on ``--openqa_dev_questions`` dev questions at each checkpoint."""
  import tf_keras  # pylint: disable=g-import-not-at-top
  from realm_tf import model_dir as model_dir_lib  # pylint: disable=g-import-not-at-top
  from realm_tf import tasks  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  from realm_tf import train_lib  # pylint: disable=g-import-not-at-top
  from realm_tf.openqa import predict  # pylint: disable=g-import-not-at-top
  dev_file, _ = qa_subset(work, "dev", budget.openqa_dev_questions, seed)
  params = openqa_params(work, vocab_file, budget, seed, dev_file, block_seq_length)
  model_dir = os.path.join(work, "openqa")
  tf_keras.utils.set_random_seed(seed)
  start = time.time()
  train_lib.run_experiment(params, model_dir, mode="train_and_eval")
  seconds = time.time() - start
  dev = model_dir_lib.read_summaries(model_dir, "validation")
  best = predict.best_checkpoint(model_dir)
  info = os.path.join(model_dir, "best_ckpt", "info.json")
  if not os.path.exists(info):
    raise RealTextError(f"{info} not found: the Open-QA run kept no best checkpoint")
  # The exporter numbers its checkpoints by its own counter; the step is in its info.json.
  best_step = int(_read_json(info)["best_ckpt_global_step"])
  return {"model_dir": model_dir, "steps": budget.openqa_steps, "dev_file": dev_file,
          "best_checkpoint": best, "best_step": best_step,
          "seconds_per_step_with_validation": round(seconds / budget.openqa_steps, 3),
          "dev": {k: [[int(step), float(v)] for step, v in dev[k]]
                  for k in ("exact_match", "official_exact_match", "top_5_match") if k in dev}}


def read_hits(model, records, rows) -> List[bool]:
  """For each evaluated question (``rows``: ``evaluation.evaluate``'s), whether an answer lies
  in what the reader read: a gold span (the builder's own rule) inside the part of one of its
  read blocks that fits the reader's input beside the question. Top-k match tests whole
  blocks; a block longer than that room is read only in part."""
  from realm_tf.openqa import inputs as inputs_lib  # pylint: disable=g-import-not-at-top
  builder = model.builder
  questions = [inputs_lib.question_of(r) for r in records]
  question_ids = builder.question_ids(builder.question_inputs([q.question for q in questions]))
  hits = []
  for q, q_ids, a_ids, row in zip(questions, question_ids, builder.answer_ids(questions), rows):
    blocks = builder.block_texts([b["block_id"] for b in row["blocks"]])
    hits.append(any(builder.gold_spans(q, a_ids, block, builder.reader_row(q_ids, block)[-1])
                    for block in blocks))
  return hits


def score_openqa(model, records, budget: Budget, out_dir: str):
  """``realm-eval``'s evaluation of a loaded ``OpenQA`` on ``records``, written to
  ``out_dir``: its metrics, rows, and EM, top-k match and read match (``read_hits``) with
  their Wilson intervals."""
  from realm_tf.openqa import evaluation  # pylint: disable=g-import-not-at-top
  metrics, rows = evaluation.evaluate(model, records, batch_size=budget.eval_batch_size,
                                      top_k=TOP_K, progress=False)
  evaluation.write_outputs(out_dir, metrics, rows)
  scores = {"exact_match": proportion([r["correct"] for r in rows]),
            "read_match": proportion(read_hits(model, records, rows))}
  for k in TOP_K:
    scores[f"top_{k}_match"] = proportion([r["first_correct_rank"] is not None
                                           and r["first_correct_rank"] < k for r in rows])
  return metrics, rows, scores


def evaluate_openqa(work: str, budget: Budget, seed: int, max_questions: int) -> Dict:
  """``realm-eval``'s evaluation (``openqa.evaluation.evaluate``) of the best dev checkpoint
  on ``--openqa_test_questions`` test questions: official EM and top-k match with their
  intervals, predictions and evidence in ``openqa_eval/``. Top-k match before fine-tuning:
  the same questions' hits in the ICT stage's top 20 (the initialization's query tower, the
  same index embeddings, the same ``HasAnswer`` test)."""
  from realm_tf.data import qa  # pylint: disable=g-import-not-at-top
  from realm_tf.openqa import predict  # pylint: disable=g-import-not-at-top
  test_file, chosen = qa_subset(work, "test", budget.openqa_test_questions, seed, max_questions)
  records, _ = qa.read_qa(test_file)
  model = predict.OpenQA.load(os.path.join(work, "openqa"), os.path.join(work, "ict_index"),
                              os.path.join(work, "blocks"),
                              reader_beam_size=budget.reader_beam_size,
                              retriever_beam_size=budget.retriever_beam_size)
  metrics, rows, after = score_openqa(model, records, budget,
                                      os.path.join(work, "openqa_eval"))
  from realm_tf.data import manifests  # pylint: disable=g-import-not-at-top
  bodies = [b["body"] for b in manifests.read_blocks(os.path.join(work, "blocks"))]
  first = first_hits(np.load(os.path.join(work, "ict", "top_ids.npy"))[chosen], bodies,
                     records)
  before = {f"top_{k}_match": proportion(first < k) for k in TOP_K}
  return {"test_file": test_file, "test_questions": len(rows), "checkpoint": model.checkpoint,
          "before": before, "after": after,
          "metrics": {k: v for k, v in metrics.items() if isinstance(v, (int, float))}}


def read_given_beams(model, beams: Dict[str, np.ndarray]) -> None:
  """Makes a loaded ``OpenQA`` read, for each question, the blocks ``beams[question]`` (in that
  order; e.g. BM25's top blocks) instead of its own retrieval. The reader and its scores are
  unchanged: a read block's span scores still add the query tower's logit for it."""
  builder = model.builder
  features = builder.features

  def with_beams(questions, query_embeddings, **kwargs):
    ids = np.stack([beams[q.question] for q in questions])
    builder.search = lambda _, k: (ids[:, :k], np.zeros([len(ids), k], np.float32))
    return features(questions, query_embeddings, **kwargs)
  builder.features = with_beams


def evaluate_bm25_reader(work: str, budget: Budget, seed: int, max_questions: int) -> Dict:
  """The fine-tuned Open-QA model reading BM25's top blocks (``bm25/top_ids.npy``) on the same
  test sample: what a BM25 user gets from the same reader. Its top-k match is BM25's."""
  from realm_tf.data import qa  # pylint: disable=g-import-not-at-top
  from realm_tf.openqa import predict  # pylint: disable=g-import-not-at-top
  test_file, chosen = qa_subset(work, "test", budget.openqa_test_questions, seed, max_questions)
  records, _ = qa.read_qa(test_file)
  top = np.load(os.path.join(work, "bm25", "top_ids.npy"))[chosen]
  model = predict.OpenQA.load(os.path.join(work, "openqa"), os.path.join(work, "ict_index"),
                              os.path.join(work, "blocks"),
                              reader_beam_size=budget.reader_beam_size,
                              retriever_beam_size=top.shape[1])
  read_given_beams(model, {r.question: row for r, row in zip(records, top)})
  _, rows, after = score_openqa(model, records, budget,
                                os.path.join(work, "bm25_reader_eval"))
  return {"test_file": test_file, "test_questions": len(rows), "checkpoint": model.checkpoint,
          "after": after}


# --------------------------------------------------------------------------------- results --

def _interval_text(value: float, lo: float, hi: float) -> str:
  return f"{value:.3f} [{lo:.3f}, {hi:.3f}]"


def retrieval_rows(work: str, stages: Dict[str, Dict], max_questions: int) -> List[Dict]:
  """One row per retriever: its recall@k (from its stage) and their 95% Wilson intervals over
  the test questions, from the per-question ranks of its saved top 20 (``top_ids.npy``)."""
  from realm_tf.data import manifests  # pylint: disable=g-import-not-at-top
  bodies = [b["body"] for b in manifests.read_blocks(os.path.join(work, "blocks"))]
  records = test_questions(work, max_questions)
  rows = [(dict(stages["bm25"], retriever=BM25), os.path.join("bm25", "top_ids.npy"))]
  if "minilm" in stages:
    minilm, seconds = stages["minilm"], stages["minilm"]["seconds"] + stages["convert"]["seconds"]
    for key, label in (("realm", MINILM), ("mean", MINILM_MEAN)):
      rows.append((dict(minilm[key], retriever=label, test_questions=minilm["test_questions"],
                        blocks=minilm["blocks"], seconds=seconds),
                   os.path.join("minilm", f"{key}_top_ids.npy")))
  if "ict" in stages:
    ict = stages["ict"]
    seconds = ict["seconds"] + stages["ict_examples"]["seconds"] + stages["ict_train"]["seconds"]
    rows.append((dict(ict, retriever=MINILM_ICT, seconds=seconds),
                 os.path.join("ict", "top_ids.npy")))
  out = []
  for row, top_file in rows:
    first = first_hits(np.load(os.path.join(work, top_file)), bodies, records)
    for k in TOP_K:
      p = proportion(first < k)
      if abs(p["value"] - row[f"recall@{k}"]) > 1e-9:
        raise RealTextError(f"{os.path.join(work, top_file)}: recall@{k} {p['value']} is not "
                            f"the stage's {row[f'recall@{k}']} (a stage's outputs were changed)")
      row[f"recall@{k}_lo"], row[f"recall@{k}_hi"] = p["lo"], p["hi"]
    out.append(row)
  return out


def _write_csv(path: str, fields: Sequence[str], rows: Sequence[Dict]) -> None:
  with open(path, "w", newline="", encoding="utf-8") as f:
    writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
      writer.writerow({k: (f"{row[k]:.4f}" if isinstance(row[k], float) and k != "seconds"
                           else row[k]) for k in fields})


def write_results(out: str, stages: Dict[str, Dict], max_questions: int = 0) -> Dict[str, str]:
  """``results/real_text_retrieval.{md,csv}``: one row per retriever with 95% intervals, then
  the stage times; with the Open-QA stages, ``results/real_text_openqa.{md,csv}``."""
  work = os.path.join(out, "work")
  rows = retrieval_rows(work, stages, max_questions)
  results = os.path.join(out, "results")
  os.makedirs(results, exist_ok=True)
  csv_path = os.path.join(results, RESULTS_NAME + ".csv")
  _write_csv(csv_path, CSV_FIELDS, rows)
  corpus, questions = stages["corpus"], stages["questions"]
  lines = [
      "# Retrieval on real text: SQuAD v1.1 dev + an enwiki slice",
      "",
      f"{corpus['blocks']} blocks of at most {stages['block_seq_length']} wordpieces from "
      f"{corpus['documents']} documents ({corpus['squad_paragraphs']} SQuAD paragraphs of "
      f"{corpus['squad_articles']} articles, and the dump's articles); "
      f"{rows[0]['test_questions']} test questions (SQuAD dev's questions, split by article: "
      + ", ".join(f"{n} {questions['questions'][n]}" for n in ("train", "dev", "test"))
      + "). Recall@k: a top-k block body holds an answer "
      "(ORQA's HasAnswer); in brackets its 95% Wilson interval over the test questions. "
      "Seconds: the retriever's stages (MiniLM: conversion, embedding and search; ICT: "
      "its examples, training, embedding, search and index).",
      "",
      "| retriever | recall@1 | recall@5 | recall@20 | test questions | seconds |",
      "|---|---|---|---|---|---|"]
  for row in rows:
    cells = [_interval_text(row[f"recall@{k}"], row[f"recall@{k}_lo"], row[f"recall@{k}_hi"])
             for k in TOP_K]
    lines.append(f"| {row['retriever']} | {' | '.join(cells)} | {row['test_questions']} | "
                 f"{row['seconds']:.1f} |")
  lines += ["", "| stage | seconds |", "|---|---|"]
  for name in STAGE_NAMES:
    if name in stages:
      lines.append(f"| {name} | {stages[name]['seconds']:.1f} |")
  if "minilm" not in stages:
    lines += ["", "MiniLM not run (--nominilm)."]
  if "ict_train" in stages:
    budget = stages["budget"]
    lines += ["", f"ICT: {budget['ict_steps']} steps of batch {budget['ict_batch_size']}, "
              f"queries of {budget['ict_query_seq_length']} and blocks of "
              f"{budget['ict_block_seq_length']} wordpieces when training, lr "
              f"{budget['ict_learning_rate']} (ORQA: 100k steps of batch 4096, 64 and 288, "
              "lr 1e-4); evaluated on the blocks at their full length."]
  lines += ["", "Not run here: REALM pre-training (no masked-LM reader ships with MiniLM, and "
            "2 cores are too few).", ""]
  md_path = os.path.join(results, RESULTS_NAME + ".md")
  with open(md_path, "w", encoding="utf-8") as f:
    f.write("\n".join(lines))
  paths = {"md": md_path, "csv": csv_path}
  if "openqa_eval" in stages:
    paths.update(write_openqa_results(results, stages))
  return paths


OPENQA_FIELDS = ("model", "checkpoint_step", "exact_match", "exact_match_lo", "exact_match_hi",
                 "read_match", "read_match_lo", "read_match_hi", "top_1_match",
                 "top_1_match_lo", "top_1_match_hi", "top_5_match", "top_5_match_lo",
                 "top_5_match_hi", "top_20_match", "top_20_match_lo", "top_20_match_hi",
                 "test_questions")
OPENQA_BEFORE = "before fine-tuning (ICT retriever)"
OPENQA_AFTER = "after fine-tuning (ICT retriever + MiniLM reader)"
OPENQA_GOLD = "gold paragraph (stage A reader, no retrieval)"
OPENQA_BM25 = "BM25 top blocks + the same fine-tuned reader"


def openqa_rows(evaluation: Dict, training: Dict, gold: Optional[Dict] = None,
                gold_step: int = 0, bm25: Optional[Dict] = None) -> List[Dict]:
  """The table's rows: the gold paragraph (``gold``: stage A's reader after ``gold_step``
  steps), before and after fine-tuning, and BM25's blocks read by the same reader."""
  rows = []
  runs = [(OPENQA_BEFORE, evaluation["before"], 0),
          (OPENQA_AFTER, evaluation["after"], training["best_step"])]
  if bm25 is not None:
    if bm25["test_file"] != evaluation["test_file"]:
      raise RealTextError(f"the BM25 row read {bm25['test_file']}, the Open-QA evaluation "
                          f"{evaluation['test_file']}: not the same questions")
    runs.append((OPENQA_BM25, bm25["after"], training["best_step"]))
  if gold is not None:
    if gold["test_file"] != evaluation["test_file"]:
      raise RealTextError(f"the gold-paragraph row read {gold['test_file']}, the Open-QA "
                          f"evaluation {evaluation['test_file']}: not the same questions")
    runs.insert(0, (OPENQA_GOLD, {"exact_match": gold["exact_match"]}, gold_step))
  for label, values, step in runs:
    row = {"model": label, "checkpoint_step": step,
           "test_questions": evaluation["test_questions"]}
    for name, p in values.items():
      row[name], row[f"{name}_lo"], row[f"{name}_hi"] = p["value"], p["lo"], p["hi"]
    for name in OPENQA_FIELDS:
      row.setdefault(name, "")
    rows.append(row)
  return rows


def write_openqa_results(results: str, stages: Dict[str, Dict]) -> Dict[str, str]:
  """``results/real_text_openqa.{md,csv}``: EM and top-k match before and after fine-tuning,
  each with its 95% Wilson interval over the test questions."""
  evaluation, training, budget = stages["openqa_eval"], stages["openqa_train"], stages["budget"]
  gold = stages.get("gold_reader")
  rows = openqa_rows(evaluation, training, stages.get("gold_test"),
                     gold["steps"] if gold else 0, stages.get("bm25_reader"))
  csv_path = os.path.join(results, OPENQA_NAME + ".csv")
  _write_csv(csv_path, OPENQA_FIELDS, rows)
  dev = training["dev"].get("exact_match", [])
  lines = [
      "# Open-QA on real text: SQuAD v1.1 dev questions, split by article",
      "",
      "ORQA's fine-tuning from the ICT-trained MiniLM retriever with a MiniLM reader ("
      + (f"stage A's: the converted encoder and span scorer trained on the training "
         f"questions' own paragraphs, {gold['steps']} steps of {budget['gold_batch_size']} "
         f"windows, lr {budget['gold_learning_rate']}; dev EM "
         f"{_interval_text(**gold['dev_exact_match'])}, F1 {gold['dev_f1']['value']:.3f} on "
         f"{gold['dev_questions']} dev questions"
         if gold else "the converted encoder and a fresh span scorer")
      + f") on the {stages['questions']['questions']['train']} "
      f"training questions, {budget['openqa_steps']} steps of batch "
      f"{budget['openqa_batch_size']}, lr {budget['openqa_learning_rate']}, retriever beam "
      f"{budget['retriever_beam_size']}, reader beam {budget['reader_beam_size']}, reader input "
      f"{budget['reader_seq_length']} wordpieces (ORQA: 100k steps of batch 1, beam 5000, "
      f"read 5, 320, lr 1e-5). Checkpoint by span exact match on "
      f"{budget['openqa_dev_questions']} dev questions (at most): "
      + ", ".join(f"step {s}: {v:.3f}" for s, v in dev) + f"; chosen: step "
      f"{training['best_step']}. Test: {evaluation['test_questions']} held-out-article "
      "questions (realm-eval's evaluation; official EM: ORQA's normalization, answers in "
      "whole words). In brackets: 95% Wilson intervals over the questions. Before "
      "fine-tuning the retriever is the ICT tower: its top-k match over the same questions "
      "and index. The gold-paragraph row reads each test question in the paragraph it was "
      "written from (no retrieval): the reader's ceiling. The BM25 row reads BM25's top "
      f"{budget['reader_beam_size']} blocks with the fine-tuned model (its span scores "
      "still add the query tower's score of each block); its top-k match is BM25's.",
      "",
      f"Read match: an answer inside the part of the {budget['reader_beam_size']} read blocks "
      f"that the reader's {budget['reader_seq_length']} wordpieces hold beside the question "
      f"(top-k match tests whole blocks of {stages['block_seq_length']}): the most that "
      "reading those blocks can get.",
      "",
      "| model | step | EM | read match | top-1 match | top-5 match | top-20 match | "
      "test questions |",
      "|---|---|---|---|---|---|---|---|"]
  for row in rows:
    cells = [(_interval_text(row[n], row[f"{n}_lo"], row[f"{n}_hi"]) if row[n] != "" else "-")
             for n in ("exact_match", "read_match", "top_1_match", "top_5_match",
                       "top_20_match")]
    lines.append(f"| {row['model']} | {row['checkpoint_step']} | {' | '.join(cells)} | "
                 f"{row['test_questions']} |")
  lines += ["", "| stage | seconds |", "|---|---|"]
  for name in ("reader_convert", "gold_reader", "gold_test", "openqa_train", "openqa_eval",
               "bm25_reader"):
    if name in stages:
      lines.append(f"| {name} | {stages[name]['seconds']:.1f} |")
  lines.append("")
  md_path = os.path.join(results, OPENQA_NAME + ".md")
  with open(md_path, "w", encoding="utf-8") as f:
    f.write("\n".join(lines))
  return {"openqa_md": md_path, "openqa_csv": csv_path}


STAGE_NAMES = ("corpus", "spans", "questions", "bm25", "convert", "minilm", "ict_examples",
               "ict_train", "ict")


def check_options(work: str, options: Dict) -> None:
  """Records the options of a work directory, or checks that they are the recorded ones: a
  stage is skipped when its output exists, so outputs of other options must not be reused."""
  path = os.path.join(work, "options.json")
  if os.path.exists(path):
    recorded = _read_json(path)
    changed = sorted(k for k in set(recorded) | set(options)
                     if k in recorded and recorded.get(k) != options.get(k))
    if changed:
      raise RealTextError(
          f"{path} was made with other options ({', '.join(changed)}: "
          f"{[recorded.get(k) for k in changed]}, now {[options.get(k) for k in changed]}); "
          "pass another --output_dir, or delete that one to start again")
    added = sorted(set(options) - set(recorded))
    if added:
      # Options that did not exist when the directory was made: the stages they govern were
      # not run then, so they are recorded now and govern the stages still to run.
      _say(f"{path}: recording options it did not have: {', '.join(added)}")
      _write_json(path, dict(recorded, **{k: options[k] for k in added}))
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
                   batch_size: int = 32, ict: bool = True, openqa: bool = True,
                   budget: Budget = Budget()) -> Dict:
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
  budget.check()
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
  check_options(work, options)
  start = time.time()
  stages = {"block_seq_length": block_seq_length, "budget": dataclasses.asdict(budget)}
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
  if ict:
    stages["ict_examples"] = stage(
        "ICT examples", os.path.join(work, "ict_examples_done.json"),
        lambda: make_ict_examples(work, vocab_file, block_seq_length))
    stages["ict_train"] = stage("ICT training", os.path.join(work, "ict_model_done.json"),
                                lambda: train_ict(work, vocab_file, budget, seed))
    stages["ict"] = stage("ICT retrieval", os.path.join(work, "ict", "done.json"),
                          lambda: run_ict_retrieval(work, max_questions, batch_size,
                                                    block_seq_length))
  if openqa:
    stages["reader_convert"] = stage(
        "MiniLM reader conversion", os.path.join(work, "minilm_reader_model_done.json"),
        lambda: convert_reader(minilm_dir, vocab_file,
                               os.path.join(work, "minilm_reader_model")))
    stages["gold_reader"] = stage(
        "Gold-paragraph reader (stage A)", os.path.join(work, "gold_reader_done.json"),
        lambda: train_gold_reader(work, squad_file, budget, seed, max_articles,
                                  max_paragraphs))
    stages["gold_test"] = stage(
        "Gold-paragraph test", os.path.join(work, "gold_reader", "test_done.json"),
        lambda: evaluate_gold(work, squad_file, budget, seed, max_articles, max_paragraphs,
                              max_questions))
    stages["openqa_train"] = stage(
        "Open-QA training", os.path.join(work, "openqa_done.json"),
        lambda: train_openqa(work, vocab_file, budget, seed, block_seq_length))
    stages["openqa_eval"] = stage(
        "Open-QA evaluation", os.path.join(work, "openqa_eval", "done.json"),
        lambda: evaluate_openqa(work, budget, seed, max_questions))
    stages["bm25_reader"] = stage(
        "BM25 + the reader", os.path.join(work, "bm25_reader_eval", "done.json"),
        lambda: evaluate_bm25_reader(work, budget, seed, max_questions))
  stages["results"] = write_results(out, stages, max_questions)
  labels = [(BM25, stages["bm25"])]
  if "minilm" in stages:
    labels += [(MINILM, stages["minilm"]["realm"]), (MINILM_MEAN, stages["minilm"]["mean"])]
  if "ict" in stages:
    labels.append((MINILM_ICT, stages["ict"]))
  for label, r in labels:
    _say(f"{label}: recall@1 {r['recall@1']:.3f}, @5 {r['recall@5']:.3f}, "
         f"@20 {r['recall@20']:.3f}")
  if "openqa_eval" in stages:
    e = stages["openqa_eval"]
    _say(f"Open-QA: EM {_interval_text(**e['after']['exact_match'])}, top-5 match before "
         f"{e['before']['top_5_match']['value']:.3f}, after "
         f"{e['after']['top_5_match']['value']:.3f} ({e['test_questions']} test questions)")
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
  flags.DEFINE_integer("seed", 0, "Seed of the MiniLM tower's fresh projection, of the data "
                       "order of the trained stages and of the Open-QA dev/test samples.")
  flags.DEFINE_integer("batch_size", 32, "Blocks per encoder call.")
  flags.DEFINE_bool("ict", True, "Also run the ICT stages (examples, training, retrieval).")
  flags.DEFINE_bool("openqa", True, "Also run the Open-QA stages (fine-tuning, test EM).")
  defaults = Budget()
  helps = {
      "ict_steps": "ICT training steps (ORQA: 100k).",
      "ict_batch_size": "ICT batch: blocks, and so in-batch negatives (ORQA: 4096).",
      "ict_query_seq_length": "ICT query (sentence) length in training (ORQA: 64).",
      "ict_block_seq_length": "ICT block length in training (ORQA: 288); the retrieval stage "
                              "embeds the blocks at --block_seq_length.",
      "ict_learning_rate": "ICT peak learning rate (ORQA: 1e-4).",
      "gold_learning_rate": "Stage A (the reader on its questions' own paragraphs, "
                            "experiments/gold_reader.py): peak learning rate.",
      "gold_epochs": "Stage A: passes over the training questions' windows.",
      "gold_batch_size": "Stage A: reader rows (paragraph windows) per step.",
      "openqa_steps": "Open-QA fine-tuning steps (ORQA: 100k).",
      "openqa_batch_size": "Questions per Open-QA step (ORQA: 1).",
      "openqa_learning_rate": "Open-QA peak learning rate (ORQA: 1e-5).",
      "reader_seq_length": "Reader input, question + block, in wordpieces (ORQA: 320).",
      "reader_beam_size": "Blocks read per question (ORQA: 5).",
      "retriever_beam_size": "Blocks retrieved per question for the retriever loss and "
                             "top-k match (ORQA: 5000).",
      "openqa_validations": "Dev validations (checkpoints) during fine-tuning; the best by dev "
                            "exact match is evaluated.",
      "openqa_dev_questions": "Dev questions of each validation (a seeded sample).",
      "openqa_test_questions": "Test questions of the Open-QA evaluation (a seeded sample).",
      "eval_batch_size": "Questions per batch when validating and evaluating Open-QA.",
  }
  for field in dataclasses.fields(Budget):
    default = getattr(defaults, field.name)
    define = flags.DEFINE_float if isinstance(default, float) else flags.DEFINE_integer
    define(field.name, default, helps[field.name])


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
                 Budget(**{f.name: FLAGS[f.name].value for f in dataclasses.fields(Budget)}))


def run():
  define_flags()
  cli.run_main(main)


if __name__ == "__main__":
  run()
