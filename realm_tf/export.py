"""Trained towers out to the ecosystem: Hugging Face BERT and sentence-transformers folders.

``export(model_dir, output_dir)`` writes, for a model directory of REALM pre-training, ICT or
Open-QA (whichever towers its newest checkpoint holds)::

    output_dir/
      EXPORT.json        what was written, from which checkpoint
      query_tower/       a sentence-transformers folder (below)
      block_tower/       the same for the block tower (absent when the model has none)
      reader/            a Hugging Face BertForMaskedLM folder (the reader and its masked-LM
                         head); span_scorer.safetensors beside it (Open-QA), with
                         SPAN_SCORER.md on its layout
      block_embeddings/  with ``index_dir``: embeddings.npy (float32, row = block id) and
                         blocks.jsonl (block id, title, live) of the published index

A tower folder is a Hugging Face ``BertModel`` folder (``config.json``, ``model.safetensors``,
``vocab.txt``, ``tokenizer_config.json``) that sentence-transformers loads as four modules
after the BERT: the ``[CLS]`` token's output (``Pooling``), BERT's pooler (``Dense``, tanh),
REALM's projection (``Dense``, no activation) and its LayerNorm (``LayerNorm``): REALM's
``LayerNorm(Dense(pooled_output))``. ``SentenceTransformer(folder).encode(texts)`` then gives
REALM's embeddings, scored by inner product (``similarity_fn_name: dot``); no L2 norm.

sentence-transformers' ``LayerNorm`` module is ``torch.nn.LayerNorm`` with its default
epsilon, 1e-5, where REALM's is 1e-12. LayerNorm ignores a common scale of its input but for
the epsilon: ``LN_eps(c * x) = LN_{eps / c^2}(x)``. So the projection is written multiplied by
``c = 2^12``: the module then computes LayerNorm with epsilon 1e-5 / 2^24 = 6e-13 instead of
1e-12, a difference far below float32's precision for any projection whose variance is not
itself ~1e-12. A power of two, so that the scale is exact in float32 and ``realm-convert
--hf_dir`` divides it back exactly; ``realm_tf_export.json`` in the tower folder records it.

Every weight is written with ``safetensors``: no pickle. The Hugging Face names are those
``checkpoint_convert.convert_hf`` reads, so ``realm-convert --hf_dir`` brings an exported
folder back to the same variables.
"""

import json
import os
import shutil
from typing import Dict, Optional, Sequence

import numpy as np
import tensorflow as tf
from safetensors import numpy as safetensors_numpy

import realm_tf
from realm_tf import checkpoint_convert as convert
from realm_tf import errors
from realm_tf import model_dir as model_dir_lib
from realm_tf import modeling
from realm_tf import tokenization
from realm_tf.data import block_store
from realm_tf.modeling import encoders
from realm_tf.retrieval.index import base as index_base
from realm_tf.retrieval.publication import index_io
from realm_tf.retrieval.publication import publish

MANIFEST_NAME = "EXPORT.json"
READER = "reader"
PARTS = ("query_tower", "block_tower", READER)
BLOCK_EMBEDDINGS = "block_embeddings"
SPAN_SCORER_NAME = "span_scorer.safetensors"
# The activation names Hugging Face's BERT gives ours (the inverse of convert's HF_ACTIVATIONS).
HF_ACTIVATION_NAMES = {encoders.GELU_TANH: "gelu_new", encoders.GELU_EXACT: "gelu",
                       "relu": "relu", "swish": "silu"}
TORCH_LAYER_NORM_EPS = 1e-5   # sentence-transformers' LayerNorm module: torch's default
REALM_LAYER_NORM_EPS = 1e-12  # RealmEmbedder's LayerNorm (TF1's layer_norm)
PROJECTION_SCALE = 2.0 ** 12

SPECIAL_TOKENS = dict(unk_token="[UNK]", sep_token="[SEP]", pad_token="[PAD]",
                      cls_token="[CLS]", mask_token="[MASK]")


class ExportError(errors.RealmError, ValueError):
  """A model directory that cannot be exported as asked, named in the message."""


