r"""A scale model of REALM pre-training: per training step, the host's and the device's work.

    python -m experiments.scale_model                       # the paper's config, ~2 min here
    python -m experiments.scale_model --quick               # small measurements, < 20 s
    python -m experiments.scale_model --output=scale.md --train_cores=128

The configuration is the code's own: ``--experiment`` (default ``realm_pretrain_paper``)
layered with ``--config_file`` (default its TPU YAML) and ``--params_override``, read with
``realm_tf.configs.load_experiment``: the batch, the number of candidates, the sequence lengths,
the encoders' shapes, ``max_masks``, the refresh interval (the refresher rebuilds from the
trainer's checkpoints, so ``trainer.checkpoint_interval``) and the training dtype come from
there. What the config does not hold is a flag: the corpus size (the paper's 13,353,718
blocks), the cores and hosts, and the assumed peaks (``ASSUMPTIONS`` lists their sources).

What one step does (``realm_tf/tasks/candidates.py``, ``tasks/realm_pretrain.py``):

* host, per input pipeline (one per TPU host, ``cores_per_host`` cores each): embed the
  batch's queries with the query-tower snapshot (TF on the host CPUs), search the ScaNN index,
  drop the trivial block, put the null block first, gather and pack the int32 candidate
  inputs ``[b, k, Lb]`` and reader inputs ``[b, k, Lr]`` (NumPy, one Python thread), and feed
  them to the device;
* device: forward and backward of the query tower (``b`` x ``Lq``), the block tower (``b k`` x
  ``Lb``) and the reader (``b k`` x ``Lr``, MLM head at ``max_masks`` positions), the gradient
  all-reduce and the AdamW update;
* refresher (its own cores): re-embed every block with the block tower and rebuild ScaNN,
  once per ``checkpoint_interval`` steps at best.

FLOPs count matrix products only, as ``2 m n k``: per encoder layer and sequence of length L,
hidden H, intermediate I: QKV ``6 L H^2``, scores and context ``4 L^2 H``, attention output
``2 L H^2``, FFN ``4 L H I``; plus the pooler ``2 H^2``, the projection ``2 H d`` and the MLM
head ``2 H^2 + 2 H V`` per masked position; the type embeddings, a one-hot matmul ``2 L T H`` in
``BertEncoderV2``. Neglected: the word and position lookups (gathers), LayerNorm,
softmax, GELU, bias adds, dropout (all O(L H) per layer, under 2% of the matmuls at BERT-base).
Backward = 2 x forward (a gradient for the input and one for the weights of every product).
The device computes on padded, fixed-length sequences, so L is the full sequence length.

Each throughput is measured here, on this machine's CPUs, with small runs, then scaled:

* ``encoder``: forward FLOP/s of an embedder built by ``realm_tf.modeling.factory`` with the
  config's query-tower shape (BERT-base by default) at a small batch;
* ``scann``: queries/s of ``mips_index.ScannIndex`` (tree + AH + reorder, the default settings
  at REALM's size) over random 128-d vectors at two corpus sizes, fitted linearly in the corpus
  size (a tree searching a fixed fraction of its leaves scans a fixed fraction of the corpus);
* ``candidates``: examples/s of ``CandidateBuilder.select_candidates`` + ``features`` at the
  config's sequence lengths on a small synthetic corpus;
* ``gather``: NumPy random-row gather bandwidth out of an array larger than the caches;
* ``copy``: NumPy -> ``tf.Tensor`` bandwidth of one batch of features (the host end of the
  infeed).

Host rates are scaled by the ratio of the assumed host's vCPUs to the CPUs here for the
multi-threaded parts (TF, ScaNN); the packing is one Python thread and is not scaled. Device
times are FLOPs / (cores x peak per core x MFU). The step budget is the device step time: the
host's work overlaps it (``prefetch(1)`` in ``build_inputs``) as long as it is shorter.
"""

import dataclasses
import math
import os
import shutil
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence

from absl import flags
import numpy as np
from official.nlp.configs import encoders
import tensorflow as tf

from realm_tf import configs
from realm_tf.binaries import cli
from realm_tf.data import block_store
from realm_tf.modeling import factory
from realm_tf.retrieval.index import mips_index
from realm_tf.tasks import candidates
from realm_tf.tasks import realm_pretrain

PAPER_NUM_BLOCKS = 13_353_718   # Guu et al. 2020, section 4 / appendix (enwiki-20181220)
DEFAULT_CONFIG = os.path.join(os.path.dirname(__file__), "configs",
                              "realm_pretrain_paper__tpu.yaml")

# The assumed hardware, with where each number comes from.
ASSUMPTIONS = {
    "tpu_peak_flops_per_chip": (123e12, "TPU v3: 123 TFLOP/s bf16 per chip (2 TensorCores): "
                                "cloud.google.com/tpu/docs/v3 (system architecture)"),
    "tpu_cores_per_chip": (2, "cloud.google.com/tpu/docs/v3"),
    "tpu_hbm_bytes_per_chip": (32 * 2**30, "32 GiB HBM2 per chip = 16 GiB per core: "
                               "cloud.google.com/tpu/docs/v3"),
    "tpu_hbm_bandwidth_per_chip": (900e9, "900 GB/s HBM per chip: cloud.google.com/tpu/docs/v3"),
    "tpu_allreduce_bandwidth_per_chip": (340e12 / 1024, "340 TB/s all-reduce bandwidth per "
                                         "1024-chip pod: cloud.google.com/tpu/docs/v3"),
    "mfu": (0.40, "assumed model-FLOPs utilization of the device (not measured; BERT-class "
            "training on TPU is commonly quoted at 30-50%)"),
    "host_vcpus": (96, "v3-8 TPU host: 96 vCPUs (Cloud TPU docs, as given in the issue)"),
    "host_ram_bytes": (335e9, "v3-8 TPU host: ~335 GB RAM (Cloud TPU docs, as given in the "
                       "issue)"),
    "cores_per_host": (8, "a v3-8 host drives 4 chips = 8 TPU cores, so a slice of C cores "
                       "has C/8 hosts, each with its own input pipeline"),
    "host_to_device_bandwidth": (10e9, "assumed ~10 GB/s effective host->TPU (PCIe 3.0 x16 "
                                 "is 15.75 GB/s raw); not from a TPU document"),
    "mean_block_tokens_fraction": (1.0, "mean block length / block_seq_length: REALM's "
                                   "greedy split fills blocks to 288 wordpieces; 1.0 is the "
                                   "upper bound"),
    "text_bytes_per_token": (4.5, "assumed UTF-8 bytes of body text per wordpiece (English "
                             "Wikipedia, ~1.3 wordpieces per word, ~6 bytes per word)"),
    "activation_bytes_formula": ("s b h (34 + 5 a s / h)", "bytes of activations per layer for "
                                 "16-bit activations, Korthikanti et al. 2022 (Reducing "
                                 "Activation Recomputation in Large Transformer Models), eq. 1; "
                                 "x2 for float32"),
}

