r"""Real text's stages (``experiments/real_text/main.py`` runs them in order): the corpus and its
questions, BM25 and dense retrieval with their recall, ICT from the converted MiniLM, the
gold-paragraph reader (stage A, ``experiments/real_text/gold_reader.py``), ORQA's fine-tuning and
``realm-eval``'s evaluation. Training goes through the shared ``stages.train``, configs through
``stages.experiment_params`` and the frozen index through ``stages.build_index``.

Each stage is a function of its arguments (paths, :class:`Budget`, a seed) and returns a small
JSON-able summary; ``Clock.once`` keeps it in the stage's ``done`` file and skips the stage when
that file exists.
"""

import dataclasses
import json
import os
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import bm25s
import numpy as np
import tensorflow as tf
import tf_keras

from data_prep import blocks as blocks_lib
from data_prep import ict_examples
from data_prep import open_qa
from data_prep import salient_spans
from data_prep import squad
from data_prep import wiki
from experiments.pipeline import stages
from experiments.pipeline.common import Clock
from experiments.pipeline.common import flag_field
from experiments.pipeline.common import proportion
from experiments.pipeline.common import read_json
from experiments.pipeline.common import write_json
from experiments.real_text import gold_reader
import realm_tf
from realm_tf import checkpoint_convert
from realm_tf import errors
from realm_tf import model_dir as model_dir_lib
from realm_tf.data import features
from realm_tf.data import manifests
from realm_tf.data import qa
from realm_tf.openqa import evaluation
from realm_tf.openqa import inputs as inputs_lib
from realm_tf.openqa import predict
from realm_tf.retrieval.index import brute_force
from realm_tf.retrieval.publication import index_io
from realm_tf.retrieval.publication import publish
from realm_tf.retrieval.sparse import hybrid
from realm_tf.retrieval.sparse import sparse_index

TOP_K = (1, 5, 20)
LEARNING_RATE = "trainer.optimizer_config.learning_rate.polynomial"


class RealTextError(errors.RealmError):
  """An input of the real-text experiment is missing or unusable; the message names it."""


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
  ict_steps: int = flag_field(250, "ICT training steps (ORQA: 100k).")
  ict_batch_size: int = flag_field(32, "ICT batch: blocks, and so in-batch negatives (ORQA: 4096).")
  ict_query_seq_length: int = flag_field(64, "ICT query (sentence) length in training (ORQA: 64).")
  ict_block_seq_length: int = flag_field(
      128, "ICT block length in training (ORQA: 288); the retrieval stage embeds the blocks at "
      "--block_seq_length.")
  ict_learning_rate: float = flag_field(1e-4, "ICT peak learning rate (ORQA: 1e-4).")
  gold_learning_rate: float = flag_field(
      3e-4, "Stage A (the reader on its questions' own paragraphs, "
      "experiments/real_text/gold_reader.py): peak learning rate.")
  gold_epochs: float = flag_field(2.0, "Stage A: passes over the training questions' windows.")
  gold_batch_size: int = flag_field(16, "Stage A: reader rows (paragraph windows) per step.")
  openqa_steps: int = flag_field(300, "Open-QA fine-tuning steps (ORQA: 100k).")
  openqa_batch_size: int = flag_field(4, "Questions per Open-QA step (ORQA: 1).")
  openqa_learning_rate: float = flag_field(5e-5, "Open-QA peak learning rate (ORQA: 1e-5).")
  reader_seq_length: int = flag_field(
      192, "Reader input, question + block, in wordpieces (ORQA: 320).")
  reader_beam_size: int = flag_field(5, "Blocks read per question (ORQA: 5).")
  retriever_beam_size: int = flag_field(
      100, "Blocks retrieved per question for the retriever loss and top-k match (ORQA: 5000).")
  openqa_validations: int = flag_field(
      2, "Dev validations (checkpoints) during fine-tuning; the best by dev exact match is "
      "evaluated.")
  openqa_dev_questions: int = flag_field(200, "Dev questions of each validation (a seeded sample).")
  openqa_test_questions: int = flag_field(
      500, "Test questions of the Open-QA evaluation (a seeded sample).")
  eval_batch_size: int = flag_field(
      16, "Questions per batch when validating and evaluating Open-QA.")

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