# ------------------------------------------------------------------------------ tensors --
def bert_tensors(encoder, prefix: str = "") -> Dict[str, np.ndarray]:
  """A ``BertEncoderV2``'s weights in Hugging Face BERT's names (``prefix``: ``"bert."`` for
  ``BertForMaskedLM``), ``Linear`` weights as ``[out, in]``: the inverse of ``convert_hf``."""
  out = {}
  for tf1_rel, variable in convert.bert_variables(encoder).items():
    tf1_name = "bert/" + tf1_rel
    name, transposed = convert.hf_name(tf1_name, prefix)
    value = np.reshape(variable.numpy(), convert.tf1_shape(tf1_name, variable))
    out[name] = np.ascontiguousarray(value.T if transposed else value, np.float32)
  return out


def mlm_tensors(reader, prefix: str = "bert.") -> Dict[str, np.ndarray]:
  """The reader's masked-LM head as ``BertForMaskedLM``'s ``cls.predictions.*``; the decoder
  is the word embedding table (ours is tied to it, as BERT's is)."""
  out = {}
  for tf1_name, variable in convert.tf1_targets("bert", None, reader).items():
    if tf1_name.startswith("cls/"):
      name, transposed = convert.hf_name(tf1_name, prefix)
      value = variable.numpy()
      out[name] = np.ascontiguousarray(value.T if transposed else value, np.float32)
  out[convert.HF_DECODER_WEIGHT] = np.ascontiguousarray(
      reader.encoder.get_embedding_table().numpy(), np.float32)
  out["cls.predictions.decoder.bias"] = out["cls.predictions.bias"].copy()
  return out


def hf_config(encoder_config, architecture: str, pad_token_id: int,
              model_dir: str) -> Dict:
  """Hugging Face's ``config.json`` for our encoder; ExportError where BERT cannot say it."""
  act = encoder_config.hidden_activation
  if act not in HF_ACTIVATION_NAMES:
    raise ExportError(f"{model_dir}: the encoder's activation {act!r} has no Hugging Face BERT "
                      f"name (exportable: {', '.join(sorted(HF_ACTIVATION_NAMES))})")
  if encoder_config.embedding_size not in (None, encoder_config.hidden_size):
    raise ExportError(f"{model_dir}: the encoder factorizes its embeddings (embedding_size "
                      f"{encoder_config.embedding_size}, hidden {encoder_config.hidden_size}): "
                      "not a BERT that Hugging Face's BertModel can hold")
  if encoder_config.norm_first:
    raise ExportError(f"{model_dir}: the encoder is pre-LayerNorm (norm_first): not a BERT "
                      "that Hugging Face's BertModel can hold")
  return {
      "architectures": [architecture], "model_type": "bert",
      "vocab_size": encoder_config.vocab_size, "hidden_size": encoder_config.hidden_size,
      "num_hidden_layers": encoder_config.num_layers,
      "num_attention_heads": encoder_config.num_attention_heads,
      "intermediate_size": encoder_config.intermediate_size,
      "hidden_act": HF_ACTIVATION_NAMES[act],
      "hidden_dropout_prob": encoder_config.dropout_rate,
      "attention_probs_dropout_prob": encoder_config.attention_dropout_rate,
      "max_position_embeddings": encoder_config.max_position_embeddings,
      "type_vocab_size": encoder_config.type_vocab_size,
      "initializer_range": encoder_config.initializer_range,
      "layer_norm_eps": REALM_LAYER_NORM_EPS, "pad_token_id": pad_token_id,
      "position_embedding_type": "absolute", "tie_word_embeddings": True,
      "torch_dtype": "float32"}


# ------------------------------------------------------------------------------ folders --
def _write_json(path: str, obj) -> None:
  with open(path, "w", encoding="utf-8") as f:
    json.dump(obj, f, indent=2, sort_keys=True)
    f.write("\n")


def _write_tensors(path: str, tensors: Dict[str, np.ndarray]) -> None:
  safetensors_numpy.save_file(tensors, path, metadata={"format": "pt"})


