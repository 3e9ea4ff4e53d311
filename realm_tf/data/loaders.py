"""The tasks' input pipelines, with per-replica batching and sharding in one place.

Every task's ``build_inputs`` goes through a data loader registered here for its data config
class (``get_loader(params, ...).load(input_context)``), and every loader ends in
:func:`distribute`: shard by input pipeline, shuffle and repeat when training, batch to the
per-replica batch size. Example::

    loader = loaders.get_loader(task_config.train_data, query_seq_length=32,
                                block_seq_length=64)
    dataset = loader.load(input_context)   # batches of parsed ICT examples
"""

import logging
import os
from typing import Callable, Dict, Optional, Type

import numpy as np
import tensorflow as tf

from realm_tf import configs
from realm_tf import errors
from realm_tf.data import features
from realm_tf.data import manifests

_LOADERS: Dict[type, Type] = {}


class InputError(errors.RealmError, ValueError):
  """Examples that do not fit the model config or the corpus."""


def register_loader(config_cls: type) -> Callable[[Type], Type]:
  """Class decorator: the loader of data configs of class ``config_cls``."""
  def register(loader_cls):
    _LOADERS[config_cls] = loader_cls
    return loader_cls
  return register


def get_loader(params, **kwargs):
  """The registered loader of ``params`` (a data config), built with ``kwargs``."""
  try:
    loader_cls = _LOADERS[type(params)]
  except KeyError:
    raise configs.ConfigError(f"no data loader is registered for {type(params).__name__}; "
                              f"registered: {sorted(c.__name__ for c in _LOADERS)}") from None
  return loader_cls(params, **kwargs)


def per_replica_batch_size(global_batch_size: int,
                           input_context: Optional[tf.distribute.InputContext]) -> int:
  if input_context is None:
    return global_batch_size
  return input_context.get_per_replica_batch_size(global_batch_size)


def distribute(dataset: tf.data.Dataset, params,
               input_context: Optional[tf.distribute.InputContext] = None,
               shuffle_buffer_size: Optional[int] = None) -> tf.data.Dataset:
  """Shards by input pipeline; shuffles and repeats when training; batches per replica.

  Args:
    dataset: unbatched records or examples.
    params: a data config (``global_batch_size``, ``is_training``, ``shuffle_buffer_size``,
      ``seed``, ``drop_remainder``).
    input_context: the ``tf.distribute.InputContext`` (None: one pipeline, one replica).
    shuffle_buffer_size: overrides ``params.shuffle_buffer_size``.

  Training batches always have the full per-replica size (static shapes for XLA/TPU).
  """
  if input_context and input_context.num_input_pipelines > 1:
    dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
  if params.is_training:
    dataset = dataset.shuffle(shuffle_buffer_size or params.shuffle_buffer_size,
                              seed=params.seed).repeat()
  return dataset.batch(per_replica_batch_size(params.global_batch_size, input_context),
                       drop_remainder=params.is_training or params.drop_remainder)


def record_files(pattern) -> list:
  """The files of ``pattern`` (a glob or a list of globs); InputError when there are none."""
  patterns = [pattern] if isinstance(pattern, str) else list(pattern)
  files = sorted(f for p in patterns if p for f in tf.io.gfile.glob(p))
  if not files:
    raise InputError(f"no examples match {pattern}")
  return files


def check_query_length(files, query_seq_length: int) -> None:
  """Refuses masked examples of another query length (read off the first record)."""
  for record in tf.data.TFRecordDataset(files[:1]).take(1):
    n = len(tf.train.Example.FromString(record.numpy()).features.feature["query_ids"]
            .int64_list.value)
    if n != query_seq_length:
      raise InputError(f"{files[0]}: masked examples have query length {n} but the model's "
                       f"query_seq_length is {query_seq_length}")


