"""Answering questions with evidence, and scoring Open-QA predictions.

Example::

    qa = realm_tf.OpenQA.load("runs/openqa_nq", "runs/index")
    for a in qa.answer(["who wrote hamlet?"]):
      print(a.answer, a.score)
      for e in a.evidence:                 # the blocks read, best retrieved first
        print(f"  {e.retrieval_score:.2f} {e.title}: {e.text[:80]}")
      best = a.evidence[a.block_rank]      # where the answer is: best.text[a.start:a.end]

The model and the index load once; ``answer`` takes a batch. The predicted answer is the best
span over every span of every read block (span score plus the block's retriever score, as
ORQA predicts; the blocks of a ``bm25`` or ``hybrid`` beam add their BM25 or fused score instead:
``retrieval.sparse.hybrid``), cut out of the block's own text by character offsets, in whole words
(:func:`answer_chars`: the one rule of every answering path, ``realm-answer``, ``realm-eval``,
``realm-serve`` and the training task's validation).
"""

import dataclasses
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from realm_tf import model_dir as model_dir_lib
from realm_tf.modeling import embedder as embedder_lib
from realm_tf.modeling.models import OpenQaModel
from realm_tf.openqa import host
from realm_tf.openqa import inputs as inputs_lib


@dataclasses.dataclass
class Evidence:
  """One block read for a question; ``dense_rank`` and ``bm25_rank``: its place (from 0) in
  the dense and the BM25 top list, -1 when not there (``retrieval.sparse.hybrid``)."""
  block_id: int
  title: str
  text: str
  retrieval_score: float
  dense_rank: int = -1
  bm25_rank: int = -1


@dataclasses.dataclass
class Answer:
  """The answer to one question.

  ``evidence[block_rank].text[start:end] == answer``; ``score`` is the span's logit (span
  score + the block's prior: its retriever score, or a BM25 or fused beam's own score).
  """
  question: str
  answer: str
  score: float
  block_rank: int
  start: int
  end: int
  evidence: List[Evidence]

  def to_json(self) -> Dict:
    return dataclasses.asdict(self)


def predictions(outputs: Dict[str, tf.Tensor], features: Dict[str, tf.Tensor]):
  """The best (block, span) of each question over every span of every read block (ORQA's
  ``get_predictions``): its index in the read blocks, its flat candidate index, and its
  wordpiece positions inside the block text."""
  logits = outputs["reader_logits"]                                        # [b, R, C]
  batch, read, num_spans = tf.shape(logits)[0], logits.shape[1], logits.shape[2]
  best = tf.argmax(tf.reshape(logits, [batch, read * num_spans]), -1, output_type=tf.int32)
  block, span = best // num_spans, best % num_spans
  index = tf.stack([block, span], -1)
  start = tf.gather_nd(outputs["span_starts"], index, batch_dims=1)
  end = tf.gather_nd(outputs["span_ends"], index, batch_dims=1)
  # The block text starts after [CLS] question [SEP]: the type-0 positions of its row.
  row_mask = tf.gather(features["reader_mask"], block, batch_dims=1)
  row_types = tf.gather(features["reader_type_ids"], block, batch_dims=1)
  offset = tf.reduce_sum(row_mask - row_types, -1)
  return dict(block=block, span=span, start=start - offset, end=end - offset,
              score=tf.reduce_max(tf.reshape(logits, [batch, -1]), -1))


def whole_words(block: inputs_lib.BlockText, start: int, end: int) -> Tuple[int, int]:
  """The wordpiece span ``start..end`` of ``block`` (inclusive, inside the block) widened to
  whole words: ``start`` back to the first wordpiece of its word, ``end`` on to the last of
  its word, as DPR's reader widens its spans. A word is one of BERT's basic tokens
  (``inputs.basic_words``: a whitespace-separated run, each punctuation mark a word of its
  own), so a span that starts and ends on word edges is unchanged: "McManus" stays "McManus"
  in "McManus' 33-yard", while "Tre" (``tre``) of "Trevathan" (``tre ##vat ##han``) becomes
  "Trevathan"."""
  words = block.word_ids
  return (int(np.searchsorted(words, words[start], side="left")),
          int(np.searchsorted(words, words[end], side="right")) - 1)