def write_hf_bert(folder: str, encoder, encoder_config, vocab_file: str, lower_case: bool,
                  max_length: int, model_dir: str, reader=None) -> None:
  """A Hugging Face BERT folder: ``BertForMaskedLM`` with ``reader``'s head, else
  ``BertModel``; the tokenizer lower-cases as the model was trained (``lower_case``)."""
  vocab = tokenization.load_vocab(vocab_file)
  architecture = "BertForMaskedLM" if reader is not None else "BertModel"
  os.makedirs(folder, exist_ok=True)
  _write_json(os.path.join(folder, convert.HF_CONFIG_NAME),
              hf_config(encoder_config, architecture,
                        vocab.index("[PAD]") if "[PAD]" in vocab else 0, model_dir))
  if reader is not None:
    tensors = dict(bert_tensors(encoder, "bert."), **mlm_tensors(reader))
  else:
    tensors = bert_tensors(encoder)
  _write_tensors(os.path.join(folder, convert.HF_WEIGHTS_NAME), tensors)
  shutil.copyfile(vocab_file, os.path.join(folder, "vocab.txt"))
  _write_json(os.path.join(folder, "tokenizer_config.json"), dict(
      tokenizer_class="BertTokenizer", do_lower_case=lower_case, strip_accents=None,
      tokenize_chinese_chars=True, model_max_length=max_length, **SPECIAL_TOKENS))
  _write_json(os.path.join(folder, "special_tokens_map.json"), SPECIAL_TOKENS)


def write_sentence_transformer(folder: str, embedder, retriever_config, vocab_file: str,
                               lower_case: bool, max_length: int, model_dir: str) -> None:
  """A tower as a sentence-transformers folder (module doc): BERT, [CLS], pooler, projection
  (times ``PROJECTION_SCALE``), LayerNorm."""
  write_hf_bert(folder, embedder.encoder, retriever_config.encoder, vocab_file, lower_case,
                max_length, model_dir)
  hidden = retriever_config.encoder.hidden_size
  dim = retriever_config.projection_size
  pooler = convert.bert_variables(embedder.encoder)
  modules = [("", "sentence_transformers.models.Transformer")]

  def module(path, kind, config, tensors=None):
    os.makedirs(os.path.join(folder, path), exist_ok=True)
    _write_json(os.path.join(folder, path, "config.json"), config)
    if tensors is not None:
      _write_tensors(os.path.join(folder, path, "model.safetensors"), tensors)
    modules.append((path, f"sentence_transformers.models.{kind}"))

  module("1_Pooling", "Pooling", dict(
      word_embedding_dimension=hidden, pooling_mode_cls_token=True,
      pooling_mode_mean_tokens=False, pooling_mode_max_tokens=False,
      pooling_mode_mean_sqrt_len_tokens=False))
  module("2_Dense", "Dense", dict(in_features=hidden, out_features=hidden, bias=True,
                                  activation_function="torch.nn.modules.activation.Tanh"),
         {"linear.weight": np.ascontiguousarray(pooler["pooler/dense/kernel"].numpy().T),
          "linear.bias": pooler["pooler/dense/bias"].numpy()})
  projection = embedder.projection
  module("3_Dense", "Dense", dict(in_features=hidden, out_features=dim, bias=True,
                                  activation_function="torch.nn.modules.linear.Identity"),
         {"linear.weight": np.ascontiguousarray(projection.kernel.numpy().T * PROJECTION_SCALE,
                                                np.float32),
          "linear.bias": (projection.bias.numpy() * PROJECTION_SCALE).astype(np.float32)})
  module("4_LayerNorm", "LayerNorm", dict(dimension=dim),
         {"norm.weight": embedder.layer_norm.gamma.numpy(),
          "norm.bias": embedder.layer_norm.beta.numpy()})
  _write_json(os.path.join(folder, "modules.json"), [
      dict(idx=i, name=str(i), path=path, type=kind) for i, (path, kind) in enumerate(modules)])
  _write_json(os.path.join(folder, "sentence_bert_config.json"),
              dict(max_seq_length=max_length, do_lower_case=False))
  _write_json(os.path.join(folder, "config_sentence_transformers.json"), dict(
      similarity_fn_name="dot", prompts={}, default_prompt_name=None,
      __version__=dict(realm_tf=realm_tf.__version__)))
  _write_json(os.path.join(folder, convert.EXPORT_NOTE_NAME), dict(
      projection_scale=PROJECTION_SCALE, projection_size=dim, seq_length=max_length,
      layer_norm_epsilon=REALM_LAYER_NORM_EPS, realm_tf=realm_tf.__version__))


