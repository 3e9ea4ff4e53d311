"""Maximum inner product search over block embeddings: ScaNN, and exact brute force.

Both implementations share the ``MipsIndex`` interface: ``search(queries, k)`` returns
``(block_ids int64 [b, k], scores float32 [b, k])`` sorted by decreasing score, where a block id
is the row of the embedding table (= ``block_id`` of the corpus). ``save(dir)`` writes the
artifacts, ``embeddings.npy`` and ``manifest.json`` (last); ``load_index(dir, expected_dim=...,
expected_fingerprint=...)`` reads them back and refuses an index that does not fit.

ScaNN defaults (``ScannSettings``), chosen by corpus size ``n``:

* ``n < 2,000``: exact scoring inside ScaNN (``score_brute_force``, float32: at most 1 MB):
  nothing to gain from quantization, and a tree would have too few points per leaf.
* ``2,000 <= n < 20,000``: no partitioning; asymmetric hashing (4-bit codes of 3 dimensions:
  43 codes per 128-d block) over every block, then the best ``R`` candidates are rescored
  with int8-quantized embeddings (``reorder(R, quantize=INT8)``) and the best 100 of those
  exactly (below).
* ``n >= 20,000``: additionally a k-means tree with ``round(sqrt(n))`` leaves (1,000 at 10^6,
  ~3,650 at REALM's 13.3M blocks; ORQA used 1,000). No SOAR spilling by default: it would
  store a second set of codes per block, over the memory budget below (``soar_lambda`` turns
  it on).

**Build-time recall target.** How many leaves to search and how many candidates to rescore
(``R``) are not fixed fractions: after building, the index measures its recall@10 against
exact search on a sample of queries (``target_recall``, default 0.95, required of the
sample's mean less two standard errors, plus a ``tuning_margin`` of 0.005; ties count as
hits, as in ``measure_recall``). For
each depth ``R`` in (100, 300, 1000) it finds the fewest leaves reaching that (galloping, then
bisection), times those pairs on the sample at batch 128 and keeps the fastest; then the
smallest ``R`` on a finer ladder that still reaches it at those leaves. The sample is the
caller's queries (the refresher passes query-tower embeddings of sample blocks) or, by
default, ``tuning_queries`` rows of the embeddings, each leaving its own row out of its
neighbours. The chosen values and the recall they measured go into ``settings()`` and so into
the manifest (``settings.num_leaves_to_search``, ``settings.reordering_num_neighbors``,
``settings.tuning``); a loaded index searches with them. A value given explicitly
(``num_leaves_to_search=...``, ``reordering_num_neighbors=...``) is used as given. Where even
every leaf and ``R = 1000`` miss the target, the tuning tells why (``candidate_recall``: the
recall if those candidates were rescored exactly) and the build is redone once: with finer
codes (2 dimensions each) if the neighbours are not among the candidates (near-random
embeddings), with float32 reordering if they are but int8 misranks them (nearly collapsed
embeddings of an untrained tower); ``settings.tuning.fallback_from`` records the first try.

**Memory.** The searcher keeps no float32 copy of the embeddings: per 128-d block it holds the
int8 reordering row (128 bytes), 43 hash codes (43 bytes on disk, packed two per byte in
memory) and an int32 leaf id: ~176 bytes on disk at 10^6 blocks (~182 at 30,000, where the
tree's centres weigh more), against 512 for a float32 row (``searcher_bytes`` measures it; the
benchmark ``experiments/benchmarks/bench_index_scale.py`` prints it). The float32 embeddings
are saved beside it (``embeddings.npy``) for callers that need them (Open-QA gathers the rows
of its beam): a loaded index memory-maps that file (``ScannIndex.embeddings``), so only the
rows read are paged in, from the page cache, and nothing float is resident per index.
``reordering_dtype="float32"`` restores exact float reordering (512 more bytes per block).

**Exact final rescoring.** int8 rescoring misranks near-ties, and at millions of blocks the
neighbours are dense enough that this alone caps recall@10 below 0.95 however many leaves are
searched (0.944 at 4x10^6 clustered vectors with every leaf). So the best ``exact_rescoring``
(100) of the int8 order are scored once more exactly, from those float32 rows: 100 rows
(51 KB) read per query from the memory map, hot rows from the page cache, the searcher itself
unchanged. A ``k`` above ``exact_rescoring`` gets the int8 order; an index loaded without its
``embeddings.npy`` too. Scores are then exact inner products.

Before hashing, the mean embedding ``mu`` is subtracted from every block (``center=True``):
``q . x = q . (x - mu) + q . mu`` and the last term is the same for every block, so the ranking
is unchanged, while the quantizers no longer spend their codes and int8 range on the component
all blocks share (large for LayerNorm outputs). Scores are returned with ``q . mu`` added back.

Every field can be overridden (``ScannSettings(num_leaves=..., ...)`` or the binaries' flags).
"""

