"""A compact, memory-mapped store of a blocks directory: token ids, uid digests, body texts.

The trainer's host side reads the corpus from here instead of holding ``manifests.read_blocks``'s
dicts and dense packed arrays: a block costs its token ids (uint16 when every id fits in 16 bits,
else uint32) plus 32 bytes of index (an int64 offset, a 20-byte uid digest, the int32 position of
its first ``[SEP]``), all in files that are memory-mapped, so only the pages that batches touch
become resident (and they are the kernel's page cache, shared between processes). Fixed-length
model inputs are built per batch for just the rows it needs (:meth:`BlockStore.gather_packed`),
equal to what ``features.pack_block_ids`` gives (and ``candidates.pack_blocks``); the body texts
(for recall hits and Open-QA) and titles (for evidence) are in the store too, decoded when
read (:attr:`BlockStore.texts`, :attr:`BlockStore.titles`).

Layout, in ``<store_root>/<key>/`` (``store_root`` is ``<blocks_dir>/block_store`` when the
blocks directory is local and writable, else a directory under the system's temporary one)::

  meta.json          {"format", "key", "blocks_dir", "fingerprint", "num_blocks", "num_tokens",
                      "token_dtype", "num_text_bytes", "num_title_bytes", "cls_id",
                      "sep_id", "manifest"}
  tokens.bin         token_dtype [num_tokens]: every block's [CLS] title [SEP] body [SEP],
                     one after the other in block_id order
  offsets.bin        int64 [num_blocks + 1]: block i is tokens[offsets[i]:offsets[i + 1]]
  uid_digests.bin    uint8 [num_blocks, 20]: SHA1 of each block's uid string (UTF-8)
  first_seps.bin     int32 [num_blocks]: position of the first sep_id in each block (-1: none)
  texts.bin          uint8 [num_text_bytes]: the block bodies' UTF-8 text, in block_id order
  text_offsets.bin   int64 [num_blocks + 1]
  titles.bin         uint8 [num_title_bytes]: the block titles' UTF-8 text, in block_id order
  title_offsets.bin  int64 [num_blocks + 1]

``key`` is a hash of the blocks manifest of version 0 (``corpus_updates.base_manifest``: the
corpus ``fingerprint``, the vocabulary's SHA1, the block length) and of :data:`FORMAT`: a
rewritten corpus gets a new store. The store is built on first use (:meth:`BlockStore.open`),
streaming over the shards batch by batch, into a temporary directory that is then renamed into
place (``os.replace``): a reader never sees a partial store. Building checks the shards against
the manifest (count, dense block ids, fingerprints) as ``read_blocks`` does. Stores of other
manifests of the same blocks directory in ``store_root`` are removed once the new one is in
place. Building holds about 50 bytes per block (ids, lengths, the final order) and one batch of
records, never a Python object per block; it shows a progress bar from 100,000 blocks on.

**Versions** (``corpus_updates``). A store serves every version of its corpus: an update's
blocks are appended to its files in place (:func:`_extend`, the rows the new version adds,
O(added) work) and ``meta.json``, replaced last, says how many rows are complete; a reader maps
the prefix of the version it opened (``BlockStore.open(blocks_dir, fingerprint=...)`` for an
older one) and gets that version's deleted rows in :attr:`BlockStore.deleted`. Building and
extending hold a lock on ``store_root`` (``flock`` of the file ``store_root/.lock``); an append
interrupted by a crash leaves bytes past ``meta.json``'s sizes, cut off by the next one.

Row ``len(store)`` is the null block ``[CLS] [SEP] [SEP]`` (empty body text, a zero digest that
equals no uid's), accepted wherever a row id is.

Example::

  store = BlockStore.open(blocks_dir)
  len(store); store.tokens(7); store.body(7); store.text(7); store.uid_digest(7)
  store.deleted; store.rows_with_title("Paris"); store.rows_with_uid(uid)
  packed = store.gather_packed(rows, 288)        # rows: int array of any shape, e.g. [b, k]
  same = store.same_uid(rows, source_uids)       # rows [b, k], source_uids [b] -> bool [b, k]
"""

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
import tqdm

from realm_tf.data import corpus_updates
from realm_tf.data import manifests

FORMAT = 2
STORE_DIR = "block_store"
META = "meta.json"
LOCK_NAME = ".lock"  # The lock file of builders and extenders, in the store root.
DIGEST_BYTES = 20
NULL_DIGEST = bytes(DIGEST_BYTES)
_BATCH = 2048           # records per parsed batch while building
_PROGRESS_MIN = 100000  # show a progress bar (progress=None) from this many blocks on
_FILES = ("tokens.bin", "offsets.bin", "uid_digests.bin", "first_seps.bin", "texts.bin",
          "text_offsets.bin", "titles.bin", "title_offsets.bin")

_PARSE_FEATURES = {
    "block_id": tf.io.FixedLenFeature([], tf.int64),
    "uid": tf.io.FixedLenFeature([], tf.string),
    "title": tf.io.FixedLenFeature([], tf.string),
    "body": tf.io.FixedLenFeature([], tf.string),
    "token_ids": tf.io.RaggedFeature(tf.int64),
}


def uid_digest(uid) -> bytes:
  """The 20-byte digest of a uid (str or bytes): ``SHA1(uid as UTF-8)``."""
  return hashlib.sha1(uid.encode("utf-8") if isinstance(uid, str) else bytes(uid)).digest()


def _digests(uids: Iterable) -> np.ndarray:
  """uint8 ``[n, 20]``: the digests of ``uids``."""
  raw = b"".join(uid_digest(u) for u in uids)
  return np.frombuffer(raw, np.uint8).reshape(-1, DIGEST_BYTES)