def answer_chars(block: inputs_lib.BlockText, start: int, end: int) -> Tuple[int, int]:
  """The characters ``[char_start, char_end)`` of the block text that answer the predicted
  wordpieces ``start..end``: those of the whole words they are part of (:func:`whole_words`);
  ``(0, 0)`` when the span is not inside the block text (no answer).

  The answer never starts or ends inside a word (a span ending at ``e`` of "engraver" reads
  "engraver", never "e"). ORQA's predicted answer does not either: it joins the whole
  whitespace-separated words of the span (``get_predictions``' ``orig_tokens``)."""
  if not len(block.token_ids) or start < 0 or end >= len(block.token_ids) or end < start:
    return 0, 0
  start, end = whole_words(block, start, end)
  return int(block.char_starts[start]), int(block.char_ends[end])


def span_text(block: inputs_lib.BlockText, start: int, end: int) -> str:
  """The answer that wordpieces ``start..end`` of the block text predict, in whole words
  (:func:`answer_chars`); "" for no answer."""
  char_start, char_end = answer_chars(block, start, end)
  return block.text[char_start:char_end]


def best_checkpoint(model_dir: str) -> str:
  """The best checkpoint by dev EM (``best_ckpt/``) when training kept one, else the newest."""
  best = tf.train.latest_checkpoint(f"{model_dir}/best_ckpt")
  return best or model_dir_lib.latest_checkpoint(model_dir)


def check_span_scorer(checkpoint: str, model_dir: str) -> None:
  names = tf.train.load_checkpoint(checkpoint).get_variable_to_shape_map()
  if not any(n.startswith("reader/span_scorer/") for n in names):
    raise model_dir_lib.ModelDirError(
        f"{model_dir}: checkpoint {checkpoint} has no span scorer (reader/span_scorer): it was "
        "not fine-tuned for Open-QA; fine-tune it (realm-train --experiment=openqa_cpu or "
        "openqa_{nq,wq,ct}_paper) or convert an ORQA checkpoint with realm-convert")