SPAN_SCORER_NOTE = """# The span scorer (ORQA's reader head), in span_scorer.safetensors

For a span (start, end) of the reader's sequence output `h` ([batch, length, hidden]):

    p = h @ dense.kernel + dense.bias            # [.., 2 * span_hidden_size]
    s, e = p[..., :span_hidden_size], p[..., span_hidden_size:]
    x = relu(s[start] + e[end])
    x = layer_normalization(x)                    # epsilon 1e-3, gamma and beta
    score = x @ dense_1.kernel + dense_1.bias     # [.., 1]

Kernels are `[in, out]` (TensorFlow's layout, not torch's `Linear`). span_hidden_size: {size};
longest span: {width} wordpieces.
"""


def write_span_scorer(folder: str, span_scorer, reader_config) -> None:
  tensors = {"dense.kernel": span_scorer.projection.kernel.numpy(),
             "dense.bias": span_scorer.projection.bias.numpy(),
             "layer_normalization.gamma": span_scorer.layer_norm.gamma.numpy(),
             "layer_normalization.beta": span_scorer.layer_norm.beta.numpy(),
             "dense_1.kernel": span_scorer.output_dense.kernel.numpy(),
             "dense_1.bias": span_scorer.output_dense.bias.numpy()}
  _write_tensors(os.path.join(folder, SPAN_SCORER_NAME), tensors)
  with open(os.path.join(folder, "SPAN_SCORER.md"), "w", encoding="utf-8") as f:
    f.write(SPAN_SCORER_NOTE.format(size=reader_config.span_hidden_size,
                                    width=reader_config.max_span_width))


def write_block_embeddings(folder: str, index_dir: str,
                           blocks_dir: Optional[str] = None) -> Dict:
  """The ``LATEST`` publication of ``index_dir``: ``embeddings.npy`` (float32, row = block id)
  and ``blocks.jsonl`` (``block_id``, ``title``, ``live``: false for a deleted block, whose
  row is kept so that ids stay rows); returns what it wrote, for the manifest."""
  path = publish.read_latest(index_dir)
  if path is None:
    raise ExportError(f"{index_dir}: no published index (no LATEST)")
  index = index_io.load_index(path)
  manifest = index_base.read_manifest(path)
  embeddings = getattr(index, "embeddings", None)
  if embeddings is None:
    raise ExportError(f"{path}: a {manifest['index_type']} index keeps no one embeddings table "
                      "to export")
  embeddings = np.asarray(embeddings, np.float32)
  blocks_dir = blocks_dir or manifest.get("blocks_dir")
  if not blocks_dir or not os.path.isdir(blocks_dir):
    raise ExportError(f"{path}: its blocks directory ({blocks_dir or 'not recorded'}) is not "
                      "here; pass --blocks_dir")
  store = block_store.BlockStore.open(blocks_dir, fingerprint=manifest.get("corpus_fingerprint"))
  if len(store) != len(embeddings):
    raise ExportError(f"{path} holds {len(embeddings)} rows but {blocks_dir} has {len(store)} "
                      "blocks")
  live = np.ones(len(embeddings), bool)
  live[np.asarray(index.deleted, np.int64)] = False
  os.makedirs(folder, exist_ok=True)
  np.save(os.path.join(folder, "embeddings.npy"), embeddings)
  with open(os.path.join(folder, "blocks.jsonl"), "w", encoding="utf-8") as f:
    for i in range(len(embeddings)):
      f.write(json.dumps(dict(block_id=i, title=store.titles[i], live=bool(live[i])),
                         ensure_ascii=False) + "\n")
  return dict(index=path, blocks_dir=os.path.abspath(blocks_dir), num_blocks=len(embeddings),
              num_live=int(live.sum()), dim=int(embeddings.shape[1]))


# ------------------------------------------------------------------------------- export --
def _holds(checkpoint: str, shared: bool) -> Dict[str, bool]:
  """Which towers ``checkpoint`` holds (a shared embedder is written under either name)."""
  names = tf.train.load_checkpoint(checkpoint).get_variable_to_shape_map()
  has = lambda prefix: any(n.startswith(prefix) for n in names)
  block = has("block_embedder/")
  return dict(query_embedder=has("query_embedder/") or (shared and block),
              block_embedder=block, reader=has("reader/encoder/"),
              span_scorer=has("reader/span_scorer/"))