@register_loader(configs.IctDataConfig)
class IctLoader:
  """Batches of ICT examples, drawn afresh at each read of a block as ORQA does.

  The files hold one record per block (the ICT examples pipeline); every batch read draws,
  for each of its blocks, one sentence as the query and a fresh removal coin
  (``features.sample_ict_examples``). The draws are stateless, seeded by ``(params.seed or 0,
  batch number)`` (the batch number counts the batches this input pipeline has read, after
  shuffling and repeating), so a run is reproducible for a fixed seed and validation, read in
  order, draws the same pairs at every pass. ``remove_prob`` defaults to the manifest's (the
  pipeline's ``--remove_prob``), and the ``[CLS]``/``[SEP]`` ids are the manifest's too.

  Args:
    params: the data config.
    query_seq_length: query length (the model's).
    block_seq_length: block length (the model's).
    remove_prob: overrides the manifest's ``remove_prob``.
    mask_id: the ``[MASK]`` id, needed when ``params.query_mask_prob`` > 0 (queries with a
      masked span, ``features.mask_query_spans``).

  Raises:
    InputError: no files, directories of another ICT format (e.g. the older fixed pairs; the
      message says to rebuild them), blocks written shorter than ``block_seq_length``, or
      directories that disagree on the special ids or on
      ``remove_prob`` (unless given).
  """

  def __init__(self, params: configs.IctDataConfig, query_seq_length: int,
               block_seq_length: int, remove_prob: Optional[float] = None,
               mask_id: Optional[int] = None):
    self.params = params
    if params.query_mask_prob > 0 and mask_id is None:
      raise InputError("ICT with query_mask_prob > 0 needs the vocabulary's [MASK] id")
    self.masking = dict(query_mask_prob=params.query_mask_prob, mask_id=mask_id or -1,
                        max_mask_span=params.query_mask_span)
    self.lengths = dict(query_seq_length=query_seq_length, block_seq_length=block_seq_length)
    self.files = record_files(params.input_path)
    found = []
    for directory in sorted({os.path.dirname(f) for f in self.files}):
      try:
        found.append(manifests.load_ict_manifest(directory))
      except manifests.DataError as e:
        raise InputError(str(e)) from None
      written = found[-1].get("block_seq_length", block_seq_length)
      if block_seq_length > written:
        # Sentences past the written length were dropped: a longer block would not be whole.
        raise InputError(f"the ICT blocks in {directory} were written for block_seq_length="
                         f"{written} but the model's is {block_seq_length}; rebuild them with "
                         f"python -m data_prep.ict_examples --block_seq_length={block_seq_length}")
    special_ids = {(m["cls_id"], m["sep_id"]) for m in found}
    probs = {m["remove_prob"] for m in found}
    if len(special_ids) > 1 or (remove_prob is None and len(probs) > 1):
      raise InputError(f"the ICT directories of {params.input_path} differ in (cls_id, sep_id) "
                       f"{sorted(special_ids)} or remove_prob {sorted(probs)}")
    (self.cls_id, self.sep_id), = special_ids
    self.remove_prob = float(probs.pop() if remove_prob is None else remove_prob)

  def serialized(self, input_context=None) -> tf.data.Dataset:
    """Batches of serialized block records (sharded, shuffled and repeated when training)."""
    return distribute(tf.data.TFRecordDataset(self.files), self.params, input_context)

  def load(self, input_context=None) -> tf.data.Dataset:
    """Batches of sampled examples (``features.ict_features``, int32)."""
    pipelines = input_context.num_input_pipelines if input_context else 1
    pipeline_id = input_context.input_pipeline_id if input_context else 0
    base_seed = tf.constant(self.params.seed or 0, tf.int64)

    def sample(batch_number, serialized):
      # Input pipelines read different blocks; their seeds differ too.
      seed = tf.stack([base_seed, batch_number * pipelines + pipeline_id])
      return features.sample_ict_examples(
          features.parse_ict_example(serialized), seed, remove_prob=self.remove_prob,
          cls_id=self.cls_id, sep_id=self.sep_id, **self.lengths, **self.masking)

    return self.serialized(input_context).enumerate().map(
        sample, num_parallel_calls=tf.data.AUTOTUNE).prefetch(2)


@register_loader(configs.MaskedLmDataConfig)
class MaskedExamplesLoader:
  """Batches of parsed masked-sentence examples (the pre-training examples pipeline), host
  features (``source_uid``, ``answer``, ``sentence``) included.

  When training with ``params.resample_masks``, every read of a sentence draws one of its
  masking variants (``features.choose_pretrain_variant``, seeded by ``params.seed`` and the
  batch's position in the stream); otherwise, and in :meth:`read_all`, the fixed masking.
  Either way the batches have the keys, shapes and dtypes of ``features.parse_pretrain_example``.
  """

  def __init__(self, params, query_seq_length: int, max_masks: int, input_path=None):
    self.params = params
    self.query_seq_length, self.max_masks = query_seq_length, max_masks
    input_path = input_path or params.input_path
    self.files = record_files(input_path)
    check_query_length(self.files, query_seq_length)
    logging.info("reading %d example files from %s", len(self.files), input_path)

  def load(self, input_context=None) -> tf.data.Dataset:
    records = distribute(tf.data.TFRecordDataset(self.files), self.params, input_context)
    if not (self.params.is_training and getattr(self.params, "resample_masks", False)):
      return records.map(
          lambda r: features.parse_pretrain_example(r, self.query_seq_length, self.max_masks))
    seed = tf.constant(self.params.seed or 0, tf.int64)
    pipelines = input_context.num_input_pipelines if input_context else 1
    pipeline = input_context.input_pipeline_id if input_context else 0

    def choose(step, serialized):
      parsed = features.parse_pretrain_example(serialized, self.query_seq_length, self.max_masks,
                                               with_variants=True)
      # A seed per batch of the (repeated) stream: each read of a sentence draws afresh.
      return features.choose_pretrain_variant(parsed, tf.stack([seed, step * pipelines + pipeline]))

    return records.enumerate().map(choose)

  def read_all(self) -> Dict:
    """Every example of the files as NumPy arrays (for host-side preprocessing)."""
    dataset = tf.data.TFRecordDataset(self.files).batch(4096).map(
        lambda r: features.parse_pretrain_example(r, self.query_seq_length, self.max_masks))
    batches = list(dataset.as_numpy_iterator())
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
