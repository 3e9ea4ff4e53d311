"""Maximum inner product search over block embeddings: ScaNN, and exact brute force.

Both implementations share the ``MipsIndex`` interface: ``search(queries, k)`` returns
``(block_ids int64 [b, k], scores float32 [b, k])`` sorted by decreasing score, where a block id
is the row of the embedding table (= ``block_id`` of the corpus). ``save(dir)`` writes the
artifacts, ``embeddings.npy`` and ``manifest.json`` (last); ``load_index(dir, expected_dim=...,
expected_fingerprint=...)`` reads them back and refuses an index that does not fit.

ScaNN defaults (``ScannSettings``), chosen by corpus size ``n``:

* ``n < 2,000``: exact scoring inside ScaNN (``score_brute_force``): nothing to gain from
  quantization, and a tree would have too few points per leaf.
* ``2,000 <= n < 250,000``: no partitioning; asymmetric hashing with one 4-bit code per
  dimension (``score_ah(1, anisotropic_quantization_threshold=0.2)``, 64 bytes per 128-d block)
  over every block, then the best 250 are rescored exactly (``reorder(250)``). Recall@10 is
  ~1.0 on 100,000 random Gaussian 128-d vectors, the hard case (a tree there loses recall that
  reordering cannot recover), and on embeddings of real blocks. ORQA's 2 dimensions per code
  is 1.4x faster but reached only 0.98 on random vectors and 0.94 on the nearly collapsed
  embeddings of an untrained tower.
* ``n >= 250,000``: additionally a k-means tree with ``round(sqrt(n))`` leaves (1,000 at 10^6,
  ~3,650 at REALM's 13.3M blocks; ORQA used 1,000), of which 10% are searched per query, with
  SOAR spilling (``soar_lambda=1.5``) to recover the neighbours that fall just across a leaf
  border. Real embeddings cluster, so a tree keeps their recall high; on random vectors
  it does not (see the benchmark in the README).

Before hashing, the mean embedding ``mu`` is subtracted from every block (``center=True``):
``q . x = q . (x - mu) + q . mu`` and the last term is the same for every block, so the ranking
is unchanged, while the quantizer no longer spends its codes on the component all blocks share
(large for LayerNorm outputs). Scores are returned with ``q . mu`` added back.

Every field can be overridden (``ScannSettings(num_leaves=..., ...)`` or the binaries' flags).
"""

import abc
import dataclasses
import json
import math
import os
import time
from typing import Any, Dict, Optional, Tuple

import numpy as np

from realm_tf.retrieval import errors

MANIFEST_NAME = "manifest.json"
EMBEDDINGS_NAME = "embeddings.npy"
SCANN_DIR = "scann"
CENTER_NAME = "scann_center.npy"
FORMAT = "realm_tf.mips_index/1"