flags.DEFINE_string("experiment", "realm_pretrain_paper", "Registered experiment.")
flags.DEFINE_multi_string("config_file", [DEFAULT_CONFIG], "YAML files layered on it.")
flags.DEFINE_string("params_override", "", "Override string, as realm-train takes it.")
flags.DEFINE_integer("num_blocks", PAPER_NUM_BLOCKS, "Corpus size (blocks).")
flags.DEFINE_integer("train_cores", 64, "TPU cores training (the paper: 64 TPUs).")
flags.DEFINE_integer("refresh_cores", 16, "TPU cores re-embedding the corpus (the paper: 16).")
flags.DEFINE_float("mfu", ASSUMPTIONS["mfu"][0], "Assumed device model-FLOPs utilization.")
flags.DEFINE_integer("host_vcpus", ASSUMPTIONS["host_vcpus"][0], "vCPUs of a TPU host.")
flags.DEFINE_integer("cores_per_host", ASSUMPTIONS["cores_per_host"][0],
                     "TPU cores per host (one input pipeline each).")
flags.DEFINE_bool("quick", False, "Small measurements (for tests, < 20 s).")
flags.DEFINE_string("output", None, "Also write the Markdown report here.")
FLAGS = flags.FLAGS


# ---------------------------------------------------------------- analytic counts
@dataclasses.dataclass(frozen=True)
class EncoderShape:
  """The shape of a BERT encoder, as ``BertEncoderConfig`` gives it."""
  num_layers: int
  hidden: int
  intermediate: int
  heads: int
  vocab: int
  max_positions: int = 512
  type_vocab: int = 2

  @classmethod
  def from_config(cls, encoder) -> "EncoderShape":
    if encoder.embedding_size not in (None, encoder.hidden_size):
      raise ValueError("factorized embeddings (embedding_size) are not modelled")
    return cls(encoder.num_layers, encoder.hidden_size, encoder.intermediate_size,
               encoder.num_attention_heads, encoder.vocab_size,
               encoder.max_position_embeddings, encoder.type_vocab_size)


def layer_forward_flops(shape: EncoderShape, seq_length: int) -> int:
  """Matmul FLOPs of one transformer layer over one sequence of ``seq_length``."""
  l, h, i = seq_length, shape.hidden, shape.intermediate
  qkv = 3 * 2 * l * h * h
  attention = 2 * (2 * l * l * h)          # scores q k^T and context p v, over all heads
  output = 2 * l * h * h
  ffn = 2 * (2 * l * h * i)
  return qkv + attention + output + ffn


def encoder_forward_flops(shape: EncoderShape, seq_length: int, num_sequences: int = 1) -> int:
  """Matmul FLOPs of the encoder: its layers, and the type embeddings, which
  ``BertEncoderV2`` looks up as a one-hot matmul (``2 L T H``; no pooler, no heads)."""
  type_embeddings = 2 * seq_length * shape.type_vocab * shape.hidden
  return num_sequences * (shape.num_layers * layer_forward_flops(shape, seq_length) +
                          type_embeddings)


def embedder_forward_flops(shape: EncoderShape, seq_length: int, num_sequences: int,
                           projection: int) -> int:
  """``LayerNorm(Dense_d(pooled))``: the encoder, the pooler (one H x H product on [CLS])
  and the projection."""
  h = shape.hidden
  return (encoder_forward_flops(shape, seq_length, num_sequences) +
          num_sequences * (2 * h * h + 2 * h * projection))


def mlm_head_flops(shape: EncoderShape, num_positions: int) -> int:
  """The MLM transform (H x H) and the tied output projection (H x V) at the positions."""
  h = shape.hidden
  return num_positions * (2 * h * h + 2 * h * shape.vocab)


def encoder_params(shape: EncoderShape) -> int:
  """Parameters of a ``BertEncoderV2`` (embeddings + LayerNorm, layers, pooler)."""
  h, i = shape.hidden, shape.intermediate
  embeddings = (shape.vocab + shape.max_positions + shape.type_vocab) * h + 2 * h
  layer = 4 * (h * h + h) + 2 * h + (h * i + i) + (i * h + h) + 2 * h
  return embeddings + shape.num_layers * layer + h * h + h


def embedder_params(shape: EncoderShape, projection: int) -> int:
  return encoder_params(shape) + shape.hidden * projection + projection + 2 * projection


def reader_params(shape: EncoderShape) -> int:
  """The reader: its encoder + the MLM head (transform, LayerNorm, output bias; the output
  weights are the tied word embeddings)."""
  h = shape.hidden
  return encoder_params(shape) + h * h + h + 2 * h + shape.vocab


def activation_bytes(shape: EncoderShape, seq_length: int, num_sequences: int,
                     bytes_per_value: int) -> float:
  """Activations kept for the backward pass (Korthikanti et al. 2022, eq. 1), all layers."""
  s, h, a = seq_length, shape.hidden, shape.heads
  per_layer = num_sequences * s * h * (34 + 5 * a * s / h)
  return shape.num_layers * per_layer * bytes_per_value / 2


def feature_bytes(model_config, batch_size: int) -> int:
  """Bytes the host sends the device per step with host retrieval: ``HOST_PATH_FEATURES`` of
  ``feature_signature``."""
  signature = candidates.feature_signature(model_config)
  total = 0
  for name in realm_pretrain.HOST_PATH_FEATURES:
    spec = signature[name]
    total += int(np.prod(spec.shape[1:], dtype=np.int64)) * spec.dtype.size
  return batch_size * total


