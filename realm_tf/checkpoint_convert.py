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

``convert_hf`` reads a Hugging Face BERT instead: a directory with ``config.json`` and
``model.safetensors`` (read into NumPy by ``safetensors``, no torch), in HF's BERT names
(``embeddings.word_embeddings.weight``, ``encoder.layer.N.attention.self.query.weight``, ...,
optionally under ``bert.``; ``Linear`` weights ``[out, in]`` are transposed). It fills the shared
retriever's BERT and/or the reader's (MLM head from ``cls.predictions.*`` when present). The
activation comes from ``hidden_act``: HF's "gelu" is the exact erf form (``gelu_exact`` here),
whereas the TF1 BERTs' "gelu" is the tanh approximation.
"""

import json
import logging
import math
import os
import re
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import safetensors
import tensorflow as tf
from official.nlp.tools import tf1_bert_checkpoint_converter_lib as tf1_lib
from safetensors import numpy as safetensors_numpy

from realm_tf import configs
from realm_tf import errors
from realm_tf import model_dir as model_dir_lib
from realm_tf import modeling
from realm_tf import tokenization
from realm_tf.modeling import encoders

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


class ConversionError(errors.RealmError, ValueError):
  """A checkpoint that does not fit the model its config describes, or cannot be read."""


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


def tf1_targets(layout: str, query_embedder, reader) -> Dict[str, tf.Variable]:
  """Full TF1 name -> Keras variable for everything ``layout`` fills."""
  scopes = LAYOUTS[layout]
  out = {}
  for part, prefix in scopes.items():
    if part.endswith("_bert"):
      encoder = (query_embedder if part.startswith("embedder") else reader).encoder
      for tf1_rel, variable in bert_variables(encoder).items():
        out[prefix + tf1_rel] = variable
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


def bert_variables(encoder) -> Dict[str, tf.Variable]:
  """TF1 BERT name (relative to ``bert/``) -> the Keras variable of a ``BertEncoderV2``."""
  keras_vars = {_rel(v, encoder.name + "/"): v for v in encoder.variables}
  # Invert the mapping: enumerate the TF1 names the Keras variables correspond to.
  return {tf1_rel: keras_vars[_tf1_bert_to_keras(tf1_rel)]
          for tf1_rel in _tf1_bert_names(encoder)}


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
    _assign(tf1_targets(layout, query_embedder, reader_model), reader, path, layout)
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
    targets = {k: v for k, v in tf1_targets("realm_embedder", query_embedder, None).items()
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


# ---- Hugging Face BERT: a directory with config.json and model.safetensors. ----

HF_CONFIG_NAME = "config.json"
HF_WEIGHTS_NAME = "model.safetensors"
HF_INDEX_NAME = "model.safetensors.index.json"
HF_TARGETS = ("retriever", "reader")
# In a tower folder that realm-export wrote (sentence-transformers layout): the projection's
# scale and size, so that the import restores REALM's projection (realm_tf/export.py).
EXPORT_NOTE_NAME = "realm_tf_export.json"

# Hugging Face ``hidden_act`` -> our ``hidden_activation`` (``encoders.get_activation``). HF's
# "gelu" is the exact erf form; "gelu_new", "gelu_pytorch_tanh" and "gelu_fast" are the tanh
# approximation, which Google's BERT and our "gelu" are.
HF_ACTIVATIONS = {"gelu": encoders.GELU_EXACT, "gelu_new": encoders.GELU_TANH,
                  "gelu_pytorch_tanh": encoders.GELU_TANH, "gelu_fast": encoders.GELU_TANH,
                  "relu": "relu", "silu": "swish", "swish": "swish"}

# The LayerNorm epsilon of Model Garden's BertEncoderV2 and MaskedLM; BertEncoderConfig has no
# field for it.
ENCODER_NORM_EPSILON = 1e-12

HF_REQUIRED_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                    "intermediate_size")

# Tensors that are never converted: the position-id buffer, the next-sentence head and the MLM
# decoder, whose weight is the word embedding table (our head ties to it) and whose bias is
# ``cls.predictions.bias``.
HF_SKIP_PATTERNS = ("embeddings.position_ids", "cls.seq_relationship.",
                    "cls.predictions.decoder.")
HF_DECODER_WEIGHT = "cls.predictions.decoder.weight"

# How many unconverted tensor names a warning lists.
_MAX_LISTED = 10


def encoder_config_from_hf_json(hf: Dict, path: str = HF_CONFIG_NAME):
  """Hugging Face BERT ``config.json`` -> Model Garden ``BertEncoderConfig``.

  The activation follows ``hidden_act`` through ``HF_ACTIVATIONS`` (HF's "gelu" becomes
  ``gelu_exact``). ``BertEncoderConfig`` has no LayerNorm epsilon and our encoder uses
  ``ENCODER_NORM_EPSILON`` (1e-12); another ``layer_norm_eps`` converts with a warning.

  Args:
    hf: the parsed ``config.json``.
    path: where it came from, for error messages.

  Raises:
    ConversionError: a missing size, or an activation, position embedding type or model type
      that our encoder does not have.
  """
  missing = [k for k in HF_REQUIRED_KEYS if k not in hf]
  if missing:
    raise ConversionError(f"{path}: missing {', '.join(missing)} (not a BERT config?)")
  model_type = hf.get("model_type", "bert")
  if model_type != "bert":
    raise ConversionError(f"{path}: model_type {model_type!r} is not supported; only BERT "
                          "('bert') checkpoints convert")
  position_type = hf.get("position_embedding_type", "absolute")
  if position_type != "absolute":
    raise ConversionError(f"{path}: position_embedding_type {position_type!r} is not "
                          "supported; our encoder has absolute position embeddings")
  act = hf.get("hidden_act", "gelu")
  if not isinstance(act, str) or act not in HF_ACTIVATIONS:
    raise ConversionError(f"{path}: hidden_act {act!r} is not supported (supported: "
                          f"{', '.join(sorted(HF_ACTIVATIONS))})")
  eps = hf.get("layer_norm_eps", ENCODER_NORM_EPSILON)
  if not math.isclose(float(eps), ENCODER_NORM_EPSILON, rel_tol=1e-3):
    logging.warning("%s: layer_norm_eps is %g but our encoder's LayerNorms use %g (not "
                    "configurable); outputs will differ slightly from the original model",
                    path, eps, ENCODER_NORM_EPSILON)
  # Apart from the activation, HF's keys are google-research BERT's.
  return encoder_config_from_bert_json(dict(hf, hidden_act=HF_ACTIVATIONS[act]))


def _read_json_dict(path: str) -> Dict:
  data = read_bert_config(path)
  if not isinstance(data, dict):
    raise ConversionError(f"{path}: expected a JSON object, got {type(data).__name__}")
  return data


def read_hf_checkpoint(hf_dir: str) -> Tuple[Dict, Dict[str, np.ndarray], Dict[str, str]]:
  """The ``config.json`` and the tensors of a Hugging Face model directory, without torch.

  Reads ``model.safetensors`` or, for a sharded checkpoint, the files that
  ``model.safetensors.index.json`` names.

  Args:
    hf_dir: the directory.

  Returns:
    ``(config, tensors, sources)``: the parsed config, NumPy arrays by tensor name, and the file
    each tensor came from.

  Raises:
    ConversionError: a missing or unreadable file.
  """
  if not os.path.isdir(hf_dir):
    raise ConversionError(f"Hugging Face model directory not found: {hf_dir}")
  config_path = os.path.join(hf_dir, HF_CONFIG_NAME)
  if not os.path.exists(config_path):
    raise ConversionError(f"{hf_dir}: no {HF_CONFIG_NAME} (a Hugging Face BERT directory holds "
                          f"{HF_CONFIG_NAME} and {HF_WEIGHTS_NAME})")
  config = _read_json_dict(config_path)
  single, index = (os.path.join(hf_dir, n) for n in (HF_WEIGHTS_NAME, HF_INDEX_NAME))
  if os.path.exists(single):
    files = [single]
  elif os.path.exists(index):
    weight_map = _read_json_dict(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
      raise ConversionError(f"{index}: no weight_map")
    files = [os.path.join(hf_dir, f) for f in sorted(set(weight_map.values()))]
  else:
    others = [n for n in ("pytorch_model.bin", "tf_model.h5")
              if os.path.exists(os.path.join(hf_dir, n))]
    hint = (f"; {others[0]} is not read (save the model with safe_serialization=True)"
            if others else "")
    raise ConversionError(f"{hf_dir}: no {HF_WEIGHTS_NAME}{hint}")
  tensors, sources = {}, {}
  for path in files:
    try:
      loaded = safetensors_numpy.load_file(path)
    except (OSError, ValueError, TypeError, safetensors.SafetensorError) as e:
      first = (str(e).strip().splitlines() or [type(e).__name__])[0]
      raise ConversionError(f"cannot read {path}: {first}") from None
    for name, value in loaded.items():
      if name in tensors:
        raise ConversionError(f"{path}: tensor {name} is also in {sources[name]}")
      tensors[name], sources[name] = value, path
  return config, tensors, sources


def _hf_bert_prefix(tensors: Dict[str, np.ndarray], hf_dir: str) -> str:
  """``"bert."`` (BertForPreTraining, BertForMaskedLM, ...) or ``""`` (BertModel)."""
  for prefix in ("bert.", ""):
    if prefix + "embeddings.word_embeddings.weight" in tensors:
      return prefix
  sample = ", ".join(sorted(tensors)[:3])
  raise ConversionError(f"{hf_dir}: no BERT tensors (neither embeddings.word_embeddings.weight "
                        f"nor bert.embeddings.word_embeddings.weight; first tensors: {sample})")


def hf_name(tf1_name: str, bert_prefix: str) -> Tuple[str, bool]:
  """A TF1 BERT or MLM-head name -> (its Hugging Face name, whether HF stores it transposed).

  ``bert/encoder/layer_3/attention/self/query/kernel`` ->
  (``{bert_prefix}encoder.layer.3.attention.self.query.weight``, True): HF keeps PyTorch's
  ``Linear`` layout, ``[out, in]``.
  """
  if tf1_name == "cls/predictions/output_bias":
    return "cls.predictions.bias", False
  prefix = ""
  if tf1_name.startswith("bert/"):
    tf1_name, prefix = tf1_name[len("bert/"):], bert_prefix
  parts = re.sub(r"^encoder/layer_(\d+)/", r"encoder/layer/\1/", tf1_name).split("/")
  if parts[-1].endswith("_embeddings"):
    return prefix + ".".join(parts + ["weight"]), False
  leaf = {"kernel": "weight", "gamma": "weight", "beta": "bias", "bias": "bias"}[parts[-1]]
  return prefix + ".".join(parts[:-1] + [leaf]), parts[-1] == "kernel"


def tf1_shape(tf1_name: str, variable: tf.Variable) -> List[int]:
  """The TF1 shape (2-D kernels, 1-D biases) of a Keras variable, which may split heads."""
  shape = variable.shape.as_list()
  if tf1_name.endswith("attention/output/dense/kernel"):  # [heads, head_size, hidden]
    return [shape[0] * shape[1], shape[2]]
  if "/attention/self/" in tf1_name:  # kernel [hidden, heads, head_size], bias [heads, size]
    return [shape[0], shape[1] * shape[2]] if len(shape) == 3 else [shape[0] * shape[1]]
  return shape


def _assign_hf(variables: Dict[str, tf.Variable], tensors: Dict[str, np.ndarray],
               sources: Dict[str, str], bert_prefix: str, hf_dir: str, used: set) -> None:
  """Assigns the HF tensor of each TF1-named variable, checking its shape; adds it to ``used``."""
  for tf1_name, variable in variables.items():
    name, transposed = hf_name(tf1_name, bert_prefix)
    want = tf1_shape(tf1_name, variable)
    if transposed:
      want = want[::-1]
    if name not in tensors:
      raise ConversionError(f"{hf_dir}: missing tensor {name} (expected shape {want})")
    value = tensors[name]
    if list(value.shape) != want:
      raise ConversionError(f"{sources[name]}: tensor {name} has shape "
                            f"{list(value.shape)} but the model that {HF_CONFIG_NAME} "
                            f"describes expects {want}")
    if not np.issubdtype(value.dtype, np.floating):
      raise ConversionError(f"{sources[name]}: tensor {name} has dtype {value.dtype}, "
                            "expected floating point")
    value = value.T if transposed else value
    variable.assign(np.reshape(value, variable.shape).astype(np.float32))
    used.add(name)


def _listed(names: Sequence[str]) -> str:
  more = len(names) - _MAX_LISTED
  return ", ".join(names[:_MAX_LISTED]) + (f" and {more} more" if more > 0 else "")


def convert_hf(hf_dir: str, output_dir: str, vocab_file: str, lower_case: bool = True,
               targets: Sequence[str] = HF_TARGETS) -> str:
  """Converts a Hugging Face BERT (``config.json`` + ``model.safetensors``) to a model directory.

  Reads the tensors with ``safetensors`` into NumPy (no torch), in HF's BERT names, with or
  without the ``bert.`` prefix. The encoder config, activation included, comes from
  ``config.json`` (``encoder_config_from_hf_json``).

  Args:
    hf_dir: the Hugging Face model directory.
    output_dir: the model directory to write (``model_config.yaml``, ``vocab.txt``, ``ckpt-0``).
    vocab_file: the checkpoint's WordPiece vocabulary (``vocab_size`` entries).
    lower_case: whether the vocabulary is uncased.
    targets: what the BERT fills: ``"retriever"`` (the shared query/block embedder; its
      projection stays freshly initialized, as for a plain TF1 BERT) and/or ``"reader"`` (its
      MLM head from ``cls.predictions.*`` when present, else fresh).

  Returns:
    The path of the written TF2 checkpoint (``output_dir/ckpt-0``).

  Raises:
    ConversionError: a missing file, a config our encoder cannot express, or a tensor that is
      missing, has the wrong shape or has no place in the model (named in the message).
      Tensors outside BERT and its MLM head (task heads, say) are listed in a warning.
  """
  targets = tuple(targets)
  if not targets or set(targets) - set(HF_TARGETS):
    raise ConversionError(f"targets {list(targets)}: choose one or both of {list(HF_TARGETS)}")
  config, tensors, sources = read_hf_checkpoint(hf_dir)
  config_path = os.path.join(hf_dir, HF_CONFIG_NAME)
  encoder_config = encoder_config_from_hf_json(config, config_path)
  vocab_size = len(tokenization.load_vocab(vocab_file))
  if vocab_size != encoder_config.vocab_size:
    raise ConversionError(f"{vocab_file} has {vocab_size} tokens but {config_path} has "
                          f"vocab_size {encoder_config.vocab_size}")
  bert_prefix = _hf_bert_prefix(tensors, hf_dir)
  exported = _read_export_note(hf_dir) if "retriever" in targets else None
  model_config = configs.RealmModelConfig(
      retriever=configs.RetrieverConfig(encoder=encoder_config, share_embedders=True,
                                        **({"projection_size": exported["projection_size"]}
                                           if exported else {})),
      reader=configs.ReaderConfig(encoder=encoder_config), vocab_file=vocab_file,
      lower_case=lower_case)

  pooler = [bert_prefix + f"pooler.dense.{n}" for n in ("weight", "bias")]
  skip_pooler = not any(n in tensors for n in pooler)
  if skip_pooler:
    logging.warning("%s has no pooler (%s): it stays freshly initialized", hf_dir, pooler[0])

  def bert_part(encoder):
    return {"bert/" + n: v for n, v in bert_variables(encoder).items()
            if not (skip_pooler and n.startswith("pooler/"))}

  used, items = set(), {}
  if "retriever" in targets:
    query_embedder, block_embedder = modeling.build_embedders(model_config.retriever)
    _assign_hf(bert_part(query_embedder.encoder), tensors, sources, bert_prefix, hf_dir,
               used)
    items.update(query_embedder=query_embedder, block_embedder=block_embedder)
    if exported:
      _assign_exported_projection(hf_dir, exported, query_embedder)
      logging.info("filled the retriever's BERT and projection from %s (a realm-export tower)",
                   hf_dir)
    else:
      logging.info("filled the retriever's BERT from %s; the projection is freshly initialized",
                   hf_dir)
  if "reader" in targets:
    reader = modeling.build_reader(model_config.reader)
    _assign_hf(bert_part(reader.encoder), tensors, sources, bert_prefix, hf_dir, used)
    mlm = {k: v for k, v in tf1_targets("bert", None, reader).items() if k.startswith("cls/")}
    if any(hf_name(k, bert_prefix)[0] in tensors for k in mlm):
      _assign_hf(mlm, tensors, sources, bert_prefix, hf_dir, used)
      _check_tied_decoder(tensors, sources, bert_prefix)
      logging.info("filled the reader's BERT and MLM head from %s", hf_dir)
    else:
      logging.info("filled the reader's BERT from %s; %s has no MLM head (cls.predictions.*), "
                   "which stays freshly initialized", hf_dir, hf_dir)
    items["reader"] = reader

  rest = [n for n in sorted(tensors)
          if n not in used and not any(p in n for p in HF_SKIP_PATTERNS)]
  bert_roots = tuple(bert_prefix + r for r in ("embeddings.", "encoder.", "pooler."))
  misfits = [n for n in rest if n.startswith(bert_roots)]
  if misfits:
    name = misfits[0]
    raise ConversionError(f"{sources[name]}: tensor {name} {list(tensors[name].shape)} has no "
                          f"place in the model that {config_path} describes (more layers?)")
  unused_mlm = [n for n in rest if n.startswith("cls.predictions.")]
  if unused_mlm:
    logging.info("the MLM head (%s) is not converted: no reader among the targets",
                 _listed(unused_mlm))
  unknown = [n for n in rest if not n.startswith("cls.predictions.")]
  if unknown:
    logging.warning("%s: %d tensors have no place in realm_tf's BERT and are not converted: %s",
                    hf_dir, len(unknown), _listed(unknown))

  model_dir_lib.write_metadata(output_dir, model_config, vocab_file)
  manager = tf.train.CheckpointManager(model_dir_lib.make_checkpoint(**items), output_dir,
                                       max_to_keep=1)
  return manager.save(checkpoint_number=0)


def _read_export_note(hf_dir: str) -> Optional[Dict]:
  """``realm_tf_export.json`` of a tower folder that ``realm-export`` wrote, or None."""
  path = os.path.join(hf_dir, EXPORT_NOTE_NAME)
  if not os.path.exists(path):
    return None
  note = _read_json_dict(path)
  for key in ("projection_scale", "projection_size"):
    if not isinstance(note.get(key), (int, float)) or note[key] <= 0:
      raise ConversionError(f"{path}: no positive {key}")
  return note


def _assign_exported_projection(hf_dir: str, note: Dict, embedder) -> None:
  """REALM's projection and LayerNorm back from an exported tower's ``3_Dense`` (written
  times ``projection_scale``, a power of two: dividing is exact) and ``4_LayerNorm``."""
  parts = {}
  for sub, names in (("3_Dense", ("linear.weight", "linear.bias")),
                     ("4_LayerNorm", ("norm.weight", "norm.bias"))):
    path = os.path.join(hf_dir, sub, HF_WEIGHTS_NAME)
    try:
      loaded = safetensors_numpy.load_file(path)
    except (OSError, ValueError, TypeError, safetensors.SafetensorError) as e:
      first = (str(e).strip().splitlines() or [type(e).__name__])[0]
      raise ConversionError(f"cannot read {path}: {first}") from None
    for name in names:
      if name not in loaded:
        raise ConversionError(f"{path}: missing tensor {name}")
      parts[f"{sub}/{name}"] = loaded[name].astype(np.float32)
  scale = np.float32(note["projection_scale"])
  targets = ((embedder.projection.kernel, parts["3_Dense/linear.weight"].T / scale),
             (embedder.projection.bias, parts["3_Dense/linear.bias"] / scale),
             (embedder.layer_norm.gamma, parts["4_LayerNorm/norm.weight"]),
             (embedder.layer_norm.beta, parts["4_LayerNorm/norm.bias"]))
  for variable, value in targets:
    if list(value.shape) != variable.shape.as_list():
      raise ConversionError(f"{hf_dir}: the projection has shape {list(value.shape)} but "
                            f"{EXPORT_NOTE_NAME} describes {variable.shape.as_list()}")
    variable.assign(value)


def _check_tied_decoder(tensors: Dict[str, np.ndarray], sources: Dict[str, str],
                        bert_prefix: str) -> None:
  """Warns when the MLM decoder is not the word embedding table, to which our head is tied."""
  if HF_DECODER_WEIGHT not in tensors:
    return
  decoder = tensors[HF_DECODER_WEIGHT]
  table = tensors[bert_prefix + "embeddings.word_embeddings.weight"]
  if decoder.shape != table.shape or not np.array_equal(decoder, table):
    logging.warning("%s: %s is not the word embedding table; realm_tf's MLM head is tied to the "
                    "table, so the decoder is not converted", sources[HF_DECODER_WEIGHT],
                    HF_DECODER_WEIGHT)
