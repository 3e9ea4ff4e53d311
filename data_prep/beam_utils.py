"""Shared Beam plumbing: pipeline options, atomic output directories, run statistics.

Atomic outputs: a pipeline writes everything under ``<output_dir>.tmp-<random>``; only when the
run succeeded is that directory renamed to ``<output_dir>`` (a previous output is moved aside
first and deleted after). A failed run removes its temporary directory, so ``<output_dir>`` is
either the previous complete output or the new complete one, never half of each. On object stores
without a directory rename (``gs://``), files are copied and ``manifest.json`` is written last:
readers treat a directory without a manifest as absent.
"""

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import time
import uuid
from typing import Dict, Iterable, List, Optional, Sequence

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import fn_runner
import tensorflow as tf

from realm_tf.data import manifests

MANIFEST = manifests.MANIFEST
STATS_FILE = "_stats.json"


def make_pipeline_options(pipeline_args: Optional[Sequence[str]] = None) -> PipelineOptions:
  """Standard Beam options from ``pipeline_args``; locally the in-memory DirectRunner.

  Any runner works through ``--runner`` (``DataflowRunner``, ``FlinkRunner``, ...) with its own
  options (``--project``, ``--region``, ``--temp_location``, ...), passed through untouched.
  """
  args = list(pipeline_args or [])
  joined = " ".join(args)
  if "--runner" not in joined:
    args.append("--runner=DirectRunner")
  runner = next((a.split("=", 1)[1] for a in args if a.startswith("--runner=")), "DirectRunner")
  if "DirectRunner" in runner:
    if "--direct_num_workers" not in joined:
      args.append("--direct_num_workers=1")
    if "--direct_running_mode" not in joined:
      args.append("--direct_running_mode=in_memory")
  return PipelineOptions(args)


def _is_remote(path: str) -> bool:
  return "://" in path


def remove_tree(path: str) -> None:
  if _is_remote(path):
    if tf.io.gfile.exists(path):
      tf.io.gfile.rmtree(path)
  elif os.path.isdir(path):
    shutil.rmtree(path, ignore_errors=True)
  elif os.path.exists(path):
    os.remove(path)


@contextlib.contextmanager
def atomic_output_dir(output_dir: str):
  """Yields a fresh temporary directory that replaces ``output_dir`` when the block succeeds.

  Example::

    with atomic_output_dir("/data/blocks") as tmp:
      run_pipeline(output=tmp)       # an exception here leaves /data/blocks untouched
      write_json(tmp + "/manifest.json", {...})
  """
  output_dir = output_dir.rstrip("/")
  parent = os.path.dirname(output_dir)
  if parent:
    tf.io.gfile.makedirs(parent)
  tmp = f"{output_dir}.tmp-{uuid.uuid4().hex[:8]}"
  tf.io.gfile.makedirs(tmp)
  try:
    yield tmp
  except BaseException:
    remove_tree(tmp)
    raise
  _commit(tmp, output_dir)


def _commit(tmp: str, final: str) -> None:
  old = None
  if tf.io.gfile.exists(final):
    old = f"{final}.old-{uuid.uuid4().hex[:8]}"
    if _is_remote(final):
      remove_tree(final)
      old = None
    else:
      os.rename(final, old)
  if _is_remote(final):
    # No atomic directory rename on object stores: copy, manifest last.
    files = [f for f in tf.io.gfile.listdir(tmp) if f != MANIFEST]
    tf.io.gfile.makedirs(final)
    for name in files + ([MANIFEST] if tf.io.gfile.exists(f"{tmp}/{MANIFEST}") else []):
      tf.io.gfile.copy(f"{tmp}/{name}", f"{final}/{name}", overwrite=True)
    remove_tree(tmp)
  else:
    os.rename(tmp, final)
  if old:
    remove_tree(old)


def write_json(path: str, obj) -> None:
  """Writes JSON atomically (temp file + rename)."""
  tmp = f"{path}.tmp-{uuid.uuid4().hex[:6]}"
  with tf.io.gfile.GFile(tmp, "w") as f:
    f.write(json.dumps(obj, indent=2, sort_keys=True) + "\n")
  tf.io.gfile.rename(tmp, path, overwrite=True)


