"""ScaNN's build settings, chosen by corpus size ``n`` (``ScannSettings.resolve``).

* ``n < 2,000``: exact scoring inside ScaNN (``score_brute_force``, float32: at most 1 MB):
  nothing to gain from quantization, and a tree would have too few points per leaf.
* ``2,000 <= n < 20,000``: no partitioning; asymmetric hashing (4-bit codes of 3 dimensions:
  43 codes per 128-d block) over every block, then the best ``R`` candidates are rescored
  with int8-quantized embeddings (``reorder(R, quantize=INT8)``) and the best 100 of those
  exactly (``exact_rescoring``).
* ``n >= 20,000``: additionally a k-means tree with ``round(sqrt(n))`` leaves (1,000 at 10^6,
  ~3,650 at REALM's 13.3M blocks; ORQA used 1,000). No SOAR spilling by default: it would
  store a second set of codes per block, over the memory budget (``soar_lambda`` turns it on).

How many leaves to search and how many candidates to rescore are tuned after building to a
recall target (``target_recall``; ``retrieval.index.tuning``). Every field can be overridden
(``ScannSettings(num_leaves=..., ...)``, ``IndexConfig.scann`` in YAML, or the binaries'
flags): ``ScannSettings`` is a Model Garden config, so it round-trips through YAML and refuses
unknown keys. This module does not import ScaNN.
"""

import dataclasses
import math
from typing import Any, Dict, Optional

from official.modeling import hyperparams

REORDERING_DTYPES = ("int8", "float32")


@dataclasses.dataclass
class ScannSettings(hyperparams.Config):
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
    rebalance_imbalance: after updates (``ScannIndex.append``/``delete``), the index is
      rebalanced (ScaNN's ``rebalance``: the partitions and codebooks retrained on the points
      it holds, then the tuning redone) when ScaNN's health statistic
      ``partition_weighted_avg_relative_imbalance`` has grown by more than this since the last
      (re)build: a query then scans this fraction more points per leaf searched.
    rebalance_changed_fraction: ... or when more than this fraction of the points were added
      or deleted since the last (re)build (the codebooks were trained on the others).
    build_memory_gib: the memory (GiB) a build may take. A corpus whose build would need more
      is built in shards (``sharded_index``): every shard's searcher stays resident (~200
      bytes per block) and one shard's rows are built at a time (~24 bytes per float); search
      merges the shards' top k. The default (8) builds REALM's 13.3M blocks in 7 shards on a
      24 GiB machine and anything up to ~2.6M 128-d blocks in one piece; ``None``: never
      shard.
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
  rebalance_imbalance: float = 0.1
  rebalance_changed_fraction: float = 0.25
  build_memory_gib: Optional[float] = 8.0

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