class OpenQA:
  """A fine-tuned Open-QA model over its index (see the module docstring).

  Args (of ``load``):
    model_dir: a model directory with a fine-tuned reader (span scorer) and query tower.
    index_dir: the index the model was fine-tuned against (its block embeddings).
    blocks_dir: the index's corpus (default: the one its manifest names).
    checkpoint: a checkpoint (default: ``best_checkpoint``).
    reader_beam_size: blocks read per question (ORQA: 5).
    retriever_beam_size: blocks retrieved per question, at most the corpus (default: the
      reader beam; more only for ``top_k_match`` in evaluation).
    retriever: ``dense``, ``bm25`` or ``hybrid`` (``retrieval.sparse.hybrid``).
    block_prior: what a read block adds to its span scores, for ``bm25`` and ``hybrid``
      (``inputs.OpenQaInputBuilder``'s; default: the index's fusion rule's); ``dense`` blocks
      add the query tower's logit for them.
  """

  def __init__(self, model: OpenQaModel, builder: inputs_lib.OpenQaInputBuilder,
               checkpoint: str):
    self.model = model
    self.builder = builder
    self.titles = builder.titles
    self.checkpoint = checkpoint
    self.timings = dict(retrieval_seconds=0.0, reading_seconds=0.0, questions=0)
    self._embed = embedder_lib.inference_function(model.query_embedder)
    self._read = tf.function(self._forward)

  def _forward(self, features):
    out = self.model(features, training=False)
    return predictions(out, features), out["retriever_logits"]

  @classmethod
  def load(cls, model_dir: str, index_dir: str, blocks_dir: Optional[str] = None,
           checkpoint: Optional[str] = None, reader_beam_size: int = 5,
           retriever_beam_size: Optional[int] = None, retriever: str = "dense",
           block_prior: Optional[str] = None) -> "OpenQA":
    config = model_dir_lib.load_config(model_dir)
    checkpoint = checkpoint or best_checkpoint(model_dir)
    check_span_scorer(checkpoint, model_dir)
    model = OpenQaModel.from_config_dataclass(config)
    model_dir_lib.restore(checkpoint, query_embedder=model.query_embedder, reader=model.reader)
    builder = host.build_input_builder(
        config, index_dir, blocks_dir or "", reader_beam_size=reader_beam_size,
        retriever_beam_size=retriever_beam_size or reader_beam_size, retriever=retriever,
        block_prior=block_prior)
    return cls(model, builder, checkpoint)

  def predict(self, questions: Sequence[inputs_lib.Question]) -> List[Dict]:
    """One batch: per question, the answer, its place, the beam and what is correct."""
    if not questions:
      return []
    for q in questions:
      if not q.question.strip():
        raise inputs_lib.QuestionError("empty question")
    start = time.perf_counter()
    question_inputs = self.builder.question_inputs([q.question for q in questions])
    embeddings = self._embed({f"input_{k[9:]}": tf.constant(v)
                              for k, v in question_inputs.items()}).numpy()
    features = self.builder.features(questions, embeddings, question_inputs=question_inputs,
                                     with_ranks=True)
    blocks = [self.builder.block_texts(row[:self.builder.read]) for row in features["beam_ids"]]
    middle = time.perf_counter()
    device = host.model_features(features)
    best, retriever_logits = self._read(device)
    best = {k: v.numpy() for k, v in best.items()}
    retriever_logits = retriever_logits.numpy()
    self.timings["retrieval_seconds"] += middle - start
    self.timings["reading_seconds"] += time.perf_counter() - middle
    self.timings["questions"] += len(questions)
    results = []
    for i, q in enumerate(questions):
      rank, s, e = int(best["block"][i]), int(best["start"][i]), int(best["end"][i])
      block = blocks[i][rank]
      char_start, char_end = answer_chars(block, s, e)
      results.append(dict(
          question=q, answer=block.text[char_start:char_end], score=float(best["score"][i]),
          block_rank=rank, start=char_start, end=char_end, beam_ids=features["beam_ids"][i],
          retriever_logits=retriever_logits[i],
          retriever_correct=features["retriever_correct"][i].astype(bool),
          span_match=self._span_match(features, i, rank, s, e), blocks=blocks[i],
          dense_rank=features["beam_dense_rank"][i], bm25_rank=features["beam_bm25_rank"][i]))
    return results

  @staticmethod
  def _span_match(features, i, rank, start, end) -> bool:
    """Whether the predicted span is one of the gold spans (ORQA's ``exact_match``)."""
    offset = int((features["reader_mask"][i, rank] - features["reader_type_ids"][i, rank]).sum())
    gold = features["gold_mask"][i, rank] > 0
    return bool(np.any((features["gold_starts"][i, rank][gold] == start + offset) &
                       (features["gold_ends"][i, rank][gold] == end + offset)))

  def answer(self, questions: Sequence[str], batch_size: int = 32) -> List[Answer]:
    """Answers with their evidence, in the order of ``questions``."""
    out = []
    for start in range(0, len(questions), batch_size):
      batch = [inputs_lib.Question(q, []) for q in questions[start:start + batch_size]]
      for r in self.predict(batch):
        evidence = [Evidence(int(block_id), self.titles[int(block_id)], block.text,
                             float(score), int(dense), int(bm25))
                    for block_id, score, block, dense, bm25 in zip(
                        r["beam_ids"], r["retriever_logits"], r["blocks"], r["dense_rank"],
                        r["bm25_rank"])]
        out.append(Answer(r["question"].question, r["answer"], r["score"], r["block_rank"],
                          r["start"], r["end"], evidence))
    return out
