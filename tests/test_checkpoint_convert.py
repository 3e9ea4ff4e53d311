"""TF1 checkpoints in the released names -> realm_tf, checked against a NumPy BERT."""

import json
import os

import numpy as np
import tensorflow as tf

import realm_tf
from realm_tf import checkpoint_convert
from realm_tf import model_dir
from realm_tf import modeling
from realm_tf.tokenization import RealmTokenizer

import helpers

HIDDEN, INTER = helpers.TF1_HIDDEN, helpers.TF1_INTER


class ConvertTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = self.get_temp_dir()
    self.vocab_file = os.path.join(self.dir, "vocab.txt")
    self.vocab_size = helpers.write_tf1_vocab(self.vocab_file)
    self.config_file = os.path.join(self.dir, "bert_config.json")
    with open(self.config_file, "w") as f:
      json.dump(helpers.bert_config(self.vocab_size), f)
    self.rng = np.random.default_rng(0)

  def embedder_weights(self):
    w = helpers.random_bert(self.rng, "module/module/module/bert/", self.vocab_size)
    w["module/module/dense/kernel"] = self.rng.standard_normal([HIDDEN, 128]).astype(np.float32)
    w["module/module/dense/bias"] = self.rng.standard_normal([128]).astype(np.float32)
    w["module/module/LayerNorm/gamma"] = self.rng.standard_normal([128]).astype(np.float32)
    w["module/module/LayerNorm/beta"] = self.rng.standard_normal([128]).astype(np.float32)
    # Optimizer slots and the step counter must be skipped.
    w["module/module/dense/kernel/adam_m"] = np.zeros([HIDDEN, 128], np.float32)
    w["global_step"] = np.zeros([], np.float32)
    return w

  def encoder_weights(self):
    w = helpers.random_bert(self.rng, "bert/", self.vocab_size)
    w["cls/predictions/transform/dense/kernel"] = (
        self.rng.standard_normal([HIDDEN, HIDDEN]) * 0.3).astype(np.float32)
    w["cls/predictions/transform/dense/bias"] = self.rng.standard_normal([HIDDEN]).astype(np.float32)
    w["cls/predictions/transform/LayerNorm/gamma"] = self.rng.standard_normal([HIDDEN]).astype(np.float32)
    w["cls/predictions/transform/LayerNorm/beta"] = self.rng.standard_normal([HIDDEN]).astype(np.float32)
    w["cls/predictions/output_bias"] = self.rng.standard_normal([self.vocab_size]).astype(np.float32)
    return w

  def test_embedder_matches_numpy(self):
    w = self.embedder_weights()
    ckpt = helpers.write_tf1_checkpoint(w, os.path.join(self.dir, "tf1", "embedder"))
    out = os.path.join(self.dir, "converted")
    checkpoint_convert.convert([ckpt], self.config_file, self.vocab_file, out)

    embedder = realm_tf.Embedder.load(out)
    queries = ["who was born in paris?", "the capital of france is paris .", "a river"]
    got = embedder.embed_queries(queries)
    inputs = embedder.tokenizer.query_inputs(queries, 96)
    ids, mask, types = (inputs[k].numpy() for k in
                        ("input_word_ids", "input_mask", "input_type_ids"))
    self.assertEqual(ids[0, 0], embedder.tokenizer.cls_id)
    _, pooled = helpers.np_bert(w, "module/module/module/bert/", ids, mask.astype(np.float32),
                                types)
    proj = pooled @ w["module/module/dense/kernel"] + w["module/module/dense/bias"]
    want = helpers.layer_norm(proj, w["module/module/LayerNorm/gamma"],
                              w["module/module/LayerNorm/beta"])
    self.assertEqual(got.shape, (3, 128))
    self.assertLess(helpers.rel_err(got, want), 1e-4)
    # Shared embedders: blocks go through the same tower.
    blocks = embedder.embed_blocks(["paris"], ["the capital of france ."])
    binp = embedder.tokenizer.block_inputs(["paris"], ["the capital of france ."], 288)
    _, pooled = helpers.np_bert(w, "module/module/module/bert/", binp["input_word_ids"].numpy(),
                                binp["input_mask"].numpy().astype(np.float32),
                                binp["input_type_ids"].numpy())
    want = helpers.layer_norm(
        pooled @ w["module/module/dense/kernel"] + w["module/module/dense/bias"],
        w["module/module/LayerNorm/gamma"], w["module/module/LayerNorm/beta"])
    self.assertLess(helpers.rel_err(blocks, want), 1e-4)

  def test_encoder_mlm_logits_match_numpy(self):
    w = self.encoder_weights()
    ckpt = helpers.write_tf1_checkpoint(w, os.path.join(self.dir, "tf1", "bert"))
    emb_ckpt = helpers.write_tf1_checkpoint(self.embedder_weights(),
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
    seq, _ = helpers.np_bert(w, "bert/", inputs["input_word_ids"].numpy(),
                     inputs["input_mask"].numpy().astype(np.float32),
                     inputs["input_type_ids"].numpy())
    h = seq[0, positions[0]] @ w["cls/predictions/transform/dense/kernel"]
    h = helpers.gelu(h + w["cls/predictions/transform/dense/bias"])
    h = helpers.layer_norm(h, w["cls/predictions/transform/LayerNorm/gamma"],
                   w["cls/predictions/transform/LayerNorm/beta"])
    want = h @ w["bert/embeddings/word_embeddings"].T + w["cls/predictions/output_bias"]
    self.assertLess(helpers.rel_err(got.numpy()[0], want), 1e-4)

  def test_plain_bert_initializes_both_towers(self):
    w = self.encoder_weights()
    ckpt = helpers.write_tf1_checkpoint(w, os.path.join(self.dir, "tf1", "bert"))
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
    ckpt = helpers.write_tf1_checkpoint(w, os.path.join(self.dir, "tf1", "orqa"))
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
    ckpt = helpers.write_tf1_checkpoint(w, os.path.join(self.dir, "tf1", "bad"))
    with self.assertRaisesRegex(checkpoint_convert.ConversionError,
                                "layer_1/intermediate/dense/kernel has shape"):
      checkpoint_convert.convert([ckpt], self.config_file, self.vocab_file,
                                 os.path.join(self.dir, "out"))

  def test_extra_layer_is_refused(self):
    w = self.embedder_weights()
    w["module/module/module/bert/encoder/layer_2/output/dense/bias"] = np.zeros(
        [HIDDEN], np.float32)
    ckpt = helpers.write_tf1_checkpoint(w, os.path.join(self.dir, "tf1", "bad"))
    with self.assertRaisesRegex(checkpoint_convert.ConversionError, "layer_2/output/dense/bias"):
      checkpoint_convert.convert([ckpt], self.config_file, self.vocab_file,
                                 os.path.join(self.dir, "out"))

  def test_cli_reports_one_line_errors(self):
    w = self.embedder_weights()
    del w["module/module/LayerNorm/beta"]
    ckpt = helpers.write_tf1_checkpoint(w, os.path.join(self.dir, "tf1", "bad"))
    cases = [
        ([ckpt], os.path.join(self.dir, "missing_vocab.txt"), "vocab file not found"),
        ([ckpt], self.vocab_file, "missing variable module/module/LayerNorm/beta"),
        ([os.path.join(self.dir, "nope")], self.vocab_file, "cannot read TF1 checkpoint"),
    ]
    for ckpts, vocab, message in cases:   # realm-convert in this process
      proc = helpers.run_cli("realm_tf.binaries.convert", f"--bert_config={self.config_file}",
                             f"--vocab_file={vocab}", f"--output_dir={self.dir}/o",
                             *[f"--tf1_checkpoint={c}" for c in ckpts])
      self.assertEqual(proc.returncode, 2, proc.stderr[-2000:])
      self.assertIn(message, proc.stderr)
      self.assertNotIn("Traceback", proc.stderr)


if __name__ == "__main__":
  tf.test.main()
