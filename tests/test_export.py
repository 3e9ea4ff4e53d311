"""realm-export (realm_tf/export.py): towers out as Hugging Face BERT and sentence-transformers
folders, and back in through realm-convert --hf_dir unchanged.

References: the source model directory's own variables (exact), a NumPy BERT reading the
exported safetensors with the sentence-transformers modules' arithmetic (torch's LayerNorm
epsilon 1e-5 on the scaled projection), and realm_tf's own towers. The real libraries load
the folders in the slow tier (test_export_libraries.py).
"""
import json
import os
import shutil
import tempfile

import numpy as np
import pytest
import tensorflow as tf
from safetensors import numpy as safetensors_numpy

import realm_tf
from experiments import assets
from realm_tf import checkpoint_convert
from realm_tf import configs
from realm_tf import export
from realm_tf import model_dir as model_dir_lib
from realm_tf import modeling
from realm_tf.retrieval.publication import refresher
from realm_tf.retrieval.publication import testing
from realm_tf.tokenization import RealmTokenizer
from realm_tf.tokenization import load_vocab

import helpers

VOCAB = str(assets.BERT_VOCAB)
QUERY_LENGTH = 24


def nq_questions(n=16):
  """Real questions: the first ``n`` of the shipped NQ-open sample."""
  with open(assets.NQ_SAMPLE, encoding="utf-8") as f:
    return [json.loads(line)["question"] for line, _ in zip(f, range(n))]


def variables(model_dir, prefix):
  reader = tf.train.load_checkpoint(model_dir_lib.latest_checkpoint(model_dir))
  return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map()
          if k.startswith(prefix) and k.endswith("VARIABLE_VALUE")}


def numpy_tower(folder, inputs):
  """REALM's embedding as sentence-transformers computes it from an exported tower folder:
  BERT, the [CLS] row, 2_Dense (tanh), 3_Dense, 4_LayerNorm (torch's epsilon, 1e-5)."""
  with open(os.path.join(folder, "config.json")) as f:
    config = json.load(f)
  tensors = safetensors_numpy.load_file(os.path.join(folder, "model.safetensors"))
  act = helpers.gelu_erf if config["hidden_act"] == "gelu" else helpers.gelu
  x = {k: v.numpy() for k, v in inputs.items()}
  sequence, _ = helpers.np_hf_bert(tensors, config, x["input_word_ids"], x["input_mask"],
                                   x["input_type_ids"], act=act)
  load = lambda sub: {k: v.astype(np.float64) for k, v in
                      safetensors_numpy.load_file(os.path.join(folder, sub,
                                                               "model.safetensors")).items()}
  pooler, projection, norm = load("2_Dense"), load("3_Dense"), load("4_LayerNorm")
  h = np.tanh(sequence[:, 0] @ pooler["linear.weight"].T + pooler["linear.bias"])
  h = h @ projection["linear.weight"].T + projection["linear.bias"]
  return helpers.layer_norm(h, norm["norm.weight"], norm["norm.bias"], eps=1e-5)