@dataclasses.dataclass
class Workload:
  """One step's work at the configured scale (see the module docstring)."""
  batch: int
  k: int
  query_len: int
  block_len: int
  reader_len: int
  max_masks: int
  projection: int
  retriever: EncoderShape
  reader: EncoderShape
  share_embedders: bool
  num_blocks: int
  refresh_interval: int
  train_steps: int
  act_bytes: int         # 2 for bfloat16 / float16 compute, 4 for float32
  dtype: str
  infeed_bytes: int = 0  # host -> device bytes per step (all hosts)

  @classmethod
  def from_params(cls, params, num_blocks: int) -> "Workload":
    task, model = params.task, params.task.model
    dtype = params.runtime.mixed_precision_dtype or "float32"
    return cls(batch=task.train_data.global_batch_size, k=model.num_candidates,
               query_len=model.retriever.query_seq_length,
               block_len=model.retriever.block_seq_length,
               reader_len=model.reader.seq_length, max_masks=model.max_masks,
               projection=model.retriever.projection_size,
               retriever=EncoderShape.from_config(model.retriever.encoder),
               reader=EncoderShape.from_config(model.reader.encoder),
               share_embedders=model.retriever.share_embedders, num_blocks=num_blocks,
               refresh_interval=params.trainer.checkpoint_interval,
               train_steps=params.trainer.train_steps,
               act_bytes=2 if dtype in ("bfloat16", "float16") else 4, dtype=dtype,
               infeed_bytes=feature_bytes(model, task.train_data.global_batch_size))

  # FLOPs
  def query_forward(self, batch=None) -> int:
    return embedder_forward_flops(self.retriever, self.query_len, batch or self.batch,
                                  self.projection)

  def block_forward(self, num_blocks=None) -> int:
    return embedder_forward_flops(self.retriever, self.block_len,
                                  num_blocks or self.batch * self.k, self.projection)

  def reader_forward(self) -> int:
    n = self.batch * self.k
    return (encoder_forward_flops(self.reader, self.reader_len, n) +
            mlm_head_flops(self.reader, n * self.max_masks))

  def scores(self) -> int:
    return 2 * self.batch * self.k * self.projection

  def train_flops(self) -> Dict[str, int]:
    """Device FLOPs per step (forward + backward = 3 x forward) by part."""
    return dict(query=3 * self.query_forward(), blocks=3 * self.block_forward(),
                reader=3 * (self.reader_forward() + self.scores()))

  def refresh_flops(self) -> int:
    """One re-embedding of the corpus and the null block (forward only)."""
    return self.block_forward(self.num_blocks + 1)

  # memory
  def params(self) -> Dict[str, int]:
    towers = embedder_params(self.retriever, self.projection)
    return dict(towers=towers * (1 if self.share_embedders else 2),
                reader=reader_params(self.reader))

  def activations_per_example(self) -> float:
    b = self.act_bytes
    return (activation_bytes(self.retriever, self.query_len, 1, b) +
            activation_bytes(self.retriever, self.block_len, self.k, b) +
            activation_bytes(self.reader, self.reader_len, self.k, b) +
            # MLM logits [k, m, V] in the compute dtype, their float32 log-softmax and its
            # gradient.
            self.k * self.max_masks * self.reader.vocab * (b + 4 + 4))


# ---------------------------------------------------------------- measurements
@dataclasses.dataclass
class Measured:
  encoder_flops_per_s: float = 0.0
  encoder_setting: str = ""
  scann_sizes: Sequence[int] = ()
  scann_seconds_per_query: Sequence[float] = ()
  scann_build_seconds: Sequence[float] = ()
  scann_bytes_per_block: float = 0.0
  scann_batch: int = 0
  scann_settings: str = ""
  candidates_per_s: float = 0.0
  candidates_setting: str = ""
  gather_bytes_per_s: float = 0.0
  gather_setting: str = ""
  copy_bytes_per_s: float = 0.0
  cpus: int = 1
  under_load: str = ""

  def scann_seconds_at(self, n: int) -> float:
    return linear_fit_at(self.scann_sizes, self.scann_seconds_per_query, n)


def linear_fit_at(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
  """The least-squares line through ``(xs, ys)`` at ``x`` (one point: proportional)."""
  xs, ys = np.asarray(xs, np.float64), np.asarray(ys, np.float64)
  if len(xs) == 1:
    return float(ys[0] * x / xs[0])
  slope, intercept = np.polyfit(xs, ys, 1)
  return float(max(intercept, 0.0) + slope * x)


def _best_time(fn, repeats: int) -> float:
  """The shortest of ``repeats`` timed calls (after one warm-up call)."""
  fn()
  best = math.inf
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - start)
  return best


def measure_encoder(shape: EncoderShape, batch: int, seq_length: int, projection: int,
                    repeats: int) -> float:
  """Forward FLOP/s (matmul FLOPs by ``embedder_forward_flops``) of a float32 embedder built
  by ``realm_tf.modeling.factory`` with ``shape`` (vocabulary cut to 1000: lookups are not
  FLOPs)."""
  encoder = encoders.BertEncoderConfig(
      vocab_size=1000, hidden_size=shape.hidden, num_layers=shape.num_layers,
      num_attention_heads=shape.heads, intermediate_size=shape.intermediate,
      max_position_embeddings=max(512, seq_length), dropout_rate=0.0,
      attention_dropout_rate=0.0)
  embedder = factory.build_embedder(configs.RetrieverConfig(encoder=encoder,
                                                            projection_size=projection))
  rng = np.random.default_rng(0)
  inputs = dict(input_word_ids=tf.constant(rng.integers(1, 1000, [batch, seq_length]), tf.int32),
                input_mask=tf.ones([batch, seq_length], tf.int32),
                input_type_ids=tf.zeros([batch, seq_length], tf.int32))
  forward = tf.function(lambda x: embedder(x, training=False))
  seconds = _best_time(lambda: forward(inputs).numpy(), repeats)
  return embedder_forward_flops(shape, seq_length, batch, projection) / seconds


def scann_settings(training_sample_size: int):
  """The index's own defaults at REALM's size (tree + AH + reorder), the tree forced on at
  every measured size, and no build-time recall tuning: on random vectors it would search
  every leaf, which real (clustered) embeddings do not need; without a target the index
  searches 10% of its leaves."""
  fields = {f.name for f in dataclasses.fields(mips_index.ScannSettings)}
  kwargs = dict(use_tree=True, training_sample_size=training_sample_size)
  if "target_recall" in fields:
    kwargs["target_recall"] = None
  return mips_index.ScannSettings(**kwargs)


