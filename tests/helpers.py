"""The test suite's shared helpers, in one module (as keras-hub's ``test_case.py``).

Test modules import it as ``helpers`` (pytest puts ``tests/`` on ``sys.path``) and never import
each other. It holds:

- JSON-lines files written and read (``write_lines``, ``read_jsonl``);
- TF1 checkpoints in Google's BERT names (``random_bert``, ``write_tf1_checkpoint``) and an
  independent NumPy BERT with the tanh GELU (``np_bert``), for the converters' tests;
- tiny Hugging Face BERT directories (``hf_config``, ``hf_tensors``, ``write_hf_dir``);
- the command lines run in this process (``run_cli``, as ``python -m`` would: flags of their
  own, ``SystemExit`` caught) or, for one smoke test per binary, as a process of their own
  (``run_process``);
- the tiny REALM model and random inputs of the pre-training unit tests (``tiny_config``,
  ``make_blocks``, ``make_examples``, ``ExactHandle``);
- a few ICT steps on a prepared world (``train_ict``) and the TensorBoard scalars of a log
  directory (``scalars``).

Tiny towers, model directories and corpora are ``realm_tf.retrieval.publication.testing``'s
(the benchmarks use them too); the synthetic worlds and warm starts several modules share are
session fixtures in ``conftest.py``.
"""

import concurrent.futures
import contextlib
import io
import hashlib
import json
import math
import os
import runpy
import subprocess
import sys
from unittest import mock
import warnings

from absl import flags
from absl.testing import flagsaver
import numpy as np
import pytest
import tensorflow as tf
from safetensors import numpy as safetensors_numpy

from realm_tf import configs
from realm_tf import train_lib
from realm_tf.binaries import cli
from realm_tf.tokenization import load_vocab

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESERVED = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def write_word_vocab(path, words):
  """A vocabulary of the reserved tokens and ``words`` (each one wordpiece); returns its size."""
  vocab = RESERVED + list(words)
  with open(path, "w") as f:
    f.write("\n".join(vocab) + "\n")
  return len(vocab)


def write_lines(path, rows):
  """One line per row (a string as it is, anything else as JSON) -> ``str(path)``."""
  with open(path, "w", encoding="utf-8") as f:
    for row in rows:
      f.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
  return str(path)


def read_jsonl(path):
  """The JSON objects of a JSON-lines file, one per non-empty line."""
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


# ------------------------------------------------------------------- TF1 BERT checkpoints --

TF1_HIDDEN, TF1_HEADS, TF1_LAYERS, TF1_INTER = 32, 4, 2, 48
TF1_WORDS = ["the", "a", "city", "river", "born", "in", "was", "who", "of", "paris", "france",
             "where", "is", "?", ".", ",", "1843", "capital", "wrote", "play"]


def write_tf1_vocab(path):
  return write_word_vocab(path, TF1_WORDS)


def bert_config(vocab_size):
  """A ``bert_config.json`` of the TF1 test size."""
  return dict(vocab_size=vocab_size, hidden_size=TF1_HIDDEN, num_hidden_layers=TF1_LAYERS,
              num_attention_heads=TF1_HEADS, intermediate_size=TF1_INTER, hidden_act="gelu",
              hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
              max_position_embeddings=512, type_vocab_size=2, initializer_range=0.02)


