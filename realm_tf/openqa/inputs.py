"""Open-QA inputs on the host, as ORQA builds them (``language/orqa/models/orqa_model.py`` and
``ops/orqa_ops.cc``), in NumPy.

For each question, with the query embeddings of the *current* query tower:

1. the retriever beam: the top ``retriever_beam_size`` blocks of the frozen index, best first,
   with their block embeddings (the device step recomputes ``q . e(z)`` from them, so the
   gradient reaches the query tower and never the block embeddings);
2. ``retriever_correct``: whether each beam block holds an answer. ORQA's ``HasAnswer`` is a
   plain substring test of an answer in the block text (case-sensitive); a regular-expression
   answer (CuratedTrec) holds when ``re.search`` finds it, ignoring case;
3. the reader inputs of the top ``reader_beam_size`` blocks: ``[CLS] question [SEP] block
   text [SEP]`` (no title; the question as the query tower sees it, the block cut to fit);
4. the gold spans: every occurrence of an answer's wordpiece ids inside the block part
   (ORQA's ``ReaderInputs``); for a regex answer, every match whose ends fall on wordpiece
   boundaries.

The block text is split into wordpieces word by word (:class:`BlockText`), so each wordpiece
knows its character span in the original text and its word: a predicted span maps back to the
block's own characters, in whole words (``predict.answer_chars``), not to detokenized
wordpieces.
"""

import dataclasses
import logging
import re
import unicodedata
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from realm_tf import configs
from realm_tf import errors
from realm_tf.data import answers as answers_lib
from realm_tf.data import qa as qa_lib
from realm_tf.retrieval.sparse import hybrid

FEATURES = ("question_word_ids", "question_mask", "question_type_ids", "beam_ids", "beam_emb",
            "retriever_correct", "reader_word_ids", "reader_mask", "reader_type_ids",
            "gold_starts", "gold_ends", "gold_mask", "question_index")


def _is_split_char(ch: str) -> bool:
  """Characters BERT's basic tokenizer splits off: ASCII symbols, Unicode punctuation, CJK."""
  cp = ord(ch)
  if (33 <= cp <= 47) or (58 <= cp <= 64) or (91 <= cp <= 96) or (123 <= cp <= 126):
    return True
  if unicodedata.category(ch).startswith("P"):
    return True
  return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or
          0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


def _is_space(ch: str) -> bool:
  """Where the tokenizer (TF.Text's ``BertTokenizer``) splits words: ASCII space, tab, newline,
  form feed and carriage return (RE2's whitespace class) and control or format characters
  (which it turns into spaces). Other Unicode spaces (no-break, ideographic) stay inside a word
  there, as they do here."""
  return ch in " \t\n\f\r" or unicodedata.category(ch) in ("Cc", "Cf")


def basic_words(text: str) -> List[Tuple[int, int]]:
  """Character spans ``[start, end)`` of BERT's basic tokens: whitespace-separated runs, with
  each punctuation (or CJK) character a token of its own."""
  spans, start = [], None
  for i, ch in enumerate(text):
    if _is_space(ch):
      if start is not None:
        spans.append((start, i))
        start = None
    elif _is_split_char(ch):
      if start is not None:
        spans.append((start, i))
        start = None
      spans.append((i, i + 1))
    elif start is None:
      start = i
  if start is not None:
    spans.append((start, len(text)))
  return spans


@dataclasses.dataclass
class BlockText:
  """A block's text as the reader sees it: wordpiece ids, each with its character span and
  the word it is part of (the index of its basic word, :func:`basic_words`, in the text)."""
  text: str
  token_ids: np.ndarray     # int32 [n]
  char_starts: np.ndarray   # int32 [n]
  char_ends: np.ndarray     # int32 [n], exclusive
  word_ids: np.ndarray      # int32 [n], non-decreasing


