"""Converts the TF1 checkpoints that Google released (BERT, REALM, ORQA) to realm_tf model dirs.

Known layouts (the variable names are those of DESIGN.md, "Released checkpoints"):

* ``bert``: google-research BERT or the REALM knowledge-augmented encoder: ``bert/...`` and
  ``cls/predictions/...``. Fills the reader (BERT + MLM head). When no embedder checkpoint is
  converted with it, it also initializes the retriever's BERT (the projection stays random),
  which is how REALM's ICT warm start begins.
* ``realm_embedder``: the REALM retriever (TF-Hub module variables): BERT under
  ``module/module/module/bert/``, projection under ``module/module/{dense,LayerNorm}/``.
  Fills the shared query/block embedder.
* ``orqa``: Open-QA fine-tuned from REALM: query tower under
  ``module/module/module/module/bert/`` + ``module/module/module/{dense,LayerNorm}/``, reader
  BERT under ``reader/module/bert/`` (MLM head ``reader/module/cls/``) and span scorer
  ``reader/{dense,dense_1,layer_normalization}/``. Block embeddings (``block_emb``,
  ``[num_blocks, 128]``, row ``i`` = record ``i`` of the released ``blocks.tfr``) are written to
  ``block_emb.npy`` when a checkpoint holding them is given; ``realm-index import`` turns the
  released blocks into a blocks directory and ``realm-index build --embeddings_file`` indexes
  them.

The BERT name mapping builds on Model Garden's TF1 converter table
(``tf1_bert_checkpoint_converter_lib.BERT_V2_NAME_REPLACEMENTS``); tensors are reshaped to the
Keras variables' shapes (attention kernels and biases are split into heads).
"""

import json
import logging
import os
from typing import Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf
from official.nlp.tools import tf1_bert_checkpoint_converter_lib as tf1_lib

from realm_tf import configs
from realm_tf import model_dir as model_dir_lib
from realm_tf import modeling

# Optimizer slots and counters that are never model weights.
SKIP_PATTERNS = ("adam_m", "adam_v", "AdamWeightDecayOptimizer", "global_step",
                 "beta1_power", "beta2_power", "/Adam", "cls/seq_relationship",
                 "good_steps", "loss_scale")

# Where convert() writes the block embeddings of a block_emb checkpoint, in the model directory.
BLOCK_EMB_NAME = "block_emb.npy"
BLOCK_EMB_VARIABLE = "block_emb"

LAYOUTS = {
    "bert": dict(reader_bert="bert/", reader_mlm="cls/predictions/"),
    "realm_embedder": dict(embedder_bert="module/module/module/bert/",
                           embedder_proj="module/module/"),
    "orqa": dict(embedder_bert="module/module/module/module/bert/",
                 embedder_proj="module/module/module/",
                 reader_bert="reader/module/bert/",
                 reader_mlm="reader/module/cls/predictions/",
                 reader_span="reader/"),
}


class ConversionError(ValueError):
  """A TF1 checkpoint that does not fit the model its bert_config describes."""


def read_bert_config(path: str) -> Dict:
  if not tf.io.gfile.exists(path):
    raise ConversionError(f"bert config not found: {path}")
  with tf.io.gfile.GFile(path) as f:
    try:
      return json.load(f)
    except json.JSONDecodeError as e:
      raise ConversionError(f"{path} is not valid JSON: {e}") from None


def encoder_config_from_bert_json(bert: Dict):
  """google-research ``bert_config.json`` -> Model Garden ``BertEncoderConfig``."""
  c = configs.bert_base(bert["vocab_size"])
  c.override(dict(
      hidden_size=bert["hidden_size"], num_layers=bert["num_hidden_layers"],
      num_attention_heads=bert["num_attention_heads"],
      intermediate_size=bert["intermediate_size"],
      hidden_activation=bert.get("hidden_act", "gelu"),
      dropout_rate=bert.get("hidden_dropout_prob", 0.1),
      attention_dropout_rate=bert.get("attention_probs_dropout_prob", 0.1),
      max_position_embeddings=bert.get("max_position_embeddings", 512),
      type_vocab_size=bert.get("type_vocab_size", 2),
      initializer_range=bert.get("initializer_range", 0.02)))
  return c


def detect_layout(names: Sequence[str]) -> str:
  """Which released layout a checkpoint's variable names follow."""
  if any(n.startswith("module/module/module/module/bert/") for n in names):
    return "orqa"
  if any(n.startswith("module/module/module/bert/") for n in names):
    return "realm_embedder"
  if any(n.startswith("bert/") for n in names):
    return "bert"
  sample = ", ".join(sorted(names)[:3])
  raise ConversionError(f"unrecognized checkpoint layout (first variables: {sample}); "
                        f"expected one of {sorted(LAYOUTS)}")


