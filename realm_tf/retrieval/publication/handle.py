"""``IndexHandle``: the reader side of the index directory, for trainers and evaluation.

The handle follows ``index_dir/LATEST``. A background thread loads a newer index as soon as
``LATEST`` moves; the caller swaps it in between batches with ``maybe_swap()``, so a search
never sees an index change half-way and never waits for a load. Example::

    handle = IndexHandle(index_dir, expected_fingerprint=blocks_manifest["fingerprint"],
                         expected_dim=128)
    handle.wait_for_first()
    for step, batch in enumerate(batches):
      if handle.maybe_swap():
        logging.info("now using the index of step %d", handle.step)
      ids, scores = handle.search(query_embeddings, k=8)
      staleness = step - handle.step
    handle.close()

Memory: a background load puts the next index beside the current one until ``maybe_swap``
drops the old, so the peak is two searchers. Neither holds a float32 copy of the embeddings:
a ScaNN searcher holds its codes and int8 reordering rows (~176 bytes per 128-d block by
default, ``mips_index.searcher_bytes``), and the float32 ``embeddings.npy`` of each index is
only memory-mapped (``embeddings()``, and the search's exact rescoring of its 100 best int8
candidates), read through the page cache as rows are touched. The peak resident is thus
~2 x 176 B x num_blocks (~4.7 GB at REALM's 13.3M blocks) plus the page-cache rows read
(shared, evictable), where two float32 copies would be 2 x 512 B x num_blocks (13.6 GB). A
brute-force index is its embeddings: it memory-maps them too, and the page cache holds what
its scans read.
"""

import os
import threading
import time
from typing import Optional, Sequence, Tuple, Union

from absl import logging
import numpy as np

from realm_tf.retrieval import errors
from realm_tf.retrieval.index import mips_index
from realm_tf.retrieval.publication import index_io
from realm_tf.retrieval.publication import publish

# Errors that mean "this index will never fit": raised to the caller, not retried (a refused
# pickle too: its message names the file and the rebuild, where a retry would end in "no index
# appeared").
_FATAL = (errors.DimensionMismatchError, errors.FingerprintMismatchError,
          errors.UnsafeIndexError)


def block_tower_id(manifest: dict) -> Optional[str]:
  """Which block tower embedded an index's blocks: its ``block_tower`` fingerprint, else the
  embeddings file it was built from (an ORQA model's ``block_emb.npy``), else None."""
  tower = manifest.get("block_tower") or {}
  if tower.get("fingerprint"):
    return str(tower["fingerprint"])
  path = manifest.get("embeddings_file")
  return f"embeddings_file:{path}" if path else None


class TowerGuard:
  """Admits only the indexes embedded by one block tower (:func:`block_tower_id`).

  A query tower fine-tuned against the embeddings of one block tower retrieves garbage from
  another's, and nothing fails: ``realm-serve`` pins the tower its model was fine-tuned
  against (the model directory's ``block_tower.json``; for a model directory written before
  it, the tower of the index it starts with) and never swaps in an index of another
  (``realm-refresh`` over another checkpoint); ``realm-index upsert|delete`` keep their
  index's tower, a rebuild from the same checkpoint has it too. A refusal is logged once per
  publication; the caller keeps its current index.

  Args:
    tower: the right tower's :func:`block_tower_id`.
  """

  def __init__(self, tower: Optional[str]):
    self.tower = tower
    self._told = set()

  def admits(self, path: str, manifest: Optional[dict] = None) -> bool:
    """Whether the index in ``path`` (its ``manifest`` if read already) has the pinned tower;
    False too while its manifest cannot be read (retried by the caller's next look)."""
    if manifest is None:
      try:
        manifest = mips_index.read_manifest(path)
      except (errors.RetrievalError, OSError):
        return False
    found = block_tower_id(manifest)
    if found == self.tower:
      return True
    told = (path, manifest.get("publication"))
    if told not in self._told:
      self._told.add(told)
      logging.warning(
          "refusing the index %s: its blocks were embedded by block tower %s, but the served "
          "query tower was fine-tuned against block tower %s; keeping the current index (publish "
          "one built with that tower's checkpoint, or fine-tune against the new one)", path,
          found, self.tower)
    return False


class _Loaded:

  def __init__(self, path: str, index: mips_index.MipsIndex):
    self.path = path
    self.index = index
    self.manifest = index.manifest
    self.step = int(index.manifest["model_step"])
    # (publication, step, update): which publication is newer (publish.publication_key).
    self.key = publish.publication_key(path, index.manifest)