# ---------------------------------------------------------------------------------------------
# Statistics: DoFns emit short event names to a tagged output ("kept", "skip:malformed_json");
# CollectStats counts them and writes one JSON file that the driver folds into the manifest.

STATS_TAG = "stats"


def count_event(name: str, n: int = 1):
  """A tagged output element that adds ``n`` to the counter ``name`` (also a Beam metric)."""
  beam.metrics.Metrics.counter("data_prep", name).inc(n)
  return beam.pvalue.TaggedOutput(STATS_TAG, (name, n))


class CollectStats(beam.PTransform):
  """``(name, n)`` pairs from several PCollections + extra ``{key: value}`` singletons -> one
  JSON file ``<directory>/_stats.json`` of ``{"counts": {...}, **extras}``."""

  def __init__(self, directory: str, extras: Optional[Dict[str, beam.PCollection]] = None):
    super().__init__()
    self._directory = directory
    self._extras = extras or {}

  def expand(self, event_pcolls):
    counts = (
        event_pcolls
        | "FlattenEvents" >> beam.Flatten()
        | "SumEvents" >> beam.CombinePerKey(sum)
        | "EventsToList" >> beam.combiners.ToList())
    side = {k: beam.pvalue.AsSingleton(v) for k, v in self._extras.items()}

    def to_json(count_list, **extras):
      out = {"counts": dict(sorted(count_list))}
      out.update(extras)
      return json.dumps(out, sort_keys=True)

    return (
        counts
        | "StatsToJson" >> beam.Map(to_json, **side)
        | "WriteStats" >> beam.io.WriteToText(
            os.path.join(self._directory, STATS_FILE), shard_name_template="", num_shards=1))


def pop_stats(directory: str) -> Dict:
  """Reads and deletes ``_stats.json`` written by :class:`CollectStats`."""
  path = os.path.join(directory, STATS_FILE)
  with tf.io.gfile.GFile(path, "r") as f:
    stats = json.loads(f.read().strip())
  tf.io.gfile.remove(path)
  return stats


def run_pipeline(build_fn, pipeline_args: Optional[Sequence[str]], name: str) -> None:
  """Builds a pipeline with ``build_fn(p)``, runs it to completion and logs the time taken."""
  options = make_pipeline_options(pipeline_args)
  start = time.time()
  runner_name = options.get_all_options()["runner"]
  logging.info("%s: starting pipeline (%s)", name, runner_name)
  runner = None
  if runner_name in ("DirectRunner", "FnApiRunner"):
    # The DirectRunner first tries the Prism runner, which it downloads from GitHub (slow, and
    # impossible offline), then falls back to the FnApiRunner for batch pipelines like ours; we
    # go to the FnApiRunner directly. Other runners (Dataflow, Flink, Spark, Prism) are used as
    # given.
    runner = fn_runner.FnApiRunner()
  with beam.Pipeline(runner=runner, options=options) as p:
    build_fn(p)
  logging.info("%s: pipeline done in %.1f s", name, time.time() - start)


class ProgressLogger:
  """Logs ``what`` every ``every`` items with a rate, from inside a DoFn (one per worker)."""

  def __init__(self, what: str, every: int = 10000):
    self.what, self.every = what, every
    self.n, self.start, self._next = 0, time.time(), every

  def add(self, n: int = 1) -> None:
    self.n += n
    if self.n >= self._next:
      rate = self.n / max(time.time() - self.start, 1e-9)
      logging.info("data_prep: %d %s (%.0f/s on this worker)", self.n, self.what, rate)
      self._next += self.every


def iter_lines_checked(path: str) -> Iterable:
  """Yields ``(line_number, raw_bytes)`` of a local or remote text file; missing -> error."""
  if not tf.io.gfile.exists(path):
    raise FileNotFoundError(f"input file not found: {path}")
  opener = tf.io.gfile.GFile if _is_remote(path) else open
  with opener(path, "rb") as f:
    for i, line in enumerate(f, start=1):
      yield i, line