def _rel(variable, anchor: str) -> str:
  """Keras variable name relative to ``anchor``: 'reader/cls/predictions/x:0' -> 'x'."""
  name = variable.name.split(":")[0]
  if anchor:
    name = name[name.index(anchor) + len(anchor):]
  return name


def _tf1_bert_to_keras(rel_name: str) -> str:
  name = "bert/" + rel_name
  for src, dst in tf1_lib.BERT_V2_NAME_REPLACEMENTS:
    if src in name:
      name = name.replace(src, dst)
  return name


def _targets(layout: str, query_embedder, reader) -> Dict[str, tf.Variable]:
  """Full TF1 name -> Keras variable for everything ``layout`` fills."""
  scopes = LAYOUTS[layout]
  out = {}
  for part, prefix in scopes.items():
    if part.endswith("_bert"):
      encoder = (query_embedder if part.startswith("embedder") else reader).encoder
      keras_vars = {_rel(v, encoder.name + "/"): v for v in encoder.variables}
      # Invert the mapping: enumerate the TF1 names the Keras variables correspond to.
      for tf1_rel in _tf1_bert_names(encoder):
        out[prefix + tf1_rel] = keras_vars[_tf1_bert_to_keras(tf1_rel)]
    elif part == "embedder_proj":
      out[prefix + "dense/kernel"] = query_embedder.projection.kernel
      out[prefix + "dense/bias"] = query_embedder.projection.bias
      out[prefix + "LayerNorm/gamma"] = query_embedder.layer_norm.gamma
      out[prefix + "LayerNorm/beta"] = query_embedder.layer_norm.beta
    elif part == "reader_mlm":
      for v in reader.masked_lm.variables:
        if "word_embeddings" in v.name:  # the tied table comes with the BERT part
          continue
        rel = _rel(v, "cls/predictions/")
        out[prefix + ("output_bias" if rel.startswith("output_bias") else rel)] = v
    elif part == "reader_span":
      s = reader.span_scorer
      for tf1, layer in (("dense", s.projection), ("dense_1", s.output_dense)):
        out[f"{prefix}{tf1}/kernel"] = layer.kernel
        out[f"{prefix}{tf1}/bias"] = layer.bias
      out[prefix + "layer_normalization/gamma"] = s.layer_norm.gamma
      out[prefix + "layer_normalization/beta"] = s.layer_norm.beta
  return out


def _tf1_bert_names(encoder) -> List[str]:
  """The TF1 BERT variable names (relative to ``bert/``) of a Keras ``BertEncoderV2``."""
  num_layers = len(encoder._transformer_layers)  # pylint: disable=protected-access
  names = ["embeddings/word_embeddings", "embeddings/token_type_embeddings",
           "embeddings/position_embeddings", "embeddings/LayerNorm/gamma",
           "embeddings/LayerNorm/beta", "pooler/dense/kernel", "pooler/dense/bias"]
  per_layer = ["attention/self/query/kernel", "attention/self/query/bias",
               "attention/self/key/kernel", "attention/self/key/bias",
               "attention/self/value/kernel", "attention/self/value/bias",
               "attention/output/dense/kernel", "attention/output/dense/bias",
               "attention/output/LayerNorm/gamma", "attention/output/LayerNorm/beta",
               "intermediate/dense/kernel", "intermediate/dense/bias",
               "output/dense/kernel", "output/dense/bias",
               "output/LayerNorm/gamma", "output/LayerNorm/beta"]
  for i in range(num_layers):
    names += [f"encoder/layer_{i}/{n}" for n in per_layer]
  return names


def _assign(targets: Dict[str, tf.Variable], reader, path: str, layout: str) -> None:
  shapes = reader.get_variable_to_shape_map()
  prefixes = tuple(LAYOUTS[layout].values())
  for name in sorted(shapes):
    if any(p in name for p in SKIP_PATTERNS) or name == "block_emb":
      continue
    if name.startswith(prefixes) and name not in targets:
      raise ConversionError(f"{path}: variable {name} {shapes[name]} has no place in the "
                            "model described by the bert config (more layers? another layout?)")
  for name, variable in targets.items():
    if name not in shapes:
      raise ConversionError(f"{path}: missing variable {name} (layout {layout!r}, "
                            f"expected shape {variable.shape.as_list()})")
    value = reader.get_tensor(name)
    if value.size != variable.shape.num_elements():
      raise ConversionError(f"{path}: variable {name} has shape {list(value.shape)} but the "
                            f"model expects {variable.shape.as_list()}")
    variable.assign(np.reshape(value, variable.shape).astype(np.float32))