def random_bert(rng, prefix, vocab_size, hidden=TF1_HIDDEN, inter=TF1_INTER, layers=TF1_LAYERS):
  """A random BERT's TF1 variables under ``prefix`` (``bert/``, ``module/...``)."""
  w = {}
  def put(name, *shape, scale=0.1):
    w[prefix + name] = (rng.standard_normal(shape) * scale).astype(np.float32)
  put("embeddings/word_embeddings", vocab_size, hidden)
  put("embeddings/token_type_embeddings", 2, hidden)
  put("embeddings/position_embeddings", 512, hidden)
  put("embeddings/LayerNorm/gamma", hidden)
  put("embeddings/LayerNorm/beta", hidden)
  for i in range(layers):
    p = f"encoder/layer_{i}/"
    for m in ("query", "key", "value"):
      put(p + f"attention/self/{m}/kernel", hidden, hidden, scale=0.3)
      put(p + f"attention/self/{m}/bias", hidden)
    put(p + "attention/output/dense/kernel", hidden, hidden, scale=0.3)
    put(p + "attention/output/dense/bias", hidden)
    put(p + "attention/output/LayerNorm/gamma", hidden)
    put(p + "attention/output/LayerNorm/beta", hidden)
    put(p + "intermediate/dense/kernel", hidden, inter, scale=0.3)
    put(p + "intermediate/dense/bias", inter)
    put(p + "output/dense/kernel", inter, hidden, scale=0.3)
    put(p + "output/dense/bias", hidden)
    put(p + "output/LayerNorm/gamma", hidden)
    put(p + "output/LayerNorm/beta", hidden)
  put("pooler/dense/kernel", hidden, hidden, scale=0.3)
  put("pooler/dense/bias", hidden)
  return w


def write_tf1_checkpoint(weights, path):
  """Writes a name-based TF1 checkpoint, as Estimator/TF-Hub did; returns its prefix."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  graph = tf.Graph()
  with graph.as_default():
    variables = [tf.compat.v1.get_variable(n, initializer=v) for n, v in weights.items()]
    saver = tf.compat.v1.train.Saver(variables)
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      saver.save(sess, path)
  return path


# ---- An independent NumPy BERT (tanh-approximate GELU, TF1 LayerNorm eps 1e-12). ----
def gelu(x):
  """Google BERT's ``gelu``: the tanh approximation."""
  return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def gelu_erf(x):
  """The exact (erf) GELU: Hugging Face's ``gelu``."""
  try:
    from scipy.special import erf  # pylint: disable=g-import-not-at-top
  except ImportError:
    erf = np.vectorize(math.erf, otypes=[np.float64])
  return 0.5 * x * (1.0 + erf(np.asarray(x) / math.sqrt(2.0)))


def layer_norm(x, g, b, eps=1e-12):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + eps) * g + b


def np_bert(w, p, ids, mask, types):
  """(sequence, pooled) of the TF1-sized BERT held in ``w`` under prefix ``p``."""
  x = (w[p + "embeddings/word_embeddings"][ids] + w[p + "embeddings/token_type_embeddings"][types]
       + w[p + "embeddings/position_embeddings"][np.arange(ids.shape[1])][None])
  x = layer_norm(x, w[p + "embeddings/LayerNorm/gamma"], w[p + "embeddings/LayerNorm/beta"])
  b, n, d = ids.shape[0], ids.shape[1], TF1_HIDDEN // TF1_HEADS
  for i in range(TF1_LAYERS):
    q = f"{p}encoder/layer_{i}/"
    heads = {}
    for m in ("query", "key", "value"):
      y = x @ w[q + f"attention/self/{m}/kernel"] + w[q + f"attention/self/{m}/bias"]
      heads[m] = y.reshape(b, n, TF1_HEADS, d).transpose(0, 2, 1, 3)
    scores = heads["query"] @ heads["key"].transpose(0, 1, 3, 2) / np.sqrt(d)
    scores = scores + (1.0 - mask[:, None, None, :]) * -1e9
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    ctx = (probs @ heads["value"]).transpose(0, 2, 1, 3).reshape(b, n, TF1_HIDDEN)
    att = ctx @ w[q + "attention/output/dense/kernel"] + w[q + "attention/output/dense/bias"]
    x = layer_norm(att + x, w[q + "attention/output/LayerNorm/gamma"],
                   w[q + "attention/output/LayerNorm/beta"])
    h = gelu(x @ w[q + "intermediate/dense/kernel"] + w[q + "intermediate/dense/bias"])
    out = h @ w[q + "output/dense/kernel"] + w[q + "output/dense/bias"]
    x = layer_norm(out + x, w[q + "output/LayerNorm/gamma"], w[q + "output/LayerNorm/beta"])
  pooled = np.tanh(x[:, 0] @ w[p + "pooler/dense/kernel"] + w[p + "pooler/dense/bias"])
  return x, pooled