def measure_scann(sizes: Sequence[int], dim: int, batch: int, num_queries: int,
                  training_sample_size: int):
  """Per-query seconds of ScaNN (tree + AH + reorder: ``ScannSettings`` with the tree forced
  on, so every size uses the mode REALM's corpus gets) at batch ``batch``; build seconds;
  serialized ScaNN bytes per block at the largest size."""
  rng = np.random.default_rng(0)
  queries = rng.standard_normal((num_queries, dim), dtype=np.float32)
  per_query, builds, size_per_block, settings = [], [], 0.0, None
  for n in sizes:
    emb = rng.standard_normal((n, dim), dtype=np.float32)
    options = scann_settings(training_sample_size)
    index = mips_index.ScannIndex.build(emb, options)
    builds.append(index.build_seconds)
    settings = index.settings()

    def search(index=index):
      for i in range(0, num_queries, batch):
        index.search(queries[i:i + batch], 11)
    per_query.append(_best_time(search, 2) / num_queries)
    if n == max(sizes):
      work = tempfile.mkdtemp(prefix="scale_model_")
      try:
        index.save(work)
        scann_dir = os.path.join(work, mips_index.SCANN_DIR)
        size_per_block = sum(os.path.getsize(os.path.join(d, f))
                             for d, _, fs in os.walk(scann_dir) for f in fs) / n
      finally:
        shutil.rmtree(work, ignore_errors=True)
    del index, emb
  return per_query, builds, size_per_block, settings


def synthetic_builder(model_config, num_blocks: int, seed: int = 0):
  """A ``CandidateBuilder`` over ``num_blocks`` random blocks that fill ``block_seq_length``
  (ids from a 30,000-word vocabulary; [CLS]=101, [SEP]=102 as in BERT's)."""
  rng = np.random.default_rng(seed)
  cls_id, sep_id = 101, 102
  length = model_config.retriever.block_seq_length
  blocks = []
  for i in range(num_blocks):
    title = rng.integers(1000, 30000, int(rng.integers(2, 6))).tolist()
    body = rng.integers(1000, 30000, length - len(title) - 3).tolist()
    blocks.append(dict(uid=f"block-{i}", token_ids=[cls_id] + title + [sep_id] + body + [sep_id],
                       body=""))
  return candidates.CandidateBuilder(blocks, model_config, None, cls_id, sep_id)


def synthetic_examples(model_config, batch: int, num_blocks: int, seed: int = 0):
  """A batch of parsed pre-training examples (full-length queries, ``max_masks`` masks)."""
  rng = np.random.default_rng(seed)
  q, m = model_config.retriever.query_seq_length, model_config.max_masks
  ids = rng.integers(1000, 30000, [batch, q]).astype(np.int32)
  ids[:, 0], ids[:, -1] = 101, 102
  return dict(query_ids=ids, query_mask=np.ones([batch, q], np.int32),
              mlm_positions=np.tile(np.arange(1, m + 1, dtype=np.int32), [batch, 1]),
              mlm_ids=rng.integers(1000, 30000, [batch, m]).astype(np.int32),
              mlm_weights=np.ones([batch, m], np.float32),
              source_uid=[f"block-{int(u)}" for u in rng.integers(0, num_blocks, batch)])


def measure_candidates(model_config, num_blocks: int, batch: int, repeats: int) -> float:
  """Examples/s of the host's candidate step after the search: ``select_candidates`` (drop the
  trivial block, null first) and ``features`` (gather, pack, reader inputs)."""
  builder = synthetic_builder(model_config, num_blocks)
  examples = synthetic_examples(model_config, batch, num_blocks)
  rng = np.random.default_rng(1)
  depth = model_config.num_candidates - 1 + builder.search_slack
  ranked = np.stack([rng.choice(num_blocks, depth, replace=False) for _ in range(batch)])

  def step():
    chosen = builder.select_candidates(ranked, examples["source_uid"])
    builder.features(examples, candidates=chosen)
  return batch / _best_time(step, repeats)


