"""What every MIPS index shares: the interface, the artifacts' names and argument checks.

An index searches ``num_blocks`` rows of dimension ``dim``; a row is a block id of the corpus.
Rows are never renumbered: an index grows by appending rows (:meth:`MipsIndex.append`) and
removes blocks by marking their rows deleted (:meth:`MipsIndex.delete`); a deleted row is never
returned again. ``search(queries, k)`` returns ``(block_ids int64 [b, k], scores float32
[b, k])`` sorted by decreasing score, ``1 <= k <= num_live``.

Saved artifacts (``MipsIndex.save``): ``embeddings.npy`` (float32 ``[num_blocks, dim]``, every
row, deleted ones included), ``deleted.npy`` (int64 rows, when any), ``sparse/`` (when the
index has a companion part over the same rows, :class:`CompanionPart`) and ``manifest.json``,
written last: the one commit point of both.

**Companion part.** ``MipsIndex.sparse`` may hold a part kept in step with the dense rows (the
BM25 part, ``realm_tf.retrieval.sparse.sparse_index``): append and delete pass it the same rows,
and ``save`` writes it under ``sparse/`` and its :meth:`CompanionPart.manifest_entry` as the
manifest's ``sparse`` entry, before the manifest. This package only knows the protocol: loading
an index directory with its part is ``realm_tf.retrieval.publication.index_io``'s.
"""

import abc
import json
import os
from typing import Any, Dict, Optional, Protocol, Sequence, Tuple

import numpy as np

from realm_tf.retrieval import errors

MANIFEST_NAME = "manifest.json"
EMBEDDINGS_NAME = "embeddings.npy"
DELETED_NAME = "deleted.npy"
SPARSE_DIR = "sparse"
FORMAT = "realm_tf.mips_index/1"
_CHECK_ROWS = 1 << 16
_COPY_ROWS = 1 << 16


def check_queries(queries, dim: int) -> np.ndarray:
  queries = np.asarray(queries, dtype=np.float32)
  if queries.ndim != 2:
    raise errors.DimensionMismatchError(
        f"queries must be a [batch, {dim}] matrix, got shape {queries.shape}")
  if queries.shape[1] != dim:
    raise errors.DimensionMismatchError(
        f"queries have dimension {queries.shape[1]} but the index has dimension {dim}")
  return np.ascontiguousarray(queries)


def check_k(k: int, n: int) -> int:
  if not 1 <= k <= n:
    raise ValueError(f"k must lie in [1, {n}] (the number of indexed blocks), got {k}")
  return int(k)


def check_embeddings(embeddings: np.ndarray) -> np.ndarray:
  embeddings = np.asarray(embeddings)
  if embeddings.ndim != 2:
    raise errors.DimensionMismatchError(
        f"embeddings must be a [num_blocks, dim] matrix, got shape {embeddings.shape}")
  if embeddings.shape[0] == 0:
    raise errors.EmptyCorpusError("cannot build an index over an empty corpus (0 blocks)")
  for start in range(0, embeddings.shape[0], _CHECK_ROWS):  # No n x dim temporary.
    if not np.isfinite(embeddings[start:start + _CHECK_ROWS]).all():
      raise errors.CorpusFormatError("embeddings contain NaN or infinite values")
  # A C-contiguous float32 array (or memory map) is passed through without a copy.
  return np.ascontiguousarray(embeddings, dtype=np.float32)


def pad(ids: np.ndarray, scores: np.ndarray, k: int):
  """``k`` columns: fewer candidates than ``k`` are padded with id -1 and score -inf."""
  if ids.shape[1] >= k:
    return ids[:, :k], scores[:, :k]
  extra = ((0, 0), (0, k - ids.shape[1]))
  return (np.pad(ids, extra, constant_values=-1),
          np.pad(scores, extra, constant_values=-np.inf))


def atomic_write_json(path: str, obj: dict) -> None:
  tmp = f"{path}.tmp-{os.getpid()}"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=2, sort_keys=True)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def save_npy(path: str, array) -> None:
  """Writes an array (or a ``RowTable``, streamed) through a temporary name: a memory map of
  the old file stays valid, and a reader never sees a partial file."""
  tmp = f"{path}.tmp-{os.getpid()}.npy"
  if isinstance(array, RowTable):
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=array.shape)
    for start in range(0, len(array), _COPY_ROWS):
      out[start:start + _COPY_ROWS] = array[start:start + _COPY_ROWS]
    out.flush()
    del out
  else:
    np.save(tmp, array)
  os.replace(tmp, path)


