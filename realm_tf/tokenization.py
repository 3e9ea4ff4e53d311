"""In-graph WordPiece tokenization and REALM's input packing.

Everything here is made of TensorFlow ops (``tensorflow_text``), so it runs inside ``tf.data``
and inside a SavedModel. The three input layouts of REALM:

* query:  ``[CLS] x [SEP]``, at most 96 tokens, all segment 0;
* block:  ``[CLS] title [SEP] body [SEP]``, at most 288 tokens, segment 0 for ``[CLS] title
  [SEP]`` and 1 for ``body [SEP]``;
* reader: ``[CLS] query [SEP] body [SEP]``, at most 384 tokens (320 for Open-QA), segment 0 for
  the query part and 1 for the body. The reader never sees the title.

When a packed input is too long, the last segment is trimmed first (``WaterfallTrimmer``), so a
query is kept whole and the block body gives way.

Example::

    tok = RealmTokenizer("vocab.txt")
    inputs = tok.query_inputs(["who wrote hamlet?"], seq_length=96)
    inputs["input_word_ids"]  # int32 [1, 96]: [CLS] who wrote ham ##let ? [SEP] 0 0 ...
"""

import os
from typing import Dict, Iterable, List, Sequence

import tensorflow as tf
import tensorflow_text as tf_text
from tensorflow_text.tools.wordpiece_vocab import bert_vocab_from_dataset as bert_vocab

from realm_tf import errors

RESERVED_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


class VocabError(errors.RealmError, ValueError):
  """A vocabulary file is missing or lacks a token REALM needs."""


def load_vocab(vocab_file: str) -> List[str]:
  """Reads a one-token-per-line vocabulary; raises VocabError naming the file on trouble."""
  if not tf.io.gfile.exists(vocab_file):
    raise VocabError(f"vocab file not found: {vocab_file}")
  with tf.io.gfile.GFile(vocab_file, "r") as f:
    vocab = [line.rstrip("\n").strip() for line in f]
  while vocab and not vocab[-1]:
    vocab.pop()
  missing = [t for t in RESERVED_TOKENS if t not in vocab]
  if missing:
    raise VocabError(f"vocab file {vocab_file} lacks the special tokens {missing}")
  return vocab