class IndexHandle:
  """Loads the index ``LATEST`` names and keeps a newer one ready to swap in.

  Args:
    index_dir: where ``realm-refresh`` or ``realm-index build`` publishes indexes.
    expected_fingerprint: the caller's corpus fingerprint, or the fingerprints of its
      versions (``BlockStore.fingerprints``: an index over an older version fits too); an
      index over another corpus is refused (``FingerprintMismatchError``).
    expected_dim: the caller's embedding width; a different index is refused.
    wait_seconds: how long ``wait_for_first`` waits for a first index.
    poll_seconds: how often ``LATEST`` is checked, in the background and while waiting.
    watch: poll for newer indexes after the first (False: a fixed, stale index).
  """

  def __init__(self, index_dir: str,
               expected_fingerprint: Union[None, str, Sequence[str]] = None,
               expected_dim: Optional[int] = None, wait_seconds: float = 600.0,
               poll_seconds: float = 10.0, watch: bool = True):
    self.index_dir = index_dir
    self.expected_fingerprint = expected_fingerprint
    self.expected_dim = expected_dim
    self.wait_seconds = float(wait_seconds)
    self.poll_seconds = float(poll_seconds)
    self.watch = watch
    self._current: Optional[_Loaded] = None
    self._pending: Optional[_Loaded] = None
    self._error: Optional[Exception] = None
    self._lock = threading.Lock()
    self._stop = threading.Event()
    self._thread: Optional[threading.Thread] = None

  # Loading ----------------------------------------------------------------------------------

  def _load(self, path: str) -> _Loaded:
    # The embeddings are memory-mapped at load (not read): the mapping stays valid if the
    # directory is pruned while this index is still in use.
    return _Loaded(path, index_io.load_index(path, expected_dim=self.expected_dim,
                                             expected_fingerprint=self.expected_fingerprint,
                                             load_embeddings=True))

  def _try_load_latest(self, newer_than: Optional[Tuple[int, int, int]]) -> Optional[_Loaded]:
    """The index ``LATEST`` names if it is newer than the publication ``newer_than``
    (``publish.publication_key``); None if none/transient."""
    path = publish.read_latest(self.index_dir)
    if path is None:
      return None
    try:
      if newer_than is not None and publish.publication_key(path) <= newer_than:
        return None
      return self._load(path)
    except _FATAL:
      raise
    except (errors.RetrievalError, OSError) as e:
      # The index was pruned or replaced between reading LATEST and loading it: retry later.
      logging.info("could not load %s yet (%s); will retry", path, e)
      return None

  def wait_for_first(self) -> "IndexHandle":
    """Blocks until an index is loaded; raises ``IndexNotReadyError`` after ``wait_seconds``."""
    if self._current is not None:
      return self
    deadline = time.time() + self.wait_seconds
    told = False
    while True:
      loaded = self._try_load_latest(None)
      if loaded is not None:
        break
      remaining = deadline - time.time()
      if remaining <= 0:
        raise errors.IndexNotReadyError(
            f"no index appeared in {self.index_dir} within {self.wait_seconds:.0f}s: start the "
            f"refresher (realm-refresh --model_dir=... --index_dir={self.index_dir} "
            f"--blocks_dir=...) or build one (realm-index build --model_dir=... "
            f"--blocks_dir=... --index_dir={self.index_dir})")
      if not told:
        logging.info("waiting up to %.0fs for an index in %s (run realm-refresh or "
                     "realm-index build)", self.wait_seconds, self.index_dir)
        told = True
      time.sleep(min(self.poll_seconds, max(remaining, 0.01)))
    self._current = loaded
    logging.info("loaded index %s (model step %d)", loaded.path, loaded.step)
    if self.watch and self._thread is None:
      self._thread = threading.Thread(target=self._watch, name="IndexHandle", daemon=True)
      self._thread.start()
    return self

  def _watch(self):
    while not self._stop.wait(self.poll_seconds):
      with self._lock:
        known = self._pending.key if self._pending is not None else self._current.key
      try:
        loaded = self._try_load_latest(known)
      except _FATAL as e:
        with self._lock:
          self._error = e
        return
      except Exception as e:  # pylint: disable=broad-except
        logging.warning("index watcher: %s", e)
        continue
      if loaded is not None:
        with self._lock:
          self._pending = loaded

  # Caller side ------------------------------------------------------------------------------

  def maybe_swap(self) -> bool:
    """Swaps in a newer index if one was loaded in the background; never blocks on a load.

    Raises the mismatch error if a newer index does not fit (dimension or corpus).
    """
    if self._current is None:
      self.wait_for_first()
    with self._lock:
      if self._error is not None:
        error, self._error = self._error, None
        raise error
      if self._pending is None:
        return False
      self._current, self._pending = self._pending, None
    logging.info("swapped in index %s (model step %d)", self._current.path, self._current.step)
    return True

  def _loaded(self) -> _Loaded:
    if self._current is None:
      self.wait_for_first()
    return self._current

  def search(self, query_embeddings: np.ndarray, k: int) -> Tuple[np.ndarray, np.ndarray]:
    """``(block_ids int64 [b, k], scores float32 [b, k])`` from the current index."""
    return self._loaded().index.search(query_embeddings, k)

  @property
  def index(self) -> mips_index.MipsIndex:
    return self._loaded().index

  def embeddings(self) -> np.ndarray:
    """The current index's block embeddings, float32 ``[num_blocks, dim]`` (row = block id).

    A read-only memory map of the index's ``embeddings.npy`` (no copy is read into memory;
    gathering rows reads just those), or the in-memory array of an index built in-process.
    """
    loaded = self._loaded()
    try:
      table = loaded.index.embeddings
    except ValueError:
      table = np.load(os.path.join(loaded.path, mips_index.EMBEDDINGS_NAME), mmap_mode="r")
    return table if table.dtype == np.float32 else np.asarray(table, np.float32)

  @property
  def step(self) -> int:
    """Model step of the current index (staleness = trainer step - this)."""
    return self._loaded().step

  @property
  def path(self) -> str:
    return self._loaded().path

  @property
  def manifest(self) -> dict:
    return dict(self._loaded().manifest)

  @property
  def query_embedder_checkpoint(self) -> Optional[str]:
    """Path of the query-tower snapshot the current index was built with (or None)."""
    loaded = self._loaded()
    rel = loaded.manifest.get("query_embedder_checkpoint")
    return None if rel is None else os.path.join(loaded.path, rel)

  def close(self) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join(timeout=max(1.0, self.poll_seconds * 2))
      self._thread = None

  def __enter__(self):
    return self

  def __exit__(self, *unused):
    self.close()
