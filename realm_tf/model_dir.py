"""The model-directory contract shared by the converter, the trainers and the refresher.

A model directory holds:

* ``model_config.yaml``: the ``RealmModelConfig`` (its ``vocab_file`` is ``vocab.txt``);
* ``vocab.txt``: the WordPiece vocabulary the towers were trained with;
* ``block_tower.json`` (a fine-tuned Open-QA model): the block tower its query tower was
  fine-tuned against (:func:`write_block_tower`), which ``realm-serve`` pins;
* ``validation_hits.jsonl`` (REALM pre-training): each validation pass's per-sentence and
  per-question hits (:func:`append_validation_hits`), so that two runs can be paired;
* TF2 checkpoints ``ckpt-<step>`` of a ``tf.train.Checkpoint`` whose top-level items are
  ``query_embedder``, ``block_embedder`` (the same object when embedders are shared),
  ``reader`` and, for trainers, ``optimizer`` and ``global_step``. Any item may be absent;
  readers restore only the items they need.
"""

import collections
import json
import os
from typing import Dict, List, Optional, Tuple

import tensorflow as tf
from official.modeling import hyperparams

from realm_tf import configs
from realm_tf import errors
from realm_tf import tokenization

CONFIG_NAME = "model_config.yaml"
VOCAB_NAME = "vocab.txt"
TRAINING_DONE = "TRAINING_DONE"
BLOCK_TOWER_NAME = "block_tower.json"
VALIDATION_HITS_NAME = "validation_hits.jsonl"


class ModelDirError(errors.RealmError, ValueError):
  """A model directory or checkpoint that is missing or does not fit."""


def write_metadata(model_dir: str, model_config: configs.RealmModelConfig,
                   vocab_file: str) -> None:
  """Writes ``model_config.yaml`` and a copy of the vocabulary into ``model_dir``.

  Raises ConfigError when the vocabulary's size differs from the towers' ``vocab_size``.
  """
  size = len(tokenization.load_vocab(vocab_file))
  for name, encoder in (("retriever", model_config.retriever.encoder),
                        ("reader", model_config.reader.encoder)):
    if encoder.vocab_size != size:
      raise configs.ConfigError(
          f"{vocab_file} has {size} tokens but the {name}'s encoder.vocab_size is "
          f"{encoder.vocab_size}; override it (e.g. "
          f"task.model.{name}.encoder.vocab_size={size})")
  tf.io.gfile.makedirs(model_dir)
  target = os.path.join(model_dir, VOCAB_NAME)
  if os.path.abspath(vocab_file) != os.path.abspath(target):
    tf.io.gfile.copy(vocab_file, target, overwrite=True)
  config = configs.RealmModelConfig(model_config.as_dict())
  config.override({"vocab_file": VOCAB_NAME})
  hyperparams.save_params_dict_to_yaml(config, os.path.join(model_dir, CONFIG_NAME))


def load_config(model_dir: str) -> configs.RealmModelConfig:
  """The model config of ``model_dir``, its vocab path made absolute."""
  path = os.path.join(model_dir, CONFIG_NAME)
  if not tf.io.gfile.exists(path):
    raise ModelDirError(f"{model_dir} is not a realm_tf model directory: no {CONFIG_NAME} "
                        "(convert a TF1 checkpoint with realm-convert or train one)")
  config = configs.RealmModelConfig()
  config.override(hyperparams.read_yaml_to_params_dict(path).as_dict(), is_strict=True)
  if config.vocab_file and not os.path.isabs(config.vocab_file):
    config.override({"vocab_file": os.path.join(model_dir, config.vocab_file)})
  return config


def latest_checkpoint(model_dir: str) -> str:
  """The newest ``ckpt-N`` in ``model_dir``, or ModelDirError."""
  if not tf.io.gfile.isdir(model_dir):
    raise ModelDirError(f"model directory not found: {model_dir}")
  path = tf.train.latest_checkpoint(model_dir)
  if path is None:
    raise ModelDirError(f"no checkpoint in {model_dir}")
  return path


def resolve_checkpoint(path: str) -> str:
  """A model directory (its newest checkpoint) or a checkpoint prefix -> a checkpoint prefix."""
  return latest_checkpoint(path) if tf.io.gfile.isdir(path) else path


def checkpoint_step(path: str) -> int:
  """``.../ckpt-1200`` -> 1200."""
  return int(path.rsplit("-", 1)[-1])


