"""TF1 checkpoints in the released names -> realm_tf, checked against a NumPy BERT."""

import json
import os
import subprocess
import sys

import numpy as np
import tensorflow as tf

import realm_tf
from realm_tf import checkpoint_convert
from realm_tf import model_dir
from realm_tf import modeling
from realm_tf.tokenization import RealmTokenizer

HIDDEN, HEADS, LAYERS, INTER = 32, 4, 2, 48
WORDS = ["the", "a", "city", "river", "born", "in", "was", "who", "of", "paris", "france",
         "where", "is", "?", ".", ",", "1843", "capital", "wrote", "play"]


def write_vocab(path):
  vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
  with open(path, "w") as f:
    f.write("\n".join(vocab) + "\n")
  return len(vocab)


def bert_config(vocab_size):
  return dict(vocab_size=vocab_size, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
              num_attention_heads=HEADS, intermediate_size=INTER, hidden_act="gelu",
              hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
              max_position_embeddings=512, type_vocab_size=2, initializer_range=0.02)


def random_bert(rng, prefix, vocab_size, hidden=HIDDEN, inter=INTER, layers=LAYERS):
  HIDDEN, INTER, LAYERS = hidden, inter, layers  # pylint: disable=invalid-name
  w = {}
  def put(name, *shape, scale=0.1):
    w[prefix + name] = (rng.standard_normal(shape) * scale).astype(np.float32)
  put("embeddings/word_embeddings", vocab_size, HIDDEN)
  put("embeddings/token_type_embeddings", 2, HIDDEN)
  put("embeddings/position_embeddings", 512, HIDDEN)
  put("embeddings/LayerNorm/gamma", HIDDEN)
  put("embeddings/LayerNorm/beta", HIDDEN)
  for i in range(LAYERS):
    p = f"encoder/layer_{i}/"
    for m in ("query", "key", "value"):
      put(p + f"attention/self/{m}/kernel", HIDDEN, HIDDEN, scale=0.3)
      put(p + f"attention/self/{m}/bias", HIDDEN)
    put(p + "attention/output/dense/kernel", HIDDEN, HIDDEN, scale=0.3)
    put(p + "attention/output/dense/bias", HIDDEN)
    put(p + "attention/output/LayerNorm/gamma", HIDDEN)
    put(p + "attention/output/LayerNorm/beta", HIDDEN)
    put(p + "intermediate/dense/kernel", HIDDEN, INTER, scale=0.3)
    put(p + "intermediate/dense/bias", INTER)
    put(p + "output/dense/kernel", INTER, HIDDEN, scale=0.3)
    put(p + "output/dense/bias", HIDDEN)
    put(p + "output/LayerNorm/gamma", HIDDEN)
    put(p + "output/LayerNorm/beta", HIDDEN)
  put("pooler/dense/kernel", HIDDEN, HIDDEN, scale=0.3)
  put("pooler/dense/bias", HIDDEN)
  return w


def write_tf1_checkpoint(weights, path):
  """Writes a name-based TF1 checkpoint, as Estimator/TF-Hub did."""
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
  return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def layer_norm(x, g, b, eps=1e-12):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + eps) * g + b


def np_bert(w, p, ids, mask, types):
  x = (w[p + "embeddings/word_embeddings"][ids] + w[p + "embeddings/token_type_embeddings"][types]
       + w[p + "embeddings/position_embeddings"][np.arange(ids.shape[1])][None])
  x = layer_norm(x, w[p + "embeddings/LayerNorm/gamma"], w[p + "embeddings/LayerNorm/beta"])
  b, n, d = ids.shape[0], ids.shape[1], HIDDEN // HEADS
  for i in range(LAYERS):
    q = f"{p}encoder/layer_{i}/"
    heads = {}
    for m in ("query", "key", "value"):
      y = x @ w[q + f"attention/self/{m}/kernel"] + w[q + f"attention/self/{m}/bias"]
      heads[m] = y.reshape(b, n, HEADS, d).transpose(0, 2, 1, 3)
    scores = heads["query"] @ heads["key"].transpose(0, 1, 3, 2) / np.sqrt(d)
    scores = scores + (1.0 - mask[:, None, None, :]) * -1e9
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    ctx = (probs @ heads["value"]).transpose(0, 2, 1, 3).reshape(b, n, HIDDEN)
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


class ConvertTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = self.get_temp_dir()
    self.vocab_file = os.path.join(self.dir, "vocab.txt")
    self.vocab_size = write_vocab(self.vocab_file)
    self.config_file = os.path.join(self.dir, "bert_config.json")
    with open(self.config_file, "w") as f:
      json.dump(bert_config(self.vocab_size), f)
    self.rng = np.random.default_rng(0)

  def embedder_weights(self):
    w = random_bert(self.rng, "module/module/module/bert/", self.vocab_size)
    w["module/module/dense/kernel"] = self.rng.standard_normal([HIDDEN, 128]).astype(np.float32)
    w["module/module/dense/bias"] = self.rng.standard_normal([128]).astype(np.float32)
    w["module/module/LayerNorm/gamma"] = self.rng.standard_normal([128]).astype(np.float32)
    w["module/module/LayerNorm/beta"] = self.rng.standard_normal([128]).astype(np.float32)
    # Optimizer slots and the step counter must be skipped.
    w["module/module/dense/kernel/adam_m"] = np.zeros([HIDDEN, 128], np.float32)
    w["global_step"] = np.zeros([], np.float32)
    return w

  def encoder_weights(self):
    w = random_bert(self.rng, "bert/", self.vocab_size)
    w["cls/predictions/transform/dense/kernel"] = (
        self.rng.standard_normal([HIDDEN, HIDDEN]) * 0.3).astype(np.float32)
    w["cls/predictions/transform/dense/bias"] = self.rng.standard_normal([HIDDEN]).astype(np.float32)
    w["cls/predictions/transform/LayerNorm/gamma"] = self.rng.standard_normal([HIDDEN]).astype(np.float32)
    w["cls/predictions/transform/LayerNorm/beta"] = self.rng.standard_normal([HIDDEN]).astype(np.float32)
    w["cls/predictions/output_bias"] = self.rng.standard_normal([self.vocab_size]).astype(np.float32)
    return w

  def test_embedder_matches_numpy(self):
    w = self.embedder_weights()
    ckpt = write_tf1_checkpoint(w, os.path.join(self.dir, "tf1", "embedder"))
    out = os.path.join(self.dir, "converted")
    checkpoint_convert.convert([ckpt], self.config_file, self.vocab_file, out)

    embedder = realm_tf.Embedder.load(out)
    queries = ["who was born in paris?", "the capital of france is paris .", "a river"]
    got = embedder.embed_queries(queries)
    inputs = embedder.tokenizer.query_inputs(queries, 96)
    ids, mask, types = (inputs[k].numpy() for k in
                        ("input_word_ids", "input_mask", "input_type_ids"))
    self.assertEqual(ids[0, 0], embedder.tokenizer.cls_id)
    _, pooled = np_bert(w, "module/module/module/bert/", ids, mask.astype(np.float32), types)
    proj = pooled @ w["module/module/dense/kernel"] + w["module/module/dense/bias"]
    want = layer_norm(proj, w["module/module/LayerNorm/gamma"], w["module/module/LayerNorm/beta"])
    self.assertEqual(got.shape, (3, 128))
    self.assertLess(rel_err(got, want), 1e-4)
    # Shared embedders: blocks go through the same tower.
    blocks = embedder.embed_blocks(["paris"], ["the capital of france ."])
    binp = embedder.tokenizer.block_inputs(["paris"], ["the capital of france ."], 288)
    _, pooled = np_bert(w, "module/module/module/bert/", binp["input_word_ids"].numpy(),
                        binp["input_mask"].numpy().astype(np.float32),
                        binp["input_type_ids"].numpy())
    want = layer_norm(pooled @ w["module/module/dense/kernel"] + w["module/module/dense/bias"],
                      w["module/module/LayerNorm/gamma"], w["module/module/LayerNorm/beta"])
    self.assertLess(rel_err(blocks, want), 1e-4)

  def test_encoder_mlm_logits_match_numpy(self):
    w = self.encoder_weights()
    ckpt = write_tf1_checkpoint(w, os.path.join(self.dir, "tf1", "bert"))
    emb_ckpt = write_tf1_checkpoint(self.embedder_weights(),
                                    os.path.join(self.dir, "tf1e", "embedder"))
    out = os.path.join(self.dir, "converted")
    checkpoint_convert.convert([emb_ckpt, ckpt], self.config_file, self.vocab_file, out)
    config = model_dir.load_config(out)
    reader = modeling.build_reader(config.reader)
    model_dir.restore(model_dir.latest_checkpoint(out), reader=reader)
    tok = RealmTokenizer(config.vocab_file)
    inputs = tok.reader_inputs(["who [MASK] born in paris ?"], ["paris is the capital ."], 24)
    positions = np.array([[1, 2, 5]], np.int32)
    got = reader(dict(inputs, masked_lm_positions=positions), training=False)["mlm_logits"]
    seq, _ = np_bert(w, "bert/", inputs["input_word_ids"].numpy(),
                     inputs["input_mask"].numpy().astype(np.float32),
                     inputs["input_type_ids"].numpy())
    h = seq[0, positions[0]] @ w["cls/predictions/transform/dense/kernel"]
    h = gelu(h + w["cls/predictions/transform/dense/bias"])
    h = layer_norm(h, w["cls/predictions/transform/LayerNorm/gamma"],
                   w["cls/predictions/transform/LayerNorm/beta"])
    want = h @ w["bert/embeddings/word_embeddings"].T + w["cls/predictions/output_bias"]
    self.assertLess(rel_err(got.numpy()[0], want), 1e-4)

  def test_plain_bert_initializes_both_towers(self):
    w = self.encoder_weights()
    ckpt = write_tf1_checkpoint(w, os.path.join(self.dir, "tf1", "bert"))
    out = os.path.join(self.dir, "converted")
    checkpoint_convert.convert([ckpt], self.config_file, self.vocab_file, out)
    embedder = realm_tf.Embedder.load(out)
    self.assertAllClose(embedder.query_embedder.encoder.get_embedding_table().numpy(),
                        w["bert/embeddings/word_embeddings"])

  def test_orqa_layout(self):
    w = {}
    for k, v in self.embedder_weights().items():
      if k.startswith("module/"):
        k = "module/" + k
      w[k] = v
    for k, v in self.encoder_weights().items():
      w["reader/module/" + k] = v
    w["reader/dense/kernel"] = np.ones([HIDDEN, 512], np.float32)
    w["reader/dense/bias"] = np.zeros([512], np.float32)
    w["reader/dense_1/kernel"] = np.ones([256, 1], np.float32)
    w["reader/dense_1/bias"] = np.zeros([1], np.float32)
    w["reader/layer_normalization/gamma"] = np.ones([256], np.float32)
    w["reader/layer_normalization/beta"] = np.zeros([256], np.float32)
    ckpt = write_tf1_checkpoint(w, os.path.join(self.dir, "tf1", "orqa"))
    out = os.path.join(self.dir, "converted")
    checkpoint_convert.convert([ckpt], self.config_file, self.vocab_file, out)
    config = model_dir.load_config(out)
    self.assertFalse(config.retriever.share_embedders)
    reader = modeling.build_reader(config.reader, with_span_scorer=True)
    model_dir.restore(model_dir.latest_checkpoint(out), reader=reader)
    self.assertAllClose(reader.span_scorer.projection.kernel.numpy(), w["reader/dense/kernel"])
    embedder = realm_tf.Embedder.load(out)
    self.assertEqual(embedder.embed_queries(["paris"]).shape, (1, 128))
    with self.assertRaisesRegex(ValueError, "no block tower"):
      embedder.embed_blocks(["a"], ["b"])

  def test_wrong_shape_names_the_variable(self):
    w = self.embedder_weights()
    w["module/module/module/bert/encoder/layer_1/intermediate/dense/kernel"] = np.zeros(
        [HIDDEN, INTER + 1], np.float32)
    ckpt = write_tf1_checkpoint(w, os.path.join(self.dir, "tf1", "bad"))
    with self.assertRaisesRegex(checkpoint_convert.ConversionError,
                                "layer_1/intermediate/dense/kernel has shape"):
      checkpoint_convert.convert([ckpt], self.config_file, self.vocab_file,
                                 os.path.join(self.dir, "out"))

  def test_extra_layer_is_refused(self):
    w = self.embedder_weights()
    w["module/module/module/bert/encoder/layer_2/output/dense/bias"] = np.zeros(
        [HIDDEN], np.float32)
    ckpt = write_tf1_checkpoint(w, os.path.join(self.dir, "tf1", "bad"))
    with self.assertRaisesRegex(checkpoint_convert.ConversionError, "layer_2/output/dense/bias"):
      checkpoint_convert.convert([ckpt], self.config_file, self.vocab_file,
                                 os.path.join(self.dir, "out"))

  def test_cli_reports_one_line_errors(self):
    w = self.embedder_weights()
    del w["module/module/LayerNorm/beta"]
    ckpt = write_tf1_checkpoint(w, os.path.join(self.dir, "tf1", "bad"))
    cases = [
        ([ckpt], os.path.join(self.dir, "missing_vocab.txt"), "vocab file not found"),
        ([ckpt], self.vocab_file, "missing variable module/module/LayerNorm/beta"),
        ([os.path.join(self.dir, "nope")], self.vocab_file, "cannot read TF1 checkpoint"),
    ]
    for ckpts, vocab, message in cases:
      args = [sys.executable, "-m", "realm_tf.binaries.convert", f"--bert_config={self.config_file}",
              f"--vocab_file={vocab}", f"--output_dir={self.dir}/o"]
      args += [f"--tf1_checkpoint={c}" for c in ckpts]
      proc = subprocess.run(args, capture_output=True, text=True, timeout=120)
      self.assertEqual(proc.returncode, 2, proc.stderr[-2000:])
      self.assertIn(message, proc.stderr)
      self.assertNotIn("Traceback", proc.stderr)


if __name__ == "__main__":
  tf.test.main()