class MiniLmExportTest(tf.test.TestCase):
  """The real all-MiniLM-L6-v2 weights (converted in, a random projection beside them) out and
  back in."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.dir = tempfile.mkdtemp()
    cls.src = os.path.join(cls.dir, "minilm")
    checkpoint_convert.convert_hf(assets.minilm_dir(), cls.src, VOCAB)
    cls.out = os.path.join(cls.dir, "exported")
    cls.manifest = export.export(cls.src, cls.out)

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.dir, ignore_errors=True)
    super().tearDownClass()

  def test_the_folders_say_what_they_hold(self):
    self.assertEqual(set(self.manifest["written"]), {"query_tower", "block_tower", "reader"})
    with open(os.path.join(self.out, export.MANIFEST_NAME)) as f:
      self.assertEqual(json.load(f), self.manifest)
    tower = os.path.join(self.out, "query_tower")
    with open(os.path.join(tower, "modules.json")) as f:
      kinds = [m["type"].rsplit(".", 1)[-1] for m in json.load(f)]
    self.assertEqual(kinds, ["Transformer", "Pooling", "Dense", "Dense", "LayerNorm"])
    with open(os.path.join(tower, "1_Pooling", "config.json")) as f:
      self.assertTrue(json.load(f)["pooling_mode_cls_token"])
    with open(os.path.join(tower, "3_Dense", "config.json")) as f:
      self.assertEqual(json.load(f)["activation_function"], "torch.nn.modules.linear.Identity")
    with open(os.path.join(tower, "tokenizer_config.json")) as f:
      self.assertTrue(json.load(f)["do_lower_case"])
    with open(os.path.join(self.out, "reader", "config.json")) as f:
      reader = json.load(f)
    self.assertEqual(reader["architectures"], ["BertForMaskedLM"])
    self.assertEqual(reader["hidden_act"], "gelu")   # MiniLM's exact GELU, Hugging Face's name
    for root, _, files in os.walk(self.out):
      self.assertFalse([f for f in files if f.endswith((".bin", ".pkl", ".pt"))], root)

  def test_back_in_through_realm_convert_the_variables_are_the_same_exactly(self):
    reader_back = os.path.join(self.dir, "reader_back")
    checkpoint_convert.convert_hf(os.path.join(self.out, "reader"), reader_back,
                                  os.path.join(self.out, "reader", "vocab.txt"),
                                  targets=["reader"])
    tower_back = os.path.join(self.dir, "tower_back")
    checkpoint_convert.convert_hf(os.path.join(self.out, "query_tower"), tower_back,
                                  os.path.join(self.out, "query_tower", "vocab.txt"),
                                  targets=["retriever"])
    for back, prefix in ((reader_back, "reader/"), (tower_back, "block_embedder/")):
      want, got = variables(self.src, prefix), variables(back, prefix)
      self.assertEqual(set(got), set(want))
      self.assertGreater(len(want), 50)
      for name in want:   # the projection too: scaled by 2^12 out, divided back exactly
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)

  def test_the_exported_tower_gives_realms_embeddings(self):
    questions = nq_questions()
    embedder = realm_tf.Embedder.load(self.src)
    want = embedder.embed_queries(questions)
    inputs = RealmTokenizer(VOCAB).query_inputs(questions, embedder.config.retriever.query_seq_length)
    got = numpy_tower(os.path.join(self.out, "query_tower"), inputs)
    # float64 NumPy against float32 TensorFlow through 6 layers: float32's rounding only.
    self.assertLess(float(np.max(np.abs(got - want))), 2e-4)
    self.assertGreater(float(np.std(want)), 0.5)   # LayerNorm's output: a real test
    back = os.path.join(self.dir, "tower_back_embed")
    checkpoint_convert.convert_hf(os.path.join(self.out, "query_tower"), back, VOCAB,
                                  targets=["retriever"])
    again = realm_tf.Embedder.load(back).embed_queries(questions)
    self.assertLess(float(np.max(np.abs(again - want))), 1e-6)

  def test_the_projection_scale_makes_torchs_epsilon_realms(self):
    """LN_1e-5(c x) = LN_{1e-5/c^2}(x): with c = 2^12 within 1e-6 of LN_1e-12(x) even for a
    projection of variance 1e-6, and far from it without the scale."""
    x = np.random.default_rng(0).standard_normal([4, 128]) * 1e-3
    ones, zeros = np.ones(128), np.zeros(128)
    want = helpers.layer_norm(x, ones, zeros, eps=1e-12)
    scaled = helpers.layer_norm(x * export.PROJECTION_SCALE, ones, zeros, eps=export.TORCH_LAYER_NORM_EPS)
    self.assertLess(float(np.max(np.abs(scaled - want))), 1e-6)
    self.assertGreater(float(np.max(np.abs(helpers.layer_norm(x, ones, zeros, eps=1e-5) - want))),
                       0.1)


def tiny_model_dir(root, share=False, span=True, **encoder_overrides):
  """A model directory with perturbed random towers of the vocabulary's size (separate query
  and block towers unless ``share``; the reader with a span scorer when ``span``)."""
  size = len(load_vocab(VOCAB))
  encoder = configs.bert_tiny(size, 16)
  encoder.override(dict(initializer_range=0.5, **encoder_overrides))
  config = configs.RealmModelConfig(
      retriever=configs.RetrieverConfig(encoder=encoder, projection_size=8,
                                        share_embedders=share, query_seq_length=QUERY_LENGTH),
      reader=configs.ReaderConfig(encoder=encoder, span_hidden_size=4), vocab_file=VOCAB)
  query, block = modeling.build_embedders(config.retriever)
  reader = modeling.build_reader(config.reader, with_span_scorer=span)
  rng = np.random.default_rng(1)
  for v in query.variables + block.variables + reader.variables:
    v.assign(v + rng.normal(0, 0.3, v.shape).astype(np.float32))
  model_dir_lib.write_metadata(root, config, VOCAB)
  tf.train.CheckpointManager(model_dir_lib.make_checkpoint(query, block, reader), root,
                             max_to_keep=1).save(checkpoint_number=7)
  return root


def test_separate_towers_and_the_span_scorer(tmp_path):
  src = tiny_model_dir(str(tmp_path / "openqa"))
  out = str(tmp_path / "out")
  manifest = export.export(src, out)
  assert manifest["step"] == 7
  assert manifest["written"]["reader"] == "BertForMaskedLM + span_scorer.safetensors"
  for tower, prefix in (("query_tower", "query_embedder/"), ("block_tower", "block_embedder/")):
    back = str(tmp_path / f"{tower}_back")
    checkpoint_convert.convert_hf(os.path.join(out, tower), back, VOCAB, targets=["retriever"])
    want = variables(src, prefix)
    got = {k.replace("block_embedder/", prefix): v
           for k, v in variables(back, "block_embedder/").items()}
    assert set(got) == set(want)
    for name in want:
      np.testing.assert_array_equal(got[name], want[name], err_msg=name)
  query = safetensors_numpy.load_file(os.path.join(out, "query_tower", "model.safetensors"))
  block = safetensors_numpy.load_file(os.path.join(out, "block_tower", "model.safetensors"))
  assert not np.array_equal(query["embeddings.word_embeddings.weight"],
                            block["embeddings.word_embeddings.weight"])
  # The block tower reads [CLS] title [SEP] body [SEP], segment 1 from the body on.
  embedder = realm_tf.Embedder.load(src)
  titles, bodies = ["Hamlet", "Paris"], ["a tragedy by William Shakespeare", "capital of France"]
  want = embedder.embed_blocks(titles, bodies)
  inputs = embedder.tokenizer.block_inputs(titles, bodies, embedder.config.retriever.block_seq_length)
  assert np.max(np.abs(numpy_tower(os.path.join(out, "block_tower"), inputs) - want)) < 1e-4
  span = safetensors_numpy.load_file(os.path.join(out, "reader", export.SPAN_SCORER_NAME))
  reader = variables(src, "reader/span_scorer/")
  kernel = reader["reader/span_scorer/output_dense/kernel/.ATTRIBUTES/VARIABLE_VALUE"]
  np.testing.assert_array_equal(span["dense_1.kernel"], kernel)
  assert "span_hidden_size: 4" in open(os.path.join(out, "reader", "SPAN_SCORER.md")).read()


def test_block_embeddings_of_a_published_index(tmp_path, monkeypatch):
  """The LATEST index's rows, ids, titles and deletions, readable without realm_tf."""
  vocab = str(tmp_path / "vocab.txt")
  testing.write_vocab(vocab)
  blocks_dir = str(tmp_path / "blocks")
  testing.make_corpus(blocks_dir, vocab, 12, block_seq_length=16)
  trainer = testing.TinyTrainer(str(tmp_path / "model"), vocab)
  trainer.perturb(0.3)
  trainer.save(0)
  index_dir = str(tmp_path / "index")
  refresher.build_index_for_checkpoint(
      None, str(tmp_path / "model"), blocks_dir, index_dir,
      refresher.BuildOptions(index_type="brute_force", recall_queries=0, progress=False,
                             tensorboard_dir=""))
  out = str(tmp_path / "out")
  monkeypatch.chdir(tmp_path)   # a relative --index_dir, as a user types it
  manifest = export.export(str(tmp_path / "model"), out, index_dir="index")
  written = manifest["written"]["block_embeddings"]
  assert (written["num_blocks"], written["num_live"]) == (12, 12)
  emb = np.load(os.path.join(out, "block_embeddings", "embeddings.npy"))
  published = np.load(os.path.join(written["index"], "embeddings.npy"))
  np.testing.assert_array_equal(emb, published)
  with open(os.path.join(out, "block_embeddings", "blocks.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  assert [r["block_id"] for r in rows] == list(range(12))
  assert all(r["live"] and r["title"] for r in rows)


def test_errors_name_the_folder_and_what_it_holds(tmp_path):
  src = tiny_model_dir(str(tmp_path / "model"), share=True, span=False)
  out = str(tmp_path / "out")
  export.export(src, out)
  with pytest.raises(export.ExportError, match=f"{out} exists: pass --overwrite"):
    export.export(src, out)
  assert export.export(src, out, overwrite=True)["step"] == 7
  pre_ln = tiny_model_dir(str(tmp_path / "pre_ln"), norm_first=True)
  with pytest.raises(export.ExportError, match=f"{pre_ln}: the encoder is pre-LayerNorm"):
    export.export(pre_ln, str(tmp_path / "out2"))
  assert not os.path.exists(tmp_path / "out2")
  with pytest.raises(export.ExportError, match="pre-LayerNorm"):   # a failed --overwrite ...
    export.export(pre_ln, out, overwrite=True)
  assert export.MANIFEST_NAME in os.listdir(out)                    # ... keeps the old folder
  empty = str(tmp_path / "empty")
  model_dir_lib.write_metadata(empty, model_dir_lib.load_config(src), VOCAB)
  tf.train.Checkpoint(step=tf.Variable(1)).save(os.path.join(empty, "ckpt"))
  with pytest.raises(export.ExportError, match=r"empty: ckpt-1 holds no tower \(it holds no "):
    export.export(empty, str(tmp_path / "out3"))
  ict = str(tmp_path / "ict")   # towers without a reader
  model_dir_lib.write_metadata(ict, model_dir_lib.load_config(src), VOCAB)
  query, block = modeling.build_embedders(model_dir_lib.load_config(src).retriever)
  tf.train.CheckpointManager(model_dir_lib.make_checkpoint(query, block), ict,
                             max_to_keep=1).save(checkpoint_number=3)
  with pytest.raises(export.ExportError,
                     match=r"ict: ckpt-3 holds no reader \(it holds query_tower, block_tower\)"):
    export.export(ict, str(tmp_path / "out5"), parts=["reader"])
  written = export.export(ict, str(tmp_path / "out5"), parts=["query_tower"])["written"]
  assert list(written) == ["query_tower"]
  assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]   # nothing left half-written
  with pytest.raises(model_dir_lib.ModelDirError, match="not a realm_tf model directory"):
    export.export(str(tmp_path), str(tmp_path / "out4"))
  proc = helpers.run_cli("realm_tf.binaries.export", f"--model_dir={src}", f"--output_dir={out}")
  assert proc.returncode == 2 and "exists: pass --overwrite" in proc.stderr
  assert "Traceback" not in proc.stderr
  proc = helpers.run_cli("realm_tf.binaries.export", f"--model_dir={src}", f"--output_dir={out}",
                         "--overwrite")
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert f"wrote {out}/reader: BertForMaskedLM" in proc.stdout


# ------------------------------------------------- slow tier: the real libraries load them --
# (helpers.through_the_libraries: sentence-transformers and transformers in .venv-hf.)


def masked_reader_inputs(tokenizer, questions, bodies, length, rng):
  """reader_inputs with two wordpieces of each body replaced by [MASK] -> (inputs, positions)."""
  inputs = {k: v.numpy() for k, v in tokenizer.reader_inputs(questions, bodies, length).items()}
  mask_id = load_vocab(VOCAB).index("[MASK]")
  positions = []
  for row in range(len(questions)):
    body = np.flatnonzero(inputs["input_type_ids"][row] * inputs["input_mask"][row])[:-1]
    pick = np.sort(rng.choice(body, 2, replace=False))
    inputs["input_word_ids"][row, pick] = mask_id
    positions.append(pick)
  return inputs, np.array(positions, np.int32)


def check_mlm(src, hf_logits, inputs, positions):
  """transformers' top-1 token equals realm_tf's at every masked position whose top two
  realm_tf logits are apart by more than float32's noise."""
  config = model_dir_lib.load_config(src)
  reader = modeling.build_reader(config.reader)
  model_dir_lib.restore(model_dir_lib.latest_checkpoint(src), reader=reader)
  want = reader(dict({k: tf.constant(v) for k, v in inputs.items()},
                     masked_lm_positions=tf.constant(positions)))["mlm_logits"].numpy()
  top2 = np.sort(want, axis=-1)[..., -2:]
  clear = (top2[..., 1] - top2[..., 0]) > 1e-3
  assert clear.mean() > 0.9
  np.testing.assert_array_equal(np.argmax(hf_logits, -1)[clear], np.argmax(want, -1)[clear])
  assert np.max(np.abs(hf_logits - want)) < 1e-3


@pytest.mark.slow
def test_minilm_through_sentence_transformers_and_transformers(tmp_path):
  src = str(tmp_path / "minilm")
  checkpoint_convert.convert_hf(assets.minilm_dir(), src, VOCAB)
  out = str(tmp_path / "out")
  export.export(src, out)
  questions = nq_questions(64)
  tokenizer = RealmTokenizer(VOCAB)
  inputs, positions = masked_reader_inputs(tokenizer, questions[:8], questions[8:16], 48,
                                           np.random.default_rng(0))
  hf = helpers.through_the_libraries(tmp_path, dict(
      export_dir=out, queries=questions,
      mlm=dict(input_ids=inputs["input_word_ids"].tolist(),
               attention_mask=inputs["input_mask"].tolist(),
               token_type_ids=inputs["input_type_ids"].tolist(), positions=positions.tolist())))
  embedder = realm_tf.Embedder.load(src)
  want = embedder.embed_queries(questions)
  assert np.max(np.abs(hf["query_embeddings"] - want)) < 1e-4
  ours = tokenizer.query_inputs(questions, 64)
  for row, ids in enumerate(hf["query_ids"]):
    mine = ours["input_word_ids"][row].numpy()
    np.testing.assert_array_equal(ids[ids >= 0], mine[ours["input_mask"][row].numpy() > 0])
  check_mlm(src, hf["mlm_logits"], inputs, positions)


@pytest.mark.slow
def test_separate_towers_and_blocks_through_sentence_transformers(tmp_path):
  src = tiny_model_dir(str(tmp_path / "model"), span=False)
  out = str(tmp_path / "out")
  export.export(src, out)
  questions = nq_questions(32)
  titles = [q.split()[-1].title() for q in questions]
  tokenizer = RealmTokenizer(VOCAB)
  inputs, positions = masked_reader_inputs(tokenizer, questions[:8], questions[8:16], 48,
                                           np.random.default_rng(1))
  hf = helpers.through_the_libraries(tmp_path, dict(
      export_dir=out, queries=questions, blocks=[[t, q] for t, q in zip(titles, questions)],
      mlm=dict(input_ids=inputs["input_word_ids"].tolist(),
               attention_mask=inputs["input_mask"].tolist(),
               token_type_ids=inputs["input_type_ids"].tolist(), positions=positions.tolist())))
  embedder = realm_tf.Embedder.load(src)
  assert np.max(np.abs(hf["query_embeddings"] - embedder.embed_queries(questions))) < 1e-4
  assert np.max(np.abs(hf["block_embeddings"] - embedder.embed_blocks(titles, questions))) < 1e-4
  check_mlm(src, hf["mlm_logits"], inputs, positions)