class RealmTokenizer:
  """WordPiece tokenizer plus REALM's query, block and reader packers.

  Args:
    vocab_file: a BERT vocabulary, one wordpiece per line (``##`` marks continuations).
    lower_case: lower-case and strip accents first, as BERT uncased does.
  """

  def __init__(self, vocab_file: str, lower_case: bool = True):
    self.vocab_file = vocab_file
    self.lower_case = lower_case
    self.vocab = load_vocab(vocab_file)
    self._ids = {t: i for i, t in enumerate(self.vocab)}
    self.pad_id = self._ids["[PAD]"]
    self.unk_id = self._ids["[UNK]"]
    self.cls_id = self._ids["[CLS]"]
    self.sep_id = self._ids["[SEP]"]
    self.mask_id = self._ids["[MASK]"]
    table = tf.lookup.StaticVocabularyTable(
        tf.lookup.KeyValueTensorInitializer(
            tf.constant(self.vocab), tf.range(len(self.vocab), dtype=tf.int64)),
        num_oov_buckets=1)
    # Lower-casing is done by hand below: BertTokenizer(lower_case=True) applies NFKC case
    # folding, which rewrites characters such as "½" that BERT's reference tokenizer keeps.
    self._bert = tf_text.BertTokenizer(
        table, token_out_type=tf.int64, lower_case=False, unknown_token="[UNK]")

  @property
  def vocab_size(self) -> int:
    return len(self.vocab)

  def tokenize(self, texts) -> tf.RaggedTensor:
    """Strings ``[batch]`` -> wordpiece ids, int32 ragged ``[batch, (tokens)]``."""
    texts = tf.convert_to_tensor(texts, dtype=tf.string)
    if self.lower_case:  # BERT uncased: lower-case, NFD, drop combining marks (accents).
      texts = tf.strings.lower(texts, encoding="utf-8")
      texts = tf_text.normalize_utf8(texts, "NFD")
      texts = tf.strings.regex_replace(texts, r"\p{Mn}", "")
    return tf.cast(self._bert.tokenize(texts).merge_dims(-2, -1), tf.int32)

  def tokenize_to_strings(self, text: str) -> List[str]:
    """One string -> its wordpieces as strings (for inspection and tests)."""
    return [self.vocab[i] for i in self.tokenize([text])[0].numpy()]

  def convert_ids_to_tokens(self, ids: Iterable[int]) -> List[str]:
    return [self.vocab[int(i)] for i in ids]

  def count_wordpieces(self, texts: Sequence[str]) -> List[int]:
    """Number of wordpieces of each string (a Python list), for block packing."""
    if not texts:
      return []
    return self.tokenize(list(texts)).row_lengths().numpy().tolist()

  def pack(self, segments: Sequence[tf.RaggedTensor], seq_length: int) -> Dict[str, tf.Tensor]:
    """Packs 1 or 2 ragged id segments as ``[CLS] a [SEP] (b [SEP])`` into fixed int32 inputs.

    The last segment is trimmed first. Returns ``input_word_ids``, ``input_mask`` and
    ``input_type_ids``, each int32 ``[batch, seq_length]``.
    """
    segments = [tf.cast(s, tf.int32) for s in segments]
    budget = seq_length - 1 - len(segments)
    if budget < 0:
      raise ValueError(f"seq_length {seq_length} cannot hold {len(segments)} segments")
    trimmed = tf_text.WaterfallTrimmer(budget).trim(segments)
    ids, type_ids = tf_text.combine_segments(
        trimmed, start_of_sequence_id=self.cls_id, end_of_segment_id=self.sep_id)
    word_ids, mask = tf_text.pad_model_inputs(ids, max_seq_length=seq_length)
    type_ids, _ = tf_text.pad_model_inputs(type_ids, max_seq_length=seq_length)
    return {
        "input_word_ids": tf.cast(word_ids, tf.int32),
        "input_mask": tf.cast(mask, tf.int32),
        "input_type_ids": tf.cast(type_ids, tf.int32),
    }

  def query_inputs(self, queries, seq_length: int = 96) -> Dict[str, tf.Tensor]:
    """``[CLS] query [SEP]`` for a batch of query strings."""
    return self.pack([self.tokenize(queries)], seq_length)

  def block_inputs(self, titles, bodies, seq_length: int = 288) -> Dict[str, tf.Tensor]:
    """``[CLS] title [SEP] body [SEP]`` for a batch of blocks."""
    return self.pack([self.tokenize(titles), self.tokenize(bodies)], seq_length)

  def reader_inputs(self, queries, bodies, seq_length: int = 384) -> Dict[str, tf.Tensor]:
    """``[CLS] query [SEP] body [SEP]`` for a batch of (query, block body) pairs."""
    return self.pack([self.tokenize(queries), self.tokenize(bodies)], seq_length)


def learn_vocab(texts: Iterable[str],
                output_file: str,
                vocab_size: int = 8000,
                lower_case: bool = True,
                extra_reserved: Sequence[str] = ()) -> List[str]:
  """Learns a WordPiece vocabulary from a small corpus with tensorflow_text's learner.

  The special tokens (``[PAD] [UNK] [CLS] [SEP] [MASK]``, in that order, then
  ``extra_reserved``) come first. Writes ``output_file`` and returns the vocabulary.
  """
  texts = list(texts)
  if not texts:
    raise ValueError("learn_vocab needs at least one text")
  dataset = tf.data.Dataset.from_tensor_slices(texts).batch(1000)
  reserved = list(RESERVED_TOKENS) + list(extra_reserved)
  vocab = bert_vocab.bert_vocab_from_dataset(
      dataset,
      vocab_size=vocab_size,
      reserved_tokens=reserved,
      bert_tokenizer_params=dict(lower_case=lower_case),
      learn_params={})
  if vocab[:len(reserved)] != reserved:
    vocab = reserved + [t for t in vocab if t not in reserved]
  parent = os.path.dirname(output_file)
  if parent:
    tf.io.gfile.makedirs(parent)
  tmp = output_file + ".tmp"
  with tf.io.gfile.GFile(tmp, "w") as f:
    f.write("\n".join(vocab) + "\n")
  tf.io.gfile.rename(tmp, output_file, overwrite=True)
  return vocab
