"""Configs round-trip through YAML; every network builds from its config and compiles with XLA."""

import os

import numpy as np
import tensorflow as tf
from absl.testing import parameterized
from official.modeling import hyperparams

from realm_tf import configs
from realm_tf import modeling

EXPERIMENTS = list(configs.EXPERIMENTS)


def tiny_inputs(batch=2, length=12, vocab=60):
  rng = np.random.default_rng(0)
  ids = rng.integers(5, vocab, size=[batch, length]).astype(np.int32)
  mask = np.ones([batch, length], np.int32)
  mask[1, 8:] = 0
  types = np.zeros([batch, length], np.int32)
  types[:, 6:] = 1
  return dict(input_word_ids=ids, input_mask=mask, input_type_ids=types)


class ConfigTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(*EXPERIMENTS)
  def test_yaml_round_trip(self, name):
    params = configs.load_experiment(name)
    path = os.path.join(self.get_temp_dir(), f"{name}.yaml")
    hyperparams.save_params_dict_to_yaml(params, path)
    again = configs.load_experiment(name, config_files=[path])
    self.assertEqual(params.as_dict(), again.as_dict())

  def test_shipped_yaml_files_load(self):
    root = os.path.join(os.path.dirname(__file__), "..", "experiments", "configs")
    files = sorted(f for f in os.listdir(root) if f.endswith(".yaml"))
    self.assertNotEmpty(files)
    for f in files:
      name = f.split("__")[0]
      configs.load_experiment(name, config_files=[os.path.join(root, f)])

  def test_overrides(self):
    params = configs.load_experiment(
        "realm_pretrain_cpu", params_override="task.model.num_candidates=4,trainer.train_steps=7")
    self.assertEqual(params.task.model.num_candidates, 4)
    self.assertEqual(params.trainer.train_steps, 7)
    self.assertEqual(params.task.model.retriever.query_seq_length, 32)

  def test_paper_values(self):
    p = configs.load_experiment("realm_pretrain_paper")
    self.assertEqual(p.task.model.retriever.encoder.num_layers, 12)
    self.assertEqual(p.task.model.retriever.encoder.hidden_size, 768)
    self.assertEqual(p.task.model.retriever.projection_size, 128)
    self.assertEqual((p.task.model.retriever.query_seq_length,
                      p.task.model.retriever.block_seq_length,
                      p.task.model.reader.seq_length, p.task.model.reader.openqa_seq_length),
                     (96, 288, 384, 320))
    self.assertEqual(p.task.train_data.global_batch_size, 512)
    self.assertEqual(p.task.model.num_candidates, 8)

  def test_unknown_key_is_one_line_error(self):
    with self.assertRaisesRegex(configs.ConfigError, "The key 'bogus' does not exist"):
      configs.load_experiment("realm_pretrain_cpu", params_override="task.model.bogus=1")
    with self.assertRaisesRegex(configs.ConfigError, "unknown experiment 'nope'"):
      configs.load_experiment("nope")
    path = os.path.join(self.get_temp_dir(), "bad.yaml")
    with open(path, "w") as f:
      f.write("task:\n  model:\n    projektion_size: 3\n")
    with self.assertRaisesRegex(configs.ConfigError, "projektion_size"):
      configs.load_experiment("ict_cpu", config_files=[path])


class ModelingTest(tf.test.TestCase, parameterized.TestCase):

  def retriever_config(self, share):
    return configs.RetrieverConfig(encoder=configs.bert_tiny(60, 32), projection_size=16,
                                   share_embedders=share)

  @parameterized.parameters(True, False)
  def test_embedders_xla(self, share):
    q, b = modeling.build_embedders(self.retriever_config(share))
    self.assertEqual(q is b, share)
    inputs = tiny_inputs()
    eager = b(inputs, training=False)
    xla = tf.function(lambda x: b(x, training=False), jit_compile=True)(inputs)
    self.assertEqual(xla.shape, (2, 16))
    self.assertAllClose(eager, xla, atol=1e-4)
    # LayerNorm output: zero mean, unit variance per row (gamma=1, beta=0 at init).
    self.assertAllClose(np.mean(eager, -1), np.zeros(2), atol=1e-4)

  def test_embedder_get_config_round_trip(self):
    q, _ = modeling.build_embedders(self.retriever_config(True))
    clone = modeling.RealmEmbedder.from_config(q.get_config()).build_from_length()
    clone.set_weights(q.get_weights())
    inputs = tiny_inputs()
    self.assertAllClose(q(inputs, training=False), clone(inputs, training=False), atol=1e-5)

  def test_reader_and_span_scorer_xla(self):
    reader = modeling.build_reader(
        configs.ReaderConfig(encoder=configs.bert_tiny(60, 32), span_hidden_size=8),
        with_span_scorer=True)
    inputs = dict(tiny_inputs(), masked_lm_positions=np.array([[1, 2], [3, 0]], np.int32))

    @tf.function(jit_compile=True)
    def run(x):
      out = reader(x, training=False)
      starts, ends, mask = modeling.candidate_spans(x["input_type_ids"], x["input_mask"], 3)
      return out["mlm_logits"], reader.span_scorer(out["sequence_output"], starts, ends), mask
    logits, spans, mask = run(inputs)
    self.assertEqual(logits.shape, (2, 2, 60))
    self.assertEqual(spans.shape, (2, 36))
    self.assertAllClose(logits, reader(inputs, training=False)["mlm_logits"], atol=1e-4)
    clone = modeling.KnowledgeAugmentedEncoder.from_config(reader.get_config())
    self.assertEqual(clone.get_config()["span_hidden_size"], 8)

  def test_span_scorer_matches_numpy(self):
    scorer = modeling.SpanScorer(4)
    seq = np.random.default_rng(1).standard_normal([1, 5, 6]).astype(np.float32)
    starts, ends = np.array([[0, 1, 2]], np.int32), np.array([[0, 3, 4]], np.int32)
    got = scorer(seq, starts, ends).numpy()
    w, bias = scorer.projection.kernel.numpy(), scorer.projection.bias.numpy()
    proj = seq[0] @ w + bias
    h = np.maximum(proj[starts[0], :4] + proj[ends[0], 4:], 0)
    h = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-3)
    want = h @ scorer.output_dense.kernel.numpy()[:, 0] + scorer.output_dense.bias.numpy()
    self.assertAllClose(got[0], want, atol=1e-4)

  def test_candidate_spans_stay_in_block(self):
    types = np.array([[0, 0, 0, 1, 1, 1, 1, 0]], np.int32)   # block: 3..5, [SEP] at 6
    mask = np.array([[1, 1, 1, 1, 1, 1, 1, 0]], np.int32)
    starts, ends, valid = modeling.candidate_spans(types, mask, 2)
    spans = {(int(s), int(e)) for s, e, v in zip(starts[0], ends[0], valid[0]) if v}
    self.assertEqual(spans, {(3, 3), (3, 4), (4, 4), (4, 5), (5, 5)})


