"""BM25 over a corpus's blocks, beside the dense index: segments, deletions and exact statistics.

Scores are ``bm25s``'s Lucene variant (Kamphuis et al., 2020; the variant of real text's BM25
row, ``experiments/real_text/text_stages.py``), over ``bm25s``' word tokens (lower-cased,
English stop words out, no stemming) of each block's title and body::

    score(q, d) = sum over q's tokens t (repeats count) of
                  log(1 + (N - df_t + 0.5) / (df_t + 0.5)) * tf / (tf + k1 (1 - b + b |d| / avgdl))

``bm25s`` bakes the collection statistics (N, df, avgdl) into its scores when it indexes, so a
block added later cannot be scored beside the others without re-indexing everything. Here the
index keeps term frequencies instead, in **segments** (Lucene's design): the corpus's build is
one segment, each update appends a small one, and the statistics (N, df, avgdl) are kept over
the live blocks and applied at query time. A score therefore never depends on how the blocks
are segmented or on what was deleted before: after any sequence of updates it equals ``bm25s``'
score over the live blocks indexed afresh (tested), and :meth:`SparseIndex.merged` only makes
queries faster. A deleted block's postings stay in their segment until a merge, but it is out of
the statistics and never returned.

Rows are the dense index's: the block id (``manifests.read_blocks``' order, upserts appended).
Saved as ``.npy`` arrays and JSON only, and loaded with ``allow_pickle=False``: nothing in a
published index is ever unpickled.
"""

import itertools
import json
import os
from typing import Dict, Iterable, Iterator, List, NamedTuple, Sequence, Tuple

import bm25s
import numpy as np

from realm_tf.retrieval import errors
from realm_tf.retrieval.sparse import hybrid

FORMAT = "realm_tf.sparse_index/1"
SETTINGS = {"scoring": "bm25s lucene", "k1": 1.5, "b": 0.75, "stopwords": "en",
            "lower_case": True, "stemmer": None}
META_NAME = "sparse.json"
_CHUNK = 10_000   # texts tokenized at a time


def _replace(path: str, write) -> None:
  """``write(file)`` into a temporary file, then renamed to ``path``."""
  tmp = f"{path}.tmp-{os.getpid()}"
  with open(tmp, "wb") as f:
    write(f)
  os.replace(tmp, path)


def tokens(texts: Sequence[str]) -> List[List[str]]:
  """``bm25s``' word tokens of each text (``SETTINGS``)."""
  if not texts:
    return []
  return bm25s.tokenize(list(texts), lower=True, stopwords="en", stemmer=None,
                        return_ids=False, show_progress=False)


def block_text(title: str, body: str) -> str:
  """What BM25 reads of a block: its title, then its body."""
  return f"{title}\n{body}"


def store_texts(store, rows: Iterable[int]) -> Iterator[str]:
  """:func:`block_text` of each of ``rows`` of a ``data.block_store.BlockStore``."""
  for row in rows:
    yield block_text(store.titles[row], store.texts[row])


class Segment(NamedTuple):
  """Postings of some blocks, term-major: for ``term_ids[i]`` (sorted), the blocks
  ``rows[starts[i]:starts[i + 1]]`` hold it ``tfs[...]`` times."""
  term_ids: np.ndarray   # int32 [T]
  starts: np.ndarray     # int64 [T + 1]
  rows: np.ndarray       # int64 [P]
  tfs: np.ndarray        # float32 [P]

  def postings(self, term: int) -> Tuple[np.ndarray, np.ndarray]:
    i = np.searchsorted(self.term_ids, term)
    if i == len(self.term_ids) or self.term_ids[i] != term:
      return self.rows[:0], self.tfs[:0]
    return self.rows[self.starts[i]:self.starts[i + 1]], self.tfs[self.starts[i]:self.starts[i + 1]]

  def term_of_each_posting(self) -> np.ndarray:
    return np.repeat(self.term_ids, np.diff(self.starts))


def _segment(terms: np.ndarray, rows: np.ndarray, tfs: np.ndarray) -> Segment:
  order = np.lexsort((rows, terms))
  terms, rows, tfs = terms[order], rows[order], tfs[order]
  term_ids, first = np.unique(terms, return_index=True)
  return Segment(term_ids.astype(np.int32), np.append(first, len(terms)).astype(np.int64),
                 rows.astype(np.int64), tfs.astype(np.float32))