@dataclasses.dataclass
class ScannSettings:
  """ScaNN build settings; ``None`` fields are filled in by ``resolve(n)`` (see module doc).

  Attributes:
    brute_force_below: corpora smaller than this are scored exactly.
    tree_above: corpora at least this large get a k-means tree.
    num_leaves: leaves of the tree (default ``round(sqrt(n))``).
    num_leaves_to_search: leaves searched per query (default 10% of ``num_leaves``).
    soar_lambda: SOAR spilling strength for the tree (``None`` disables spilling).
    training_sample_size: points used to train the tree and the codebooks.
    dimensions_per_block: dimensions per asymmetric-hashing code block.
    anisotropic_quantization_threshold: ScaNN's anisotropic loss threshold (``nan``: off).
    reordering_num_neighbors: candidates rescored exactly after hashing.
    use_tree: force the tree on (True) or off (False); ``None``: by size.
    center: subtract the mean embedding before hashing (ranking unchanged).
  """
  brute_force_below: int = 2_000
  tree_above: int = 250_000
  num_leaves: Optional[int] = None
  num_leaves_to_search: Optional[int] = None
  soar_lambda: Optional[float] = 1.5
  training_sample_size: int = 100_000
  dimensions_per_block: int = 1
  anisotropic_quantization_threshold: float = 0.2
  reordering_num_neighbors: int = 250
  use_tree: Optional[bool] = None
  center: bool = True

  def resolve(self, n: int) -> Dict[str, Any]:
    """The concrete settings for ``n`` blocks, as a JSON-able dict (recorded in manifests)."""
    if n < self.brute_force_below:
      return {"mode": "brute_force"}
    out: Dict[str, Any] = {
        "mode": "ah",
        "dimensions_per_block": self.dimensions_per_block,
        "anisotropic_quantization_threshold": self.anisotropic_quantization_threshold,
        "reordering_num_neighbors": self.reordering_num_neighbors,
        "training_sample_size": min(n, self.training_sample_size),
        "center": bool(self.center),
    }
    use_tree = self.use_tree if self.use_tree is not None else n >= self.tree_above
    if use_tree:
      leaves = self.num_leaves or max(2, int(round(math.sqrt(n))))
      leaves = min(leaves, max(2, n // 50))  # ScaNN wants ~50+ points per leaf.
      search = self.num_leaves_to_search or max(1, int(math.ceil(0.1 * leaves)))
      out.update(mode="tree_ah", num_leaves=leaves, num_leaves_to_search=min(search, leaves),
                 soar_lambda=self.soar_lambda)
    return out


def _check_queries(queries, dim: int) -> np.ndarray:
  queries = np.asarray(queries, dtype=np.float32)
  if queries.ndim != 2:
    raise errors.DimensionMismatchError(
        f"queries must be a [batch, {dim}] matrix, got shape {queries.shape}")
  if queries.shape[1] != dim:
    raise errors.DimensionMismatchError(
        f"queries have dimension {queries.shape[1]} but the index has dimension {dim}")
  return np.ascontiguousarray(queries)


def _check_k(k: int, n: int) -> int:
  if not 1 <= k <= n:
    raise ValueError(f"k must lie in [1, {n}] (the number of indexed blocks), got {k}")
  return int(k)


def _atomic_write_json(path: str, obj: dict) -> None:
  tmp = f"{path}.tmp-{os.getpid()}"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=2, sort_keys=True)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def _check_embeddings(embeddings: np.ndarray) -> np.ndarray:
  embeddings = np.asarray(embeddings)
  if embeddings.ndim != 2:
    raise errors.DimensionMismatchError(
        f"embeddings must be a [num_blocks, dim] matrix, got shape {embeddings.shape}")
  if embeddings.shape[0] == 0:
    raise errors.EmptyCorpusError("cannot build an index over an empty corpus (0 blocks)")
  if not np.isfinite(embeddings).all():
    raise errors.CorpusFormatError("embeddings contain NaN or infinite values")
  return np.ascontiguousarray(embeddings, dtype=np.float32)


class MipsIndex(abc.ABC):
  """Maximum inner product search over ``num_blocks`` rows of dimension ``dim``."""

  index_type: str = ""

  def __init__(self, num_blocks: int, dim: int):
    self.num_blocks = int(num_blocks)
    self.dim = int(dim)
    self.build_seconds: Optional[float] = None

  @abc.abstractmethod
  def search(self, queries: np.ndarray, k: int) -> Tuple[np.ndarray, np.ndarray]:
    """Top ``k`` rows by inner product: ``(ids int64 [b, k], scores float32 [b, k])``."""

  @abc.abstractmethod
  def settings(self) -> Dict[str, Any]:
    """The settings the index was built with (JSON-able)."""

  @abc.abstractmethod
  def _save_artifacts(self, directory: str) -> None:
    """Writes everything but the manifest into ``directory`` (which exists)."""

  def save(self, directory: str, metadata: Optional[Dict[str, Any]] = None) -> dict:
    """Writes the index into ``directory``; ``manifest.json`` last. Returns the manifest."""
    os.makedirs(directory, exist_ok=True)
    self._save_artifacts(directory)
    manifest = dict(metadata or {})
    manifest.update(format=FORMAT, index_type=self.index_type, num_blocks=self.num_blocks,
                    dim=self.dim, settings=self.settings())
    if self.build_seconds is not None:
      manifest.setdefault("index_build_seconds", round(self.build_seconds, 3))
    _atomic_write_json(os.path.join(directory, MANIFEST_NAME), manifest)
    return manifest


class BruteForceIndex(MipsIndex):
  """Exact MIPS by a blocked matrix product (ground truth, and small corpora).

  Args:
    embeddings: float32 ``[num_blocks, dim]``.
    rows_per_block: rows scored per matrix product, bounding memory at
      ``batch * rows_per_block`` floats.
  """

  index_type = "brute_force"

  def __init__(self, embeddings: np.ndarray, rows_per_block: int = 262_144):
    embeddings = _check_embeddings(embeddings)
    super().__init__(*embeddings.shape)
    self.embeddings = embeddings
    self.rows_per_block = rows_per_block
    self.build_seconds = 0.0

  def search(self, queries, k):
    queries = _check_queries(queries, self.dim)
    k = _check_k(k, self.num_blocks)
    best_ids = np.zeros([len(queries), 0], np.int64)
    best_scores = np.zeros([len(queries), 0], np.float32)
    for start in range(0, self.num_blocks, self.rows_per_block):
      scores = queries @ self.embeddings[start:start + self.rows_per_block].T
      kk = min(k, scores.shape[1])
      part = np.argpartition(-scores, kk - 1, axis=1)[:, :kk]
      best_ids = np.concatenate([best_ids, part + start], axis=1)
      best_scores = np.concatenate([best_scores, np.take_along_axis(scores, part, 1)], axis=1)
      if best_ids.shape[1] > k:
        keep = np.argpartition(-best_scores, k - 1, axis=1)[:, :k]
        best_ids = np.take_along_axis(best_ids, keep, 1)
        best_scores = np.take_along_axis(best_scores, keep, 1)
    order = np.argsort(-best_scores, axis=1, kind="stable")
    return (np.take_along_axis(best_ids, order, 1).astype(np.int64),
            np.take_along_axis(best_scores, order, 1).astype(np.float32))

  def settings(self):
    return {"mode": "exact", "rows_per_block": self.rows_per_block}

  def _save_artifacts(self, directory):
    np.save(os.path.join(directory, EMBEDDINGS_NAME), self.embeddings)


class ScannIndex(MipsIndex):
  """ScaNN over the embeddings (tree + asymmetric hashing + exact reordering by default).

  Build with ``ScannIndex.build(embeddings, ScannSettings())``; the settings actually used are in
  ``settings()``.
  """

  index_type = "scann"

  def __init__(self, searcher, num_blocks: int, dim: int, resolved: Dict[str, Any],
               embeddings: Optional[np.ndarray] = None, center: Optional[np.ndarray] = None):
    super().__init__(num_blocks, dim)
    self.searcher = searcher
    self.center = center
    self._settings = dict(resolved)
    self._embeddings = embeddings

  @classmethod
  def build(cls, embeddings: np.ndarray, settings: Optional[ScannSettings] = None,
            num_threads: int = 0) -> "ScannIndex":
    from scann.scann_ops.py import scann_ops_pybind  # pylint: disable=g-import-not-at-top
    embeddings = _check_embeddings(embeddings)
    n, dim = embeddings.shape
    resolved = (settings or ScannSettings()).resolve(n)
    start = time.time()
    center, data = None, embeddings
    if resolved.get("center"):
      center = embeddings.mean(axis=0, dtype=np.float64).astype(np.float32)
      data = embeddings - center
    # The builder's k only sets a default for search(); we always pass k explicitly.
    builder = scann_ops_pybind.builder(data, 10, "dot_product")
    if resolved["mode"] == "brute_force":
      builder = builder.score_brute_force()
    else:
      if resolved["mode"] == "tree_ah":
        builder = builder.tree(num_leaves=resolved["num_leaves"],
                               num_leaves_to_search=resolved["num_leaves_to_search"],
                               training_sample_size=resolved["training_sample_size"],
                               soar_lambda=resolved["soar_lambda"])
      builder = builder.score_ah(
          resolved["dimensions_per_block"],
          anisotropic_quantization_threshold=resolved["anisotropic_quantization_threshold"],
          training_sample_size=resolved["training_sample_size"])
      builder = builder.reorder(resolved["reordering_num_neighbors"])
    if num_threads:
      builder.set_n_training_threads(num_threads)
    index = cls(builder.build(), n, dim, resolved, embeddings, center)
    index.build_seconds = time.time() - start
    return index

  @property
  def embeddings(self) -> np.ndarray:
    if self._embeddings is None:
      raise ValueError("this ScannIndex was loaded without its embeddings")
    return self._embeddings

  def search(self, queries, k):
    queries = _check_queries(queries, self.dim)
    k = _check_k(k, self.num_blocks)
    pre = max(k, self._settings.get("reordering_num_neighbors", k))
    if len(queries) > 1:
      ids, scores = self.searcher.search_batched_parallel(
          queries, final_num_neighbors=k, pre_reorder_num_neighbors=pre)
    else:
      ids, scores = self.searcher.search_batched(
          queries, final_num_neighbors=k, pre_reorder_num_neighbors=pre)
    ids, scores = np.asarray(ids).astype(np.int64), np.asarray(scores, np.float32)
    if self.center is not None:
      scores = scores + (queries @ self.center)[:, np.newaxis]
    if ids.shape != (len(queries), k):  # Fewer candidates than k in the searched leaves.
      full_ids = np.full([len(queries), k], -1, np.int64)
      full_scores = np.full([len(queries), k], -np.inf, np.float32)
      full_ids[:, :ids.shape[1]], full_scores[:, :ids.shape[1]] = ids, scores
      ids, scores = full_ids, full_scores
    return ids, scores

  def settings(self):
    return dict(self._settings)

  def _save_artifacts(self, directory):
    if self._embeddings is not None:
      np.save(os.path.join(directory, EMBEDDINGS_NAME), self._embeddings)
    scann_dir = os.path.join(directory, SCANN_DIR)
    os.makedirs(scann_dir, exist_ok=True)
    if self.center is not None:
      np.save(os.path.join(directory, CENTER_NAME), self.center)
    # Relative paths, so the directory can be renamed into place after writing.
    self.searcher.serialize(scann_dir, relative_path=True)


def build_index(embeddings: np.ndarray, index_type: str = "scann",
                settings: Optional[ScannSettings] = None) -> MipsIndex:
  """``index_type``: ``scann`` (default settings pick exact scoring for tiny corpora) or
  ``brute_force``."""
  if index_type == "scann":
    return ScannIndex.build(embeddings, settings)
  if index_type == "brute_force":
    return BruteForceIndex(embeddings)
  raise ValueError(f"unknown index_type {index_type!r}; use 'scann' or 'brute_force'")


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


def check_manifest(manifest: dict, directory: str, expected_dim: Optional[int] = None,
                   expected_fingerprint: Optional[str] = None) -> None:
  """Refuses an index whose dimension or corpus fingerprint differs from the caller's."""
  if expected_dim is not None and int(manifest["dim"]) != int(expected_dim):
    raise errors.DimensionMismatchError(
        f"index {directory} has dimension {manifest['dim']} but the model's embeddings have "
        f"dimension {expected_dim}: rebuild the index with this model (realm-index build)")
  if expected_fingerprint is not None:
    found = manifest.get("corpus_fingerprint")
    if found != expected_fingerprint:
      raise errors.FingerprintMismatchError(
          f"index {directory} was built over corpus {found} but this run uses corpus "
          f"{expected_fingerprint}: its block ids would point at the wrong blocks; rebuild "
          "the index from this blocks directory (realm-index build / realm-refresh)")


def load_index(directory: str, expected_dim: Optional[int] = None,
               expected_fingerprint: Optional[str] = None,
               load_embeddings: bool = False) -> MipsIndex:
  """Loads an index written by ``MipsIndex.save``; checks dimension and fingerprint first.

  Args:
    directory: the index directory (e.g. ``index_dir/step-1200``).
    expected_dim: the caller's embedding width; a different index is refused.
    expected_fingerprint: the caller's corpus fingerprint; a different index is refused.
    load_embeddings: also memory-map ``embeddings.npy`` into a ``ScannIndex`` (a
      ``BruteForceIndex`` always loads it).
  """
  manifest = read_manifest(directory)
  check_manifest(manifest, directory, expected_dim, expected_fingerprint)
  n, dim = int(manifest["num_blocks"]), int(manifest["dim"])
  if manifest["index_type"] == "brute_force":
    path = os.path.join(directory, EMBEDDINGS_NAME)
    try:
      embeddings = np.load(path)
    except (OSError, ValueError) as e:
      raise errors.IndexFormatError(f"cannot read {path}: {e}") from None
    if embeddings.shape != (n, dim):
      raise errors.IndexFormatError(f"{path} has shape {embeddings.shape}, the manifest says "
                                    f"({n}, {dim})")
    index = BruteForceIndex(embeddings, manifest["settings"].get("rows_per_block", 262_144))
  elif manifest["index_type"] == "scann":
    from scann.scann_ops.py import scann_ops_pybind  # pylint: disable=g-import-not-at-top
    scann_dir = os.path.join(directory, SCANN_DIR)
    if not os.path.isdir(scann_dir):
      raise errors.IndexFormatError(f"{directory}: no {SCANN_DIR}/ artifacts")
    try:
      searcher = scann_ops_pybind.load_searcher(scann_dir)
    except Exception as e:  # pylint: disable=broad-except
      raise errors.IndexFormatError(f"cannot load the ScaNN searcher in {scann_dir}: "
                                    f"{str(e).splitlines()[0] if str(e) else e!r}") from None
    embeddings = None
    if load_embeddings:
      embeddings = np.load(os.path.join(directory, EMBEDDINGS_NAME), mmap_mode="r")
    center = None
    if manifest["settings"].get("center"):
      center = np.load(os.path.join(directory, CENTER_NAME))
      if center.shape != (dim,):
        raise errors.IndexFormatError(f"{directory}/{CENTER_NAME} has shape {center.shape}")
    index = ScannIndex(searcher, n, dim, manifest["settings"], embeddings, center)
    size = searcher.size()
    if size != n:
      raise errors.IndexFormatError(f"{scann_dir} holds {size} points, the manifest says {n}")
  else:
    raise errors.IndexFormatError(f"{directory}: unknown index_type "
                                  f"{manifest['index_type']!r}")
  index.manifest = manifest
  return index


def recall_at_k(approx_ids: np.ndarray, exact_ids: np.ndarray) -> float:
  """Mean fraction of the exact top-k ids found in the approximate top-k (ties not counted)."""
  k = exact_ids.shape[1]
  hits = [len(set(a[:k].tolist()) & set(e.tolist())) for a, e in zip(approx_ids, exact_ids)]
  return float(np.mean(hits) / k)


def measure_recall(index: MipsIndex, embeddings: np.ndarray, queries: np.ndarray,
                   k: int = 10, rtol: float = 1e-5) -> float:
  """Recall@k of ``index`` against exact search, counting ties as hits.

  An approximate neighbour counts when its true inner product is at least the exact k-th
  best score (up to ``rtol``): near-identical embeddings (an untrained tower) have many
  neighbours whose scores differ only by float rounding, and any of them is a correct answer.
  """
  queries = _check_queries(queries, index.dim)
  k = _check_k(k, index.num_blocks)
  _, exact_scores = BruteForceIndex(embeddings).search(queries, k)
  approx_ids, _ = index.search(queries, k)
  valid = approx_ids >= 0
  rows = np.asarray(embeddings)[np.where(valid, approx_ids, 0)]
  true_scores = np.einsum("bd,bkd->bk", queries, rows)
  kth = exact_scores[:, -1:]
  hits = (true_scores >= kth - rtol * np.maximum(1.0, np.abs(kth))) & valid
  return float(np.minimum(hits.sum(axis=1), k).mean() / k)
