"""Tests of ``experiments/scale_model.py``: its FLOP and parameter counts against independent
counts, its scaling arithmetic on a hand-computed example, and ``--quick`` end to end."""

from absl.testing import parameterized
import numpy as np
import tensorflow as tf
from official.nlp.configs import encoders

from experiments import scale_model as sm
from realm_tf import configs
from realm_tf.modeling import factory

import helpers


def _einsum_flops(equation, shapes):
  """2 x the product of every index's size (a multiply-add per point of the index space)."""
  inputs = equation.replace(" ", "").split("->")[0].split(",")
  sizes = {}
  for spec, shape in zip(inputs, shapes):
    assert "." not in spec, equation
    for letter, size in zip(spec, shape):
      sizes[letter] = size
  return 2 * int(np.prod(list(sizes.values()), dtype=np.int64))


def graph_matmul_flops(concrete_function):
  """Matmul FLOPs of a traced graph, read from its ops' static shapes (MatMul, BatchMatMul*,
  Einsum), recursing into called functions: an independent count of the same model."""
  graph = concrete_function.graph
  library = {f.name: f for f in graph._functions.values()}  # pylint: disable=protected-access

  def count(g):
    total = 0
    for op in g.get_operations():
      shapes = [t.shape.as_list() for t in op.inputs]
      if op.type == "MatMul":
        a, b = shapes[0], shapes[1]
        m, k = (a[1], a[0]) if op.get_attr("transpose_a") else (a[0], a[1])
        n = b[0] if op.get_attr("transpose_b") else b[1]
        total += 2 * m * n * k
      elif op.type in ("BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"):
        a, b = shapes[0], shapes[1]
        adj_a, adj_b = op.get_attr("adj_x"), op.get_attr("adj_y")
        m, k = (a[-1], a[-2]) if adj_a else (a[-2], a[-1])
        n = b[-2] if adj_b else b[-1]
        batch = np.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2]))
        total += 2 * int(np.prod(batch, dtype=np.int64)) * m * n * k
      elif op.type == "Einsum":
        total += _einsum_flops(op.get_attr("equation").decode(), shapes)
      for attr in ("f",):
        try:
          name = op.get_attr(attr).name
        except (ValueError, AttributeError):
          continue
        if name in library:
          total += count(library[name].graph)
    return total

  return count(graph)


def _encoder(layers, hidden, heads, intermediate, vocab=50):
  return encoders.BertEncoderConfig(vocab_size=vocab, hidden_size=hidden, num_layers=layers,
                                    num_attention_heads=heads, intermediate_size=intermediate,
                                    max_position_embeddings=64, dropout_rate=0.0,
                                    attention_dropout_rate=0.0)


def _inputs(batch, seq):
  return dict(input_word_ids=tf.ones([batch, seq], tf.int32),
              input_mask=tf.ones([batch, seq], tf.int32),
              input_type_ids=tf.zeros([batch, seq], tf.int32))