def measure_gather(total_bytes: int, row_tokens: int, rows: int, repeats: int) -> float:
  """Bytes/s of a random-row gather (uint16 rows of ``row_tokens``) out of ``total_bytes``."""
  n = max(total_bytes // (2 * row_tokens), rows)
  table = np.random.default_rng(0).integers(0, 30000, [n, row_tokens], dtype=np.uint16)
  idx = np.random.default_rng(1).integers(0, n, rows)
  out = np.empty([rows, row_tokens], np.uint16)
  seconds = _best_time(lambda: np.take(table, idx, axis=0, out=out), repeats)
  return rows * row_tokens * 2 / seconds


def measure_copy(model_config, batch: int, repeats: int) -> float:
  """Bytes/s of NumPy -> ``tf.Tensor`` for one batch of device features."""
  arrays = [np.ones([batch, *spec.shape[1:]], spec.dtype.as_numpy_dtype)
            for spec in candidates.feature_signature(model_config).values()]

  def copy():
    for a in arrays:
      tf.constant(a)
  total = sum(a.nbytes for a in arrays)
  return total / _best_time(copy, repeats)


def measure(work: Workload, model_config, quick: bool) -> Measured:
  """Every measurement, small (``quick``) or default size."""
  m = Measured(cpus=os.cpu_count() or 1)
  m.under_load = "" if os.path.exists("/tmp/cpu_free_C") else " (measured under load)"
  if quick:
    shape = EncoderShape(2, 128, 512, 2, 1000)
    batch, seq = 4, 64
  else:
    shape, batch, seq = work.retriever, 4, 128
  m.encoder_flops_per_s = measure_encoder(shape, batch, seq, work.projection,
                                          repeats=2 if quick else 3)
  m.encoder_setting = (f"{shape.num_layers}x{shape.hidden} (I={shape.intermediate}) float32 "
                       f"embedder forward, batch {batch} x {seq}")
  sizes = (5_000, 20_000) if quick else (50_000, 200_000)
  m.scann_batch = 64
  per_query, builds, per_block, settings = measure_scann(
      sizes, work.projection, m.scann_batch, 256 if quick else 1024,
      training_sample_size=5_000 if quick else 20_000)
  m.scann_sizes, m.scann_seconds_per_query, m.scann_build_seconds = sizes, per_query, builds
  m.scann_bytes_per_block = per_block
  m.scann_settings = (
      f"tree sqrt(n) leaves, {100 * settings['num_leaves_to_search'] / settings['num_leaves']:.0f}"
      f"% searched, SOAR, AH {settings.get('dimensions_per_block')} dim/code, reorder "
      f"{settings.get('reordering_num_neighbors')} ({settings.get('reordering_dtype', 'float32')})"
      ", no recall tuning")
  n_blocks, cand_batch = (300, 16) if quick else (4000, 64)
  m.candidates_per_s = measure_candidates(model_config, n_blocks, cand_batch,
                                          repeats=2 if quick else 3)
  m.candidates_setting = f"batch {cand_batch}, {n_blocks} blocks in memory"
  gather_total = (32 if quick else 512) * 2**20
  m.gather_bytes_per_s = measure_gather(gather_total, work.block_len, 20_000, repeats=3)
  m.gather_setting = f"{gather_total / 2**20:.0f} MiB uint16 table, rows of {work.block_len}"
  m.copy_bytes_per_s = measure_copy(model_config, 16 if quick else 64, repeats=3)
  return m


# ---------------------------------------------------------------- the model
@dataclasses.dataclass
class Hardware:
  train_cores: int
  refresh_cores: int
  mfu: float
  host_vcpus: int
  cores_per_host: int
  peak_per_core: float = ASSUMPTIONS["tpu_peak_flops_per_chip"][0] / ASSUMPTIONS[
      "tpu_cores_per_chip"][0]
  hbm_per_core: float = ASSUMPTIONS["tpu_hbm_bytes_per_chip"][0] / ASSUMPTIONS[
      "tpu_cores_per_chip"][0]
  hbm_bw_per_core: float = ASSUMPTIONS["tpu_hbm_bandwidth_per_chip"][0] / ASSUMPTIONS[
      "tpu_cores_per_chip"][0]
  allreduce_bw_per_chip: float = ASSUMPTIONS["tpu_allreduce_bandwidth_per_chip"][0]
  host_to_device: float = ASSUMPTIONS["host_to_device_bandwidth"][0]
  host_ram: float = ASSUMPTIONS["host_ram_bytes"][0]

  @property
  def hosts(self) -> int:
    return max(1, math.ceil(self.train_cores / self.cores_per_host))

  def device_seconds(self, flops: float, cores: Optional[int] = None) -> float:
    return flops / ((cores or self.train_cores) * self.peak_per_core * self.mfu)


@dataclasses.dataclass
class Row:
  component: str
  where: str
  work: str
  measured: str
  here_s: Optional[float]     # this machine's time for the whole step's work (None: n/a)
  scaled_s: float             # per step at paper scale on the assumed hardware
  host: bool                  # runs on the (per-pipeline) host, overlapping the device


def _si(x: float, unit: str = "") -> str:
  for factor, prefix in ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"),
                         (1e3, "k")):
    if abs(x) >= factor:
      return f"{x / factor:.3g} {prefix}{unit}"
  return f"{x:.3g} {unit}"


def _bytes(x: float) -> str:
  for factor, prefix in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
    if abs(x) >= factor:
      return f"{x / factor:.3g} {prefix}"
  return f"{x:.0f} B"


def _seconds(x: Optional[float]) -> str:
  if x is None:
    return "n/a"
  if x >= 3600:
    return f"{x / 3600:.3g} h"
  if x >= 1:
    return f"{x:.3g} s"
  return f"{1e3 * x:.3g} ms"