def tokenize_with_offsets(tokenizer, texts: Sequence[str]) -> List[BlockText]:
  """Wordpieces of each text with character offsets into it.

  Each basic word is tokenized on its own (the same wordpieces as tokenizing the whole text,
  since BERT's wordpieces never cross a basic-token boundary). A word's pieces get character
  spans by their lengths when the normalized word keeps the original's length; otherwise
  (accents folded, unknown token) every piece spans the whole word.
  """
  words = [basic_words(t) for t in texts]
  flat = [t[s:e] for t, spans in zip(texts, words) for s, e in spans]
  pieces = tokenizer.tokenize(flat) if flat else None
  ids = pieces.flat_values.numpy() if flat else np.zeros([0], np.int32)
  lengths = pieces.row_lengths().numpy() if flat else np.zeros([0], np.int64)
  out, w, pos = [], 0, 0
  for text, spans in zip(texts, words):
    t_ids, starts, ends, word_ids = [], [], [], []
    for word, (s, e) in enumerate(spans):
      n = int(lengths[w])
      piece_ids = ids[pos:pos + n]
      strings = [tokenizer.vocab[i] for i in piece_ids]
      widths = [len(p[2:] if p.startswith("##") else p) for p in strings]
      exact = "[UNK]" not in strings and sum(widths) == e - s
      cursor = s
      for width in widths:
        starts.append(cursor if exact else s)
        cursor += width
        ends.append(cursor if exact else e)
      t_ids.extend(piece_ids.tolist())
      word_ids.extend([word] * n)
      w += 1
      pos += n
    out.append(BlockText(text, np.array(t_ids, np.int32), np.array(starts, np.int32),
                         np.array(ends, np.int32), np.array(word_ids, np.int32)))
  return out


def has_answer(text: str, answers: Sequence[str], is_regex: bool = False) -> bool:
  """ORQA's ``HasAnswer``: an answer string occurs in the text (substring, case-sensitive);
  for regex answers, ``re.search`` ignoring case (a pattern that does not compile never
  matches)."""
  if not is_regex:
    return any(a and a in text for a in answers)
  for pattern in answers:
    regex = _compile(pattern)
    if regex is not None and regex.search(text):
      return True
  return False


_REGEX_CACHE: Dict[str, Optional[re.Pattern]] = {}


def _compile(pattern: str) -> Optional[re.Pattern]:
  if pattern not in _REGEX_CACHE:
    try:
      _REGEX_CACHE[pattern] = re.compile(pattern, re.IGNORECASE | re.UNICODE | re.MULTILINE)
    except re.error:
      _REGEX_CACHE[pattern] = None
  return _REGEX_CACHE[pattern]


def find_token_spans(block_ids: np.ndarray, answer_ids: Sequence[np.ndarray]
                     ) -> List[Tuple[int, int]]:
  """Every occurrence ``(start, end)`` (inclusive) of any answer's ids in ``block_ids``."""
  spans = []
  for a in answer_ids:
    n = len(a)
    if n == 0 or n > len(block_ids):
      continue
    windows = np.lib.stride_tricks.sliding_window_view(block_ids, n)
    for start in np.flatnonzero((windows == np.asarray(a)[None, :]).all(axis=1)):
      spans.append((int(start), int(start) + n - 1))
  return spans


def find_regex_spans(block: BlockText, patterns: Sequence[str]) -> List[Tuple[int, int]]:
  """Token spans of regex matches in the block text whose ends fall on wordpiece edges."""
  starts = {}
  for i, c in enumerate(block.char_starts):
    starts.setdefault(int(c), i)   # pieces of one word may share a start: the first
  ends = {int(c): i for i, c in enumerate(block.char_ends)}
  spans = []
  for pattern in patterns:
    regex = _compile(pattern)
    if regex is None:
      continue
    for m in regex.finditer(block.text):
      s, e = m.start(), m.end()
      while s < e and block.text[s].isspace():
        s += 1
      while e > s and block.text[e - 1].isspace():
        e -= 1
      if s < e and s in starts and e in ends and starts[s] <= ends[e]:
        spans.append((starts[s], ends[e]))
  return spans


class QuestionError(errors.RealmError, ValueError):
  """A question that cannot be asked (an empty one)."""


@dataclasses.dataclass
class Question:
  question: str
  answers: List[str]
  is_regex: bool = False


def question_of(record: qa_lib.QARecord) -> Question:
  """The model's question of a QA record (``realm_tf.data.qa.read_qa``)."""
  return Question(record.question, list(record.answers), record.answer_type == qa_lib.REGEX)


def load_questions(path: str, answer_type: str = "") -> List[Question]:
  """The questions of a QA file (``answer_type``: ``read_qa``'s, "" for the file's own);
  malformed lines are skipped and counted (logged)."""
  records, skipped = qa_lib.read_qa(path, answer_type=answer_type or None)
  if skipped:
    logging.warning("%s: skipped %d malformed lines (first: %s)", path, len(skipped), skipped[0])
  return [question_of(r) for r in records]