class FlopCountTest(tf.test.TestCase, parameterized.TestCase):

  def test_layer_formula_by_hand(self):
    # L=4, H=8, I=16: QKV 3*2*4*8*8 = 1536, scores + context 2*2*4*4*8 = 512,
    # output 2*4*8*8 = 512, FFN 2*2*4*8*16 = 2048.
    shape = sm.EncoderShape(num_layers=1, hidden=8, intermediate=16, heads=2, vocab=10)
    self.assertEqual(sm.layer_forward_flops(shape, 4), 1536 + 512 + 512 + 2048)
    # L=10, H=6, I=12: 2160 + 2400 + 720 + 2880.
    shape = sm.EncoderShape(num_layers=3, hidden=6, intermediate=12, heads=3, vocab=10)
    # + the one-hot type embeddings, 2 * 10 * 2 * 6 = 240 per sequence.
    self.assertEqual(sm.encoder_forward_flops(shape, 10, num_sequences=2),
                     2 * (3 * (2160 + 2400 + 720 + 2880) + 240))

  @parameterized.parameters((2, 32, 2, 64, 3, 16, 8), (3, 48, 4, 96, 2, 24, 16))
  def test_embedder_flops_match_the_graph(self, layers, hidden, heads, inner, batch, seq, proj):
    encoder = _encoder(layers, hidden, heads, inner)
    embedder = factory.build_embedder(configs.RetrieverConfig(encoder=encoder,
                                                              projection_size=proj))
    fn = tf.function(lambda x: embedder(x, training=False)).get_concrete_function(
        _inputs(batch, seq))
    shape = sm.EncoderShape.from_config(encoder)
    self.assertEqual(graph_matmul_flops(fn),
                     sm.embedder_forward_flops(shape, seq, batch, proj))

  @parameterized.parameters((2, 32, 2, 64, 2, 16, 3), (1, 40, 5, 80, 3, 12, 2))
  def test_reader_flops_match_the_graph(self, layers, hidden, heads, inner, batch, seq, masks):
    encoder = _encoder(layers, hidden, heads, inner)
    reader = factory.build_reader(configs.ReaderConfig(encoder=encoder, seq_length=seq))
    inputs = dict(_inputs(batch, seq), masked_lm_positions=tf.zeros([batch, masks], tf.int32))
    fn = tf.function(lambda x: reader(x, training=False)["mlm_logits"]).get_concrete_function(
        inputs)
    shape = sm.EncoderShape.from_config(encoder)
    # The traced graph also holds the encoder's pooler (2 b H^2), whose output the MLM loss
    # never reads: it is pruned from the compiled step, and the scale model leaves it out.
    dead_pooler = 2 * batch * hidden * hidden
    self.assertEqual(graph_matmul_flops(fn) - dead_pooler,
                     sm.encoder_forward_flops(shape, seq, batch) +
                     sm.mlm_head_flops(shape, batch * masks))

  @parameterized.parameters((2, 32, 2, 64, 8), (3, 24, 3, 40, 4))
  def test_params_match_the_built_models(self, layers, hidden, heads, inner, proj):
    encoder = _encoder(layers, hidden, heads, inner, vocab=70)
    shape = sm.EncoderShape.from_config(encoder)
    embedder = factory.build_embedder(configs.RetrieverConfig(encoder=encoder,
                                                              projection_size=proj))
    reader = factory.build_reader(configs.ReaderConfig(encoder=encoder))
    self.assertEqual(embedder.count_params(), sm.embedder_params(shape, proj))
    self.assertEqual(reader.count_params(), sm.reader_params(shape))

  def test_paper_config_is_read_from_the_code(self):
    params = configs.load_experiment("realm_pretrain_paper", [sm.DEFAULT_CONFIG])
    work = sm.Workload.from_params(params, sm.PAPER_NUM_BLOCKS)
    self.assertEqual((work.batch, work.k, work.query_len, work.block_len, work.reader_len),
                     (512, 8, 96, 288, 384))
    self.assertEqual((work.retriever.num_layers, work.retriever.hidden), (12, 768))
    self.assertEqual(work.act_bytes, 2)                       # bfloat16
    self.assertEqual(work.refresh_interval, 500)
    # int32/float32 features: 3 x 96 (query) + 3 x 8 x 288 (blocks) + 3 x 8 x 384 (reader)
    # + 3 x 10 (masks) + 1 (index step) + 8 (candidate rows) + 1 (skipped duplicate)
    # + 8 (candidates holding the answer) values each.
    self.assertEqual(work.infeed_bytes, 512 * 4 * (288 + 6912 + 9216 + 30 + 1 + 8 + 1 + 8))
    # BERT-base: ~110M per tower.
    self.assertBetween(work.params()["reader"], 105e6, 115e6)