def rel_err(a, b):
  return np.max(np.abs(a - b)) / np.max(np.abs(b))


# ------------------------------------------------------- Hugging Face BERT directories --

HF_HIDDEN, HF_HEADS, HF_LAYERS, HF_INTER, HF_POSITIONS = 16, 2, 2, 32, 64
HF_WORDS = ["the", "a", "city", "river", "born", "in", "was", "who", "of", "paris", "france",
            "where", "is", "?", ".", "capital"]


def write_hf_vocab(path):
  return write_word_vocab(path, HF_WORDS)


def hf_config(vocab_size, **overrides):
  """A tiny Hugging Face ``config.json`` (``bert``, exact GELU)."""
  config = dict(model_type="bert", vocab_size=vocab_size, hidden_size=HF_HIDDEN,
                num_hidden_layers=HF_LAYERS, num_attention_heads=HF_HEADS,
                intermediate_size=HF_INTER, hidden_act="gelu", hidden_dropout_prob=0.1,
                attention_probs_dropout_prob=0.1, max_position_embeddings=HF_POSITIONS,
                type_vocab_size=2, initializer_range=0.02, layer_norm_eps=1e-12,
                position_embedding_type="absolute")
  config.update(overrides)
  return config


def hf_tensors(rng, vocab_size, prefix="", mlm=False):
  """A random ``BertModel`` (``prefix`` "bert." and ``mlm``: ``BertForPreTraining``)."""
  t = {}
  def put(name, *shape, scale=0.3, offset=0.0):
    t[name] = (offset + rng.standard_normal(shape) * scale).astype(np.float32)

  def put_norm(name):
    put(name + ".weight", HF_HIDDEN, scale=0.1, offset=1.0)
    put(name + ".bias", HF_HIDDEN, scale=0.1)

  b, hidden, inter = prefix, HF_HIDDEN, HF_INTER
  put(b + "embeddings.word_embeddings.weight", vocab_size, hidden)
  put(b + "embeddings.position_embeddings.weight", HF_POSITIONS, hidden)
  put(b + "embeddings.token_type_embeddings.weight", 2, hidden)
  put_norm(b + "embeddings.LayerNorm")
  t[b + "embeddings.position_ids"] = np.arange(HF_POSITIONS, dtype=np.int64)[None]
  for i in range(HF_LAYERS):
    p = f"{b}encoder.layer.{i}."
    for m in ("query", "key", "value"):
      put(p + f"attention.self.{m}.weight", hidden, hidden)
      put(p + f"attention.self.{m}.bias", hidden)
    put(p + "attention.output.dense.weight", hidden, hidden)
    put(p + "attention.output.dense.bias", hidden)
    put_norm(p + "attention.output.LayerNorm")
    put(p + "intermediate.dense.weight", inter, hidden)
    put(p + "intermediate.dense.bias", inter)
    put(p + "output.dense.weight", hidden, inter)
    put(p + "output.dense.bias", hidden)
    put_norm(p + "output.LayerNorm")
  put(b + "pooler.dense.weight", hidden, hidden)
  put(b + "pooler.dense.bias", hidden)
  if mlm:
    put("cls.predictions.transform.dense.weight", hidden, hidden)
    put("cls.predictions.transform.dense.bias", hidden)
    put_norm("cls.predictions.transform.LayerNorm")
    put("cls.predictions.bias", vocab_size)
    t["cls.predictions.decoder.weight"] = t[b + "embeddings.word_embeddings.weight"].copy()
    t["cls.predictions.decoder.bias"] = t["cls.predictions.bias"].copy()
    put("cls.seq_relationship.weight", 2, hidden)
    put("cls.seq_relationship.bias", 2)
  return t