import abc
import copy
import dataclasses
import json
import math
import os
import time
from typing import Any, Dict, Optional, Tuple

from absl import logging
import numpy as np

from realm_tf.retrieval import errors

MANIFEST_NAME = "manifest.json"
EMBEDDINGS_NAME = "embeddings.npy"
SCANN_DIR = "scann"
CENTER_NAME = "scann_center.npy"
FORMAT = "realm_tf.mips_index/1"
_CHECK_ROWS = 1 << 16
REORDERING_DTYPES = ("int8", "float32")
# Candidate reordering depths the tuning tries (those within [k, max]; the max always).
_DEPTH_CANDIDATES = (100, 300, 1000)  # Depths whose fewest leaves are timed against each other.
_REORDER_LADDER = (10, 15, 20, 30, 40, 50, 75, 100, 150, 200, 300, 400, 600, 800, 1000)


@dataclasses.dataclass
class ScannSettings:
  """ScaNN build settings; ``None`` fields are filled in by ``resolve(n)`` or by tuning.

  Attributes:
    brute_force_below: corpora smaller than this are scored exactly.
    tree_above: corpora at least this large get a k-means tree.
    num_leaves: leaves of the tree (default ``round(sqrt(n))``).
    num_leaves_to_search: leaves searched per query (default: the smallest reaching
      ``target_recall``; 10% of ``num_leaves`` without a target).
    soar_lambda: SOAR spilling strength for the tree (``None`` disables spilling).
    training_sample_size: points used to train the tree and the codebooks.
    dimensions_per_block: dimensions per asymmetric-hashing code (4 bits each).
    anisotropic_quantization_threshold: ScaNN's anisotropic loss threshold (``nan``: off).
    reordering_num_neighbors: candidates rescored after hashing (default: the smallest on a
      ladder reaching ``target_recall``; ``max_reordering_num_neighbors`` without a target).
    max_reordering_num_neighbors: the most candidates the tuning may rescore.
    exact_rescoring: with int8 reordering, the best this many of its candidates are scored
      again exactly, in float32, from the embeddings (memory-mapped ``embeddings.npy`` of a
      loaded index: ``exact_rescoring`` rows read per query, through the page cache; nothing
      float in the searcher). int8 misranks near-ties, which at millions of blocks caps the
      recall below 0.95 however many leaves are searched. Applies to ``k <= exact_rescoring``
      (larger ``k``: int8 order); 0: off.
    reordering_dtype: ``int8`` (quantized rows, 1 byte per dimension) or ``float32`` (exact
      rescoring, a float copy of the embeddings inside the searcher).
    target_recall: recall@``tuning_k`` the tuning aims for (``None``: no tuning).
    tuning_margin: the tuning requires ``target_recall + tuning_margin`` of its sample's
      lower bound (below): rows of the corpus are slightly easier queries than fresh ones
      near them (0.004 on the benchmark's clustered data).
    tuning_confidence: that lower bound is the sample's mean recall less this many standard
      errors over its queries, so that fresh queries reach the target too: the fewest leaves
      reaching a bare mean overfit the sample (on the tests' clustered vectors, 500 queries: fresh
      recall 0.942-0.961 over seven builds where the sample gave 0.96; with two standard
      errors and 2,000 queries: 0.959-0.963, five builds).
    tuning_queries: sample rows of the embeddings used as tuning queries when the caller
      gives none (the refresher embeds this many sample blocks with the query tower).
    tuning_k: the k of the tuned recall@k.
    fallback_dimensions_per_block: where the target is out of reach with every leaf because
      the true neighbours are not among the candidates (near-random embeddings: too coarse
      codes), the build is redone with this many dimensions per code and no SOAR spilling
      (~196 instead of ~176 bytes per 128-d block); ``None``: no such second build.
    fallback_float32_reordering: where the candidates do hold the neighbours but int8
      rescoring misranks them (nearly collapsed embeddings, e.g. of an untrained tower), the
      build is redone with float32 reordering (+512 bytes per block: recall first).
    use_tree: force the tree on (True) or off (False); ``None``: by size.
    center: subtract the mean embedding before hashing (ranking unchanged).
  """
  brute_force_below: int = 2_000
  tree_above: int = 20_000
  num_leaves: Optional[int] = None
  num_leaves_to_search: Optional[int] = None
  soar_lambda: Optional[float] = None
  training_sample_size: int = 100_000
  dimensions_per_block: int = 3
  anisotropic_quantization_threshold: float = 0.2
  reordering_num_neighbors: Optional[int] = None
  max_reordering_num_neighbors: int = 1000
  exact_rescoring: int = 100
  reordering_dtype: str = "int8"
  target_recall: Optional[float] = 0.95
  tuning_margin: float = 0.005
  tuning_confidence: float = 2.0
  tuning_queries: int = 2000
  tuning_k: int = 10
  fallback_dimensions_per_block: Optional[int] = 2
  fallback_float32_reordering: bool = True
  use_tree: Optional[bool] = None
  center: bool = True

  def resolve(self, n: int) -> Dict[str, Any]:
    """The concrete settings for ``n`` blocks before tuning, as a JSON-able dict."""
    if n < self.brute_force_below:
      return {"mode": "brute_force"}
    if self.reordering_dtype not in REORDERING_DTYPES:
      raise ValueError(f"reordering_dtype must be one of {sorted(REORDERING_DTYPES)}, got "
                       f"{self.reordering_dtype!r}")
    if self.target_recall is not None and not 0.0 < self.target_recall <= 1.0:
      raise ValueError(f"target_recall must lie in (0, 1], got {self.target_recall}")
    tune = self.target_recall is not None
    out: Dict[str, Any] = {
        "mode": "ah",
        "dimensions_per_block": self.dimensions_per_block,
        "anisotropic_quantization_threshold": self.anisotropic_quantization_threshold,
        "reordering_num_neighbors": (self.reordering_num_neighbors or
                                     self.max_reordering_num_neighbors),
        "reordering_dtype": self.reordering_dtype,
        "exact_rescoring": int(self.exact_rescoring) if self.reordering_dtype == "int8" else 0,
        "training_sample_size": min(n, self.training_sample_size),
        "center": bool(self.center),
        "tune_reordering": tune and self.reordering_num_neighbors is None,
    }
    use_tree = self.use_tree if self.use_tree is not None else n >= self.tree_above
    if use_tree:
      leaves = self.num_leaves or max(2, int(round(math.sqrt(n))))
      leaves = min(leaves, max(2, n // 50))  # ScaNN wants ~50+ points per leaf.
      search = self.num_leaves_to_search or max(1, int(math.ceil(0.1 * leaves)))
      out.update(mode="tree_ah", num_leaves=leaves, num_leaves_to_search=min(search, leaves),
                 soar_lambda=self.soar_lambda,
                 tune_leaves=tune and self.num_leaves_to_search is None)
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
  for start in range(0, embeddings.shape[0], _CHECK_ROWS):  # No n x dim temporary.
    if not np.isfinite(embeddings[start:start + _CHECK_ROWS]).all():
      raise errors.CorpusFormatError("embeddings contain NaN or infinite values")
  # A C-contiguous float32 array (or memory map) is passed through without a copy.
  return np.ascontiguousarray(embeddings, dtype=np.float32)


def _save_npy(path: str, array: np.ndarray) -> None:
  """``np.save`` through a temporary name: a memory map of the old file stays valid."""
  tmp = f"{path}.tmp-{os.getpid()}.npy"
  np.save(tmp, array)
  os.replace(tmp, path)


def _tie_recalls(embeddings: np.ndarray, queries: np.ndarray, approx_ids: np.ndarray,
                 kth_scores: np.ndarray, k: int, rtol: float = 1e-5) -> np.ndarray:
  """Each query's recall@k, an approximate id counting when its true score reaches the
  exact k-th."""
  valid = approx_ids[:, :k] >= 0
  rows = np.asarray(embeddings)[np.where(valid, approx_ids[:, :k], 0)]
  true_scores = np.einsum("bd,bkd->bk", queries, rows)
  kth = np.asarray(kth_scores, np.float32).reshape(-1, 1)
  hits = (true_scores >= kth - rtol * np.maximum(1.0, np.abs(kth))) & valid
  return np.minimum(hits.sum(axis=1), k) / k


def _tie_recall(embeddings: np.ndarray, queries: np.ndarray, approx_ids: np.ndarray,
                kth_scores: np.ndarray, k: int, rtol: float = 1e-5) -> float:
  """Mean recall@k over the queries (``_tie_recalls``)."""
  return float(_tie_recalls(embeddings, queries, approx_ids, kth_scores, k, rtol).mean())


def recall_lower_bound(per_query: np.ndarray, z: float) -> float:
  """The mean of per-query recalls less ``z`` standard errors (0 queries or 1: the mean)."""
  per_query = np.asarray(per_query, np.float64)
  if len(per_query) < 2:
    return float(per_query.mean())
  return float(per_query.mean() - z * per_query.std(ddof=1) / math.sqrt(len(per_query)))


def _exact_kth_scores(embeddings: np.ndarray, queries: np.ndarray, k: int,
                      exclude: Optional[np.ndarray] = None, batch: int = 128) -> np.ndarray:
  """The exact k-th best inner product of each query (blocked; queries in batches).

  ``exclude``: one row id per query that does not count (a query that is that row).
  """
  exact = BruteForceIndex(np.asarray(embeddings, np.float32), check=False)
  kk = k if exclude is None else k + 1
  ids, scores = zip(*[exact.search(queries[i:i + batch], kk)
                      for i in range(0, len(queries), batch)])
  ids, scores = np.concatenate(ids), np.concatenate(scores)
  if exclude is None:
    return scores[:, -1]
  return _drop_excluded(ids, scores, exclude)[1][:, -1]


def _drop_excluded(ids: np.ndarray, scores: np.ndarray,
                   exclude: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
  """Of ``k + 1`` results per row, the ``k`` left after removing the excluded id (else the
  last)."""
  hit = ids == np.asarray(exclude).reshape(-1, 1)
  drop = np.where(hit.any(axis=1), hit.argmax(axis=1), ids.shape[1] - 1)
  keep = np.ones(ids.shape, bool)
  keep[np.arange(len(ids)), drop] = False
  shape = (ids.shape[0], ids.shape[1] - 1)
  return ids[keep].reshape(shape), scores[keep].reshape(shape)


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
    embeddings: float32 ``[num_blocks, dim]`` (a memory map is read in place; a loaded
      index memory-maps its ``embeddings.npy``).
    rows_per_block: rows scored per matrix product, bounding memory at
      ``batch * rows_per_block`` floats.
    check: check shape and finiteness (off for trusted, already checked embeddings).
  """

  index_type = "brute_force"

  def __init__(self, embeddings: np.ndarray, rows_per_block: int = 262_144, check: bool = True):
    embeddings = _check_embeddings(embeddings) if check else embeddings
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
    _save_npy(os.path.join(directory, EMBEDDINGS_NAME), self.embeddings)


class ScannIndex(MipsIndex):
  """ScaNN over the embeddings (tree + asymmetric hashing + int8 reordering by default).

  Build with ``ScannIndex.build(embeddings, ScannSettings())``; the settings actually used,
  including the tuned leaves and reordering depth, are in ``settings()``.
  """

  index_type = "scann"

  def __init__(self, searcher, num_blocks: int, dim: int, resolved: Dict[str, Any],
               embeddings: Optional[np.ndarray] = None, center: Optional[np.ndarray] = None,
               embeddings_path: Optional[str] = None):
    super().__init__(num_blocks, dim)
    self.searcher = searcher
    self.center = center
    self._settings = dict(resolved)
    self._embeddings = embeddings
    self._embeddings_path = embeddings_path

  @classmethod
  def build(cls, embeddings: np.ndarray, settings: Optional[ScannSettings] = None,
            num_threads: int = 0, tuning_queries: Optional[np.ndarray] = None) -> "ScannIndex":
    """Builds the searcher, then tunes it to ``settings.target_recall`` (see module doc).

    Where the target is out of reach even with every leaf and the deepest reordering, the
    build is redone with finer codes or float32 reordering, as the tuning's diagnosis says
    (``fallback_dimensions_per_block``, ``fallback_float32_reordering``); the settings tried
    first are in ``settings()["tuning"]["fallback_from"]``.

    Args:
      embeddings: float32 ``[num_blocks, dim]``; kept by reference (for ``save``), not copied
        into the searcher.
      settings: ``ScannSettings`` (defaults if None).
      num_threads: ScaNN training threads (0: all).
      tuning_queries: ``[m, dim]`` queries to tune on (default: ``settings.tuning_queries``
        sample rows of ``embeddings``).
    """
    settings = settings or ScannSettings()
    start = time.time()
    index = cls._build_once(embeddings, settings, num_threads, tuning_queries)
    tried = []
    while True:
      tuning = index._settings.get("tuning")
      if tuning is None or tuning["target_reached"]:
        break
      current = index._settings
      if (tuning.get("candidate_recall", 0.0) >= tuning["target_recall"] + tuning["margin"]
          and current["reordering_dtype"] == "int8" and settings.fallback_float32_reordering):
        # The candidates hold the neighbours; int8 rescoring misranks them (near-collapsed
        # embeddings): rescore in float32, the same codes.
        change = dict(reordering_dtype="float32")
      elif (settings.fallback_dimensions_per_block and
            (settings.fallback_dimensions_per_block < current["dimensions_per_block"] or
             current.get("soar_lambda") is not None)):
        change = dict(dimensions_per_block=settings.fallback_dimensions_per_block,
                      soar_lambda=None)  # Finer codes: more of the neighbours in the candidates.
      else:
        break
      logging.info("ScaNN: recall@%d %.4f < %.3f; rebuilding with %s", tuning["k"],
                   tuning["recall"], tuning["target_recall"], change)
      tried.append({key: current.get(key) for key in (
          "dimensions_per_block", "soar_lambda", "reordering_dtype", "num_leaves_to_search",
          "reordering_num_neighbors")})
      tried[-1].update(recall=tuning["recall"],
                       candidate_recall=tuning.get("candidate_recall"))
      settings = dataclasses.replace(settings, **change)
      if "dimensions_per_block" in change:
        settings = dataclasses.replace(settings, fallback_dimensions_per_block=None)
      retry = cls._build_once(embeddings, settings, num_threads, tuning_queries)
      if retry._settings["tuning"]["recall"] < tuning["recall"]:
        break  # Keep the better one.
      index = retry
    if tried:
      index._settings["tuning"]["fallback_from"] = tried
    index.build_seconds = time.time() - start
    return index

  @classmethod
  def _build_once(cls, embeddings: np.ndarray, settings: ScannSettings, num_threads: int,
                  tuning_queries: Optional[np.ndarray]) -> "ScannIndex":
    """One build and tuning with exactly ``settings``."""
    from scann.scann_ops.py import scann_builder  # pylint: disable=g-import-not-at-top
    from scann.scann_ops.py import scann_ops_pybind  # pylint: disable=g-import-not-at-top
    embeddings = _check_embeddings(embeddings)
    n, dim = embeddings.shape
    resolved = settings.resolve(n)
    tune_leaves = resolved.pop("tune_leaves", False)
    tune_reordering = resolved.pop("tune_reordering", False)
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
      quantize = (scann_builder.ReorderType.INT8 if resolved["reordering_dtype"] == "int8"
                  else scann_builder.ReorderType.FLOAT32)
      builder = builder.reorder(resolved["reordering_num_neighbors"], quantize=quantize)
    if num_threads:
      builder.set_n_training_threads(num_threads)
    searcher = builder.build()
    del builder, data  # The centred copy; ScaNN keeps only its codes and int8 rows.
    index = cls(searcher, n, dim, resolved, embeddings, center)
    if resolved["mode"] != "brute_force" and (tune_leaves or tune_reordering):
      if tuning_queries is None:
        rng = np.random.default_rng(0)
        rows = np.sort(rng.choice(n, min(n, settings.tuning_queries), replace=False))
        tuning_queries, source, exclude = embeddings[rows], "embeddings", rows
      else:
        source, exclude = "given", None
      index.tune(embeddings, tuning_queries, settings.target_recall, k=settings.tuning_k,
                 margin=settings.tuning_margin, confidence=settings.tuning_confidence,
                 tune_leaves=tune_leaves, tune_reordering=tune_reordering,
                 max_reordering_num_neighbors=resolved["reordering_num_neighbors"],
                 source=source, exclude=exclude)
    index.build_seconds = time.time() - start
    return index

  def tune(self, embeddings: np.ndarray, queries: np.ndarray, target_recall: float,
           k: int = 10, tune_leaves: bool = True, tune_reordering: bool = True,
           max_reordering_num_neighbors: Optional[int] = None,
           source: str = "given", exclude: Optional[np.ndarray] = None,
           margin: float = 0.0, confidence: float = 0.0) -> Dict[str, Any]:
    """Sets the fewest leaves, then the fewest reordered candidates, reaching the target.

    Recall@k is measured against exact search over ``embeddings`` (the float32 rows this
    index was built over) on ``queries``, ties counting as hits; a setting reaches the target
    when the sample's mean recall less ``confidence`` standard errors (over queries) is at
    least ``target_recall + margin``. ``exclude``: for queries that
    are rows of ``embeddings``, their row ids; each query's own row is then left out of both
    the exact and the approximate top k (finding a row from itself is too easy a test).
    Returns the ``tuning`` record (also stored in ``settings()``).
    """
    queries = _check_queries(queries, self.dim)
    if len(queries) == 0:
      raise ValueError("tuning needs at least one query")
    if exclude is not None and self.num_blocks < 2:
      exclude = None
    k = _check_k(min(k, self.num_blocks - (exclude is not None)), self.num_blocks)
    start = time.time()
    kth = _exact_kth_scores(embeddings, queries, k, exclude)
    tree = self._settings["mode"] == "tree_ah"
    # The exact rescoring reads its candidates from the int8 reordering: never fewer.
    floor = max(k, int(self._settings.get("exact_rescoring") or 0))
    max_reorder = max(floor, int(max_reordering_num_neighbors or
                                 self._settings["reordering_num_neighbors"]))
    measured: Dict[Tuple[Optional[int], int], np.ndarray] = {}

    def recalls(leaves, reorder):
      key = (leaves, reorder)
      if key not in measured:
        ids, scores = self.search(queries, k + (exclude is not None),
                                  leaves_to_search=leaves, reordering_num_neighbors=reorder)
        if exclude is not None:
          ids, _ = _drop_excluded(ids, scores, exclude)
        measured[key] = _tie_recalls(embeddings, queries, ids, kth, k)
      return measured[key]

    def recall(leaves, reorder):
      """The sample's recall less ``confidence`` standard errors: what fresh queries get."""
      return recall_lower_bound(recalls(leaves, reorder), confidence)

    aim = min(1.0, target_recall + margin)

    def smallest(values, fn):
      """Smallest value with fn(value) >= aim; galloping, then bisection (fn ~monotone)."""
      if fn(values[-1]) < aim:
        return values[-1], False
      lo, hi, step = -1, 0, 1  # fn(values[lo]) < aim (lo -1: none tried); values[hi]: next.
      while hi < len(values) - 1 and fn(values[hi]) < aim:
        lo, hi, step = hi, min(len(values) - 1, hi + step), step * 2
      while hi - lo > 1:
        mid = (lo + hi) // 2
        if fn(values[mid]) >= aim:
          hi = mid
        else:
          lo = mid
      return values[hi], True

    def qps(leaves, reorder):
      timed_queries = queries[:512]
      self.search(queries[:128], k, leaves_to_search=leaves, reordering_num_neighbors=reorder)
      best = float("inf")
      for _ in range(3):
        begin = time.perf_counter()
        for i in range(0, len(timed_queries), 128):
          self.search(timed_queries[i:i + 128], k, leaves_to_search=leaves,
                      reordering_num_neighbors=reorder)
        best = min(best, time.perf_counter() - begin)
      return len(timed_queries) / max(best, 1e-9)

    leaves = self._settings.get("num_leaves_to_search") if tree else None
    fixed_reorder = max(floor, int(self._settings["reordering_num_neighbors"]))
    reorder = max_reorder if tune_reordering else fixed_reorder
    reached = True
    timed = []
    if tree and tune_leaves:
      # For each candidate depth (ascending), the fewest leaves reaching the aim; a deeper
      # reordering never needs more leaves. Then the fastest of those pairs, timed on the
      # tuning queries at batch 128.
      num_leaves = int(self._settings["num_leaves"])
      first = max(1, int(math.ceil(0.01 * num_leaves)))
      depths = ([reorder] if not tune_reordering else
                sorted({r for r in _DEPTH_CANDIDATES if floor <= r < max_reorder} |
                       {max_reorder}))
      top = num_leaves
      for depth in depths:
        found, ok = smallest(list(range(first, top + 1)), lambda v, d=depth: recall(v, d))
        if ok:
          timed.append((found, depth, qps(found, depth)))
          top = found
      if timed:
        leaves, reorder, _ = max(timed, key=lambda t: t[2])
      else:
        leaves, reached = num_leaves, False
    if tune_reordering and reached:
      # The fewest candidates on a finer ladder that keep the aim at those leaves.
      ladder = sorted({r for r in _REORDER_LADDER if floor <= r < reorder} | {reorder})
      reorder, _ = smallest(ladder, lambda v: recall(leaves, v))
    final = float(recalls(leaves, reorder).mean())
    record = {
        "target_recall": float(target_recall),
        "margin": float(margin),
        "confidence": float(confidence),
        "k": int(k),
        "recall": round(final, 4),
        "recall_lower_bound": round(recall(leaves, reorder), 4),
        "target_reached": bool(final >= target_recall),
        "queries": int(len(queries)),
        "query_source": source,
        "evaluations": len(measured),
        "timed": [[int(a), int(b), round(c)] for a, b, c in timed],
        "seconds": round(time.time() - start, 3),
    }
    if not record["target_reached"]:
      # Which stage loses the recall: rescoring the same candidates exactly tells.
      record["candidate_recall"] = round(self._candidate_recall(
          embeddings, queries, kth, k, leaves, max_reorder, exclude), 4)
      logging.warning("ScaNN tuning: recall@%d %.4f < target %.3f even with %s leaves and %d "
                      "candidates (%.4f if those were rescored exactly)", k, final,
                      target_recall, leaves, reorder, record["candidate_recall"])
    if tree:
      self._settings["num_leaves_to_search"] = int(leaves)
    self._settings["reordering_num_neighbors"] = int(reorder)
    self._settings["max_reordering_num_neighbors"] = int(max_reorder)
    self._settings["tuning"] = record
    return record

  def _candidate_recall(self, embeddings, queries, kth, k, leaves, depth, exclude) -> float:
    """Recall@k if the ``depth`` candidates of the hashing were rescored in float32."""
    depth = min(depth, self.num_blocks)
    best = []
    for i in range(0, len(queries), 32):
      q = queries[i:i + 32]
      cand, _ = self.search(q, depth, leaves_to_search=leaves, reordering_num_neighbors=depth)
      valid = cand >= 0
      scores = np.einsum("bd,bkd->bk", q, np.asarray(embeddings)[np.where(valid, cand, 0)])
      scores[~valid] = -np.inf
      if exclude is not None:
        scores[cand == np.asarray(exclude[i:i + 32]).reshape(-1, 1)] = -np.inf
      top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
      best.append(np.where(np.take_along_axis(valid, top, 1),
                           np.take_along_axis(cand, top, 1), -1))
    return _tie_recall(embeddings, queries, np.concatenate(best), kth, k)

  @property
  def embeddings(self) -> np.ndarray:
    """The float32 embeddings: the build's array, or ``embeddings.npy`` memory-mapped."""
    if self._embeddings is None and self._embeddings_path is not None:
      if os.path.exists(self._embeddings_path):
        self._embeddings = np.load(self._embeddings_path, mmap_mode="r")
    if self._embeddings is None:
      raise ValueError("this ScannIndex was loaded without its embeddings")
    return self._embeddings

  def search(self, queries, k, leaves_to_search: Optional[int] = None,
             reordering_num_neighbors: Optional[int] = None):
    """Top ``k``; ``leaves_to_search`` / ``reordering_num_neighbors`` override the settings."""
    queries = _check_queries(queries, self.dim)
    k = _check_k(k, self.num_blocks)
    pre = max(k, reordering_num_neighbors or self._settings.get("reordering_num_neighbors", k))
    leaves = None
    if self._settings.get("mode") == "tree_ah":
      leaves = int(leaves_to_search or self._settings["num_leaves_to_search"])
    rescore = int(self._settings.get("exact_rescoring") or 0)
    if k <= rescore and self._settings.get("mode") != "brute_force":
      table = self._rescoring_table()
      if table is not None:
        return self._search_rescored(queries, k, min(rescore, self.num_blocks), leaves,
                                     max(pre, rescore), table)
    if len(queries) > 1:
      ids, scores = self.searcher.search_batched_parallel(
          queries, final_num_neighbors=k, pre_reorder_num_neighbors=pre,
          leaves_to_search=leaves)
    else:
      ids, scores = self.searcher.search_batched(
          queries, final_num_neighbors=k, pre_reorder_num_neighbors=pre,
          leaves_to_search=leaves)
    ids, scores = np.asarray(ids).astype(np.int64), np.asarray(scores, np.float32)
    if self.center is not None:
      scores = scores + (queries @ self.center)[:, np.newaxis]
    if ids.shape != (len(queries), k):  # Fewer candidates than k in the searched leaves.
      full_ids = np.full([len(queries), k], -1, np.int64)
      full_scores = np.full([len(queries), k], -np.inf, np.float32)
      full_ids[:, :ids.shape[1]], full_scores[:, :ids.shape[1]] = ids, scores
      ids, scores = full_ids, full_scores
    return ids, scores

  def _rescoring_table(self) -> Optional[np.ndarray]:
    try:
      return self.embeddings
    except ValueError:
      return None  # Loaded without its embeddings file: int8 order only.

  def _search_rescored(self, queries, k, depth, leaves, pre, table):
    """The best ``depth`` by int8 reordering, scored exactly from ``table``; the top ``k``."""
    search = (self.searcher.search_batched_parallel if len(queries) > 1
              else self.searcher.search_batched)
    ids, _ = search(queries, final_num_neighbors=depth, pre_reorder_num_neighbors=pre,
                    leaves_to_search=leaves)
    ids = np.asarray(ids).astype(np.int64).reshape(len(queries), -1)
    valid = ids >= 0
    scores = np.einsum("bd,bkd->bk", queries, np.asarray(table[np.where(valid, ids, 0)]),
                       dtype=np.float32)
    scores[~valid] = -np.inf
    top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    ids, scores = np.take_along_axis(ids, top, 1), np.take_along_axis(scores, top, 1)
    ids[~np.isfinite(scores)] = -1
    if ids.shape[1] < k:  # Fewer candidates than k in the searched leaves.
      pad = k - ids.shape[1]
      ids = np.pad(ids, ((0, 0), (0, pad)), constant_values=-1)
      scores = np.pad(scores, ((0, 0), (0, pad)), constant_values=-np.inf)
    return ids, scores.astype(np.float32)

  def settings(self):
    return copy.deepcopy(self._settings)

  def _save_artifacts(self, directory):
    if self._embeddings is not None or self._embeddings_path is not None:
      path = os.path.join(directory, EMBEDDINGS_NAME)
      _save_npy(path, self.embeddings)
      # From now on the saved file serves ``embeddings`` (memory-mapped, not resident), so
      # the index no longer pins the caller's array.
      self._embeddings = np.load(path, mmap_mode="r")
    scann_dir = os.path.join(directory, SCANN_DIR)
    os.makedirs(scann_dir, exist_ok=True)
    if self.center is not None:
      np.save(os.path.join(directory, CENTER_NAME), self.center)
    # Relative paths, so the directory can be renamed into place after writing.
    self.searcher.serialize(scann_dir, relative_path=True)


def searcher_bytes(directory: str) -> int:
  """Bytes of a saved ScaNN searcher: its ``scann/`` assets and the centre, not embeddings.

  This is what ``load_index`` reads into memory (the asymmetric-hashing codes are packed
  two per byte once loaded, so the resident size is a little smaller).
  """
  total = 0
  for root, _, files in os.walk(os.path.join(directory, SCANN_DIR)):
    total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
  center = os.path.join(directory, CENTER_NAME)
  return total + (os.path.getsize(center) if os.path.exists(center) else 0)


def build_index(embeddings: np.ndarray, index_type: str = "scann",
                settings: Optional[ScannSettings] = None,
                tuning_queries: Optional[np.ndarray] = None) -> MipsIndex:
  """``index_type``: ``scann`` (default settings pick exact scoring for tiny corpora) or
  ``brute_force``. ``tuning_queries``: the sample ScaNN tunes its recall on (see module doc)."""
  if index_type == "scann":
    return ScannIndex.build(embeddings, settings, tuning_queries=tuning_queries)
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
    load_embeddings: memory-map ``embeddings.npy`` into a ``ScannIndex`` now (the mapping
      then outlives a later removal of the directory); otherwise ``ScannIndex.embeddings``
      maps it on first use. A ``BruteForceIndex`` always maps it: it searches those rows.
      Either way nothing float is read into memory until rows are touched.
  """
  manifest = read_manifest(directory)
  check_manifest(manifest, directory, expected_dim, expected_fingerprint)
  n, dim = int(manifest["num_blocks"]), int(manifest["dim"])
  if manifest["index_type"] == "brute_force":
    path = os.path.join(directory, EMBEDDINGS_NAME)
    try:
      embeddings = np.load(path, mmap_mode="r")
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
    embeddings_path = os.path.join(directory, EMBEDDINGS_NAME)
    embeddings = None
    if load_embeddings and os.path.exists(embeddings_path):
      embeddings = np.load(embeddings_path, mmap_mode="r")
    center = None
    if manifest["settings"].get("center"):
      center = np.load(os.path.join(directory, CENTER_NAME))
      if center.shape != (dim,):
        raise errors.IndexFormatError(f"{directory}/{CENTER_NAME} has shape {center.shape}")
    index = ScannIndex(searcher, n, dim, manifest["settings"], embeddings, center,
                       embeddings_path=embeddings_path)
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
  kth = _exact_kth_scores(embeddings, queries, k)
  approx_ids, _ = index.search(queries, k)
  return _tie_recall(embeddings, queries, approx_ids, kth, k, rtol)