# ---------------------------------------------------------------------------------------------
# TFRecord shards written with TensorFlow's own writer.
#
# Beam's WriteToTFRecord needs a crc32c package (google-crc32c, crcmod or python-snappy) that is
# not among our dependencies; TensorFlow already has a fast native TFRecord writer, so shards are
# grouped by a stable hash and each group is written by tf.io.TFRecordWriter. The writes land in
# the temporary output directory, so a retried bundle simply rewrites its shard.

def _stable_hash(key) -> int:
  return int.from_bytes(hashlib.sha1(repr(key).encode("utf-8")).digest()[:8], "big")


class WriteTFRecordShards(beam.PTransform):
  """``(sort_key, serialized_bytes)`` -> ``<prefix>-SSSSS-of-NNNNN<suffix>`` TFRecord files.

  ``num_shards=0`` picks ``ceil(count / records_per_shard)`` shards from the element count.
  Within a shard, records are sorted by ``sort_key``. Returns a PCollection with the number of
  records written per shard. Missing shards (possible with very few records) are created empty
  by :func:`fill_missing_shards`, which the pipelines call before committing.
  """

  def __init__(self, prefix: str, suffix: str = ".tfrecord", num_shards: int = 0,
               records_per_shard: int = 50000):
    super().__init__()
    self._prefix, self._suffix = prefix, suffix
    self._num_shards, self._per_shard = num_shards, records_per_shard

  def expand(self, pcoll):
    fixed, per_shard = self._num_shards, self._per_shard

    def n_shards(count):
      if fixed > 0:
        return fixed
      return max(1, min(4096, -(-count // per_shard)))

    num = (pcoll | "Count" >> beam.combiners.Count.Globally() | "NumShards" >> beam.Map(n_shards))
    prefix, suffix = self._prefix, self._suffix

    def write(kv, num_shards):
      index, items = kv
      items = sorted(items, key=lambda kv: kv[0])
      path = manifests.shard_name(prefix, index, num_shards, suffix)
      with tf.io.TFRecordWriter(path) as writer:
        for _, record in items:
          writer.write(record)
      beam.metrics.Metrics.counter("data_prep", "records_written").inc(len(items))
      return len(items)

    return (pcoll
            | "ShardKey" >> beam.Map(lambda kv, n: (_stable_hash(kv[0]) % n, kv),
                                     n=beam.pvalue.AsSingleton(num))
            | "GroupShards" >> beam.GroupByKey()
            | "WriteShards" >> beam.Map(write, num_shards=beam.pvalue.AsSingleton(num)))


def fill_missing_shards(directory: str, prefix: str, suffix: str = ".tfrecord") -> List[str]:
  """Creates empty files for the shard indices a sharded write left out; returns all shards.

  With no shard at all, writes ``<prefix>-00000-of-00001<suffix>`` (an empty split).
  """
  pattern = re.compile(re.escape(prefix) + r"-(\d{5})-of-(\d{5})" + re.escape(suffix) + "$")
  found = [pattern.match(f) for f in tf.io.gfile.listdir(directory)]
  found = [m for m in found if m]
  totals = {int(m.group(2)) for m in found}
  if len(totals) > 1:
    raise AssertionError(f"{directory}: {prefix} shards disagree on the shard count {totals}")
  total = totals.pop() if totals else 1
  have = {int(m.group(1)) for m in found}
  for i in range(total):
    if i not in have:
      with tf.io.TFRecordWriter(
          manifests.shard_name(os.path.join(directory, prefix), i, total, suffix)):
        pass
  return manifests.shard_files(directory, prefix, suffix)


def _read_tfrecord_file(path: str):
  for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
    yield record


class ReadTFRecordFiles(beam.PTransform):
  """Serialized records of TFRecord files, read with TensorFlow's reader (see above).

  ``files``: e.g. ``manifests.block_shard_files(blocks_dir)``.
  """

  def __init__(self, files: Sequence[str]):
    super().__init__()
    self._files = list(files)

  def expand(self, pbegin):
    if not self._files:
      raise ValueError("ReadTFRecordFiles needs at least one file")
    return (pbegin | "Files" >> beam.Create(self._files)
            | "Read" >> beam.FlatMap(_read_tfrecord_file).with_output_types(bytes)
            | "Distribute" >> beam.Reshuffle())