class RowTable:
  """Float rows ``0 .. n-1``: a ``base`` table (often a read-only memory map of a published
  index) and rows appended after it, held without copying the base.

  Indexed like the array it stands for: by a slice (step 1) or by an integer array of any
  shape (``table[ids]`` is ``ids.shape + (dim,)``).
  """

  def __init__(self, base: np.ndarray, extra: np.ndarray):
    self.base, self.extra = base, np.asarray(extra, np.float32)
    self.shape = (len(base) + len(self.extra), base.shape[1])
    self.dtype = np.dtype(np.float32)
    self.ndim = 2

  @classmethod
  def extend(cls, table, rows: np.ndarray) -> "RowTable":
    """``table`` (an array or a ``RowTable``) with ``rows`` appended."""
    if isinstance(table, RowTable):
      return cls(table.base, np.concatenate([table.extra, rows]))
    return cls(table, rows)

  def __len__(self):
    return self.shape[0]

  def __getitem__(self, item):
    n = len(self.base)
    if isinstance(item, slice):
      start, stop, step = item.indices(len(self))
      if step != 1:
        raise IndexError("a RowTable slices with step 1")
      parts = [np.asarray(self.base[start:min(stop, n)], np.float32),
               self.extra[max(start - n, 0):max(stop - n, 0)]]
      return np.concatenate(parts) if len(parts[1]) else parts[0]
    ids = np.asarray(item, np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= len(self)):
      raise IndexError(f"rows must lie in [0, {len(self)}), got [{ids.min()}, {ids.max()}]")
    out = np.empty(ids.shape + (self.shape[1],), np.float32)
    in_base = ids < n
    out[in_base] = self.base[ids[in_base]]
    out[~in_base] = self.extra[ids[~in_base] - n]
    return out


class CompanionPart(Protocol):
  """A part of an index directory over the same rows as the dense index, saved with it."""

  def add(self, rows: Sequence[int], texts: Sequence[str]) -> None:
    """Takes in the appended ``rows`` (new, in order), given their blocks' ``texts``."""

  def delete(self, rows: Sequence[int]) -> None:
    """Stops returning the live ``rows``."""

  def merged(self) -> "CompanionPart":
    """The same part compacted (its deleted rows' data dropped), for a rebuilt index."""

  def save(self, path: str) -> None:
    """Writes the part into the directory ``path`` (each file through a temporary name)."""

  def manifest_entry(self) -> Dict[str, Any]:
    """What the index's manifest records of the part (JSON-able)."""