def token_dtype(max_id: int) -> np.dtype:
  """uint16 when every id fits in 16 bits, else uint32."""
  if max_id <= np.iinfo(np.uint16).max:
    return np.dtype(np.uint16)
  if max_id <= np.iinfo(np.uint32).max:
    return np.dtype(np.uint32)
  raise manifests.CorpusFormatError(f"token id {max_id} does not fit in 32 bits")


def manifest_key(manifest: Dict) -> str:
  """The store's key: hex SHA1 over :data:`FORMAT` and the canonical JSON of the manifest of
  version 0 (``corpus_updates.base_manifest``; every version of a corpus has the same key)."""
  base = corpus_updates.base_manifest(manifest)
  text = json.dumps({"format": FORMAT, "manifest": base}, sort_keys=True)
  return hashlib.sha1(text.encode("utf-8")).hexdigest()


def default_store_root(blocks_dir: str) -> str:
  """``<blocks_dir>/block_store`` for a local, writable blocks directory; else a directory
  under the system's temporary one, named after the blocks directory."""
  if "://" not in blocks_dir and os.access(blocks_dir, os.W_OK):
    return os.path.join(blocks_dir, STORE_DIR)
  name = hashlib.sha1(os.path.abspath(blocks_dir).encode("utf-8")).hexdigest()[:16]
  return os.path.join(tempfile.gettempdir(), "realm_tf_block_store", name)


def _map(path: str, dtype, shape) -> np.ndarray:
  """A read-only memory map of a raw array file (an empty array when there is nothing)."""
  if int(np.prod(shape)) == 0:
    return np.zeros(shape, dtype)
  # A plain ndarray over the map: indexing it skips np.memmap's Python-level overhead.
  return np.asarray(np.memmap(path, dtype=dtype, mode="r", shape=tuple(shape)))


class _Texts:
  """Texts as a read-only sequence of str, decoded when read (row n, the null row: "")."""

  def __init__(self, data: np.ndarray, offsets: np.ndarray):
    self._data, self._offsets = data, offsets

  def __len__(self):
    return len(self._offsets)  # n blocks + the null row

  def __getitem__(self, i):
    i = int(i)
    if i < 0:
      i += len(self)
    if not 0 <= i < len(self):
      raise IndexError(f"row {i} out of range for {len(self) - 1} blocks")
    if i == len(self) - 1:
      return ""
    start, stop = int(self._offsets[i]), int(self._offsets[i + 1])
    return self._data[start:stop].tobytes().decode("utf-8")

  def blocks(self) -> "_Blocks":
    """The same sequence without the null row (``len``: the number of blocks)."""
    return _Blocks(self)


class _Blocks:
  """A ``_Texts`` without its null row."""

  def __init__(self, texts: _Texts):
    self._texts = texts

  def __len__(self):
    return len(self._texts) - 1

  def __getitem__(self, i):
    i = int(i)
    if not -len(self) <= i < len(self):
      raise IndexError(f"block {i} out of range for {len(self)} blocks")
    return self._texts[i % len(self)] if i < 0 else self._texts[i]