class ScalingTest(tf.test.TestCase):

  def test_linear_fit(self):
    self.assertAlmostEqual(sm.linear_fit_at([1, 3], [2, 4], 5), 6.0)
    self.assertAlmostEqual(sm.linear_fit_at([2], [4], 5), 10.0)

  def test_device_seconds(self):
    hw = sm.Hardware(train_cores=4, refresh_cores=2, mfu=0.5, host_vcpus=4, cores_per_host=8)
    # 4 cores x 61.5 TFLOP/s x 0.5 = 123 TFLOP/s.
    self.assertAlmostEqual(hw.device_seconds(1.23e15), 10.0)
    self.assertAlmostEqual(hw.device_seconds(1.23e15, cores=2), 20.0)

  def test_rows_on_a_hand_computed_example(self):
    shape = sm.EncoderShape(num_layers=1, hidden=4, intermediate=8, heads=1, vocab=10)
    work = sm.Workload(batch=16, k=2, query_len=4, block_len=8, reader_len=12, max_masks=1,
                       projection=2, retriever=shape, reader=shape, share_embedders=True,
                       num_blocks=1000, refresh_interval=10, train_steps=100, act_bytes=2,
                       dtype="bfloat16", infeed_bytes=1600)
    m = sm.Measured(encoder_flops_per_s=1e9, cpus=2, scann_sizes=(100, 200),
                    scann_seconds_per_query=(1e-3, 2e-3), scann_build_seconds=(1.0, 2.0),
                    scann_batch=64, candidates_per_s=100.0, gather_bytes_per_s=1e9,
                    copy_bytes_per_s=1e9)
    hw = sm.Hardware(train_cores=16, refresh_cores=2, mfu=0.5, host_vcpus=4, cores_per_host=8)
    self.assertEqual(hw.hosts, 2)
    rows = {r.component: r for r in sm.build_rows(work, m, hw)}
    # Query forward per sequence: layer 384 + 256 + 128 + 512 = 1280, type embeddings
    # 2*4*2*4 = 64, pooler 32, projection 16: 1392; 8 queries per host: 11136 FLOPs at
    # 1e9 x 4 vCPUs / 2 CPUs = 2e9 FLOP/s.
    self.assertAlmostEqual(rows["query embedding (snapshot tower)"].scaled_s, 11136 / 2e9)
    # ScaNN: 1e-5 s per query per block-unit -> 1e-2 s at 1000 blocks; 8 queries, x 2/4.
    self.assertAlmostEqual(rows["ScaNN search"].scaled_s, 8 * 1e-2 * 2 / 4)
    self.assertAlmostEqual(
        rows["candidate building (drop trivial, null first, gather, pack)"].scaled_s, 0.08)
    self.assertAlmostEqual(rows["host -> device infeed"].scaled_s,
                           800 / sm.ASSUMPTIONS["host_to_device_bandwidth"][0])
    # Device: 3 x query forward of 16 sequences = 3 x 16 x 1328, over 16 x 61.5e12 x 0.5.
    self.assertAlmostEqual(rows["query tower fwd+bwd"].scaled_s,
                           3 * 16 * 1392 / (16 * 61.5e12 * 0.5))
    # Device retrieval: 2 x 16 queries x 1000 blocks x 2 dims of search on the device; the
    # host sends 16 x (3 x 4 + 3 x 1 + 1) int32 over 2 hosts.
    device = {r.component: r for r in sm.device_retrieval_rows(work, m, hw)}
    self.assertAlmostEqual(device["retrieval: exact search over the core's shard"].scaled_s,
                           2 * 16 * 1000 * 2 / (16 * 61.5e12 * 0.5))
    self.assertAlmostEqual(
        device["retrieval: host -> device infeed (queries, masks, source group)"].scaled_s,
        16 * 16 * 4 / 2 / sm.ASSUMPTIONS["host_to_device_bandwidth"][0])
    refresh = sm.refresh_model(work, m, hw, step_s=1.0)
    # Block forward: layer at L=8: 768 + 1024 + 256 + 1024 = 3072, type embeddings 128,
    # pooler + projection 48: 3248 per block.
    self.assertEqual(refresh["flops"], 1001 * 3248)
    self.assertAlmostEqual(refresh["build_s"], 2.0 * 1000 / 200 * 2 / 4)


def test_quick_end_to_end(tmp_path):
  """``python -m experiments.scale_model --quick``, in this process."""
  out = tmp_path / "scale.md"
  result = helpers.run_cli("experiments.scale_model", "--quick", f"--output={out}")
  assert result.returncode == 0, result.stderr[-3000:]
  text = out.read_text()
  assert text in result.stdout
  assert "batch 512, k=8, Lq/Lb/Lr = 96/288/384" in text
  for component in ("query tower fwd+bwd", "block tower fwd+bwd", "reader fwd+bwd + MLM head",
                    "AdamW update", "gradient all-reduce", "query embedding (snapshot tower)",
                    "ScaNN search", "candidate building", "corpus gather",
                    "host -> device infeed", "refresh: re-embed the corpus",
                    "refresh: ScaNN rebuild", "host RAM resident per input host",
                    "retrieval: exact search over the core's shard", "host per step",
                    "device HBM per core"):
    assert f"| {component}" in text or f"| **{component}" in text, component
  assert text.count("\n| ") >= 20
  assert "**Bottleneck:" in text and "refresh cores" in text