if __name__ == "__main__":
  tf.test.main()


class FaithfulTrainingTest(tf.test.TestCase, parameterized.TestCase):
  """The original code's optimizer, warm-up and retriever dropout."""

  @parameterized.parameters(*EXPERIMENTS)
  def test_bert_warmup_for_every_experiment(self, name):
    """BERT's create_optimizer as REALM and ORQA call it: min(10000, max(100, steps / 10))
    warm-up steps, over the final train_steps (after overrides); decay over all of them."""
    for steps in (500, 6000, 150_000):
      params = configs.load_experiment(name, params_override=f"trainer.train_steps={steps}")
      optimizer = params.trainer.optimizer_config
      self.assertEqual(optimizer.warmup.linear.warmup_steps, min(10000, max(100, steps // 10)))
      self.assertEqual(optimizer.learning_rate.polynomial.decay_steps, steps)
    # A run no longer than BERT's 100-step minimum warms up over a tenth of its steps: Model
    # Garden's warm-up would ramp to the rate decayed to 0 and the run would never move.
    from official.modeling import optimization  # pylint: disable=g-import-not-at-top
    for steps in (4, 50, 100):
      params = configs.load_experiment(name, params_override=f"trainer.train_steps={steps}")
      optimizer = params.trainer.optimizer_config
      self.assertEqual(optimizer.warmup.linear.warmup_steps, steps // 10)
      lr = optimization.OptimizerFactory(optimizer).build_learning_rate()
      self.assertGreater(float(lr(steps // 2)), 0.0)
    # A warm-up set explicitly stays.
    params = configs.load_experiment(
        name, params_override="trainer.optimizer_config.warmup.linear.warmup_steps=7")
    self.assertEqual(params.trainer.optimizer_config.warmup.linear.warmup_steps, 7)

  def test_optimizer_as_bert(self):
    """AdamW with BERT's epsilon 1e-6, weight decay 0.01 (not on LayerNorm or biases) and
    gradients clipped to global norm 1.0; the schedule warms up linearly, then decays."""
    from official.modeling import optimization  # pylint: disable=g-import-not-at-top
    params = configs.load_experiment("realm_pretrain_cpu",
                                     params_override="trainer.train_steps=1000")
    factory = optimization.OptimizerFactory(params.trainer.optimizer_config)
    lr = factory.build_learning_rate()
    optimizer = factory.build_optimizer(lr)
    self.assertEqual(optimizer.epsilon, 1e-6)
    self.assertEqual(optimizer.gradient_clip_norm, 1.0)
    self.assertEqual(optimizer.weight_decay_rate, 0.01)
    peak = params.trainer.optimizer_config.learning_rate.polynomial.initial_learning_rate
    # Model Garden's warm-up ramps to the decayed rate of its last step (BERT's to the peak).
    self.assertAllClose([lr(0), lr(50), lr(100), lr(550), lr(1000)],
                        [0.0, peak * 0.9 * 0.5, peak * 0.9, peak * 0.45, 0.0], rtol=1e-5)

  def test_projection_dropout(self):
    """ORQA's retriever module: dropout 0.1 on the embedding after its LayerNorm, in training
    only (the paper's towers; the toy towers have none, NOTES section 3)."""
    self.assertEqual(configs.RetrieverConfig().projection_dropout, 0.1)
    self.assertEqual(configs.load_experiment(
        "realm_pretrain_paper").task.model.retriever.projection_dropout, 0.1)
    self.assertEqual(configs.retriever_tiny().projection_dropout, 0.0)
    config = configs.RetrieverConfig(encoder=configs.bert_tiny(60, 16, dropout_rate=0.0),
                                     projection_size=64, projection_dropout=0.5)
    embedder = modeling.build_embedder(config)
    x = tiny_inputs()
    normalized = embedder.layer_norm(embedder.projection(
        embedder.encoder(x, training=False)["pooled_output"]))
    self.assertAllClose(embedder(x, training=False), normalized)
    dropped = embedder(x, training=True).numpy()
    zero = dropped == 0
    self.assertBetween(zero.mean(), 0.3, 0.7)
    self.assertAllClose(dropped[~zero], normalized.numpy()[~zero] / 0.5, rtol=1e-5)