def trained_step(path: str) -> int:
  """The training step a checkpoint was saved at: its ``global_step`` variable when it has one
  (``best_ckpt/best_ckpt-N``'s N counts exports, not steps), else the number in its name."""
  try:
    return int(tf.train.load_checkpoint(path).get_tensor(
        "global_step/.ATTRIBUTES/VARIABLE_VALUE"))
  except (tf.errors.NotFoundError, ValueError):  # No such variable (e.g. a converted model).
    return checkpoint_step(path)


_VALUE = "/.ATTRIBUTES/VARIABLE_VALUE"


def checkpoint_keys(name: str, obj) -> List[str]:
  """The keys under which ``tf.train.Checkpoint(name=obj)`` writes ``obj``'s variables: its
  object graph walked breadth first, as the checkpoint writer walks it (a shared object is
  written once, under the first path that reaches it; ``.`` and ``/`` in a child's name are
  escaped as ``..`` and ``.S``)."""
  keys, seen = [], set()
  queue = collections.deque([(name, obj)])
  while queue:
    path, node = queue.popleft()
    if id(node) in seen:
      continue
    seen.add(id(node))
    if isinstance(node, tf.Variable):
      keys.append(path + _VALUE)
      continue
    for child, value in tf.train.TrackableView.children(node).items():
      queue.append((f"{path}/{child.replace('.', '..').replace('/', '.S')}", value))
  return keys


def restore(checkpoint_path: str, allow_missing: bool = False, part: bool = False,
            **items) -> None:
  """Restores exactly ``items`` (e.g. ``block_embedder=model``) from a checkpoint.

  Anything else in the checkpoint (other items, the optimizer) is ignored. Unless
  ``allow_missing``, raises ModelDirError when a variable of ``items`` is not in the
  checkpoint, or (unless ``part``: each item is a part of what the checkpoint holds under its
  name) when the checkpoint holds a variable under an item that the item does not have
  (another model size, an extra head), naming them; a shape mismatch always raises.
  """
  items = {k: v for k, v in items.items() if v is not None}
  try:
    # expect_partial: the checkpoint's other items are not wanted; exactness is checked just
    # below (assert_existing_objects_matched) and after (unused variables).
    status = tf.train.Checkpoint(**items).read(checkpoint_path).expect_partial()
    if not allow_missing:
      status.assert_existing_objects_matched()
  except (AssertionError, ValueError, tf.errors.OpError) as e:
    first = str(e).strip().splitlines()[0][:400]
    raise ModelDirError(f"checkpoint {checkpoint_path} does not fit the model "
                        f"({', '.join(items)}): {_missing_names(checkpoint_path, items)}"
                        f"{first}") from None
  if allow_missing or part:
    return
  stored = tf.train.load_checkpoint(checkpoint_path).get_variable_to_shape_map()
  for name, obj in items.items():
    expected = set(checkpoint_keys(name, obj))
    unused = sorted(k for k in stored if k.startswith(name + "/") and k.endswith(_VALUE)
                    and "/.OPTIMIZER_SLOT/" not in k and k not in expected)
    if unused:
      raise ModelDirError(
          f"checkpoint {checkpoint_path} holds {len(unused)} variable(s) of {name} that the "
          f"model does not have, e.g. {', '.join(k[:-len(_VALUE)] for k in unused[:3])}: it "
          "was written by another model (size, layers or heads); check model_config.yaml")


def _missing_names(checkpoint_path: str, items) -> str:
  """``"lacks reader/span_scorer/dense/kernel, ...; "``: the items' variables the checkpoint
  does not hold under their own paths ("" when none, or when it cannot tell)."""
  try:
    stored = tf.train.load_checkpoint(checkpoint_path).get_variable_to_shape_map()
  except (ValueError, tf.errors.OpError):
    return ""
  missing = [k[:-len(_VALUE)] for name, obj in items.items()
             for k in checkpoint_keys(name, obj) if k not in stored]
  if not missing:
    return ""
  return f"it lacks {len(missing)} variable(s), e.g. {', '.join(missing[:3])}; "


def make_checkpoint(query_embedder=None, block_embedder=None, reader=None,
                    **extra) -> tf.train.Checkpoint:
  """A ``tf.train.Checkpoint`` over the given items, in the contract's names."""
  items = dict(query_embedder=query_embedder, block_embedder=block_embedder, reader=reader,
               **extra)
  return tf.train.Checkpoint(**{k: v for k, v in items.items() if v is not None})


def training_done(model_dir: str) -> bool:
  return tf.io.gfile.exists(os.path.join(model_dir, TRAINING_DONE))