class MipsIndex(abc.ABC):
  """Maximum inner product search over ``num_blocks`` rows of dimension ``dim``, of which the
  rows in ``deleted`` (sorted int64) are never returned."""

  index_type: str = ""

  def __init__(self, num_blocks: int, dim: int, deleted: Optional[np.ndarray] = None):
    self.num_blocks = int(num_blocks)
    self.dim = int(dim)
    self.deleted = np.unique(np.asarray([] if deleted is None else deleted, np.int64))
    self.build_seconds: Optional[float] = None
    self.manifest: Optional[dict] = None
    # A companion part over the same rows (BM25), kept in step by append and delete.
    self.sparse: Optional[CompanionPart] = None

  @property
  def num_live(self) -> int:
    """Rows that a search can return."""
    return self.num_blocks - len(self.deleted)

  @abc.abstractmethod
  def search(self, queries: np.ndarray, k: int) -> Tuple[np.ndarray, np.ndarray]:
    """Top ``k`` rows by inner product: ``(ids int64 [b, k], scores float32 [b, k])``."""

  @abc.abstractmethod
  def settings(self) -> Dict[str, Any]:
    """The settings the index was built with (JSON-able)."""

  @abc.abstractmethod
  def _save_artifacts(self, directory: str) -> None:
    """Writes everything but the manifest and ``deleted.npy`` into ``directory`` (exists)."""

  @abc.abstractmethod
  def _append(self, rows: np.ndarray, embeddings: np.ndarray) -> None:
    """Adds ``embeddings`` as the new ``rows`` (``num_blocks ..``)."""

  @abc.abstractmethod
  def _delete(self, rows: np.ndarray) -> None:
    """Stops returning the live ``rows``."""

  def append(self, embeddings: np.ndarray, texts: Optional[Sequence[str]] = None) -> np.ndarray:
    """Adds blocks as the next rows; returns their ids (``num_blocks ..`` before the call).
    ``texts``: the blocks' texts, when the index has a sparse part, which takes them in as the
    same rows."""
    embeddings = check_embeddings(embeddings)
    if embeddings.shape[1] != self.dim:
      raise errors.DimensionMismatchError(
          f"appended embeddings have dimension {embeddings.shape[1]} but the index has "
          f"dimension {self.dim}")
    if self.sparse is not None and (texts is None or len(texts) != len(embeddings)):
      raise ValueError(f"this index has a sparse part: give the {len(embeddings)} appended "
                       "blocks' texts")
    rows = np.arange(self.num_blocks, self.num_blocks + len(embeddings), dtype=np.int64)
    self._append(rows, embeddings)
    self.num_blocks += len(rows)
    if self.sparse is not None:
      self.sparse.add(rows, texts)
    return rows

  def delete(self, rows) -> None:
    """Marks live ``rows`` deleted: no search returns them again."""
    rows = np.unique(np.asarray(rows, np.int64).reshape(-1))
    if not rows.size:
      return
    if rows.min() < 0 or rows.max() >= self.num_blocks:
      raise ValueError(f"rows must lie in [0, {self.num_blocks}), got [{rows.min()}, "
                       f"{rows.max()}]")
    dead = np.intersect1d(rows, self.deleted)
    if dead.size:
      raise ValueError(f"rows {dead[:5].tolist()} are deleted already")
    if len(rows) >= self.num_live:
      raise errors.EmptyCorpusError(f"deleting {len(rows)} rows would leave no block of "
                                    f"{self.num_live} in the index")
    self._delete(rows)
    self.deleted = np.union1d(self.deleted, rows)
    if self.sparse is not None:
      self.sparse.delete(rows)

  def save(self, directory: str, metadata: Optional[Dict[str, Any]] = None) -> dict:
    """Writes the index into ``directory``; ``manifest.json`` last. Returns the manifest."""
    os.makedirs(directory, exist_ok=True)
    self._save_artifacts(directory)
    if len(self.deleted):
      save_npy(os.path.join(directory, DELETED_NAME), self.deleted)
    manifest = dict(metadata or {})
    manifest.update(format=FORMAT, index_type=self.index_type, num_blocks=self.num_blocks,
                    num_deleted=int(len(self.deleted)), dim=self.dim, settings=self.settings())
    manifest.pop("sparse", None)
    if self.sparse is not None:
      self.sparse.save(os.path.join(directory, SPARSE_DIR))
      manifest["sparse"] = self.sparse.manifest_entry()
    if self.build_seconds is not None:
      manifest.setdefault("index_build_seconds", round(self.build_seconds, 3))
    atomic_write_json(os.path.join(directory, MANIFEST_NAME), manifest)
    self.manifest = manifest
    return manifest


def read_manifest(directory: str) -> dict:
  """``manifest.json`` of an index directory, or IndexFormatError."""
  path = os.path.join(directory, MANIFEST_NAME)
  if not os.path.isdir(directory):
    raise errors.IndexFormatError(f"index directory not found: {directory}")
  if not os.path.exists(path):
    raise errors.IndexFormatError(f"{directory} holds no complete index: no {MANIFEST_NAME}")
  try:
    with open(path) as f:
      manifest = json.load(f)
  except ValueError as e:
    raise errors.IndexFormatError(f"{path} is not valid JSON: {e}") from None
  if manifest.get("format") != FORMAT:
    raise errors.IndexFormatError(f"{path}: format {manifest.get('format')!r}, expected "
                                  f"{FORMAT!r}")
  return manifest


def map_embeddings(directory: str, manifest: dict) -> np.ndarray:
  """``embeddings.npy`` of a saved index, memory-mapped, checked against its manifest."""
  path = os.path.join(directory, EMBEDDINGS_NAME)
  n, dim = int(manifest["num_blocks"]), int(manifest["dim"])
  try:
    table = np.load(path, mmap_mode="r")
  except (OSError, ValueError) as e:
    raise errors.IndexFormatError(f"cannot read {path}: {e}") from None
  if table.shape != (n, dim):
    raise errors.IndexFormatError(f"{path} has shape {table.shape}, the manifest says "
                                  f"({n}, {dim})")
  return table


def load_deleted(directory: str, manifest: dict) -> np.ndarray:
  """The deleted rows of a saved index (``deleted.npy``), checked against its manifest."""
  expected = int(manifest.get("num_deleted", 0))
  path = os.path.join(directory, DELETED_NAME)
  if not expected:
    return np.zeros([0], np.int64)
  try:
    deleted = np.load(path)
  except (OSError, ValueError) as e:
    raise errors.IndexFormatError(f"cannot read {path}: {e}") from None
  if deleted.shape != (expected,):
    raise errors.IndexFormatError(f"{path} holds {deleted.shape} rows, the manifest says "
                                  f"{expected}")
  return deleted.astype(np.int64)