def export(model_dir: str, output_dir: str, overwrite: bool = False,
           checkpoint: Optional[str] = None, index_dir: Optional[str] = None,
           blocks_dir: Optional[str] = None, parts: Sequence[str] = ()) -> Dict:
  """Writes ``model_dir``'s towers under ``output_dir`` (module doc), and with ``index_dir``
  its published block embeddings (``blocks_dir``: their corpus, by default the one the
  index's manifest names); returns the manifest. ``parts``: which of ``PARTS`` to write
  (default: every one the checkpoint holds). The folder appears whole or not at all (written
  beside it, then renamed); ``overwrite`` replaces an existing one only once the new is done.

  Raises:
    ExportError: ``output_dir`` exists (without ``overwrite``); a part asked for, or any tower,
      that the checkpoint does not hold; an encoder that Hugging Face's BERT cannot hold.
  """
  config = model_dir_lib.load_config(model_dir)
  checkpoint = checkpoint or model_dir_lib.latest_checkpoint(model_dir)
  holds = _holds(checkpoint, config.retriever.share_embedders)
  held = [p for p, key in zip(PARTS, ("query_embedder", "block_embedder", "reader"))
          if holds[key]]
  unknown = sorted(set(parts) - set(PARTS))
  if unknown:
    raise ExportError(f"unknown part(s) {', '.join(unknown)}: choose from {', '.join(PARTS)}")
  missing = [p for p in parts if p not in held]
  if missing or not held:
    raise ExportError(f"{model_dir}: {os.path.basename(checkpoint)} holds no "
                      f"{' or '.join(missing) or 'tower'} (it holds "
                      f"{', '.join(held) or 'no tower'})")
  parts = list(parts) or held
  if os.path.exists(output_dir) and not overwrite:
    raise ExportError(f"{output_dir} exists: pass --overwrite to replace it")
  tmp = f"{output_dir.rstrip('/')}.tmp-{os.getpid()}"
  shutil.rmtree(tmp, ignore_errors=True)
  os.makedirs(tmp)
  try:
    manifest = _write_parts(tmp, model_dir, config, checkpoint, holds, parts)
    if index_dir:
      manifest["written"][BLOCK_EMBEDDINGS] = write_block_embeddings(
          os.path.join(tmp, BLOCK_EMBEDDINGS), index_dir, blocks_dir)
    _write_json(os.path.join(tmp, MANIFEST_NAME), manifest)
    if os.path.exists(output_dir):
      shutil.rmtree(output_dir)
    os.replace(tmp, output_dir)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  return manifest


def _write_parts(folder: str, model_dir: str, config, checkpoint: str, holds: Dict[str, bool],
                 parts: Sequence[str]) -> Dict:
  """``parts`` of ``checkpoint`` into ``folder`` -> the manifest."""
  manifest = dict(model_dir=os.path.abspath(model_dir), checkpoint=os.path.basename(checkpoint),
                  step=model_dir_lib.checkpoint_step(checkpoint), lower_case=config.lower_case,
                  projection_scale=PROJECTION_SCALE, realm_tf=realm_tf.__version__, written={})
  retriever = config.retriever
  if {"query_tower", "block_tower"} & set(parts):
    query, block = modeling.build_embedders(retriever)
    model_dir_lib.restore(checkpoint, query_embedder=query)
    if not retriever.share_embedders and "block_tower" in parts:
      model_dir_lib.restore(checkpoint, block_embedder=block)
    towers = {"query_tower": (query, retriever.query_seq_length),
              "block_tower": (block, retriever.block_seq_length)}
    for name in ("query_tower", "block_tower"):
      if name in parts:
        tower, length = towers[name]
        write_sentence_transformer(os.path.join(folder, name), tower, retriever,
                                   config.vocab_file, config.lower_case, length, model_dir)
        manifest["written"][name] = "sentence-transformers (Hugging Face BertModel inside)"
  if READER in parts:
    reader = modeling.build_reader(config.reader, with_span_scorer=holds["span_scorer"])
    model_dir_lib.restore(checkpoint, reader=reader)
    path = os.path.join(folder, READER)
    write_hf_bert(path, reader.encoder, config.reader.encoder, config.vocab_file,
                  config.lower_case, config.reader.seq_length, model_dir, reader=reader)
    manifest["written"][READER] = "BertForMaskedLM"
    if holds["span_scorer"]:
      write_span_scorer(path, reader.span_scorer, config.reader)
      manifest["written"][READER] += f" + {SPAN_SCORER_NAME}"
  return manifest