class SparseIndex:
  """BM25 over blocks, searchable, updatable (:meth:`add`, :meth:`delete`), saved without
  pickles. Build with :meth:`build`; load with :meth:`load`."""

  def __init__(self, vocab: Dict[str, int], segments: List[Segment], doc_len: np.ndarray,
               live: np.ndarray, df: np.ndarray):
    self.vocab = vocab
    self.segments = segments
    self.doc_len = doc_len      # float32 [rows]: tokens of each block (0 for a row never added)
    self.live = live            # bool [rows]
    self.df = df                # int64 [len(vocab)]: live blocks holding each term

  # ---------------------------------------------------------------------------- building --
  @classmethod
  def build(cls, texts: Iterable[str]) -> "SparseIndex":
    """An index of ``texts`` as rows 0, 1, ..., in one segment (tokenized ``_CHUNK`` at a
    time, so that the texts are never all held at once)."""
    index = cls({}, [], np.zeros(0, np.float32), np.zeros(0, bool), np.zeros(0, np.int64))
    parts, texts = [], iter(texts)
    while chunk := list(itertools.islice(texts, _CHUNK)):
      parts.append(index._postings(range(index.num_rows, index.num_rows + len(chunk)), chunk))
    index.segments = [_segment(*map(np.concatenate, zip(*parts)))] if parts else []
    return index

  @property
  def num_rows(self) -> int:
    return len(self.live)

  @property
  def num_live(self) -> int:
    return int(self.live.sum())

  def add(self, rows: Sequence[int], texts: Sequence[str]) -> None:
    """Indexes ``texts`` as ``rows`` (new: from :attr:`num_rows` on), in one new segment."""
    if len(texts):
      self.segments.append(_segment(*self._postings(rows, texts)))

  def _postings(self, rows: Sequence[int], texts: Sequence[str]):
    """Tokenizes ``texts`` into ``rows``: the vocabulary, lengths, live rows and document
    frequencies take them in; their postings ``(terms, rows, tfs)``."""
    rows = np.asarray(list(rows), np.int64)
    if len(rows) != len(texts):
      raise ValueError(f"{len(rows)} rows for {len(texts)} texts")
    if len(np.unique(rows)) != len(rows) or (rows < self.num_rows).any():
      # A deleted row's postings stay until a merge: its number is never given again (the
      # dense index appends too).
      raise ValueError(f"rows must be distinct and new (from {self.num_rows}): "
                       f"{sorted(rows.tolist())[:5]}")
    grow = int(rows.max()) + 1 - self.num_rows
    self.doc_len = np.concatenate([self.doc_len, np.zeros(grow, np.float32)])
    self.live = np.concatenate([self.live, np.zeros(grow, bool)])
    terms, posting_rows, tfs = [], [], []
    for row, words in zip(rows, tokens(texts)):
      unique, counts = np.unique(np.array(
          [self.vocab.setdefault(w, len(self.vocab)) for w in words], np.int64),
          return_counts=True)
      terms.append(unique)
      posting_rows.append(np.full(len(unique), row))
      tfs.append(counts)
      self.doc_len[row] = len(words)
    terms = np.concatenate(terms)
    self.df = np.concatenate([self.df, np.zeros(len(self.vocab) - len(self.df), np.int64)])
    self.df += np.bincount(terms, minlength=len(self.vocab))
    self.live[rows] = True
    return terms, np.concatenate(posting_rows), np.concatenate(tfs)

  def delete(self, rows: Sequence[int]) -> None:
    """Takes live ``rows`` out of the statistics and of every result."""
    rows = np.asarray(list(rows), np.int64)
    if len(rows) and ((rows >= self.num_rows).any() or not self.live[rows].all()):
      raise ValueError(f"rows not live: {sorted(set(rows.tolist()))[:5]}")
    gone = np.zeros(self.num_rows, bool)
    gone[rows] = True
    for segment in self.segments:
      self.df -= np.bincount(segment.term_of_each_posting()[gone[segment.rows]],
                             minlength=len(self.df))
    self.live[rows] = False
    self.doc_len[rows] = 0

  def merged(self) -> "SparseIndex":
    """The same index in one segment, without the deleted blocks' postings."""
    parts = [(s.term_of_each_posting(), s.rows, s.tfs) for s in self.segments]
    terms, rows, tfs = (np.concatenate(p) for p in zip(*parts)) if parts else (
        np.zeros(0, np.int64),) * 3
    keep = self.live[rows]
    return SparseIndex(dict(self.vocab), [_segment(terms[keep], rows[keep], tfs[keep])],
                       self.doc_len.copy(), self.live.copy(), self.df.copy())

  # ----------------------------------------------------------------------------- search --
  def scores(self, query: str) -> np.ndarray:
    """``float32 [num_rows]``: each block's BM25 score for ``query`` (0 for a deleted row)."""
    out = np.zeros(self.num_rows, np.float64)
    n = self.num_live
    if not n:
      return out.astype(np.float32)
    avgdl = self.doc_len.sum(dtype=np.float64) / n
    k1, b = SETTINGS["k1"], SETTINGS["b"]
    for word in tokens([query])[0]:
      term = self.vocab.get(word)
      if term is None or not self.df[term]:
        continue
      idf = np.log(1 + (n - self.df[term] + 0.5) / (self.df[term] + 0.5))
      for segment in self.segments:
        rows, tf = segment.postings(term)
        norm = k1 * (1 - b + b * self.doc_len[rows] / avgdl)
        out += np.bincount(rows, idf * tf / (tf + norm), minlength=self.num_rows)
    out[~self.live] = 0
    return out.astype(np.float32)

  def search(self, queries: Sequence[str], k: int) -> Tuple[np.ndarray, np.ndarray]:
    """The top ``k`` live blocks of each query with a positive score, best first (ties: the
    lower row): ``(rows int64 [q, k], scores float32 [q, k])``, padded with row -1 and score
    0 when fewer blocks share a word with the query."""
    rows = np.full([len(queries), k], -1, np.int64)
    scores = np.zeros([len(queries), k], np.float32)
    for i, query in enumerate(queries):
      s = self.scores(query)
      top = np.flatnonzero(s > 0)
      top = top[np.lexsort((top, -s[top]))][:k]
      rows[i, :len(top)], scores[i, :len(top)] = top, s[top]
    return rows, scores

  # ------------------------------------------------------------------------ persistence --
  def summary(self) -> Dict:
    """What a manifest records of it."""
    return {"format": FORMAT, "settings": SETTINGS, "num_rows": self.num_rows,
            "num_live": self.num_live, "segments": len(self.segments)}

  def manifest_entry(self) -> Dict:
    """What the dense index's manifest records of it, as its ``sparse`` part: the
    :meth:`summary` and the fusion rule answering will use (``hybrid.FUSION``)."""
    return dict(self.summary(), fusion=hybrid.FUSION)

  def save(self, path: str) -> None:
    """Writes ``path/``: ``sparse.json`` (:meth:`summary` and the vocabulary), last, and
    ``.npy`` arrays, each through a temporary name (a file hard-linked from a published index
    is replaced, never written into)."""
    os.makedirs(path, exist_ok=True)
    arrays = {"doc_len": self.doc_len, "live": self.live, "df": self.df}
    for i, segment in enumerate(self.segments):
      arrays.update({f"segment{i}_{f}": getattr(segment, f) for f in Segment._fields})
    for name, value in arrays.items():
      _replace(os.path.join(path, f"{name}.npy"),
               lambda f, value=value: np.save(f, value, allow_pickle=False))
    _replace(os.path.join(path, META_NAME), lambda f: f.write(
        json.dumps(dict(self.summary(), vocab=self.vocab)).encode("utf-8")))

  @classmethod
  def load(cls, path: str) -> "SparseIndex":
    """Reads what :meth:`save` wrote; IndexFormatError naming the file when it is not that."""
    meta_path = os.path.join(path, META_NAME)
    try:
      with open(meta_path, encoding="utf-8") as f:
        meta = json.load(f)
    except (OSError, ValueError) as e:
      raise errors.IndexFormatError(f"{meta_path}: not a sparse index ({e})") from e
    if meta.get("format") != FORMAT or meta.get("settings") != SETTINGS:
      raise errors.IndexFormatError(
          f"{meta_path}: format {meta.get('format')!r} with settings {meta.get('settings')}; "
          f"this code reads {FORMAT!r} with {SETTINGS}: rebuild it with realm-index build")

    def array(name, mmap=False):
      file = os.path.join(path, f"{name}.npy")
      try:
        return np.load(file, allow_pickle=False, mmap_mode="r" if mmap else None)
      except (OSError, ValueError) as e:
        raise errors.IndexFormatError(f"{file}: {e}; rebuild the index") from e

    # Postings are never written in place: memory-mapped, read as queries touch them.
    segments = [Segment(*[array(f"segment{i}_{f}", mmap=True) for f in Segment._fields])
                for i in range(meta["segments"])]
    index = cls(meta["vocab"], segments, array("doc_len"), array("live"), array("df"))
    if index.num_rows != meta["num_rows"] or index.num_live != meta["num_live"]:
      raise errors.IndexFormatError(f"{path}: {index.num_rows} rows ({index.num_live} live) "
                                    f"on disk, {meta_path} says {meta['num_rows']} "
                                    f"({meta['num_live']}); rebuild the index")
    return index