def write_hf_dir(path, config, tensors):
  """``path/config.json`` (unless ``config`` is None) and ``path/model.safetensors``."""
  os.makedirs(path, exist_ok=True)
  if config is not None:
    with open(os.path.join(path, "config.json"), "w") as f:
      json.dump(config, f)
  safetensors_numpy.save_file(tensors, os.path.join(path, "model.safetensors"))
  return path


# ---------------------------------------------------------------------- command lines --

@contextlib.contextmanager
def _flags_of_its_own():
  """Inside, only absl's own flags are defined, as when a command line's process starts.

  The flags other modules defined (an experiment a test imported defines its flags at import:
  ``experiments.synthetic.demo``'s ``--output_dir`` would clash with ``realm-eval``'s) are set aside
  and put back afterwards; the flags defined inside are removed, the values restored (flagsaver).
  """
  fv = flags.FLAGS
  aside = {}   # flag -> the module that defined it
  for module, module_flags in fv.flags_by_module_dict().items():
    if not module.startswith("absl."):
      for flag in module_flags:
        aside.setdefault(flag, module)
  module_ids = {flag: module_id for module_id, module_flags in
                fv.flags_by_module_id_dict().items() for flag in module_flags}
  for flag in aside:
    for name in (flag.name, flag.short_name):
      if name and name in fv and fv[name] is flag:
        delattr(fv, name)
  try:
    with flagsaver.flagsaver():
      yield
  finally:
    for flag, module in aside.items():
      fv[flag.name] = flag
      fv.register_flag_by_module(module, flag)
      if flag in module_ids:
        fv.register_flag_by_module_id(module_ids[flag], flag)


def run_cli(module, *args):
  """``python -m <module> <args>`` run in this process: the module executed as ``__main__``
  (``runpy``) with ``sys.argv`` set, its flags its own (see ``_flags_of_its_own``) and its
  ``SystemExit`` caught (``cli.exit_now``, which ends a command line's process, raises it
  here). Returns a ``subprocess.CompletedProcess`` (status, stdout, stderr).
  """
  out, err = io.StringIO(), io.StringIO()
  code = 0

  def exit_here(code=0):   # cli.exit_now would end this process: the test's
    raise SystemExit(code)

  with _flags_of_its_own(), mock.patch.object(sys, "argv", [module, *args]), \
      mock.patch.object(cli, "exit_now", exit_here), \
      contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
      warnings.catch_warnings():
    # runpy warns that the module is imported already (by the tests): it runs afresh anyway.
    warnings.simplefilter("ignore", RuntimeWarning)
    try:
      runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
      code = 0 if e.code is None else e.code
  return subprocess.CompletedProcess([module, *args], code, out.getvalue(), err.getvalue())


def run_process(module, *args, timeout=300):
  """``python -m <module> <args>`` as a process of its own (a command line's smoke test) ->
  the finished process."""
  env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
  return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                        env=env, cwd=REPO, timeout=timeout, check=False)


def run_processes(runs, parallel=2):
  """``{name: (module, *args)}`` run as processes of their own, ``parallel`` at a time (their
  start-up, importing TensorFlow, is the cost: two cores run two) -> ``{name: finished}``."""
  with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
    futures = {name: pool.submit(run_process, *run) for name, run in runs.items()}
  return {name: future.result() for name, future in futures.items()}


def error_line(proc):
  """The one ``error: ...`` line of a command line that failed as expected: exit status 2 and
  no traceback."""
  assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
  assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
  lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
  assert len(lines) == 1, proc.stderr[-2000:]
  return lines[0]


# ------------------------------------------------------- a tiny REALM model and its inputs --
# REALM pre-training's unit tests (test_realm_pretrain, test_health): 16-wide towers over a
# 40-token vocabulary, random blocks and masked queries, exact search over fixed embeddings.

VOCAB, CLS, SEP, MASK = 40, 2, 3, 4
K, M, LQ, LB, LR = 4, 3, 10, 12, 20