def mark_training_done(model_dir: str, step: Optional[int] = None) -> None:
  with tf.io.gfile.GFile(os.path.join(model_dir, TRAINING_DONE), "w") as f:
    f.write(f"{step if step is not None else ''}\n")


def write_block_tower(model_dir: str, record: Dict) -> None:
  """Writes ``model_dir/block_tower.json``: which block tower embedded the index the model's
  query tower was fine-tuned against. ``record``: ``{"fingerprint": <the index's
  publication.handle.block_tower_id>, "index": <its directory's name>}``, or ``{"own": True}``
  for a model that trains its own block tower (an index of the served checkpoint's tower is
  the right one)."""
  tf.io.gfile.makedirs(model_dir)
  path = os.path.join(model_dir, BLOCK_TOWER_NAME)
  with tf.io.gfile.GFile(path + ".tmp", "w") as f:
    f.write(json.dumps(record, indent=1, sort_keys=True) + "\n")
  tf.io.gfile.rename(path + ".tmp", path, overwrite=True)


def read_block_tower(model_dir: str) -> Optional[Dict]:
  """``model_dir/block_tower.json`` (:func:`write_block_tower`), or None for a model directory
  that has none (not fine-tuned for Open-QA, or before it was recorded); ModelDirError when it
  cannot be read."""
  path = os.path.join(model_dir, BLOCK_TOWER_NAME)
  if not tf.io.gfile.exists(path):
    return None
  try:
    with tf.io.gfile.GFile(path) as f:
      record = json.loads(f.read())
  except (ValueError, tf.errors.OpError) as e:
    raise ModelDirError(f"cannot read {path} ({e}): delete it to serve the model with the "
                        "block tower of the index it starts with") from None
  if not isinstance(record, dict) or not (record.get("own") or record.get("fingerprint")):
    raise ModelDirError(f"{path} names no block tower: delete it to serve the model with the "
                        "block tower of the index it starts with")
  return record


def append_validation_hits(model_dir: str, record: Dict) -> None:
  """Appends one validation pass's ``record`` to ``model_dir/validation_hits.jsonl``:
  ``{"step", "k", "held_out": "0110..."}`` (a sentence's top k blocks, its own skipped, hold its
  answer; in the held-out files' order) and, with a QA file, ``"qa"`` (the same per question, in
  the file's order), ``"qa_file"`` and ``"qa_sha256"`` (of its bytes: pair two runs only where
  they agree)."""
  tf.io.gfile.makedirs(model_dir)
  path = os.path.join(model_dir, VALIDATION_HITS_NAME)
  old = ""
  if tf.io.gfile.exists(path):
    with tf.io.gfile.GFile(path) as f:
      old = f.read()
  with tf.io.gfile.GFile(path + ".tmp", "w") as f:
    f.write(old + json.dumps(record, sort_keys=True) + "\n")
  tf.io.gfile.rename(path + ".tmp", path, overwrite=True)


def read_validation_hits(model_dir: str) -> Dict[int, Dict]:
  """``{step: record}`` of :func:`append_validation_hits` (its hits as stored, "0"/"1" strings:
  ``experiments/pipeline/paired.py`` pairs them); a step validated twice (a resumed run) keeps
  its last pass. Empty when the file is absent."""
  path = os.path.join(model_dir, VALIDATION_HITS_NAME)
  if not tf.io.gfile.exists(path):
    return {}
  out = {}
  with tf.io.gfile.GFile(path) as f:
    for n, line in enumerate(f, 1):
      try:
        record = json.loads(line)
        step = int(record["step"])
      except (ValueError, KeyError, TypeError) as e:
        raise ModelDirError(f"{path}, line {n}: not a validation record ({e})") from None
      out[step] = record
  return out


def read_summaries(model_dir: str, subdir: str = "train") -> Dict[str, List[Tuple[int, float]]]:
  """``{tag: [(step, value)]}``, sorted by step, of the scalars a trainer wrote to
  ``model_dir/subdir`` (``train`` or ``validation``)."""
  curves: Dict[str, List[Tuple[int, float]]] = {}
  for path in sorted(tf.io.gfile.glob(os.path.join(model_dir, subdir, "events.*"))):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        number = (float(tf.make_ndarray(value.tensor)) if value.HasField("tensor")
                  else value.simple_value)
        curves.setdefault(value.tag, []).append((int(event.step), number))
  return {k: sorted(v) for k, v in curves.items()}