def reader_row(question_ids: np.ndarray, body_ids: np.ndarray, seq_length: int, cls_id: int,
               sep_id: int):
  """``[CLS] question [SEP] body [SEP]`` padded to ``seq_length``: ``(word_ids, mask,
  type_ids, offset, kept)``, the body's type id 1, ``offset`` its first row position and
  ``kept`` its length. The Open-QA reader's row; the caller fits the parts to the length."""
  ids = np.concatenate([[cls_id], question_ids, [sep_id], body_ids, [sep_id]]).astype(np.int32)
  word_ids = np.zeros([seq_length], np.int32)
  word_ids[:len(ids)] = ids
  mask = (np.arange(seq_length) < len(ids)).astype(np.int32)
  type_ids = ((np.arange(seq_length) >= len(question_ids) + 2) & (mask > 0)).astype(np.int32)
  return word_ids, mask, type_ids, len(question_ids) + 2, len(body_ids)


class OpenQaInputBuilder:
  """Builds the fixed-shape features of a batch of questions (see the module docstring).

  Args:
    bodies: the block texts, indexed by block id.
    embeddings: the frozen block embeddings ``float32 [num_blocks, dim]``.
    search: ``(query_embeddings [b, dim], k) -> (ids [b, k], scores [b, k])`` over the same
      blocks (an index's search).
    tokenizer: the model's ``RealmTokenizer``.
    query_seq_length, reader_seq_length: the query tower's and the reader's input lengths.
    retriever_beam_size, reader_beam_size: the beam and how many of its top blocks are read.
    max_gold_spans: gold spans kept per read block (more are counted in ``spans_dropped``).
    titles: the block titles (for showing evidence), indexed by block id.
    blocks: for a trainable block tower, the corpus as a ``block_store.BlockStore``; the top
      ``trainable_blocks`` of each beam then also get ``beam_block_*`` features, their
      block-tower inputs at ``block_seq_length``, gathered per batch.
    handle: the ``IndexHandle`` that ``search`` goes through, for ``maybe_swap``.
    retriever: how the beam is retrieved (``retrieval.sparse.hybrid``): ``dense`` (``search``),
      ``bm25`` or ``hybrid`` (these two through ``handle``'s index's sparse part).
    block_prior: how the reader weighs the blocks of a ``bm25`` or ``hybrid`` beam against
      each other (``hybrid.BLOCK_PRIORS``; default: the index's fusion rule's). ``retriever``
      adds each block's query-tower logit to its span scores (ORQA's rule, and always that of
      ``dense`` beams); ``fusion`` adds its fused score (``hybrid.Beam.fused``); ``none`` adds
      nothing. The last two give the batch a ``block_prior`` feature ``[b, R]``.
  """

  def __init__(self, bodies: Sequence[str], embeddings: np.ndarray, search: Callable,
               tokenizer, query_seq_length: int, reader_seq_length: int,
               retriever_beam_size: int, reader_beam_size: int, max_gold_spans: int = 32,
               titles: Optional[Sequence[str]] = None,
               blocks=None, block_seq_length: int = 0, trainable_blocks: int = 0,
               handle=None, retriever: str = hybrid.DEFAULT,
               block_prior: Optional[str] = None):
    if len(bodies) != len(embeddings):
      raise ValueError(f"{len(bodies)} blocks but {len(embeddings)} block embeddings")
    if reader_beam_size > retriever_beam_size:
      raise configs.ConfigError(f"reader_beam_size {reader_beam_size} > retriever_beam_size "
                                f"{retriever_beam_size} (the beam is at most the corpus)")
    if retriever_beam_size > len(bodies):
      raise ValueError(f"retriever_beam_size {retriever_beam_size} is larger than the corpus "
                       f"({len(bodies)} blocks)")
    self.bodies = bodies
    self.titles = titles if titles is not None else [""] * len(bodies)
    self.embeddings = np.asarray(embeddings, np.float32)
    self.search = search
    self.tokenizer = tokenizer
    self.query_seq_length = query_seq_length
    self.reader_seq_length = reader_seq_length
    self.beam = retriever_beam_size
    self.read = reader_beam_size
    self.max_gold_spans = max_gold_spans
    if trainable_blocks and (blocks is None or block_seq_length <= 0):
      raise ValueError("trainable_blocks needs blocks and block_seq_length")
    if not 0 <= trainable_blocks <= retriever_beam_size:
      raise configs.ConfigError(f"trainable_blocks {trainable_blocks} is not in [0, "
                                f"retriever_beam_size {retriever_beam_size}]")
    self.blocks = blocks
    self.block_seq_length = block_seq_length
    self.trainable_blocks = trainable_blocks
    self.handle = handle
    self.retriever = hybrid.check(retriever, handle.index if handle is not None else None)
    if block_prior is not None and block_prior not in hybrid.BLOCK_PRIORS:
      raise configs.ConfigError(f"unknown block prior {block_prior!r}: one of "
                                f"{', '.join(hybrid.BLOCK_PRIORS)}")
    self._block_prior = block_prior
    self._blocks: Dict[int, BlockText] = {}
    self._pack_questions = None
    self.stats = dict(questions=0, questions_truncated=0, spans_dropped=0)

  def maybe_swap(self) -> bool:
    """Swaps in a newer index of ``handle`` (and its embeddings), if one was published."""
    if self.handle is None or not self.handle.maybe_swap():
      return False
    self.embeddings = self.handle.embeddings()
    return True

  def block_prior(self, retriever: Optional[str] = None) -> str:
    """The block prior of a ``retriever`` beam (default: the builder's retriever)."""
    if (retriever or self.retriever) == "dense":
      return "retriever"
    if self._block_prior is not None:
      return self._block_prior
    return hybrid.fusion_of(self.handle.index)["block_prior"]

  def block_texts(self, block_ids: Sequence[int]) -> List[BlockText]:
    """The reader's view of the given blocks (tokenized once, then cached)."""
    missing = sorted({int(i) for i in block_ids if int(i) not in self._blocks})
    for i, b in zip(missing, tokenize_with_offsets(self.tokenizer,
                                                   [self.bodies[i] for i in missing])):
      self._blocks[i] = b
    return [self._blocks[int(i)] for i in block_ids]

  def question_inputs(self, questions: Sequence[str]) -> Dict[str, np.ndarray]:
    """``[CLS] question [SEP]`` at ``query_seq_length`` (longer questions are cut; counted)."""
    if self._pack_questions is None:   # one traced function, not dozens of eager ops
      tokenizer, length = self.tokenizer, self.query_seq_length

      def pack(texts):
        pieces = tokenizer.tokenize(texts)
        return tokenizer.pack([pieces], length), pieces.row_lengths()
      self._pack_questions = tf.function(pack, input_signature=[tf.TensorSpec([None], tf.string)])
    inputs, lengths = self._pack_questions(tf.constant(list(questions), tf.string))
    self.stats["questions"] += len(questions)
    self.stats["questions_truncated"] += int((lengths.numpy() > self.query_seq_length - 2).sum())
    return {f"question_{k[6:]}": v.numpy() for k, v in inputs.items()}

  def count_truncated(self, questions: Sequence[str]) -> int:
    """How many of ``questions`` are longer than the query tower's input (cut to fit)."""
    return sum(n > self.query_seq_length - 2
               for n in self.tokenizer.count_wordpieces(list(questions)))

  def reader_row(self, question_ids: np.ndarray, block: BlockText):
    """One ``[CLS] q [SEP] block [SEP]`` row (``reader_row``) of the reader's length, the
    question cut to fit and the block to the room left."""
    length = self.reader_seq_length
    q = question_ids[:max(0, length - 3)]
    return reader_row(q, block.token_ids[:max(0, length - len(q) - 3)], length,
                      self.tokenizer.cls_id, self.tokenizer.sep_id)

  @staticmethod
  def gold_spans(question: Question, answer_ids: Sequence[np.ndarray], block: BlockText,
                 kept: int) -> List[Tuple[int, int]]:
    """The answer's spans in ``block`` that lie whole in its first ``kept`` wordpieces (what
    the reader reads), inclusive block positions, sorted: the fine-tuning targets.
    ``answer_ids``: the question's answers as wordpieces (``answer_ids``); a regex question's
    answers match the block's text."""
    if question.is_regex:
      spans = find_regex_spans(block, question.answers)
    else:
      spans = find_token_spans(block.token_ids[:kept], answer_ids)
    return sorted(set((s, e) for s, e in spans if e < kept))

  def features(self, questions: Sequence[Question], query_embeddings: np.ndarray,
               question_indices: Optional[Sequence[int]] = None,
               question_inputs: Optional[Dict[str, np.ndarray]] = None,
               with_ranks: bool = False, retriever: Optional[str] = None
               ) -> Dict[str, np.ndarray]:
    """The batch's features (``FEATURES``), every array with the batch as first axis; with
    ``with_ranks``, also each beam block's rank in the dense and the BM25 list
    (``beam_dense_rank``, ``beam_bm25_rank``: ``hybrid.Beam``). ``retriever``: this batch's
    (default: the builder's)."""
    n = len(questions)
    if question_inputs is None:
      question_inputs = self.question_inputs([q.question for q in questions])
    beam = hybrid.retrieve(self.handle.index if self.handle is not None else None,
                           retriever or self.retriever, np.asarray(query_embeddings, np.float32),
                           [q.question for q in questions], self.beam, dense_search=self.search)
    ids = beam.ids
    correct = np.array([[has_answer(self.bodies[i], q.answers, q.is_regex) for i in row]
                        for q, row in zip(questions, ids)], dtype=bool).reshape(n, self.beam)
    answer_ids = self.answer_ids(questions)
    question_ids = self.question_ids(question_inputs)
    reader = {k: np.zeros([n, self.read, self.reader_seq_length], np.int32)
              for k in ("word_ids", "mask", "type_ids")}
    gold = {k: np.zeros([n, self.read, self.max_gold_spans], np.int32)
            for k in ("starts", "ends", "mask")}
    for b, (q, row) in enumerate(zip(questions, ids)):
      for r, block in enumerate(self.block_texts(row[:self.read])):
        word_ids, mask, type_ids, offset, kept = self.reader_row(question_ids[b], block)
        reader["word_ids"][b, r], reader["mask"][b, r], reader["type_ids"][b, r] = (
            word_ids, mask, type_ids)
        spans = self.gold_spans(q, answer_ids[b], block, kept)
        self.stats["spans_dropped"] += max(0, len(spans) - self.max_gold_spans)
        for g, (s, e) in enumerate(spans[:self.max_gold_spans]):
          gold["starts"][b, r, g], gold["ends"][b, r, g] = s + offset, e + offset
          gold["mask"][b, r, g] = 1
    features = dict(question_inputs)
    features.update(
        beam_ids=ids.astype(np.int32), beam_emb=self.embeddings[ids],
        retriever_correct=correct.astype(np.int32),
        reader_word_ids=reader["word_ids"], reader_mask=reader["mask"],
        reader_type_ids=reader["type_ids"], gold_starts=gold["starts"],
        gold_ends=gold["ends"], gold_mask=gold["mask"],
        question_index=np.asarray(question_indices if question_indices is not None
                                  else np.full([n], -1), np.int32))
    if self.trainable_blocks:
      packed = self.blocks.gather_packed(ids[:, :self.trainable_blocks], self.block_seq_length,
                                         self.tokenizer.cls_id, self.tokenizer.sep_id)
      features.update({f"beam_block_{k[6:]}": v for k, v in packed.items()})
    prior = self.block_prior(retriever)
    if prior != "retriever":
      features["block_prior"] = (beam.fused[:, :self.read] if prior == "fusion" else
                                 np.zeros([n, self.read])).astype(np.float32)
    if with_ranks:
      features.update(beam_dense_rank=beam.dense_rank, beam_bm25_rank=beam.bm25_rank)
    return features

  def answer_ids(self, questions: Sequence[Question]) -> List[List[np.ndarray]]:
    """Each question's answers as wordpieces (none for a regex question)."""
    flat = [a for q in questions for a in (q.answers if not q.is_regex else [])]
    pieces = []
    if flat:
      tokens = self.tokenizer.tokenize(flat)
      pieces = np.split(tokens.flat_values.numpy(), np.cumsum(tokens.row_lengths().numpy())[:-1])
    out, i = [], 0
    for q in questions:
      k = 0 if q.is_regex else len(q.answers)
      out.append(pieces[i:i + k])
      i += k
    return out

  @staticmethod
  def question_ids(question_inputs: Dict[str, np.ndarray]) -> List[np.ndarray]:
    """The question's wordpieces (between ``[CLS]`` and ``[SEP]``) of each query row."""
    out = []
    for ids, mask in zip(question_inputs["question_word_ids"], question_inputs["question_mask"]):
      out.append(ids[1:int(mask.sum()) - 1])
    return out


def official_match(prediction: str, question: Question) -> bool:
  """ORQA's official exact match of a predicted answer (``eval_utils.is_correct``)."""
  return answers_lib.is_correct(prediction, question.answers, is_regex=question.is_regex)