def tiny_config(share=True):
  """The tiny REALM model's config (no dropout, a wide initialization)."""
  enc = configs.bert_tiny(VOCAB, 16)
  enc.override(dict(dropout_rate=0.0, attention_dropout_rate=0.0, initializer_range=0.5))
  return configs.RealmModelConfig(
      retriever=configs.RetrieverConfig(encoder=enc, projection_size=8, projection_dropout=0.0, share_embedders=share,
                                        query_seq_length=LQ, block_seq_length=LB),
      reader=configs.ReaderConfig(encoder=enc, seq_length=LR), num_candidates=K, max_masks=M)


def make_blocks(n, rng):
  """``n`` random blocks (token ids, uid); the last two share a uid."""
  blocks = []
  for i in range(n):
    title = [int(x) for x in rng.integers(5, VOCAB, 2)]
    body = [int(x) for x in rng.integers(5, VOCAB, rng.integers(3, 12))]
    key = "duplicate" if i >= n - 2 else f"t{i} <sep> b{i}"   # the last two share a uid
    uid = hashlib.sha1(key.encode()).hexdigest()
    blocks.append(dict(block_id=i, uid=uid, token_ids=[CLS] + title + [SEP] + body + [SEP]))
  return blocks


def make_examples(b, rng, blocks):
  """``b`` masked queries (1 to M masked tokens each) whose source blocks are drawn from
  ``blocks``."""
  query_ids = np.zeros([b, LQ], np.int64)
  query_mask = np.zeros([b, LQ], np.int64)
  positions = np.zeros([b, M], np.int64)
  ids = np.zeros([b, M], np.int64)
  weights = np.zeros([b, M], np.float32)
  for i in range(b):
    n = int(rng.integers(4, LQ - 2))
    toks = rng.integers(5, VOCAB, n)
    nm = int(rng.integers(1, M + 1))
    start = int(rng.integers(0, n - nm + 1))
    ids[i, :nm] = toks[start:start + nm]
    positions[i, :nm] = np.arange(start, start + nm) + 1
    toks[start:start + nm] = MASK
    query_ids[i, :n + 2] = [CLS, *toks, SEP]
    query_mask[i, :n + 2] = 1
    weights[i, :nm] = 1.0
  source = rng.integers(0, len(blocks), b)
  return dict(query_ids=query_ids, query_mask=query_mask, mlm_positions=positions, mlm_ids=ids,
              mlm_weights=weights, source_uid=np.array([blocks[s]["uid"] for s in source]),
              source_block_id=source)


class ExactHandle:
  """Exact search over fixed block embeddings (stands in for IndexHandle)."""

  def __init__(self, emb, step=0):
    self.emb, self.step = emb, step

  def search(self, q, k):
    scores = q @ self.emb.T
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return order, np.take_along_axis(scores, order, 1)


# -------------------------------------------------------------------------- training --

def train_ict(world, name, steps, *overrides):
  """``steps`` of ICT (``ict_cpu``, 32-wide towers, batches of 8) on the ICT pairs of a world
  prepared by ``conftest.realm_world``, into ``world["root"]/name`` -> (model dir, last logs)."""
  size = len(load_vocab(world["vocab"]))
  params = configs.load_experiment("ict_cpu", params_override=",".join([
      f"task.vocab_file={world['vocab']}", f"task.model.encoder.vocab_size={size}",
      "task.model.encoder.hidden_size=32", "task.model.encoder.intermediate_size=64",
      f"task.train_data.input_path={os.path.join(world['ict'], 'train-*')}",
      "task.train_data.global_batch_size=8", f"trainer.train_steps={steps}",
      "trainer.steps_per_loop=1", "trainer.summary_interval=1", *overrides]))
  path = str(world["root"] / name)
  return path, train_lib.run_experiment(params, path)


# -------------------------------------------------------------------------- summaries --