def _open_block_emb(path: str, projection_size: int):
  """The checkpoint reader of a ``block_emb`` checkpoint, its variable checked to be
  ``[num_blocks, projection_size]``."""
  try:
    reader = tf.train.load_checkpoint(path)
  except (tf.errors.OpError, ValueError) as e:
    raise ConversionError(f"cannot read block_emb checkpoint {path}: "
                          f"{str(e).splitlines()[0]}") from None
  shapes = reader.get_variable_to_shape_map()
  if BLOCK_EMB_VARIABLE not in shapes:
    sample = ", ".join(sorted(shapes)[:3])
    raise ConversionError(f"{path} holds no variable {BLOCK_EMB_VARIABLE!r} (first "
                          f"variables: {sample})")
  shape = list(shapes[BLOCK_EMB_VARIABLE])
  if len(shape) != 2 or shape[1] != projection_size or shape[0] < 1:
    raise ConversionError(f"{path}: {BLOCK_EMB_VARIABLE} has shape {shape} but the model's "
                          f"embeddings are [num_blocks, {projection_size}]")
  return reader


def _save_block_emb(reader, output_dir: str) -> str:
  """Writes ``block_emb`` as float32 ``output_dir/block_emb.npy`` (temp file, then rename)."""
  path = os.path.join(output_dir, BLOCK_EMB_NAME)
  block_emb = np.asarray(reader.get_tensor(BLOCK_EMB_VARIABLE), np.float32)
  with tf.io.gfile.GFile(path + ".tmp", "wb") as f:
    np.save(f, block_emb)
  tf.io.gfile.rename(path + ".tmp", path, overwrite=True)
  return path


def convert(tf1_checkpoints: Sequence[str], bert_config_file: str, vocab_file: str,
            output_dir: str, lower_case: bool = True,
            block_emb_checkpoint: Optional[str] = None) -> str:
  """Converts one or more TF1 checkpoints into one realm_tf model directory.

  ``block_emb_checkpoint``: a checkpoint holding ``block_emb`` (ORQA's and REALM's block
  embeddings, ``[num_blocks, 128]``), written as ``output_dir/block_emb.npy``.

  Returns the path of the written TF2 checkpoint (``output_dir/ckpt-0``).
  """
  encoder_config = encoder_config_from_bert_json(read_bert_config(bert_config_file))
  readers = []
  for path in tf1_checkpoints:
    try:
      reader = tf.train.load_checkpoint(path)
    except (tf.errors.OpError, ValueError) as e:
      raise ConversionError(f"cannot read TF1 checkpoint {path}: "
                            f"{str(e).splitlines()[0]}") from None
    readers.append((path, reader, detect_layout(list(reader.get_variable_to_shape_map()))))
  layouts = [layout for _, _, layout in readers]
  if len(set(layouts)) != len(layouts):
    raise ConversionError(f"two checkpoints of the same layout given: {layouts}")

  model_config = configs.RealmModelConfig(
      retriever=configs.RetrieverConfig(encoder=encoder_config,
                                        share_embedders="orqa" not in layouts),
      reader=configs.ReaderConfig(encoder=encoder_config), vocab_file=vocab_file,
      lower_case=lower_case)
  block_emb = None
  if block_emb_checkpoint:
    block_emb = _open_block_emb(block_emb_checkpoint, model_config.retriever.projection_size)
  query_embedder, block_embedder = modeling.build_embedders(model_config.retriever)
  reader_model = modeling.build_reader(model_config.reader,
                                       with_span_scorer="orqa" in layouts)
  filled = set()
  for path, reader, layout in readers:
    _assign(_targets(layout, query_embedder, reader_model), reader, path, layout)
    filled.add("reader" if layout == "bert" else "embedder")
    if layout == "orqa":
      filled.add("reader")
    logging.info("converted %s (layout %s)", path, layout)

  items = dict(reader=reader_model if "reader" in filled else None)
  if "embedder" in filled:
    items["query_embedder"] = query_embedder
    if model_config.retriever.share_embedders:
      items["block_embedder"] = block_embedder
  elif layouts == ["bert"]:
    # Plain BERT: start the (shared) retriever's BERT from the same weights.
    bert_reader = [r for _, r, layout in readers if layout == "bert"][0]
    targets = {k: v for k, v in _targets("realm_embedder", query_embedder, None).items()
               if "/bert/" in k}
    renamed = {"bert/" + k.split("/bert/", 1)[1]: v for k, v in targets.items()}
    for name, variable in renamed.items():
      variable.assign(np.reshape(bert_reader.get_tensor(name), variable.shape))
    items.update(query_embedder=query_embedder, block_embedder=block_embedder)
    logging.info("initialized the retriever's BERT from the BERT checkpoint; the "
                 "projection is freshly initialized")

  model_dir_lib.write_metadata(output_dir, model_config, vocab_file)
  if block_emb is not None:
    logging.info("wrote %s", _save_block_emb(block_emb, output_dir))
  manager = tf.train.CheckpointManager(model_dir_lib.make_checkpoint(**items), output_dir,
                                       max_to_keep=1)
  return manager.save(checkpoint_number=0)