class BlockStore:
  """The corpus as flat arrays (see the module docstring); use :meth:`open` or
  :meth:`from_blocks`.

  Attributes:
    cls_id, sep_id: the ``[CLS]``/``[SEP]`` ids used for the null row and by default in
      :meth:`body` and :meth:`gather_packed` (the first and last token of block 0 unless given).
    fingerprint: the corpus fingerprint of the version the store was opened for.
    fingerprints: the fingerprints of that version and every older one, oldest first
      (``corpus_updates.fingerprints``).
    deleted: sorted int64 rows deleted in that version (still readable; never retrieved).
    path: the store's directory (None for one built in memory).
  """

  def __init__(self, tokens: np.ndarray, offsets: np.ndarray, digests: np.ndarray,
               first_seps: np.ndarray, texts: np.ndarray, text_offsets: np.ndarray,
               titles: np.ndarray, title_offsets: np.ndarray,
               cls_id: Optional[int], sep_id: Optional[int], fingerprint: Optional[str] = None,
               path: Optional[str] = None, deleted: Optional[np.ndarray] = None,
               fingerprints: Optional[Sequence[str]] = None):
    self._tokens, self._offsets, self._digests = tokens, offsets, digests
    self._first_seps = first_seps  # per block, the position of its first sep_id (-1: none)
    self._sep_of_first_seps = None if sep_id is None else int(sep_id)
    self._text_data, self._text_offsets = texts, text_offsets
    self._digest_view = np.ascontiguousarray(digests).view(f"V{DIGEST_BYTES}")[:, 0] if len(
        digests) else np.zeros([0], f"V{DIGEST_BYTES}")
    self.cls_id = None if cls_id is None else int(cls_id)
    self.sep_id = None if sep_id is None else int(sep_id)
    self.fingerprint = fingerprint
    self.fingerprints = list(fingerprints) if fingerprints else [fingerprint]
    self.deleted = np.unique(np.asarray([] if deleted is None else deleted, np.int64))
    self.path = path
    self._title_data, self._title_offsets = titles, title_offsets
    self._title_lengths = None
    self.texts = _Texts(texts, text_offsets)
    self.titles = _Texts(titles, title_offsets)

  # ---- construction ----
  @classmethod
  def open(cls, blocks_dir: str, store_dir: Optional[str] = None,
           progress: Optional[bool] = None, cls_id: Optional[int] = None,
           sep_id: Optional[int] = None, fingerprint: Optional[str] = None) -> "BlockStore":
    """The store of ``blocks_dir``'s current version (or of its older version
    ``fingerprint``), built or extended first when needed.

    Args:
      blocks_dir: a blocks directory (``manifests``' format).
      store_dir: where stores live (default :func:`default_store_root`).
      progress: show a progress bar while building (None: for 100,000 blocks or more).
      cls_id, sep_id: override the special ids the store infers from block 0.
      fingerprint: open this version of the corpus (e.g. the one an index was built over).

    Raises the errors of ``manifests.load_blocks_manifest`` / ``block_shard_files`` and
    ``CorpusFormatError`` when the shards do not match the manifest.
    """
    manifest = manifests.load_blocks_manifest(blocks_dir)
    if fingerprint is not None:
      manifest = corpus_updates.manifest_at(manifest, fingerprint)
    key = manifest_key(manifest)
    root = store_dir or default_store_root(blocks_dir)
    final = os.path.join(root, key[:20])
    rows = int(manifest["num_blocks"])
    store = cls._try_open(final, key, rows)
    if store is None:
      os.makedirs(root, exist_ok=True)
      with _store_lock(root):  # One builder or extender at a time.
        store = cls._try_open(final, key, rows)
        if store is None and _committed_rows(final, key) is not None:
          if _extend(final, blocks_dir, manifest):
            store = cls._try_open(final, key, rows)
        if store is None:
          store = cls._rebuild(blocks_dir, manifest, key, root, final, progress)
      _remove_stale(root, os.path.basename(final), blocks_dir)
    store.fingerprint = manifest["fingerprint"]
    store.fingerprints = corpus_updates.fingerprints(manifest)
    store.deleted = corpus_updates.deleted_rows(manifest)
    if cls_id is not None:
      store.cls_id = int(cls_id)
    if sep_id is not None:
      store.sep_id = int(sep_id)
    return store

  @classmethod
  def _rebuild(cls, blocks_dir: str, manifest: Dict, key: str, root: str, final: str,
               progress: Optional[bool]) -> "BlockStore":
    """Builds the store of ``manifest`` afresh and puts it in place of whatever is in
    ``final`` (a damaged store, or one that cannot be extended); holds the store's lock."""
    tmp = os.path.join(root, f".tmp-{key[:20]}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
      _build(blocks_dir, manifest, key, tmp, progress)
      if os.path.isdir(final):  # Moved aside first: nobody sees a half-removed store.
        os.replace(final, f"{tmp}.old")
        shutil.rmtree(f"{tmp}.old", ignore_errors=True)
      os.replace(tmp, final)
    finally:
      shutil.rmtree(tmp, ignore_errors=True)
    store = cls._try_open(final, key, int(manifest["num_blocks"]))
    if store is None:
      raise manifests.CorpusFormatError(f"block store {final} is unreadable after building")
    return store

  @classmethod
  def _try_open(cls, path: str, key: str, rows: int) -> Optional["BlockStore"]:
    """The first ``rows`` rows of the store in ``path`` when it is complete, built for
    ``key`` and holds them; else None."""
    meta = _read_meta(path, key)
    if meta is None or int(meta["num_blocks"]) < rows:
      return None
    n, dtype = int(meta["num_blocks"]), np.dtype(meta["token_dtype"])
    sizes = _file_sizes(meta)
    for name, size in sizes.items():
      file = os.path.join(path, name)
      if not os.path.isfile(file) or os.path.getsize(file) < size:
        return None
    join = lambda name: os.path.join(path, name)
    offsets = _map(join("offsets.bin"), np.int64, [n + 1])[:rows + 1]
    text_offsets = _map(join("text_offsets.bin"), np.int64, [n + 1])[:rows + 1]
    title_offsets = _map(join("title_offsets.bin"), np.int64, [n + 1])[:rows + 1]
    return cls(_map(join("tokens.bin"), dtype, [int(offsets[-1])]), offsets,
               _map(join("uid_digests.bin"), np.uint8, [rows, DIGEST_BYTES]),
               _map(join("first_seps.bin"), np.int32, [rows]),
               _map(join("texts.bin"), np.uint8, [int(text_offsets[-1])]), text_offsets,
               _map(join("titles.bin"), np.uint8, [int(title_offsets[-1])]), title_offsets,
               meta.get("cls_id"), meta.get("sep_id"), meta.get("fingerprint"), path)

  @classmethod
  def from_blocks(cls, blocks: Sequence[Dict], cls_id: Optional[int] = None,
                  sep_id: Optional[int] = None) -> "BlockStore":
    """An in-memory store of blocks as ``manifests.read_blocks`` returns them (row = position;
    ``uid``, ``token_ids`` and optionally ``body`` and ``title``)."""
    lengths = np.array([len(b["token_ids"]) for b in blocks], np.int64)
    flat = np.concatenate([np.asarray(b["token_ids"], np.int64) for b in blocks] or
                          [np.zeros([0], np.int64)])
    if flat.size and flat.min() < 0:
      raise manifests.CorpusFormatError(f"negative token id {flat.min()}")
    tokens = flat.astype(token_dtype(int(flat.max()) if flat.size else 0))
    texts = [b.get("body", "").encode("utf-8") for b in blocks]
    text_lengths = np.array([len(t) for t in texts], np.int64)
    titles = [b.get("title", "").encode("utf-8") for b in blocks]
    cls_id, sep_id = _special_ids(tokens, lengths, cls_id, sep_id)
    offsets = _offsets(lengths)
    try:
      fingerprint = manifests.corpus_fingerprint(b["uid"] for b in blocks)
    except UnicodeError:  # Not the hex uids of the blocks format.
      fingerprint = None
    return cls(tokens, offsets, _digests(b["uid"] for b in blocks),
               _first_seps(tokens, offsets, sep_id),
               np.frombuffer(b"".join(texts), np.uint8), _offsets(text_lengths),
               np.frombuffer(b"".join(titles), np.uint8), _offsets(_byte_lengths(titles)),
               cls_id, sep_id, fingerprint)

  # ---- one row ----
  def __len__(self) -> int:
    return len(self._offsets) - 1

  @property
  def null_row(self) -> int:
    return len(self)

  @property
  def num_tokens(self) -> int:
    return int(self._tokens.shape[0])

  @property
  def token_dtype(self) -> np.dtype:
    return self._tokens.dtype

  def nbytes(self) -> int:
    """Bytes of all the arrays (on disk for an opened store; resident only where touched)."""
    return int(sum(a.nbytes for a in (self._tokens, self._offsets, self._digests,
                                      self._first_seps, self._text_data, self._text_offsets,
                                      self._title_data, self._title_offsets)))

  def texts_nbytes(self) -> int:
    """Bytes of the body texts and titles and their offsets (read for recall hits, Open-QA
    and evidence, not by the training step)."""
    return int(self._text_data.nbytes + self._text_offsets.nbytes + self._title_data.nbytes +
               self._title_offsets.nbytes)

  def _row(self, i) -> int:
    i = int(i)
    if not 0 <= i <= len(self):
      raise IndexError(f"row {i} out of range: {len(self)} blocks and the null row")
    return i

  def _ids(self, cls_id, sep_id) -> Tuple[int, int]:
    cls_id = self.cls_id if cls_id is None else cls_id
    sep_id = self.sep_id if sep_id is None else sep_id
    if cls_id is None or sep_id is None:
      raise ValueError("this store knows no [CLS]/[SEP] ids: pass cls_id and sep_id")
    return int(cls_id), int(sep_id)

  def tokens(self, i) -> np.ndarray:
    """int32 ids of block ``i``: ``[CLS] title [SEP] body [SEP]`` (the null row's for
    ``i = len(store)``)."""
    i = self._row(i)
    if i == len(self):
      cls_id, sep_id = self._ids(None, None)
      return np.array([cls_id, sep_id, sep_id], np.int32)
    return np.asarray(self._tokens[int(self._offsets[i]):int(self._offsets[i + 1])], np.int32)

  def body(self, i, sep_id: Optional[int] = None) -> np.ndarray:
    """int32 body ids of block ``i`` with their closing ``[SEP]``: what follows the first
    ``[SEP]`` (all but the first id when there is none; as ``candidates.pack_blocks`` gives in
    ``bodies``)."""
    i = self._row(i)
    bodies, lengths = self.gather_bodies(np.array([i]), None, sep_id)
    return bodies[0, :int(lengths[0])]

  def text(self, i) -> str:
    """The body text of block ``i`` ("" for the null row)."""
    return self.texts[self._row(i)]

  def uid_digest(self, i) -> bytes:
    """The 20-byte uid digest of block ``i`` (:func:`uid_digest`; zeros for the null row)."""
    i = self._row(i)
    return NULL_DIGEST if i == len(self) else self._digests[i].tobytes()

  # ---- rows by uid, title, deletion ----
  @property
  def uid_keys(self) -> np.ndarray:
    """One ``V20`` value per block, its uid digest: equal values, the same uid (for grouping
    blocks by uid)."""
    return self._digest_view

  def token_lengths(self) -> np.ndarray:
    """int64 ``[n]``: the number of ids of each block."""
    return np.diff(self._offsets)

  def is_live(self, rows) -> np.ndarray:
    """bool, shape of ``rows``: a block of this version that is not deleted (the null row and
    negative rows: False)."""
    rows = np.asarray(rows, np.int64)
    return (rows >= 0) & (rows < len(self)) & ~np.isin(rows, self.deleted)

  def rows_with_uid(self, uid) -> np.ndarray:
    """The live rows whose uid is ``uid`` (str or bytes), ascending."""
    want = np.frombuffer(uid_digest(uid), f"V{DIGEST_BYTES}")[0]
    rows = np.flatnonzero(self._digest_view == want)
    return rows[self.is_live(rows)]

  def rows_with_title(self, title: str) -> np.ndarray:
    """The live rows whose title is ``title``, ascending."""
    return self.rows_with_titles([title])[0]

  def rows_with_titles(self, titles: Sequence[str]) -> List[np.ndarray]:
    """:meth:`rows_with_title` of each title: one pass over the blocks per distinct title
    length (an update looks up every document's title at once)."""
    if self._title_lengths is None:  # Kept for the next lookup.
      self._title_lengths = np.diff(self._title_offsets)
    wanted = [title.encode("utf-8") for title in titles]
    out: List[np.ndarray] = [np.zeros([0], np.int64)] * len(titles)
    for length in sorted({len(w) for w in wanted}):
      rows, keys = np.flatnonzero(self._title_lengths == length), None
      if length and len(rows):  # The titles of that length as fixed-width byte strings.
        at = self._title_offsets[rows][:, None] + np.arange(length)[None, :]
        keys = np.ascontiguousarray(self._title_data[at]).view(f"S{length}")[:, 0]
        order = np.argsort(keys, kind="stable")
        keys, rows = keys[order], rows[order]
      for i, w in enumerate(wanted):
        if len(w) == length:  # (No keys: every row has the empty title, or no row matches.)
          found = rows if keys is None else rows[np.searchsorted(keys, w, "left"):
                                                 np.searchsorted(keys, w, "right")]
          found = np.sort(found)
          out[i] = found[self.is_live(found)]
    return out

  # ---- batches of rows ----
  def same_uid(self, rows, uids) -> np.ndarray:
    """bool, shape of ``rows``: does the block in ``rows[i, ...]`` have the uid ``uids[i]``?

    ``uids`` holds one uid (str or bytes) per leading row of ``rows``, or is a single uid for
    every row. The null row and negative rows (no result) have no uid: False.
    """
    rows = np.asarray(rows, np.int64)
    if isinstance(uids, (str, bytes)):
      want = np.frombuffer(uid_digest(uids), f"V{DIGEST_BYTES}")[0]
      want = np.full(rows.shape, want)
    else:
      want = np.frombuffer(b"".join(uid_digest(u) for u in uids), f"V{DIGEST_BYTES}")
      if rows.ndim == 0 or len(want) != rows.shape[0]:
        raise ValueError(f"{len(want)} uids for rows of shape {rows.shape}")
      want = want.reshape([-1] + [1] * (rows.ndim - 1))
    if rows.size and rows.max() > len(self):
      raise IndexError(f"row {rows.max()} out of range: {len(self)} blocks and the null row")
    real = (rows >= 0) & (rows < len(self))
    got = self._digest_view[np.where(real, rows, 0)] if len(self) else np.zeros(
        rows.shape, f"V{DIGEST_BYTES}")
    return real & (got == want)

  def _locate(self, rows: np.ndarray, sep_id: int):
    """Flat ``rows`` -> (null, starts, lengths, first_sep): where each row's ids start in the
    flat tokens, their number and the position of the first ``sep_id`` (-1: none). The null
    row is ``[CLS] [SEP] [SEP]``: 3 ids, first [SEP] at 1 (its ids are not in the tokens)."""
    if rows.size and (rows.min() < 0 or rows.max() > len(self)):
      raise IndexError(f"rows must be in [0, {len(self)}] (the null row is {len(self)}), got "
                       f"[{rows.min()}, {rows.max()}]")
    null = rows == len(self)
    if not len(self):
      zeros = np.zeros(rows.shape, np.int64)
      return null, zeros, zeros + 3, zeros + 1
    real = np.where(null, 0, rows)
    starts = self._offsets[real]
    lengths = self._offsets[real + 1] - starts
    if sep_id == self._sep_of_first_seps:
      first = self._first_seps[real].astype(np.int64)
    else:   # Another [SEP] than the store's: look for it in these rows.
      longest = int(lengths.max()) if lengths.size else 0
      window = self._window(starts, lengths, longest)
      is_sep = window == sep_id
      first = np.where(is_sep.any(axis=1), np.argmax(is_sep, axis=1), -1)
    return null, starts, np.where(null, 3, lengths), np.where(null, 1, first)

  def _window(self, starts: np.ndarray, counts: np.ndarray, width: int) -> np.ndarray:
    """int32 ``[m, width]``: ``counts[r]`` ids from ``starts[r]`` in the flat tokens, then 0."""
    valid = np.arange(width)[None, :] < np.minimum(counts, width)[:, None]
    if not self.num_tokens:
      return np.zeros(valid.shape, np.int32)
    index = np.where(valid, starts[:, None] + np.arange(width)[None, :], 0)
    return np.where(valid, self._tokens[index], 0).astype(np.int32)

  def gather_packed(self, rows, seq_length: int, cls_id: Optional[int] = None,
                    sep_id: Optional[int] = None) -> Dict[str, np.ndarray]:
    """Packed int32 model inputs of ``rows`` (any shape), ``rows.shape + [seq_length]``.

    Equal to ``features.pack_block_ids`` of those rows' ids: trimmed to ``seq_length`` with
    the last position set to ``[SEP]`` when longer, mask 1 over the ids, type ids 1 after the
    first ``[SEP]``. Keys ``input_word_ids``, ``input_mask``, ``input_type_ids``.
    """
    cls_id, sep_id = self._ids(cls_id, sep_id)
    rows = np.asarray(rows, np.int64)
    null, starts, lengths, first = self._locate(rows.reshape(-1), sep_id)
    kept = np.minimum(lengths, seq_length)
    word = self._window(starts, kept, seq_length)
    word[null] = np.pad([cls_id, sep_id, sep_id], (0, max(seq_length - 3, 0)))[:seq_length]
    trimmed = lengths > seq_length
    if seq_length > 0:
      word[trimmed, seq_length - 1] = sep_id
    positions = np.arange(seq_length)[None, :]
    mask = positions < kept[:, None]
    # The first [SEP] among the kept ids (one put at the end by trimming comes after it).
    first = np.where((first >= 0) & (first < kept), first, seq_length)
    types = (positions > first[:, None]) & mask
    shape = rows.shape + (seq_length,)
    return {"input_word_ids": word.reshape(shape),
            "input_mask": mask.astype(np.int32).reshape(shape),
            "input_type_ids": types.astype(np.int32).reshape(shape)}

  def gather_bodies(self, rows, width: Optional[int], sep_id: Optional[int] = None,
                    cls_id: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
    """The bodies of ``rows`` (any shape): int32 ``rows.shape + [width]``, each body's first
    ``width`` ids (with the closing ``[SEP]``; 0 after), and each body's full length (int64
    ``rows.shape``). ``width`` None: the longest of these bodies."""
    sep_id = self._ids(cls_id, sep_id)[1] if sep_id is None else int(sep_id)
    rows = np.asarray(rows, np.int64)
    null, starts, lengths, first = self._locate(rows.reshape(-1), sep_id)
    # The body starts after the first [SEP] (after position 0 when there is none).
    skip = np.where(first >= 0, first + 1, 1)
    body_lengths = np.maximum(lengths - skip, 0)
    if width is None:
      width = int(body_lengths.max()) if body_lengths.size else 0
    bodies = self._window(starts + skip, np.where(null, 0, body_lengths), width)
    if width:
      bodies[null, 0] = sep_id
    return bodies.reshape(rows.shape + (width,)), body_lengths.reshape(rows.shape)


def _first_seps(tokens: np.ndarray, offsets: np.ndarray, sep_id: Optional[int],
                chunk: int = 1 << 16) -> np.ndarray:
  """int32 ``[n]``: the position of the first ``sep_id`` in each block (-1: none)."""
  n = len(offsets) - 1
  out = np.full([n], -1, np.int32)
  if sep_id is None:
    return out
  for a in range(0, n, chunk):
    b = min(a + chunk, n)
    lo = int(offsets[a])
    where = np.flatnonzero(np.asarray(tokens[lo:int(offsets[b])]) == sep_id) + lo
    at = np.searchsorted(where, offsets[a:b])
    found = at < len(where)
    position = where[np.minimum(at, max(len(where) - 1, 0))] if len(where) else offsets[a:b]
    found &= position < offsets[a + 1:b + 1]
    out[a:b] = np.where(found, position - offsets[a:b], -1)
  return out


def _offsets(lengths: np.ndarray) -> np.ndarray:
  out = np.zeros([len(lengths) + 1], np.int64)
  np.cumsum(lengths, out=out[1:])
  return out


def _special_ids(tokens, lengths, cls_id, sep_id):
  """Given ids, else the first and last token of block 0 (None for an empty corpus)."""
  if len(lengths) and lengths[0] > 0:
    cls_id = int(tokens[0]) if cls_id is None else cls_id
    sep_id = int(tokens[int(lengths[0]) - 1]) if sep_id is None else sep_id
  return cls_id, sep_id


def _remove_stale(root: str, keep: str, blocks_dir: str) -> None:
  """Removes the finished stores that ``root`` holds for older manifests of ``blocks_dir``
  (never a builder's temporary directory, nor the store of another blocks directory)."""
  for name in os.listdir(root):
    path = os.path.join(root, name)
    if name == keep or name.startswith("."):
      continue
    try:
      with open(os.path.join(path, META)) as f:
        if json.load(f).get("blocks_dir") != _location(blocks_dir):
          continue
    except (OSError, ValueError):
      continue
    shutil.rmtree(path, ignore_errors=True)


def _location(blocks_dir: str) -> str:
  return blocks_dir if "://" in blocks_dir else os.path.abspath(blocks_dir)


class _Column:
  """A ragged column written while streaming: values appended to a file, lengths kept."""

  def __init__(self, path: str, dtype):
    self.path, self.dtype = path, np.dtype(dtype)
    self.file = open(path, "wb")
    self.lengths = []
    self.count = 0

  def append(self, values: np.ndarray, lengths: np.ndarray) -> None:
    self.file.write(np.ascontiguousarray(values, self.dtype).tobytes())
    self.lengths.append(np.asarray(lengths, np.int64))
    self.count += int(values.size)

  def widen(self, dtype) -> None:
    """Rewrites what was written with a wider dtype (uint16 -> uint32 token ids)."""
    self.file.close()
    old = np.fromfile(self.path, self.dtype)
    self.dtype = np.dtype(dtype)
    old.astype(self.dtype).tofile(self.path)
    self.file = open(self.path, "ab")

  def close(self) -> np.ndarray:
    self.file.close()
    return np.concatenate(self.lengths) if self.lengths else np.zeros([0], np.int64)


def _permute(src: str, dst: str, dtype, lengths: np.ndarray, order: np.ndarray,
             chunk: int = 1 << 16) -> np.ndarray:
  """Writes the ragged rows of ``src`` (in arrival order, ``lengths``) to ``dst`` in the order
  ``order`` (arrival positions, sorted by block id); returns the offsets in ``dst``."""
  offsets = _offsets(lengths[order])
  if np.array_equal(order, np.arange(len(order))):
    os.replace(src, dst)
    return offsets
  total = int(offsets[-1])
  if total == 0:
    open(dst, "wb").close()
    return offsets
  rank = np.empty_like(order)
  rank[order] = np.arange(len(order))
  src_offsets = _offsets(lengths)
  source = np.memmap(src, dtype=dtype, mode="r", shape=(int(src_offsets[-1]),))
  target = np.memmap(dst, dtype=dtype, mode="w+", shape=(total,))
  for a in range(0, len(order), chunk):
    b = min(a + chunk, len(order))
    lo, hi = int(src_offsets[a]), int(src_offsets[b])
    shift = np.repeat(offsets[rank[a:b]] - src_offsets[a:b], lengths[a:b])
    target[np.arange(lo, hi) + shift] = source[lo:hi]
  target.flush()
  del source, target
  os.remove(src)
  return offsets


class _FileArray:
  """Slices of a raw array file, read when taken (no mapping stays resident while building)."""

  def __init__(self, path: str, dtype):
    self.path, self.dtype = path, np.dtype(dtype)

  def __getitem__(self, item: slice) -> np.ndarray:
    start, stop = int(item.start), int(item.stop)
    return np.fromfile(self.path, self.dtype, count=stop - start,
                       offset=start * self.dtype.itemsize)


def _fingerprint(path: str, offsets: np.ndarray, chunk: int = 1 << 16) -> str:
  """``manifests.corpus_fingerprint`` of the uids stored one after the other in ``path``."""
  h = hashlib.sha1()
  n = len(offsets) - 1
  data = _FileArray(path, np.uint8)
  for a in range(0, n, chunk):
    b = min(a + chunk, n)
    lo, hi = int(offsets[a]), int(offsets[b])
    lengths = np.diff(offsets[a:b + 1])
    out = np.empty([hi - lo + (b - a)], np.uint8)
    position = np.arange(hi - lo) + np.repeat(np.arange(b - a), lengths)
    out[position] = data[lo:hi]
    out[np.cumsum(lengths) + np.arange(b - a)] = ord("\n")
    h.update(out.tobytes())
  return h.hexdigest()


def _parse(serialized):
  parsed = tf.io.parse_example(serialized, _PARSE_FEATURES)
  ids = parsed["token_ids"]
  return {"block_id": parsed["block_id"], "uid": parsed["uid"], "body": parsed["body"],
          "title": parsed["title"], "values": ids.values, "lengths": ids.row_lengths()}


def _byte_lengths(strings) -> np.ndarray:
  return np.fromiter((len(s) for s in strings), np.int64, len(strings))


def _build(blocks_dir: str, manifest: Dict, key: str, out: str,
           progress: Optional[bool]) -> None:
  """Streams the shards of ``blocks_dir`` into a complete store in the new directory ``out``."""
  base = corpus_updates.base_manifest(manifest)
  files = corpus_updates.corpus_files(blocks_dir, manifest)
  n = int(manifest["num_blocks"])
  os.makedirs(out)
  start = time.time()
  logging.info("building the block store of %s (%d blocks) in %s", blocks_dir, n, out)
  join = lambda name: os.path.join(out, name)
  tokens = _Column(join("tokens.arrival"), np.uint16)
  texts = _Column(join("texts.arrival"), np.uint8)
  titles = _Column(join("titles.arrival"), np.uint8)
  uids = _Column(join("uids.arrival"), np.uint8)
  digests = open(join("digests.arrival"), "wb")
  block_ids = []
  dataset = tf.data.TFRecordDataset(files).batch(_BATCH).map(
      _parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).prefetch(2)
  show = n >= _PROGRESS_MIN if progress is None else progress
  with tqdm.tqdm(total=n, desc="building the block store", unit="block", disable=not show,
                 mininterval=2.0) as bar:
    for batch in dataset.as_numpy_iterator():
      values = batch["values"]
      if values.size:
        if values.min() < 0:
          raise manifests.CorpusFormatError(f"{blocks_dir}: negative token id {values.min()}")
        wanted = token_dtype(int(values.max()))
        if wanted.itemsize > tokens.dtype.itemsize:
          tokens.widen(wanted)
      tokens.append(values, batch["lengths"])
      body, uid = list(batch["body"]), list(batch["uid"])
      texts.append(np.frombuffer(b"".join(body), np.uint8), _byte_lengths(body))
      title = list(batch["title"])
      titles.append(np.frombuffer(b"".join(title), np.uint8), _byte_lengths(title))
      uids.append(np.frombuffer(b"".join(uid), np.uint8), _byte_lengths(uid))
      digests.write(b"".join(hashlib.sha1(u).digest() for u in uid))
      block_ids.append(batch["block_id"])
      bar.update(len(uid))
  digests.close()
  token_lengths, text_lengths, uid_lengths = tokens.close(), texts.close(), uids.close()
  title_lengths = titles.close()
  block_ids = np.concatenate(block_ids) if block_ids else np.zeros([0], np.int64)
  if len(block_ids) != n:
    raise manifests.CorpusFormatError(f"{blocks_dir}: {len(block_ids)} blocks on disk, "
                                      f"manifest says {n}")
  order = np.argsort(block_ids, kind="stable")
  if not np.array_equal(block_ids[order], np.arange(n)):
    raise manifests.CorpusFormatError(f"{blocks_dir}: the block ids are not 0..{n - 1}, each once")
  uid_offsets = _permute(join("uids.arrival"), join("uids.bin"), np.uint8, uid_lengths, order)
  _check_uids(join("uids.bin"), uid_offsets, manifest, base, blocks_dir)
  os.remove(join("uids.bin"))
  _permute(join("digests.arrival"), join("uid_digests.bin"), np.uint8,
           np.full([n], DIGEST_BYTES, np.int64), order)
  offsets = _permute(join("tokens.arrival"), join("tokens.bin"), tokens.dtype, token_lengths,
                     order)
  offsets.tofile(join("offsets.bin"))
  _permute(join("texts.arrival"), join("texts.bin"), np.uint8, text_lengths, order).tofile(
      join("text_offsets.bin"))
  _permute(join("titles.arrival"), join("titles.bin"), np.uint8, title_lengths, order).tofile(
      join("title_offsets.bin"))
  flat = _FileArray(join("tokens.bin"), tokens.dtype)
  cls_id, sep_id = _special_ids(flat[0:int(offsets[1])], offsets[1:2], None, None)
  _first_seps(flat, offsets, sep_id).tofile(join("first_seps.bin"))
  meta = {"format": FORMAT, "key": key, "blocks_dir": _location(blocks_dir),
          "fingerprint": base["fingerprint"],
          "num_blocks": n, "num_tokens": int(offsets[-1]), "token_dtype": tokens.dtype.name,
          "num_text_bytes": int(text_lengths.sum()),
          "num_title_bytes": int(title_lengths.sum()), "cls_id": cls_id, "sep_id": sep_id,
          "manifest": base}
  with open(join(META), "w") as f:
    json.dump(meta, f, indent=2)
  logging.info("built the block store of %s: %d blocks, %d tokens (%s) in %.1f s", blocks_dir,
               n, meta["num_tokens"], meta["token_dtype"], time.time() - start)


# ---- versions: the lock, the committed rows, appending an update's rows ----

@contextlib.contextmanager
def _store_lock(root: str):
  """Holds the lock of the directory ``root`` (one builder or extender of its stores at a time;
  released when the process dies): ``corpus_updates.file_lock`` of ``root/.lock``."""
  with corpus_updates.file_lock(os.path.join(root, LOCK_NAME)):
    yield


def _read_meta(path: str, key: str) -> Optional[Dict]:
  """``meta.json`` of a complete store built for ``key``, else None."""
  try:
    with open(os.path.join(path, META)) as f:
      meta = json.load(f)
  except (OSError, ValueError):
    return None
  return meta if meta.get("format") == FORMAT and meta.get("key") == key else None


def _committed_rows(path: str, key: str) -> Optional[int]:
  meta = _read_meta(path, key)
  return None if meta is None else int(meta["num_blocks"])


def _file_sizes(meta: Dict) -> Dict[str, int]:
  """The bytes of each file that ``meta`` covers (a file may be longer: an interrupted
  append)."""
  n, dtype = int(meta["num_blocks"]), np.dtype(meta["token_dtype"])
  return dict(zip(_FILES, (int(meta["num_tokens"]) * dtype.itemsize, 8 * (n + 1),
                           DIGEST_BYTES * n, 4 * n, int(meta["num_text_bytes"]), 8 * (n + 1),
                           int(meta["num_title_bytes"]), 8 * (n + 1))))


def _check_uids(uids_path: str, uid_offsets: np.ndarray, manifest: Dict, base: Dict,
               where: str) -> None:
  """The uids of every row (one after the other in ``uids_path``) against version 0's
  fingerprint (``base``: its manifest), then those of the rows the updates appended against
  theirs (``corpus_updates.check_appended``)."""
  n0 = int(base["num_blocks"])
  if _fingerprint(uids_path, uid_offsets[:n0 + 1]) != base["fingerprint"]:
    raise manifests.CorpusFormatError(f"{where}: the blocks do not match the manifest "
                                      "fingerprint")
  corpus_updates.check_appended(manifest, _UidRows(uids_path, uid_offsets[n0:]), 1, where)


class _UidRows:
  """Uids stored one after the other in a file, by row: ``rows[a:b]`` reads rows
  ``a .. b - 1`` (a list of bytes) from the file (``offsets``: row ``i``'s bytes are
  ``offsets[i]:offsets[i + 1]``)."""

  def __init__(self, path: str, offsets: np.ndarray):
    self._data, self._offsets = _FileArray(path, np.uint8), offsets

  def __getitem__(self, rows: slice) -> List[bytes]:
    cuts = self._offsets[rows.start:rows.stop + 1]
    raw = self._data[int(cuts[0]):int(cuts[-1])].tobytes()
    cuts = cuts - cuts[0]
    return [raw[a:b] for a, b in zip(cuts[:-1], cuts[1:])]


def _append_file(path: str, size: int, data: np.ndarray) -> None:
  """Cuts ``path`` to ``size`` bytes (what the last complete append left) and appends."""
  with open(path, "r+b") as f:
    f.truncate(size)
    f.seek(size)
    f.write(np.ascontiguousarray(data).tobytes())
    f.flush()
    os.fsync(f.fileno())


def _extend(path: str, blocks_dir: str, manifest: Dict) -> bool:
  """Appends the rows the store in ``path`` lacks, those of ``manifest``'s updates, in place;
  ``meta.json`` last. Holds the store's lock (the caller's). False when the store cannot take
  them (wider token ids than it stores, or rows that start mid-update): rebuild it."""
  meta = _read_meta(path, manifest_key(manifest))
  have, want = int(meta["num_blocks"]), int(manifest["num_blocks"])
  first_version = corpus_updates.version_appending(manifest, have)
  if first_version is None:
    return False
  files = corpus_updates.update_files(blocks_dir, manifest, first_version)
  parts = [_parse(batch) for batch in tf.data.TFRecordDataset(files).batch(_BATCH)]
  parts = [{k: v.numpy() for k, v in p.items()} for p in parts]
  block_ids = np.concatenate([p["block_id"] for p in parts])
  if not np.array_equal(block_ids, np.arange(have, want)):
    raise manifests.CorpusFormatError(f"{blocks_dir}: the updates' blocks are not rows "
                                      f"{have}..{want - 1} in order")
  values = np.concatenate([p["values"] for p in parts])
  dtype = np.dtype(meta["token_dtype"])
  if values.size and (values.min() < 0 or token_dtype(int(values.max())).itemsize >
                      dtype.itemsize):
    return False
  join = lambda name: os.path.join(path, name)
  uids = [u for p in parts for u in p["uid"]]
  corpus_updates.check_appended(manifest, uids, first_version, blocks_dir)
  sizes = _file_sizes(meta)
  lengths = np.concatenate([p["lengths"] for p in parts]).astype(np.int64)
  local = _offsets(lengths)
  columns = {"tokens.bin": values.astype(dtype),
             "offsets.bin": local[1:] + int(meta["num_tokens"]),
             "uid_digests.bin": np.frombuffer(b"".join(uid_digest(u) for u in uids), np.uint8),
             "first_seps.bin": _first_seps(values, local, meta.get("sep_id"))}
  for name, field, total in (("texts", "body", "num_text_bytes"),
                             ("titles", "title", "num_title_bytes")):
    strings = [x for p in parts for x in p[field]]
    string_lengths = _byte_lengths(strings)
    columns[f"{name}.bin"] = np.frombuffer(b"".join(strings), np.uint8)
    prefix = name[:-1]  # text_offsets.bin, title_offsets.bin
    columns[f"{prefix}_offsets.bin"] = _offsets(string_lengths)[1:] + int(meta[total])
  for name in _FILES:
    _append_file(join(name), sizes[name], columns[name])
  meta = dict(meta, num_blocks=want, num_tokens=int(meta["num_tokens"]) + int(values.size),
              num_text_bytes=int(meta["num_text_bytes"]) + int(columns["texts.bin"].size),
              num_title_bytes=int(meta["num_title_bytes"]) + int(columns["titles.bin"].size))
  tmp = join(f"{META}.tmp-{os.getpid()}")
  with open(tmp, "w") as f:
    json.dump(meta, f, indent=2)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, join(META))
  logging.info("block store %s: appended rows %d..%d", path, have, want - 1)
  return True