# ------------------------------------------------------------------------- corpus and questions --


def slice_dump(path: str, max_pages: int, out_path: str) -> str:
  """The first ``max_pages`` pages of a MediaWiki XML dump as a small dump of its own.

  Cuts the XML text after the ``max_pages``-th ``</page>`` and closes the root element, so the
  pipeline reads real pages, header included, without the rest of the dump.
  """
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


def make_corpus(work: str, squad_file: str, wiki_dump: str, vocab_file: str,
                block_seq_length: int, max_articles: int, max_paragraphs: int,
                max_pages: int) -> Dict:
  """SQuAD paragraphs (+ the dump) -> ``work/blocks`` through ``data_prep.blocks``."""
  corpus_dir = os.path.join(work, "corpus")
  os.makedirs(corpus_dir, exist_ok=True)
  articles = squad.read_articles(squad_file, max_articles, max_paragraphs)
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
  manifest = salient_spans.run_annotate(os.path.join(work, "blocks"),
                                        os.path.join(work, "sentences"))
  return {k: manifest[k] for k in ("num_sentences", "num_sentences_with_spans", "num_spans",
                                   "annotator", "labels")}


def make_questions(work: str, squad_file: str, max_articles: int, max_paragraphs: int,
                   fractions: Sequence[float]) -> Dict:
  """SQuAD questions -> ``qa/squad-{train,dev,test}.jsonl``, split by article."""
  articles = squad.read_articles(squad_file, max_articles, max_paragraphs)
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
  records, _ = qa.read_qa(os.path.join(work, "qa", "squad-test.jsonl"))
  return records[:max_questions] if max_questions else records


# ------------------------------------------------------------------------------------ retrieval --


def first_hits(top_ids: np.ndarray, bodies: Sequence[str], records) -> np.ndarray:
  """Per question, the rank of the first top block whose body holds an answer
  (``has_answer``), or the number of top blocks when none does (a block id of -1 pads a short
  list: never a hit)."""
  hits = np.array([[b >= 0 and inputs_lib.has_answer(bodies[b], r.answers,
                                                     r.answer_type == "regex")
                    for b in row] for row, r in zip(top_ids, records)], bool)
  return np.where(hits.any(1), hits.argmax(1), hits.shape[1])


def recall_at(top_ids: np.ndarray, bodies: Sequence[str], records, ks=TOP_K) -> Dict[str, float]:
  """``recall@k``: the share of questions with an answer (``has_answer``) in a top-k body."""
  first = first_hits(top_ids, bodies, records)
  return {f"recall@{k}": float(np.mean(first < k)) for k in ks}


def bm25_tokens(texts: Sequence[str]) -> List[List[str]]:
  """``bm25s``'s word tokens (lower-cased, English stop words out, no stemming)."""
  return bm25s.tokenize(list(texts), stopwords="en", return_ids=False, show_progress=False)


def bm25_search(documents: Sequence[str], queries: Sequence[str], k: int
                ) -> Tuple[np.ndarray, np.ndarray]:
  """Top ``k`` documents of each query by BM25 (``bm25s``, Lucene's variant, k1 1.5, b 0.75):
  ``(ids int64 [q, k], scores float32 [q, k])``, best first; ids index ``documents``."""
  retriever = bm25s.BM25(method="lucene", k1=1.5, b=0.75)
  retriever.index(bm25_tokens(documents), show_progress=False)
  ids, scores = retriever.retrieve(bm25_tokens(queries), k=min(k, len(documents)),
                                   show_progress=False)
  return np.asarray(ids, np.int64), np.asarray(scores, np.float32)