def scalars(logdir):
  """``{tag: {step: value}}`` of the TensorBoard event files in ``logdir``."""
  out = {}
  for path in tf.io.gfile.glob(os.path.join(logdir, "events.out.tfevents.*")):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        out.setdefault(value.tag, {})[event.step] = float(tf.make_ndarray(value.tensor))
  return out


# ------------------------------------------------------------------ NumPy references --
def np_hf_bert(t, config, ids, mask, types, act, prefix=""):
  """(sequence_output, pooled_output) of a Hugging Face ``BertModel`` held in ``t``."""
  def get(name):
    return t[prefix + name].astype(np.float64)

  def linear(x, name):
    return x @ get(name + ".weight").T + get(name + ".bias")

  def norm(x, name):
    return layer_norm(x, get(name + ".weight"), get(name + ".bias"),
                              config["layer_norm_eps"])

  batch, length = ids.shape
  heads = config["num_attention_heads"]
  size = config["hidden_size"] // heads
  x = (get("embeddings.word_embeddings.weight")[ids]
       + get("embeddings.position_embeddings.weight")[np.arange(length)][None]
       + get("embeddings.token_type_embeddings.weight")[types])
  x = norm(x, "embeddings.LayerNorm")
  for i in range(config["num_hidden_layers"]):
    p = f"encoder.layer.{i}."
    q, k, v = (linear(x, p + "attention.self." + m).reshape(batch, length, heads, size)
               .transpose(0, 2, 1, 3) for m in ("query", "key", "value"))
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(size)
    scores = np.where(mask[:, None, None, :] > 0, scores, -1e9)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    context = (probs @ v).transpose(0, 2, 1, 3).reshape(batch, length, heads * size)
    x = norm(linear(context, p + "attention.output.dense") + x, p + "attention.output.LayerNorm")
    h = act(linear(x, p + "intermediate.dense"))
    x = norm(linear(h, p + "output.dense") + x, p + "output.LayerNorm")
  return x, np.tanh(linear(x[:, 0], "pooler.dense"))


# ------------------------------------------------- the real Hugging Face libraries --
# sentence-transformers and transformers on CPU torch, pinned, in an environment of their own
# (make test-all builds .venv-hf), so that torch never shares a process with TensorFlow.
HF_PYTHON = os.environ.get("REALM_HF_PYTHON",
                           os.path.join(REPO, ".venv-hf", "bin", "python"))
HF_SIDE = os.path.join(REPO, "tests", "hf", "hf_side.py")


def through_the_libraries(tmp_path, request):
  """``tests/hf/hf_side.py`` on ``request`` in the libraries' environment -> its arrays."""
  if not os.path.exists(HF_PYTHON):
    pytest.fail(f"{HF_PYTHON} not found: `make test-all` installs it (target hf-venv)")
  path, out = str(tmp_path / "request.json"), str(tmp_path / "hf_out.npz")
  with open(path, "w", encoding="utf-8") as f:
    json.dump(request, f)
  env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
             TOKENIZERS_PARALLELISM="false")
  proc = subprocess.run([HF_PYTHON, HF_SIDE, path, out], capture_output=True, text=True,
                        env=env, timeout=900, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return dict(np.load(out))


def assert_same_top_k(got, want, scores, rtol=1e-5, atol=1e-5):
  """Top-k ids ``got`` equal the reference's ``want`` ([queries, k]), but that a query may hold
  another id in a place whose reference score (``scores``: [queries, rows], by row id) equals
  the wanted one's within the tolerance: a near-tie, which another kernel's summation order
  breaks the other way (issue 70). Each query's scores in rank order must then agree."""
  got, want = np.asarray(got), np.asarray(want)
  assert got.shape == want.shape, (got.shape, want.shape)
  for q in range(len(got)):
    if not np.array_equal(got[q], want[q]):
      assert len(set(got[q].tolist())) == len(got[q]), f"query {q}: {got[q]} repeats an id"
      np.testing.assert_allclose(scores[q, got[q]], scores[q, want[q]], rtol=rtol, atol=atol,
                                 err_msg=f"query {q}: {got[q]} against {want[q]}")