def build_rows(work: Workload, m: Measured, hw: Hardware) -> List[Row]:
  """The per-step table (see the module docstring for what each row assumes)."""
  rows = []
  train = work.train_flops()
  cpu_rate = m.encoder_flops_per_s
  host_rate = cpu_rate * hw.host_vcpus / m.cpus          # multi-threaded TF on a TPU host
  per_host = work.batch / hw.hosts                         # examples per input pipeline
  for name, flops, what in (
      ("query tower fwd+bwd", train["query"], f"{work.batch} x {work.query_len} tokens"),
      ("block tower fwd+bwd (rescoring k candidates)", train["blocks"],
       f"{work.batch * work.k} x {work.block_len} tokens"),
      ("reader fwd+bwd + MLM head", train["reader"],
       f"{work.batch * work.k} x {work.reader_len} tokens, {work.max_masks} masks each")):
    rows.append(Row(name, f"device ({hw.train_cores} cores)", f"{_si(flops, 'FLOP')}",
                    f"{_si(cpu_rate, 'FLOP/s')} (CPU fwd; TPU: assumed peak x MFU)",
                    flops / cpu_rate, hw.device_seconds(flops), False))
  params = sum(work.params().values())
  # AdamW: read param, grad, m, v; write param, m, v (float32): 28 bytes per parameter.
  update_bytes = 28 * params
  rows.append(Row("AdamW update (HBM-bound)", "device, every core (replicated)",
                  f"{_bytes(update_bytes)} HBM traffic per core", "n/a (assumed HBM BW)", None,
                  update_bytes / hw.hbm_bw_per_core, False))
  grad_bytes = 4 * params
  chips = max(1, hw.train_cores // ASSUMPTIONS["tpu_cores_per_chip"][0])
  allreduce = 2 * grad_bytes * (chips - 1) / chips / hw.allreduce_bw_per_chip
  rows.append(Row("gradient all-reduce", "device ICI", f"{_bytes(grad_bytes)} float32 grads",
                  "n/a (assumed ICI BW)", None, allreduce, False))
  # Host side, per input pipeline (each host does its share of the batch).
  q_flops = work.query_forward(per_host)
  rows.append(Row("query embedding (snapshot tower)", f"host CPU, per host ({hw.hosts} hosts)",
                  f"{_si(q_flops, 'FLOP')} ({per_host:.0f} x {work.query_len} tokens fwd)",
                  f"{_si(cpu_rate, 'FLOP/s')} on {m.cpus} CPUs{m.under_load}",
                  work.query_forward() / cpu_rate, q_flops / host_rate, True))
  s_here = m.scann_seconds_at(work.num_blocks)
  rows.append(Row("ScaNN search", "host CPU, per host",
                  f"{per_host:.0f} queries over {work.num_blocks:,} blocks",
                  f"{1 / m.scann_seconds_per_query[-1]:.0f} q/s at {m.scann_sizes[-1]:,}, "
                  f"{1 / m.scann_seconds_per_query[0]:.0f} q/s at {m.scann_sizes[0]:,} "
                  f"(batch {m.scann_batch}){m.under_load}; linear fit -> "
                  f"{1 / s_here:.1f} q/s at {work.num_blocks:,}",
                  work.batch * s_here, per_host * s_here * m.cpus / hw.host_vcpus, True))
  rows.append(Row("candidate building (drop trivial, null first, gather, pack)",
                  "host, 1 Python thread per host",
                  f"{per_host:.0f} examples -> [{work.k}, {work.block_len}] + "
                  f"[{work.k}, {work.reader_len}] int32",
                  f"{m.candidates_per_s:.0f} examples/s ({m.candidates_setting}){m.under_load}",
                  work.batch / m.candidates_per_s, per_host / m.candidates_per_s, True))
  # The store is read twice per candidate (packed block and reader body): uint16 tokens.
  gathered = per_host * work.k * 2 * work.block_len * 2
  rows.append(Row("corpus gather, out of cache (part of candidate building)",
                  "host RAM, per host", f"{_bytes(gathered)} random rows",
                  f"{_bytes(m.gather_bytes_per_s)}/s ({m.gather_setting}){m.under_load}",
                  gathered * hw.hosts / m.gather_bytes_per_s, gathered / m.gather_bytes_per_s,
                  True))
  infeed = work.infeed_bytes / hw.hosts
  rows.append(Row("host -> device infeed", "PCIe, per host",
                  f"{_bytes(infeed)} int32/float32 features",
                  f"{_bytes(m.copy_bytes_per_s)}/s NumPy -> tf.Tensor here; "
                  f"assumed {_bytes(hw.host_to_device)}/s to the TPU",
                  infeed * hw.hosts / m.copy_bytes_per_s, infeed / hw.host_to_device, True))
  return rows


def device_retrieval_rows(work: Workload, m: Measured, hw: Hardware) -> List[Row]:
  """``task.retrieval: device`` (``tasks/device_retrieval.py``): what changes per step.

  The device adds a no-gradient query-tower forward and the exact search over its shard
  (``2 B n d`` in all), plus three collectives (all-gather of the queries and of the local
  tops, all-reduce of the candidates' token rows); the host keeps only the infeed of the
  parsed queries (the ``HOST_FEATURES``). top_k over a shard is neglected (a pass over
  ``B n / R`` scores, under the matmul's time).
  """
  rows = []
  cpu_rate = m.encoder_flops_per_s
  search = 2 * work.batch * work.num_blocks * work.projection
  rows.append(Row("retrieval: query tower fwd (no gradient)", f"device ({hw.train_cores} cores)",
                  f"{_si(work.query_forward(), 'FLOP')}", f"{_si(cpu_rate, 'FLOP/s')} (CPU)",
                  work.query_forward() / cpu_rate, hw.device_seconds(work.query_forward()),
                  False))
  rows.append(Row("retrieval: exact search over the core's shard", "device, every core",
                  f"{_si(search, 'FLOP')} ({work.batch} x {work.num_blocks:,} x "
                  f"{work.projection})", f"{_si(cpu_rate, 'FLOP/s')} (CPU, as the encoder)",
                  search / cpu_rate, hw.device_seconds(search), False))
  chips = max(1, hw.train_cores // ASSUMPTIONS["tpu_cores_per_chip"][0])
  width = work.block_len + 1   # token rows and their length
  collective = (work.batch * work.projection * 4 + 2 * hw.train_cores * work.batch *
                (work.k - 1) * 4 + work.batch * (work.k - 1) * width * 4)
  rows.append(Row("retrieval: all-gather queries + tops, all-reduce token rows", "device ICI",
                  f"{_bytes(collective)}", "n/a (assumed ICI BW)", None,
                  2 * collective * (chips - 1) / chips / hw.allreduce_bw_per_chip, False))
  infeed = work.batch * (3 * work.query_len + 3 * work.max_masks + 1) * 4 / hw.hosts
  rows.append(Row("retrieval: host -> device infeed (queries, masks, source group)",
                  "PCIe, per host", f"{_bytes(infeed)}",
                  f"assumed {_bytes(hw.host_to_device)}/s to the TPU",
                  infeed * hw.hosts / m.copy_bytes_per_s, infeed / hw.host_to_device, True))
  return rows


def refresh_model(work: Workload, m: Measured, hw: Hardware, step_s: float) -> Dict[str, float]:
  """Seconds to re-embed the corpus on ``refresh_cores``, the ScaNN rebuild on one host, and
  the cores needed to refresh every ``refresh_interval`` steps."""
  flops = work.refresh_flops()
  embed_s = hw.device_seconds(flops, hw.refresh_cores)
  budget = work.refresh_interval * step_s
  # Build time scaled linearly in n from the largest measured size, and by vCPUs.
  build_s = (m.scann_build_seconds[-1] * work.num_blocks / m.scann_sizes[-1] * m.cpus /
             hw.host_vcpus)
  cores_needed = math.ceil(flops / (max(budget - build_s, 1e-9) * hw.peak_per_core * hw.mfu))
  return dict(flops=flops, embed_s=embed_s, build_s=build_s, budget=budget,
              cores_needed=cores_needed,
              interval_steps=(embed_s + build_s) / step_s,
              here_s=flops / m.encoder_flops_per_s)


def memory_model(work: Workload, m: Measured, hw: Hardware) -> Dict[str, float]:
  n = work.num_blocks
  tokens = n * work.block_len * ASSUMPTIONS["mean_block_tokens_fraction"][0]
  itemsize = block_store.token_dtype(work.retriever.vocab - 1).itemsize
  store = tokens * itemsize + 2 * 8 * (n + 1) + block_store.DIGEST_BYTES * n
  texts = tokens * ASSUMPTIONS["text_bytes_per_token"][0]
  embeddings = (n + 1) * work.projection * 4
  scann = m.scann_bytes_per_block * (n + 1)
  params = work.params()
  snapshot = 4 * embedder_params(work.retriever, work.projection)
  # Resident: the store (random rows of it are read every step, so all of it ends up paged
  # in), the ScaNN searcher twice (a newer index loads before the swap) and the snapshot.
  # The texts and the float32 embeddings are memory-mapped files the training step never
  # reads (validation / Open-QA do).
  host = store + 2 * scann + snapshot
  mapped = texts + 2 * embeddings
  p = sum(params.values())
  state = p * (4 + 4 + 8)                                # float32 params, grads, Adam m and v
  act = work.activations_per_example()
  per_core_examples = work.batch / hw.train_cores
  core = state + act * per_core_examples
  # Cores at which the activations fit next to the replicated state (no rematerialization).
  room = hw.hbm_per_core - state
  fit_cores = math.ceil(work.batch * act / room) if room > 0 else math.inf
  return dict(store=store, texts=texts, embeddings=embeddings, scann=scann, snapshot=snapshot,
              host=host, mapped=mapped, params=p, state=state, act_per_example=act, core=core,
              fit_cores=fit_cores, towers=params["towers"], reader=params["reader"])


def report(params, work: Workload, m: Measured, hw: Hardware,
           experiment: str = "experiment") -> str:
  """The Markdown report of ``experiment`` (its name, for the title): the per-step table,
  memory, refresh and the bottleneck line."""
  rows = build_rows(work, m, hw)
  device = [r for r in rows if not r.host]
  step_s = sum(r.scaled_s for r in device)
  host_s = sum(r.scaled_s for r in rows if r.host)
  refresh = refresh_model(work, m, hw, step_s)
  mem = memory_model(work, m, hw)
  out = []
  a = out.append
  a(f"# REALM scale model: {experiment}")
  a("")
  a(f"Config: batch {work.batch}, k={work.k}, Lq/Lb/Lr = {work.query_len}/{work.block_len}/"
    f"{work.reader_len}, {work.max_masks} masks, towers {work.retriever.num_layers}x"
    f"{work.retriever.hidden} (shared: {work.share_embedders}), reader "
    f"{work.reader.num_layers}x{work.reader.hidden}, vocab {work.reader.vocab}, compute dtype "
    f"{work.dtype}, refresh every >= {work.refresh_interval} steps (checkpoint_interval), "
    f"{work.train_steps:,} steps; corpus {work.num_blocks:,} blocks.")
  a(f"Hardware assumed: {hw.train_cores} TPU v3 cores training ({hw.hosts} hosts of "
    f"{hw.cores_per_host} cores, {hw.host_vcpus} vCPUs each), {hw.refresh_cores} cores "
    f"refreshing; {_si(hw.peak_per_core, 'FLOP/s')} bf16 peak per core at MFU "
    f"{hw.mfu:.0%}. Measured here: {m.cpus} CPUs{m.under_load}.")
  a("")
  a("| component | where | work per step | measured rate here | time here for the whole "
    "step's work | scaled time per step (paper scale, assumed hw) | share of step budget |")
  a("|---|---|---|---|---:|---:|---:|")
  for r in rows:
    a(f"| {r.component} | {r.where} | {r.work} | {r.measured} | {_seconds(r.here_s)} | "
      f"{_seconds(r.scaled_s)} | {100 * r.scaled_s / step_s:.1f}% |")
  a(f"| **device step (sum of device rows)** | | {_si(sum(work.train_flops().values()), 'FLOP')} "
    f"| | | **{_seconds(step_s)}** | 100% |")
  a(f"| **host pipeline (sum of host rows, overlaps the device)** | per host | "
    f"{work.batch / hw.hosts:.0f} examples | | | **{_seconds(host_s)}** | "
    f"{100 * host_s / step_s:.1f}% |")
  a(f"| refresh: re-embed the corpus | {hw.refresh_cores} TPU cores | "
    f"{_si(refresh['flops'], 'FLOP')} ({work.num_blocks + 1:,} x {work.block_len} tokens fwd) "
    f"per refresh | {_si(m.encoder_flops_per_s, 'FLOP/s')} (CPU) | "
    f"{_seconds(refresh['here_s'])} per refresh | {_seconds(refresh['embed_s'])} per refresh "
    f"= {_seconds(refresh['embed_s'] / work.refresh_interval)} per step over "
    f"{work.refresh_interval} steps | {100 * refresh['embed_s'] / refresh['budget']:.0f}% of "
    f"{work.refresh_interval} steps |")
  a(f"| refresh: ScaNN rebuild | refresher host ({hw.host_vcpus} vCPUs) | {work.num_blocks:,} "
    f"x {work.projection} | build {m.scann_build_seconds[-1]:.1f} s at "
    f"{m.scann_sizes[-1]:,} here{m.under_load} | | {_seconds(refresh['build_s'])} per refresh "
    f"(linear in n) | {100 * refresh['build_s'] / refresh['budget']:.0f}% of "
    f"{work.refresh_interval} steps |")
  a("")
  a(f"Per step: {work.batch:,} index searches ({work.batch / hw.hosts:.0f} per host), "
    f"{_bytes(work.infeed_bytes)} host -> device in all, device FLOPs "
    f"{_si(sum(work.train_flops().values()), 'FLOP')} (query "
    f"{_si(work.train_flops()['query'], '')}, blocks {_si(work.train_flops()['blocks'], '')}, "
    f"reader {_si(work.train_flops()['reader'], '')}). {work.train_steps:,} steps at "
    f"{_seconds(step_s)}: {work.train_steps * step_s / 86400:.2f} days.")
  a("")
  a("| memory | size |")
  a("|---|---:|")
  a(f"| host: block store (tokens uint16 + offsets + uid digests, memory-mapped) | "
    f"{_bytes(mem['store'])} |")
  a(f"| host: block body texts (memory-mapped; only validation/recall reads them) | "
    f"{_bytes(mem['texts'])} |")
  a(f"| host: float32 embeddings beside the index ({work.num_blocks:,} x {work.projection}; "
    f"memory-mapped, not read by training) | {_bytes(mem['embeddings'])} |")
  a(f"| host: ScaNN searcher ({m.scann_bytes_per_block:.0f} B/block measured on disk: tree "
    f"ids + AH codes + reordering rows) | {_bytes(mem['scann'])} |")
  a(f"| host: query-tower snapshot (float32) | {_bytes(mem['snapshot'])} |")
  a(f"| **host RAM resident per input host** (store + 2 searchers while a new index loads + "
    f"snapshot) | **{_bytes(mem['host'])}** of {_bytes(hw.host_ram)} |")
  a(f"| host: memory-mapped on top, if fully paged in (texts + 2 x embeddings) | "
    f"{_bytes(mem['mapped'])} |")
  a(f"| device: parameters (towers {mem['towers'] / 1e6:.1f}M + reader "
    f"{mem['reader'] / 1e6:.1f}M = {mem['params'] / 1e6:.1f}M) | {_bytes(4 * mem['params'])} |")
  a(f"| device: params + grads + Adam m, v (float32, replicated on every core) | "
    f"{_bytes(mem['state'])} per core |")
  a(f"| device: activations for backward, per example ({work.dtype}, no rematerialization) | "
    f"{_bytes(mem['act_per_example'])} |")
  a(f"| **device HBM per core** at {work.batch / hw.train_cores:g} examples per core | "
    f"**{_bytes(mem['core'])}** of {_bytes(hw.hbm_per_core)} |")
  a("")
  a("## With `task.retrieval: device` (exact top-k on the replicas)")
  a("")
  a("| component | where | work per step | measured rate here | time here | scaled time per "
    "step | share of the host-path step |")
  a("|---|---|---|---|---:|---:|---:|")
  extra = device_retrieval_rows(work, m, hw)
  for r in extra:
    a(f"| {r.component} | {r.where} | {r.work} | {r.measured} | {_seconds(r.here_s)} | "
      f"{_seconds(r.scaled_s)} | {100 * r.scaled_s / step_s:.1f}% |")
  device_step = step_s + sum(r.scaled_s for r in extra if not r.host)
  device_host = sum(r.scaled_s for r in extra if r.host)
  tables = (work.num_blocks * (work.projection + work.block_len + 2) * 4) / hw.train_cores
  a(f"| **device step** | | | | | **{_seconds(device_step)}** | "
    f"{100 * device_step / step_s:.1f}% |")
  a(f"| **host per step** (was {_seconds(host_s)}) | per host | | | | "
    f"**{_seconds(device_host)}** | {100 * device_host / step_s:.2f}% |")
  a(f"| device HBM per core for the tables (float32 embeddings, int32 ids + length, uid group)"
    f" | {hw.train_cores} cores | {_bytes(tables)} | | | | |")
  a("")
  a(f"The host's query embedding and ScaNN search ({_seconds(host_s)} a step, headroom "
    f"x{step_s / host_s:.1f} on the host path) give way to {_seconds(device_step - step_s)} "
    f"more device time a step ({100 * (device_step - step_s) / step_s:.1f}%), exact search "
    f"(recall 1.0 instead of the index's ~0.95), retrieval with the current query tower, no "
    f"ScaNN searcher or snapshot tower on the input hosts, and {_bytes(tables)} of HBM a core "
    "beside the model.")
  a("")
  a("Assumptions:")
  for key, (value, source) in ASSUMPTIONS.items():
    a(f"- {key} = {value if isinstance(value, str) else f'{value:.4g}'}: {source}")
  a(f"- ScaNN measured on random Gaussian vectors (the hard case) with {m.scann_settings}, "
    "training sample cut to keep the run short; per-query time fitted linearly in n.")
  a("- Host TF and ScaNN rates scale with vCPUs (optimistic: hyperthreads, memory bandwidth); "
    "the packing is one Python thread and runs at this machine's single-thread speed.")
  a(f"- Encoder rate here: {m.encoder_setting}; FLOPs are matmuls only, backward = 2 x "
    "forward; the TPU rows use the assumed peak x MFU, not this rate.")
  a("")
  # The bottleneck and the shopping list.
  parts = [(r.scaled_s, r.component) for r in device]
  host_parts = [(r.scaled_s, r.component) for r in rows if r.host]
  top_device, top_host = max(parts), max(host_parts)
  bottleneck = (f"the device ({top_device[1]}: {100 * top_device[0] / step_s:.0f}% of the "
                f"{_seconds(step_s)} step)" if step_s >= host_s else
                f"the host input pipeline ({top_host[1]}; {_seconds(host_s)} per step > the "
                f"device's {_seconds(step_s)})")
  fit = ("fits" if mem["core"] <= hw.hbm_per_core else
         f"does NOT fit without rematerialization; >= {mem['fit_cores']} cores fit it")
  a(f"**Bottleneck: {bottleneck}; host headroom x{step_s / host_s:.1f} (largest host part: "
    f"{top_host[1]}, {_seconds(top_host[0])}). A user needs: host RAM >= "
    f"{_bytes(mem['host'])} resident (+{_bytes(mem['mapped'])} mapped) per input host; {hw.train_cores} TPU v3 cores train at "
    f"~{_seconds(step_s)}/step (HBM {_bytes(mem['core'])} per core: {fit}); re-embedding "
    f"{work.num_blocks:,} x {work.block_len} tokens takes {_seconds(refresh['embed_s'])} on "
    f"{hw.refresh_cores} cores (+{_seconds(refresh['build_s'])} ScaNN build) = an index every "
    f"~{refresh['interval_steps']:.0f} steps; refreshing every {work.refresh_interval} steps "
    f"needs ~{refresh['cores_needed']} refresh cores.**")
  return "\n".join(out) + "\n"


def main(argv):
  del argv
  params = configs.load_experiment(FLAGS.experiment, FLAGS.config_file, FLAGS.params_override)
  work = Workload.from_params(params, FLAGS.num_blocks)
  hw = Hardware(FLAGS.train_cores, FLAGS.refresh_cores, FLAGS.mfu, FLAGS.host_vcpus,
                FLAGS.cores_per_host)
  start = time.time()
  m = measure(work, params.task.model, FLAGS.quick)
  text = report(params, work, m, hw, FLAGS.experiment)
  text += f"\n(measurements took {time.time() - start:.0f} s)\n"
  sys.stdout.write(text)
  if FLAGS.output:
    with open(FLAGS.output, "w") as f:
      f.write(text)


if __name__ == "__main__":
  cli.run_main(main)