def run_bm25(work: str, max_questions: int) -> Dict:
  blocks = manifests.read_blocks(os.path.join(work, "blocks"))
  records = test_questions(work, max_questions)
  ids, scores = bm25_search([sparse_index.block_text(b["title"], b["body"]) for b in blocks],
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
  the encoder's masked mean, L2-normalized (sentence-transformers' pooling for MiniLM).
  ``side``: the query tower's, or the block tower's (the same one unless the towers are
  untied, as REALM's frozen block tower is); ``source``: a model directory or its loaded
  ``Embedder``."""

  def __init__(self, source, side: str = "query"):
    self.embedder = (source if isinstance(source, realm_tf.Embedder)
                     else realm_tf.Embedder.load(source))
    tower = {"query": self.embedder.query_embedder, "block": self.embedder.block_embedder}[side]

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
  ids, _ = brute_force.BruteForceIndex(embeddings).search(queries, min(k, len(embeddings)))
  return ids


def question_rows(tokenizer, records, length: int) -> List[List[int]]:
  """``[CLS] question [SEP]`` wordpiece ids of each record, cut to ``length``."""
  ids = tokenizer.tokenize([r.question for r in records]).to_list()
  return [[tokenizer.cls_id] + q[:length - 2] + [tokenizer.sep_id] for q in ids]


def run_minilm(work: str, max_questions: int, batch_size: int,
               say: Callable[[str], None] = print) -> Dict:
  """The converted MiniLM's two rows (REALM's tower, mean pooling): embeddings, top 20, recall."""
  blocks = manifests.read_blocks(os.path.join(work, "blocks"))
  records = test_questions(work, max_questions)
  tower = TowerPass(os.path.join(work, "minilm_model"))
  config = tower.embedder.config.retriever
  tokenizer = tower.embedder.tokenizer
  every = max(1, len(blocks) // 10)
  started = time.time()

  def progress(done):
    if done % every < batch_size or done == len(blocks):
      say(f"  embedded {done}/{len(blocks)} blocks ({time.time() - started:.0f} s)")

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


# ------------------------------------------------------------------------------------------ ICT --


def encoder_yaml(work: str, kind: str) -> str:
  """A YAML (JSON is YAML) giving the converted MiniLM's encoder shape to the ICT task's towers
  (``kind="ict"``) or to the Open-QA task's retriever and reader (``"openqa"``); its path."""
  encoder = model_dir_lib.load_config(os.path.join(work, "minilm_model")).retriever.encoder
  encoder = encoder.as_dict()
  model = ({"encoder": encoder} if kind == "ict"
           else {"retriever": {"encoder": encoder}, "reader": {"encoder": encoder}})
  path = os.path.join(work, f"minilm_encoder_{kind}.yaml")
  write_json(path, {"task": {"model": model}})
  return path


def make_ict_examples(work: str, vocab_file: str, block_seq_length: int) -> Dict:
  """The corpus's own blocks -> ICT examples (``data_prep.ict_examples``) in ``ict_examples/``;
  every block trains (no held-out ICT split: the test is on the questions)."""
  manifest = ict_examples.run_ict_examples(
      os.path.join(work, "blocks"), vocab_file, os.path.join(work, "ict_examples"),
      block_seq_length=block_seq_length, eval_fraction=0.0)
  return {k: manifest[k] for k in ("num_train", "num_sentences", "remove_prob")}


def train_lengths(steps: int, validations: int = 1) -> stages.Settings:
  """The trainer's intervals: a checkpoint (and validation) every ``steps // validations``
  steps, host round trips and summaries every ``min(20, that)``."""
  every = max(1, steps // validations)
  loop = min(20, every)
  return {"trainer.train_steps": steps, "trainer.checkpoint_interval": every,
          "trainer.validation_interval": every, "trainer.steps_per_loop": loop,
          "trainer.summary_interval": loop}


def ict_params(work: str, vocab_file: str, budget: Budget, seed: int):
  """The ICT experiment (``realm-train --experiment=ict_cpu``) from the converted MiniLM
  (``task.init_checkpoint``): both towers the one MiniLM, its projection the untrained row's,
  on ``ict_examples/``, at ``budget``'s sizes."""
  return stages.experiment_params(
      "ict_cpu", [os.path.join(stages.CONFIG_DIR, "ict_cpu__real_text.yaml"),
                  encoder_yaml(work, "ict")], dict({
          "task.vocab_file": vocab_file,
          "task.init_checkpoint": os.path.join(work, "minilm_model"),
          "task.train_data.input_path": os.path.join(work, "ict_examples", "train-*"),
          "task.train_data.global_batch_size": budget.ict_batch_size,
          "task.train_data.seed": seed,
          "task.model.query_seq_length": budget.ict_query_seq_length,
          "task.model.block_seq_length": budget.ict_block_seq_length,
          f"{LEARNING_RATE}.initial_learning_rate": budget.ict_learning_rate,
      }, **train_lengths(budget.ict_steps)))


def train_ict(clock: Clock, work: str, vocab_file: str, budget: Budget, seed: int) -> Dict:
  """ICT (``ict_params``: the ICT task and trainer of ``realm-train``, in this process:
  ``stages.train``) into ``ict_model/``."""
  model_dir = os.path.join(work, "ict_model")
  start = time.time()
  logs = stages.train(clock, "ICT", ict_params(work, vocab_file, budget, seed), model_dir, seed)
  seconds = time.time() - start
  return {"model_dir": model_dir, "steps": budget.ict_steps,
          "checkpoint": model_dir_lib.latest_checkpoint(model_dir),
          "seconds_per_step": round(seconds / budget.ict_steps, 3),
          "last_logs": {k: round(float(v), 4) for k, v in logs.items()}}


def run_ict_retrieval(work: str, max_questions: int, batch_size: int,
                      block_seq_length: int) -> Dict:
  """The ICT-trained tower's recall, as the untrained row's, into ``ict/``; then its frozen
  index for Open-QA, ``ict_index/`` (``run_tower_retrieval``)."""
  return run_tower_retrieval(work, os.path.join(work, "ict_model"), "ict", max_questions,
                             batch_size, block_seq_length)


HYBRID_WEIGHTS = (0.3, 0.5, 0.6, 0.7, 0.8, 0.9)   # BM25 weights of the dev table


def run_hybrid(work: str, max_questions: int, batch_size: int) -> Dict:
  """The hybrid retriever's recall (``retrieval.sparse.hybrid``: BM25's and the ICT tower's top 20
  fused by the library's rule, ``hybrid.FUSION``) on the test questions, into ``hybrid/``;
  with the dev questions' table of BM25 weights that chose the rule (experiments/NOTES.md,
  section 31). The ICT lists are the ICT row's (checked), from its index's embeddings."""
  started = time.time()
  blocks = manifests.read_blocks(os.path.join(work, "blocks"))
  bodies = [b["body"] for b in blocks]
  texts = [sparse_index.block_text(b["title"], b["body"]) for b in blocks]
  index_dir = os.path.join(work, "ict_index")
  index = index_io.load_index(publish.read_latest(index_dir), load_embeddings=True)
  dense = brute_force.BruteForceIndex(np.asarray(index.embeddings[np.arange(len(blocks))]))
  tower = TowerPass(os.path.join(work, "ict_model"))
  length = model_dir_lib.load_config(
      os.path.join(work, "minilm_model")).retriever.query_seq_length
  depth = min(hybrid.FUSION["depth"], len(blocks))

  # The index's BM25 part, as realm-answer's hybrid reads it: a list holds only the blocks
  # that share a word with the question (bm25s pads its top k with blocks of score 0).
  bm25 = sparse_index.SparseIndex.build(texts)

  def lists(records):
    q_emb, _ = embed_token_ids(tower, question_rows(tower.embedder.tokenizer, records, length),
                               length, batch_size, type_ids=False)
    return (*dense.search(q_emb, depth), *bm25.search([r.question for r in records], depth))

  dev, _ = qa.read_qa(os.path.join(work, "qa", "squad-dev.jsonl"))
  dev_lists = lists(dev)
  table = {"BM25": recall_at(dev_lists[2], bodies, dev),
           "ICT": recall_at(dev_lists[0], bodies, dev)}
  for weight in HYBRID_WEIGHTS:
    table[f"bm25_weight {weight}"] = recall_at(
        hybrid.fuse(*dev_lists, depth, bm25_weight=weight).ids, bodies, dev)
  records = test_questions(work, max_questions)
  test_lists = lists(records)
  if not np.array_equal(test_lists[0], np.load(os.path.join(work, "ict", "top_ids.npy"))):
    raise RealTextError(f"{index_dir}: its ICT lists are not the ICT row's (ict/top_ids.npy)")
  top = hybrid.fuse(*test_lists, depth).ids
  out_dir = os.path.join(work, "hybrid")
  os.makedirs(out_dir, exist_ok=True)
  np.save(os.path.join(out_dir, "top_ids.npy"), top)
  return dict(recall_at(top, bodies, records), test_questions=len(records), blocks=len(blocks),
              fusion=hybrid.FUSION, dev_questions=len(dev), dev_recall=table,
              seconds=round(time.time() - started, 1))


def run_tower_retrieval(work: str, model_dir: str, name: str, max_questions: int,
                        batch_size: int, block_seq_length: int) -> Dict:
  """A trained tower's recall on the test questions, as the untrained row's (the same blocks
  at their full ``block_seq_length``, the same questions at the converted model's query
  length, exact search): its top 20 in ``<name>/``; then its frozen index for Open-QA in
  ``<name>_index/`` (``stages.build_index`` from the same embeddings)."""
  blocks_dir = os.path.join(work, "blocks")
  blocks = manifests.read_blocks(blocks_dir)
  records = test_questions(work, max_questions)
  tower = TowerPass(model_dir)
  query_length = model_dir_lib.load_config(
      os.path.join(work, "minilm_model")).retriever.query_seq_length
  started = time.time()
  block_emb, _ = embed_token_ids(TowerPass(tower.embedder, "block"),
                                 [b["token_ids"] for b in blocks], block_seq_length, batch_size)
  embed_seconds = time.time() - started
  q_emb, _ = embed_token_ids(tower, question_rows(tower.embedder.tokenizer, records,
                                                  query_length), query_length, batch_size,
                             type_ids=False)
  ids = np.array([b["block_id"] for b in blocks])
  if sorted(ids.tolist()) != list(range(len(blocks))):
    raise RealTextError(f"{blocks_dir}: block ids are not 0..{len(blocks) - 1}")
  top = ids[top_k(q_emb, block_emb, max(TOP_K))]
  out_dir = os.path.join(work, name)
  os.makedirs(out_dir, exist_ok=True)
  np.save(os.path.join(out_dir, "top_ids.npy"), top)
  np.save(os.path.join(out_dir, "question_emb.npy"), q_emb)
  by_id = np.zeros_like(block_emb)
  by_id[ids] = block_emb
  index_path = stages.build_index(model_dir, blocks_dir, os.path.join(work, f"{name}_index"),
                                  embeddings=by_id)
  result = recall_at(top, [b["body"] for b in blocks], records)
  return dict(result, test_questions=len(records), blocks=len(blocks), index=index_path,
              embed_seconds=round(embed_seconds, 1))


# --------------------------------------------------------------------------- reader and Open-QA --


def convert_reader(minilm_dir: str, vocab_file: str, out: str) -> Dict:
  """``realm-convert --hf_dir --targets=reader``: MiniLM as the reader's BERT (its span scorer
  starts fresh in Open-QA fine-tuning)."""
  return {"checkpoint": checkpoint_convert.convert_hf(minilm_dir, out, vocab_file,
                                                      targets=["reader"])}


def qa_subset(work: str, split: str, count: int, seed: int, max_questions: int = 0,
              name: str = "openqa") -> Tuple[str, List[int]]:
  """``qa/<name>-<split>.jsonl``: ``count`` questions of ``squad-<split>.jsonl`` (the first
  ``max_questions`` of it, 0: all) drawn with ``seed``, in file order (all when fewer); its
  path and the chosen lines' indices."""
  with open(os.path.join(work, "qa", f"squad-{split}.jsonl"), encoding="utf-8") as f:
    lines = [line for line in f if line.strip()]
  if max_questions:
    lines = lines[:max_questions]
  chosen = list(range(len(lines)))
  if count < len(lines):
    chosen = sorted(np.random.RandomState(seed).choice(len(lines), count, replace=False).tolist())
  path = os.path.join(work, "qa", f"{name}-{split}.jsonl")
  with open(path, "w", encoding="utf-8") as f:
    f.writelines(lines[i] for i in chosen)
  return path, chosen


def gold_settings(budget: Budget, seed: int):
  """Stage A's settings (``gold_reader.Settings``) from the budget: the Open-QA reader's input
  length, so stage B reads rows of the length stage A trained on."""
  return gold_reader.Settings(
      learning_rate=budget.gold_learning_rate, epochs=budget.gold_epochs,
      batch_size=budget.gold_batch_size, seq_length=budget.reader_seq_length,
      max_query_length=min(64, budget.reader_seq_length // 2),
      eval_batch_size=budget.eval_batch_size, seed=seed)


def train_gold_reader(work: str, squad_file: str, budget: Budget, seed: int,
                      max_articles: int, max_paragraphs: int,
                      say: Callable[[str], None] = print, start: str = "minilm_reader_model",
                      name: str = "gold_reader") -> Dict:
  """Stage A (``gold_reader.py``) into ``<name>/``: the reader of ``start`` (the
  converted MiniLM by default; a REALM run's pre-trained reader) fine-tuned on the train
  articles' questions with their own paragraphs, scored on every dev question's."""
  out = os.path.join(work, name)
  os.makedirs(out, exist_ok=True)
  summary = gold_reader.train(os.path.join(work, start), out, squad_file,
                              gold_settings(budget, seed), max_articles, max_paragraphs,
                              say=say)
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
                  block_seq_length: int, retriever: str = "ict_model",
                  index: str = "ict_index", reader: str = "", beam: str = "dense"):
  """The Open-QA experiment (``realm-train --experiment=openqa_cpu``): the query tower of
  ``retriever`` (the ICT towers by default), the reader of ``reader`` (default
  ``reader_start``), the frozen ``index``, SQuAD's training questions, ``dev_file`` for
  validation (the best checkpoint by dev exact match in ``best_ckpt/``). ``beam``: the task's
  retriever (``task.retriever``); ``hybrid`` retrieves ``hybrid.FUSION["depth"]`` blocks, the
  fused list answering reads, where ``dense`` retrieves ``--retriever_beam_size``."""
  query_length = model_dir_lib.load_config(
      os.path.join(work, "minilm_model")).retriever.query_seq_length
  return stages.experiment_params(
      "openqa_cpu", [os.path.join(stages.CONFIG_DIR, "openqa_cpu__real_text.yaml"),
                     encoder_yaml(work, "openqa")], dict({
          "task.model.vocab_file": vocab_file,
          "task.index_dir": os.path.join(work, index),
          "task.blocks_dir": os.path.join(work, "blocks"),
          "task.retriever_init_checkpoint": os.path.join(work, retriever),
          "task.reader_init_checkpoint": (os.path.join(work, reader) if reader
                                          else reader_start(work)),
          "task.train_data.input_path": os.path.join(work, "qa", "squad-train.jsonl"),
          "task.train_data.global_batch_size": budget.openqa_batch_size,
          "task.train_data.seed": seed,
          "task.validation_data.input_path": dev_file,
          "task.validation_data.global_batch_size": budget.eval_batch_size,
          "task.model.retriever.query_seq_length": query_length,
          "task.model.retriever.block_seq_length": block_seq_length,
          "task.model.reader.openqa_seq_length": budget.reader_seq_length,
          "task.retriever": beam,
          "task.retriever_beam_size": (budget.retriever_beam_size if beam == "dense"
                                       else hybrid.FUSION["depth"]),
          "task.reader_beam_size": budget.reader_beam_size,
          f"{LEARNING_RATE}.initial_learning_rate": budget.openqa_learning_rate,
      }, **train_lengths(budget.openqa_steps, budget.openqa_validations)))


def train_openqa(clock: Clock, work: str, vocab_file: str, budget: Budget, seed: int,
                 block_seq_length: int, name: str = "openqa", retriever: str = "ict_model",
                 index: str = "ict_index", reader: str = "", sample_seed: int = -1,
                 beam: str = "dense") -> Dict:
  """ORQA's fine-tuning (``tasks/openqa.py``, ``--mode=train_and_eval``) into ``<name>/``
  (``openqa_params``' starts and ``beam``), validated on ``--openqa_dev_questions`` dev
  questions at each checkpoint (drawn with ``sample_seed``, default ``seed``)."""
  dev_file, _ = qa_subset(work, "dev", budget.openqa_dev_questions,
                          seed if sample_seed < 0 else sample_seed)
  params = openqa_params(work, vocab_file, budget, seed, dev_file, block_seq_length,
                         retriever, index, reader, beam)
  model_dir = os.path.join(work, name)
  start = time.time()
  stages.train(clock, "Open-QA", params, model_dir, seed, mode="train_and_eval")
  seconds = time.time() - start
  dev = model_dir_lib.read_summaries(model_dir, "validation")
  best = predict.best_checkpoint(model_dir)
  info = os.path.join(model_dir, "best_ckpt", "info.json")
  if not os.path.exists(info):
    raise RealTextError(f"{info} not found: the Open-QA run kept no best checkpoint")
  # The exporter numbers its checkpoints by its own counter; the step is in its info.json.
  best_step = int(read_json(info)["best_ckpt_global_step"])
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
  metrics, rows = evaluation.evaluate(model, records, batch_size=budget.eval_batch_size,
                                      top_k=TOP_K, progress=False)
  evaluation.write_outputs(out_dir, metrics, rows)
  scores = {"exact_match": proportion([r["correct"] for r in rows]),
            "read_match": proportion(read_hits(model, records, rows))}
  for k in TOP_K:
    scores[f"top_{k}_match"] = proportion([r["first_correct_rank"] is not None
                                           and r["first_correct_rank"] < k for r in rows])
  return metrics, rows, scores


def evaluate_openqa(work: str, budget: Budget, seed: int, max_questions: int,
                    name: str = "openqa", index: str = "ict_index",
                    before: str = "ict") -> Dict:
  """``realm-eval``'s evaluation (``openqa.evaluation.evaluate``) of ``<name>/``'s best dev
  checkpoint over ``index`` on ``--openqa_test_questions`` test questions: official EM and
  top-k match with their intervals, predictions and evidence in ``<name>_eval/``. Top-k match
  before fine-tuning: the same questions' hits in the ``before`` stage's top 20 (the
  initialization's query tower, the same index embeddings, the same ``HasAnswer`` test)."""
  test_file, chosen = qa_subset(work, "test", budget.openqa_test_questions, seed, max_questions)
  records, _ = qa.read_qa(test_file)
  model = predict.OpenQA.load(os.path.join(work, name), os.path.join(work, index),
                              os.path.join(work, "blocks"),
                              reader_beam_size=budget.reader_beam_size,
                              retriever_beam_size=budget.retriever_beam_size)
  metrics, rows, after = score_openqa(model, records, budget,
                                      os.path.join(work, f"{name}_eval"))
  bodies = [b["body"] for b in manifests.read_blocks(os.path.join(work, "blocks"))]
  first = first_hits(np.load(os.path.join(work, before, "top_ids.npy"))[chosen], bodies,
                     records)
  before = {f"top_{k}_match": proportion(first < k) for k in TOP_K}
  return {"test_file": test_file, "test_questions": len(rows), "checkpoint": model.checkpoint,
          "before": before, "after": after,
          "metrics": {k: v for k, v in metrics.items() if isinstance(v, (int, float))}}


def sparse_index_dir(work: str) -> str:
  """The ICT index with a BM25 part: ``ict_index/`` when it has one, else ``ict_index_sparse/``,
  the same embeddings published again with one (the run's ICT index may predate the indexes'
  BM25 parts)."""
  index_dir = os.path.join(work, "ict_index")
  index = index_io.load_index(publish.read_latest(index_dir), load_embeddings=True)
  if index.sparse is None:
    index_dir = os.path.join(work, "ict_index_sparse")
    if publish.read_latest(index_dir) is None:
      stages.build_index(os.path.join(work, "ict_model"), os.path.join(work, "blocks"),
                         index_dir, embeddings=np.asarray(index.embeddings))
  return index_dir


def evaluate_hybrid_reader(work: str, budget: Budget, seed: int, max_questions: int,
                           name: str = "openqa", out: str = "hybrid_reader_eval") -> Dict:
  """The fine-tuned Open-QA model of ``<name>/`` answering with ``--retriever=hybrid``
  (``realm-eval``'s path) on the ORQA row's test sample, into ``<out>/``: its own query tower's
  top blocks over the ICT index (``sparse_index_dir``) fused with BM25's (``hybrid.FUSION``,
  over each list's top ``FUSION["depth"]``, as ``realm-answer`` retrieves), read as the ORQA
  row reads them."""
  index_dir = sparse_index_dir(work)
  test_file, _ = qa_subset(work, "test", budget.openqa_test_questions, seed, max_questions)
  records, _ = qa.read_qa(test_file)
  model = predict.OpenQA.load(os.path.join(work, name), index_dir,
                              os.path.join(work, "blocks"),
                              reader_beam_size=budget.reader_beam_size,
                              retriever_beam_size=hybrid.FUSION["depth"], retriever="hybrid")
  _, rows, after = score_openqa(model, records, budget, os.path.join(work, out))
  return {"test_file": test_file, "test_questions": len(rows), "checkpoint": model.checkpoint,
          "index": os.path.basename(index_dir), "block_prior": model.builder.block_prior(),
          "after": after}


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


def evaluate_bm25_reader(work: str, budget: Budget, seed: int, max_questions: int,
                         retriever: str = "bm25", out: str = "bm25_reader_eval") -> Dict:
  """The fine-tuned Open-QA model reading another retriever's top blocks (``<retriever>/
  top_ids.npy``: BM25's by default; a REALM tower's for the paper's mixed row) on the same
  test sample, into ``out/``: what that retriever's user gets from the same reader. Its top-k
  match is that retriever's."""
  test_file, chosen = qa_subset(work, "test", budget.openqa_test_questions, seed, max_questions)
  records, _ = qa.read_qa(test_file)
  top = np.load(os.path.join(work, retriever, "top_ids.npy"))[chosen]
  model = predict.OpenQA.load(os.path.join(work, "openqa"), os.path.join(work, "ict_index"),
                              os.path.join(work, "blocks"),
                              reader_beam_size=budget.reader_beam_size,
                              retriever_beam_size=top.shape[1])
  read_given_beams(model, {r.question: row for r, row in zip(records, top)})
  _, rows, after = score_openqa(model, records, budget, os.path.join(work, out))
  return {"test_file": test_file, "test_questions": len(rows), "checkpoint": model.checkpoint,
          "after": after}
