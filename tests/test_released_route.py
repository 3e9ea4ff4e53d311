"""The released ORQA route: blocks.tfr + titles.tfr + ORQA checkpoint + block_emb -> an index.

Everything is written in the released formats with random weights: the two TFRecord files of
raw UTF-8 strings, a TF1 checkpoint in ORQA's variable names (a small BERT) and a TF1 checkpoint
holding ``block_emb``. They go through ``checkpoint_convert.convert``, ``realm-index import`` and
``realm-index build``, and the index must rank as ``q @ block_emb.T`` does.
"""

import json
import os
import shutil
import tempfile
from unittest import mock

import numpy as np
import tensorflow as tf

import realm_tf
from realm_tf import checkpoint_convert
from realm_tf import model_dir
from realm_tf import modeling
from realm_tf.data import features as features_lib
from realm_tf.data import manifests
from realm_tf.data import released
from realm_tf.openqa import host
from realm_tf.openqa import inputs as inputs_lib
from realm_tf.retrieval import errors
from realm_tf.retrieval.publication import handle as handle_lib
from realm_tf.retrieval.publication import refresher
from realm_tf.tokenization import RealmTokenizer

import helpers

NUM_BLOCKS = 40
PROJECTION = 128
SPAN_HIDDEN = 256
BLOCK_SEQ_LENGTH = 24
QUERY_BERT = "module/module/module/module/bert/"
READER_BERT = "reader/module/bert/"
MAX_SPAN_WIDTH = 10


def make_texts(n, seed=0):
  """``n`` (title, body) pairs: vocabulary words, some unknown and non-ASCII, some too long."""
  rng = np.random.default_rng(seed)
  words = helpers.TF1_WORDS + ["café", "zürich", "naïve", "straße"]
  titles, bodies = [], []
  for i in range(n):
    titles.append(" ".join(rng.choice(words, 2)).title() + f" {i}")
    length = 40 if i % 7 == 3 else int(rng.integers(3, 15))
    bodies.append(" ".join(rng.choice(words, length)))
  return titles, bodies


def write_strings(path, texts):
  """A TFRecord file of raw UTF-8 strings, one per record (the released blocks/titles)."""
  with tf.io.TFRecordWriter(path) as writer:
    for text in texts:
      writer.write(text if isinstance(text, bytes) else text.encode("utf-8"))
  return path


def orqa_weights(rng, vocab_size):
  """A TF1 ORQA checkpoint's variables: query tower, reader BERT + MLM head, span scorer."""
  h = helpers.TF1_HIDDEN
  w = helpers.random_bert(rng, QUERY_BERT, vocab_size)
  proj = "module/module/module/"
  w[proj + "dense/kernel"] = (rng.standard_normal([h, PROJECTION]) * 0.3).astype(np.float32)
  w[proj + "dense/bias"] = rng.standard_normal([PROJECTION]).astype(np.float32)
  w[proj + "LayerNorm/gamma"] = rng.standard_normal([PROJECTION]).astype(np.float32)
  w[proj + "LayerNorm/beta"] = rng.standard_normal([PROJECTION]).astype(np.float32)
  w.update(helpers.random_bert(rng, READER_BERT, vocab_size))
  # Scales closer to a trained BERT's. LayerNorm gains of ~1 make the towers depend on their
  # inputs (at 0.1 every question retrieves the same beam and picks the same span), and GELU's
  # pre-activations reach |x| ~ 2, where Google's tanh GELU and the exact (erf) one differ.
  for name in w:
    if "/bert/" in name and name.endswith("LayerNorm/gamma"):
      w[name] *= 10.0
    elif name.endswith("intermediate/dense/kernel"):
      w[name] *= 0.5
  mlm = "reader/module/cls/predictions/"
  w[mlm + "transform/dense/kernel"] = (rng.standard_normal([h, h]) * 0.3).astype(np.float32)
  w[mlm + "transform/dense/bias"] = rng.standard_normal([h]).astype(np.float32)
  w[mlm + "transform/LayerNorm/gamma"] = rng.standard_normal([h]).astype(np.float32)
  w[mlm + "transform/LayerNorm/beta"] = rng.standard_normal([h]).astype(np.float32)
  w[mlm + "output_bias"] = rng.standard_normal([vocab_size]).astype(np.float32)
  w["reader/dense/kernel"] = rng.standard_normal([h, 2 * SPAN_HIDDEN]).astype(np.float32)
  w["reader/dense/bias"] = rng.standard_normal([2 * SPAN_HIDDEN]).astype(np.float32)
  w["reader/dense_1/kernel"] = rng.standard_normal([SPAN_HIDDEN, 1]).astype(np.float32)
  w["reader/dense_1/bias"] = rng.standard_normal([1]).astype(np.float32)
  w["reader/layer_normalization/gamma"] = rng.standard_normal([SPAN_HIDDEN]).astype(np.float32)
  w["reader/layer_normalization/beta"] = rng.standard_normal([SPAN_HIDDEN]).astype(np.float32)
  w["global_step"] = np.zeros([], np.float32)
  return w


def run_cli(*args):
  """``realm-index <args>``, in this process -> the finished run."""
  return helpers.run_cli("realm_tf.binaries.index", *args, "--noprogress")


# ---- ORQA's networks in NumPy, from the TF1 tensors (orqa_model.py, ict_model.py). ----
def np_query_embedding(w, question_ids, cls_id, sep_id):
  """The ``projected`` signature on ``[CLS] q [SEP]`` (no padding, segment 0, as ORQA's
  ``retrieve``): ``LayerNorm_1e-12(dense(pooled))``, the pooler ``tanh(dense(h_CLS))``."""
  ids = np.concatenate([[cls_id], question_ids, [sep_id]])[None]
  _, pooled = helpers.np_bert(w, QUERY_BERT, ids, np.ones_like(ids), np.zeros_like(ids))
  p = "module/module/module/"
  projected = pooled[0] @ w[p + "dense/kernel"] + w[p + "dense/bias"]
  return helpers.layer_norm(projected, w[p + "LayerNorm/gamma"], w[p + "LayerNorm/beta"])


def np_span_logits(w, question_ids, block_ids, cls_id, sep_id):
  """ORQA's reader on one unpadded ``[CLS] q [SEP] block [SEP]`` row (segment 1 from the
  block on): the spans ``(start, end)`` (inclusive, block positions, width <= 10) and their
  scores ``dense_1(LayerNorm_1e-3(relu(start_half[s] + end_half[e])))``."""
  ids = np.concatenate([[cls_id], question_ids, [sep_id], block_ids, [sep_id]])[None]
  offset = len(question_ids) + 2
  types = (np.arange(ids.shape[1]) >= offset).astype(np.int64)[None]
  sequence, _ = helpers.np_bert(w, READER_BERT, ids, np.ones_like(ids), types)
  projection = sequence[0] @ w["reader/dense/kernel"] + w["reader/dense/bias"]
  start_half, end_half = projection[:, :SPAN_HIDDEN], projection[:, SPAN_HIDDEN:]
  n = len(block_ids)
  spans = [(s, e) for s in range(n) for e in range(s, min(s + MAX_SPAN_WIDTH, n))]
  starts = np.array([offset + s for s, _ in spans])
  ends = np.array([offset + e for _, e in spans])
  hidden = np.maximum(start_half[starts] + end_half[ends], 0.0)
  hidden = helpers.layer_norm(hidden, w["reader/layer_normalization/gamma"],
                                  w["reader/layer_normalization/beta"], eps=1e-3)
  logits = hidden @ w["reader/dense_1/kernel"][:, 0] + w["reader/dense_1/bias"][0]
  return spans, logits


def orqa_reference(weights, block_emb, bodies, tokenizer, texts, read=5):
  """ORQA's prediction for each question, in float64 NumPy from the TF1 tensors.

  Returns a dict: ``question_ids`` (wordpieces per question), ``retriever_logits``
  ``[questions, blocks]``, ``beams`` (the top ``read`` block ids per question), ``spans``
  (per question and rank, the block's spans and their logits with the retriever logit added)
  and ``best`` (per question: ``(logit, rank, start, end)`` of the best span over every read
  block, and the runner-up's logit).
  """
  w = {k: v.astype(np.float64) for k, v in weights.items()}
  cls_id, sep_id = tokenizer.cls_id, tokenizer.sep_id
  question_ids = [tokenizer.tokenize([q]).flat_values.numpy() for q in texts]
  query = np.stack([np_query_embedding(w, ids, cls_id, sep_id) for ids in question_ids])
  retriever_logits = query @ block_emb.astype(np.float64).T
  beams = np.argsort(-retriever_logits, axis=1)[:, :read]
  spans, best = [], []
  for b, beam in enumerate(beams):
    spans.append([])
    candidates = []  # (logit, rank, start, end) over every span of every read block.
    for rank, block_id in enumerate(beam):
      block_ids = tokenizer.tokenize([bodies[block_id]]).flat_values.numpy()
      block_spans, logits = np_span_logits(w, question_ids[b], block_ids, cls_id, sep_id)
      logits = logits + retriever_logits[b, block_id]
      spans[b].append((block_spans, logits))
      candidates += [(logit, rank, s, e) for logit, (s, e) in zip(logits, block_spans)]
    candidates.sort(reverse=True)
    best.append((candidates[0], candidates[1][0]))
  return dict(question_ids=question_ids, query=query, retriever_logits=retriever_logits,
              beams=beams, spans=spans, best=best)


def span_words(body, start, end):
  """The text of wordpieces ``start..end`` of a body whose every word is one wordpiece."""
  return " ".join(body.split()[start:end + 1])


def run_eval(*args):
  """``realm-eval <args>``, in this process -> the finished run."""
  return helpers.run_cli("realm_tf.binaries.eval", *args, "--noprogress")


class ReleasedRouteTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = tempfile.mkdtemp()
    join = lambda *p: os.path.join(cls.root, *p)
    cls.vocab_file = join("vocab.txt")
    vocab_size = helpers.write_tf1_vocab(cls.vocab_file)
    cls.config_file = join("bert_config.json")
    with open(cls.config_file, "w") as f:
      json.dump(helpers.bert_config(vocab_size), f)
    cls.titles, cls.bodies = make_texts(NUM_BLOCKS)
    cls.blocks_tfr = write_strings(join("blocks.tfr"), cls.bodies)
    cls.titles_tfr = write_strings(join("titles.tfr"), cls.titles)
    rng = np.random.default_rng(0)
    cls.weights = orqa_weights(rng, vocab_size)
    cls.orqa_ckpt = helpers.write_tf1_checkpoint(cls.weights,
                                                 join("tf1", "orqa", "model.ckpt"))
    # Retriever logits of the size of the span scores: the best span is not always in the top
    # block.
    cls.block_emb = (rng.standard_normal([NUM_BLOCKS, PROJECTION]) * 0.3).astype(np.float32)
    cls.block_emb_ckpt = helpers.write_tf1_checkpoint(
        {"block_emb": cls.block_emb}, join("tf1", "encoded", "encoded.ckpt"))
    cls.model_dir = join("orqa_converted")
    checkpoint_convert.convert([cls.orqa_ckpt], cls.config_file, cls.vocab_file, cls.model_dir,
                               block_emb_checkpoint=cls.block_emb_ckpt)
    cls.blocks_dir = join("blocks")
    cls.manifest = released.import_released_blocks(
        cls.blocks_tfr, cls.titles_tfr, cls.vocab_file, cls.blocks_dir,
        block_seq_length=BLOCK_SEQ_LENGTH, num_shards=3, progress=False, batch_size=16)

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.root, ignore_errors=True)
    super().tearDownClass()

  def setUp(self):
    super().setUp()
    self.dir = tempfile.mkdtemp(dir=self.root)

  def assert_one_line_error(self, proc, message):
    self.assertEqual(proc.returncode, 2, proc.stderr[-3000:])
    self.assertNotIn("Traceback", proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    self.assertLen(lines, 1, proc.stderr[-3000:])
    self.assertIn(message, lines[0])

  # ----------------------------------------------------------------------- the conversion --

  def test_converted_span_scorer_and_block_emb(self):
    config = model_dir.load_config(self.model_dir)
    reader = modeling.build_reader(config.reader, with_span_scorer=True)
    model_dir.restore(model_dir.latest_checkpoint(self.model_dir), reader=reader)
    scorer, w = reader.span_scorer, self.weights
    self.assertAllEqual(scorer.projection.kernel.numpy(), w["reader/dense/kernel"])
    self.assertAllEqual(scorer.projection.bias.numpy(), w["reader/dense/bias"])
    self.assertAllEqual(scorer.output_dense.kernel.numpy(), w["reader/dense_1/kernel"])
    self.assertAllEqual(scorer.output_dense.bias.numpy(), w["reader/dense_1/bias"])
    self.assertAllEqual(scorer.layer_norm.gamma.numpy(), w["reader/layer_normalization/gamma"])
    self.assertAllEqual(scorer.layer_norm.beta.numpy(), w["reader/layer_normalization/beta"])
    saved = np.load(os.path.join(self.model_dir, checkpoint_convert.BLOCK_EMB_NAME))
    self.assertEqual(saved.dtype, np.float32)
    self.assertAllEqual(saved, self.block_emb)

  def test_block_emb_checkpoint_is_checked(self):
    wrong = helpers.write_tf1_checkpoint(
        {"block_emb": np.zeros([3, PROJECTION + 1], np.float32)},
        os.path.join(self.dir, "wrong", "ckpt"))
    with self.assertRaisesRegex(checkpoint_convert.ConversionError,
                                r"block_emb has shape \[3, 129\]"):
      checkpoint_convert.convert([self.orqa_ckpt], self.config_file, self.vocab_file,
                                 os.path.join(self.dir, "out"), block_emb_checkpoint=wrong)
    none = helpers.write_tf1_checkpoint({"other": np.zeros([2], np.float32)},
                                        os.path.join(self.dir, "none", "ckpt"))
    with self.assertRaisesRegex(checkpoint_convert.ConversionError, "no variable 'block_emb'"):
      checkpoint_convert.convert([self.orqa_ckpt], self.config_file, self.vocab_file,
                                 os.path.join(self.dir, "out"), block_emb_checkpoint=none)

  # ---------------------------------------------------------------------------- the import --

  def test_imported_blocks(self):
    blocks = manifests.read_blocks(self.blocks_dir)  # Checks count and fingerprint too.
    self.assertLen(blocks, NUM_BLOCKS)
    self.assertEqual([b["block_id"] for b in blocks], list(range(NUM_BLOCKS)))
    self.assertEqual([b["title"] for b in blocks], self.titles)
    self.assertEqual([b["doc_title"] for b in blocks], self.titles)
    self.assertEqual([b["body"] for b in blocks], self.bodies)
    self.assertEqual([b["uid"] for b in blocks],
                     [features_lib.block_uid(t, b) for t, b in zip(self.titles, self.bodies)])
    inputs = RealmTokenizer(self.vocab_file).block_inputs(self.titles, self.bodies,
                                                          BLOCK_SEQ_LENGTH)
    ids, mask = inputs["input_word_ids"].numpy(), inputs["input_mask"].numpy()
    want = [row[:m.sum()].tolist() for row, m in zip(ids, mask)]
    self.assertEqual([b["token_ids"] for b in blocks], want)
    self.assertIn(BLOCK_SEQ_LENGTH, [len(t) for t in want])  # Some blocks were trimmed.
    self.assertLen(manifests.block_shard_files(self.blocks_dir), 3)

    # The same manifest as write_blocks gives for the same blocks, plus the source files.
    reference = manifests.write_blocks(os.path.join(self.dir, "reference"), self.titles,
                                       self.bodies, RealmTokenizer(self.vocab_file),
                                       BLOCK_SEQ_LENGTH, num_shards=3)
    manifest = manifests.load_blocks_manifest(self.blocks_dir)
    self.assertEqual(manifest, self.manifest)
    self.assertEqual(manifest["source"], {"blocks_tfr": self.blocks_tfr,
                                          "titles_tfr": self.titles_tfr})
    self.assertEqual({k: v for k, v in manifest.items() if k != "source"}, reference)
    self.assertEqual(manifest["fingerprint"],
                     manifests.corpus_fingerprint(b["uid"] for b in blocks))

  def test_incremental_fingerprint(self):
    uids = [features_lib.block_uid(t, b) for t, b in zip(self.titles, self.bodies)]
    fingerprint = released._Fingerprint()  # pylint: disable=protected-access
    for uid in uids:
      fingerprint.update(uid)
    self.assertEqual(fingerprint.hexdigest(), manifests.corpus_fingerprint(uids))

  def test_limit_and_default_shards(self):
    out = os.path.join(self.dir, "blocks")
    manifest = released.import_released_blocks(self.blocks_tfr, self.titles_tfr,
                                               self.vocab_file, out, limit=7, progress=False)
    self.assertEqual((manifest["num_blocks"], manifest["num_shards"]), (7, 1))
    self.assertEqual(manifest["block_seq_length"], 288)
    self.assertEqual([b["body"] for b in manifests.read_blocks(out)], self.bodies[:7])

  def test_import_errors(self):
    out = os.path.join(self.dir, "blocks")
    short = write_strings(os.path.join(self.dir, "titles.tfr"), self.titles[:-1])
    with self.assertRaisesRegex(manifests.CorpusFormatError,
                                f"{self.blocks_tfr} has 40 records but {short} has 39"):
      released.import_released_blocks(self.blocks_tfr, short, self.vocab_file, out,
                                      progress=False)
    bad = list(self.bodies)
    bad[21] = b"caf\xe9 latin-1"
    bad_tfr = write_strings(os.path.join(self.dir, "blocks.tfr"), bad)
    with self.assertRaisesRegex(manifests.CorpusFormatError,
                                f"{bad_tfr}: record 21 is not valid UTF-8"):
      released.import_released_blocks(bad_tfr, self.titles_tfr, self.vocab_file, out,
                                      num_shards=4, progress=False, batch_size=8)
    self.assertEqual(os.listdir(out), [])  # The shards written before the bad record are gone.
    with self.assertRaisesRegex(manifests.MissingDataError, "file not found: .*nope.tfr"):
      released.import_released_blocks(os.path.join(self.dir, "nope.tfr"), self.titles_tfr,
                                      self.vocab_file, out, progress=False)
    with self.assertRaisesRegex(manifests.DataError, "already holds a blocks directory"):
      released.import_released_blocks(self.blocks_tfr, self.titles_tfr, self.vocab_file,
                                      self.blocks_dir, progress=False)

  # ----------------------------------------------------------------------------- the index --

  def test_cli_import_build_and_search(self):
    blocks_dir = os.path.join(self.dir, "blocks")
    index_dir = os.path.join(self.dir, "index")
    # realm-index's smoke test as a process of its own (its other runs are in this process).
    proc = helpers.run_process(
        "realm_tf.binaries.index", "import", f"--blocks_tfr={self.blocks_tfr}",
        f"--titles_tfr={self.titles_tfr}", f"--vocab_file={self.vocab_file}",
        f"--blocks_dir={blocks_dir}", "--num_shards=2", "--noprogress")
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    self.assertIn(f"wrote 40 blocks in 2 shards to {blocks_dir}", proc.stdout)
    manifest = manifests.load_blocks_manifest(blocks_dir)
    self.assertEqual(manifest["block_seq_length"], 288)

    # No --embeddings_file: the model has no block tower, so <model_dir>/block_emb.npy is used.
    proc = run_cli("build", f"--model_dir={self.model_dir}", f"--blocks_dir={blocks_dir}",
                   f"--index_dir={index_dir}")
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    self.assertIn("no block tower", proc.stdout)
    path = proc.stdout.strip().splitlines()[-1]
    self.assertEqual(path, os.path.join(index_dir, "step-0"))

    embedder = realm_tf.Embedder.load(self.model_dir)
    queries = np.concatenate([
        embedder.embed_queries(["who was born in paris ?", "the capital of france"]),
        np.random.default_rng(1).standard_normal([3, PROJECTION]).astype(np.float32)])
    with handle_lib.IndexHandle(index_dir, expected_fingerprint=manifest["fingerprint"],
                                expected_dim=PROJECTION, wait_seconds=0, watch=False) as handle:
      self.assertEqual(handle.manifest["blocks_dir"], blocks_dir)
      self.assertEqual(handle.manifest["corpus_fingerprint"], manifest["fingerprint"])
      self.assertEqual(handle.manifest["embeddings_file"],
                       os.path.join(self.model_dir, checkpoint_convert.BLOCK_EMB_NAME))
      self.assertEqual(handle.index.num_blocks, NUM_BLOCKS)
      ids, scores = handle.search(queries, k=5)
    exact = queries @ self.block_emb.T
    want = np.argsort(-exact, axis=1)[:, :5]
    self.assertAllEqual(ids, want)
    self.assertAllClose(scores, np.take_along_axis(exact, want, axis=1), rtol=1e-4, atol=1e-4)
    with self.assertRaises(errors.FingerprintMismatchError):
      handle_lib.IndexHandle(index_dir, expected_fingerprint="0" * 40, wait_seconds=0,
                             watch=False).wait_for_first()

  def test_cli_errors(self):
    short = write_strings(os.path.join(self.dir, "titles.tfr"), self.titles[:-2])
    proc = run_cli("import", f"--blocks_tfr={self.blocks_tfr}", f"--titles_tfr={short}",
                   f"--vocab_file={self.vocab_file}", f"--blocks_dir={self.dir}/blocks")
    self.assert_one_line_error(proc, f"{self.blocks_tfr} has 40 records but {short} has 38")

    rows = os.path.join(self.dir, "rows.npy")
    np.save(rows, self.block_emb[:-1])
    proc = run_cli("build", f"--model_dir={self.model_dir}", f"--blocks_dir={self.blocks_dir}",
                   f"--index_dir={self.dir}/index", f"--embeddings_file={rows}")
    self.assert_one_line_error(proc, f"{rows} has 39 rows but the corpus in {self.blocks_dir} "
                                     "has 40 blocks")

    dim = os.path.join(self.dir, "dim.npy")
    np.save(dim, self.block_emb[:, :64])
    proc = run_cli("build", f"--model_dir={self.model_dir}", f"--blocks_dir={self.blocks_dir}",
                   f"--index_dir={self.dir}/index", f"--embeddings_file={dim}")
    self.assert_one_line_error(proc, f"{dim} has dimension 64 but the model's projection_size "
                                     "is 128")
    self.assertFalse(os.path.exists(os.path.join(self.dir, "index", "LATEST")))

  def test_model_without_block_tower_needs_embeddings(self):
    bare = os.path.join(self.dir, "model")
    shutil.copytree(self.model_dir, bare,
                    ignore=shutil.ignore_patterns(checkpoint_convert.BLOCK_EMB_NAME))
    options = refresher.BuildOptions(progress=False, recall_queries=0, tensorboard_dir="")
    with self.assertRaisesRegex(errors.RetrievalError,
                                "has no block tower .*--embeddings_file=.*block_emb.npy"):
      refresher.build_index_for_checkpoint(None, bare, self.blocks_dir,
                                           os.path.join(self.dir, "index"), options=options)
    with self.assertRaisesRegex(manifests.MissingDataError, "embeddings file not found"):
      refresher.load_embeddings_file(os.path.join(self.dir, "none.npy"), NUM_BLOCKS, PROJECTION)


  # ----------------------------------------------------------------- answering questions --

  QUESTIONS = ["who was born in paris ?", "where is the capital of france ?",
               "the river of the city", "who wrote a play in 1843 , in zürich ?", "a play"]

  @classmethod
  def qa_index(cls):
    """The index of the converted model's ``block_emb`` over the imported blocks (built once)."""
    index_dir = os.path.join(cls.root, "qa_index")
    if not os.path.exists(os.path.join(index_dir, "LATEST")):
      refresher.build_index_for_checkpoint(
          None, cls.model_dir, cls.blocks_dir, index_dir,
          options=refresher.BuildOptions(progress=False, recall_queries=0, tensorboard_dir=""),
          embeddings_file=os.path.join(cls.model_dir, checkpoint_convert.BLOCK_EMB_NAME))
    return index_dir

  def reference(self):
    tokenizer = RealmTokenizer(self.vocab_file)
    for body in self.bodies:  # Every word is one wordpiece: a span's text is its words.
      self.assertLen(tokenizer.tokenize([body]).flat_values, len(body.split()))
    ref = orqa_reference(self.weights, self.block_emb, self.bodies, tokenizer, self.QUESTIONS)
    # Questions retrieve different beams; their best spans lie in blocks of several ranks, each
    # ahead of the runner-up by far more than the 1e-4 the logits are compared to.
    self.assertLen({tuple(beam) for beam in ref["beams"]}, len(self.QUESTIONS))
    self.assertGreater(len({rank for (_, rank, _, _), _ in ref["best"]}), 2)
    for (score, _, _, _), second in ref["best"]:
      self.assertGreater(score - second, 1e-3)
    return ref

  def test_openqa_answers_as_orqa_in_numpy(self):
    """``OpenQA.load`` over the converted model and its index answers as ORQA's networks,
    computed in NumPy from the TF1 tensors, do: the beam, every span logit, the best span."""
    config = model_dir.load_config(self.model_dir)
    self.assertEqual(config.reader.max_span_width, MAX_SPAN_WIDTH)
    qa = realm_tf.OpenQA.load(self.model_dir, self.qa_index())
    # bert_config's "gelu" is Google's tanh approximation, in every layer of both towers.
    x = tf.constant([-2.7, -0.5, 1.0, 2.7])
    for encoder in (qa.model.query_embedder.encoder, qa.model.reader.encoder):
      for layer in encoder.transformer_layers:
        gelu = layer._intermediate_activation_layer  # pylint: disable=protected-access
        self.assertAllClose(gelu(x), helpers.gelu(x.numpy()), rtol=0, atol=1e-6)

    texts = self.QUESTIONS
    questions = [inputs_lib.Question(q, ["paris"]) for q in texts]
    results = qa.predict(questions)
    answers = qa.answer(texts, batch_size=3)  # Two batches.
    ref = self.reference()
    beams, retriever_logits = ref["beams"], ref["retriever_logits"]

    # The model's own logits on the same inputs (the beam retrieved with the NumPy queries).
    features = qa.builder.features(questions, ref["query"].astype(np.float32))
    self.assertAllEqual(features["beam_ids"], beams)
    out = qa.model({k: tf.constant(features[k]) for k in host.MODEL_FEATURES},
                   training=False)
    self.assertAllClose(out["retriever_logits"],
                        np.take_along_axis(retriever_logits, beams, axis=1), rtol=0, atol=1e-4)

    def model_span_logits(b, rank):
      """{(start, end) in block positions: logit} of the model's valid candidates."""
      logits = out["reader_logits"][b, rank].numpy()
      valid = logits > -5000.0  # Invalid candidates are at -10000 + the retriever logit.
      offset = len(ref["question_ids"][b]) + 2
      starts = out["span_starts"][b, rank].numpy()[valid] - offset
      ends = out["span_ends"][b, rank].numpy()[valid] - offset
      return {(int(s), int(e)): logit for s, e, logit in zip(starts, ends, logits[valid])}

    for b, (result, answer) in enumerate(zip(results, answers)):
      beam = beams[b]
      for rank, (spans, logits) in enumerate(ref["spans"][b]):
        ours = model_span_logits(b, rank)
        self.assertCountEqual(ours, spans)
        self.assertAllClose([ours[span] for span in spans], logits, rtol=0, atol=1e-4)
      (score, rank, start, end), _ = ref["best"][b]
      self.assertAllEqual(result["beam_ids"], beam)
      self.assertAllClose(result["retriever_logits"], retriever_logits[b, beam], rtol=0,
                          atol=1e-4)
      self.assertAllEqual(result["retriever_correct"], ["paris" in self.bodies[i] for i in beam])
      self.assertEqual(result["block_rank"], rank)
      self.assertAllClose(result["score"], score, rtol=0, atol=1e-4)
      self.assertEqual(result["answer"], span_words(self.bodies[beam[rank]], start, end))
      self.assertEqual(result["span_match"], result["answer"] == "paris")
      self.assertEqual(answer.question, texts[b])
      self.assertEqual((answer.answer, answer.block_rank), (result["answer"], rank))
      self.assertEqual(answer.evidence[rank].text[answer.start:answer.end], answer.answer)
      self.assertEqual([e.block_id for e in answer.evidence], beam.tolist())
      self.assertEqual([e.text for e in answer.evidence], [self.bodies[i] for i in beam])
      self.assertEqual([e.title for e in answer.evidence], [self.titles[i] for i in beam])
      self.assertAllClose([e.retrieval_score for e in answer.evidence],
                          retriever_logits[b, beam], rtol=0, atol=1e-4)

    # The comparison tells the GELUs apart: a reference with the exact GELU is off by more.
    tokenizer = RealmTokenizer(self.vocab_file)
    block_ids = tokenizer.tokenize([self.bodies[beams[0, 0]]]).flat_values.numpy()
    w = {k: v.astype(np.float64) for k, v in self.weights.items()}
    with mock.patch.object(helpers, "gelu", helpers.gelu_erf):
      spans, erf_logits = np_span_logits(w, ref["question_ids"][0], block_ids,
                                         tokenizer.cls_id, tokenizer.sep_id)
    ours = model_span_logits(0, 0)
    erf_logits = erf_logits + retriever_logits[0, beams[0, 0]]
    self.assertGreater(np.abs([ours[span] for span in spans] - erf_logits).max(), 1e-3)

  def test_realm_eval_on_the_converted_model(self):
    """``realm-eval`` over the converted model writes ORQA's predictions and the metrics."""
    ref = self.reference()
    predicted = [span_words(self.bodies[beam[rank]], start, end)
                 for beam, ((_, rank, start, end), _) in zip(ref["beams"], ref["best"])]
    self.assertNotIn("paris", predicted)
    # Questions 0 and 2 are answered right (their own answers); the rest say "paris".
    golds = [[predicted[i]] if i in (0, 2) else ["paris"] for i in range(len(predicted))]
    qa_file = os.path.join(self.dir, "questions.jsonl")
    with open(qa_file, "w", encoding="utf-8") as f:
      for question, gold in zip(self.QUESTIONS, golds):
        f.write(json.dumps(dict(question=question, answers=gold), ensure_ascii=False) + "\n")
    output_dir = os.path.join(self.dir, "eval")
    proc = run_eval(f"--model_dir={self.model_dir}", f"--index_dir={self.qa_index()}",
                    f"--dataset={qa_file}", f"--output_dir={output_dir}", "--batch_size=2")
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    self.assertIn(f"wrote {os.path.join(output_dir, 'predictions.jsonl')}", proc.stdout)

    with open(os.path.join(output_dir, "predictions.jsonl"), encoding="utf-8") as f:
      lines = [json.loads(line) for line in f]
    self.assertEqual(lines, [dict(question=q, prediction=p)
                             for q, p in zip(self.QUESTIONS, predicted)])
    with open(os.path.join(output_dir, "predictions_with_evidence.jsonl"),
              encoding="utf-8") as f:
      rows = [json.loads(line) for line in f]
    for row, beam, ((_, rank, _, _), _) in zip(rows, ref["beams"], ref["best"]):
      self.assertEqual([b["block_id"] for b in row["blocks"]], beam.tolist())
      self.assertEqual(row["block_rank"], rank)
      block = row["blocks"][rank]
      self.assertEqual(block["text"][block["answer_start"]:block["answer_end"]],
                       row["prediction"])
    with open(os.path.join(output_dir, "metrics.json"), encoding="utf-8") as f:
      metrics = json.load(f)
    self.assertEqual((metrics["questions"], metrics["correct"]), (5, 2))
    self.assertAllClose(metrics["exact_match"], 0.4)
    self.assertEqual((metrics["retriever_beam_size"], metrics["reader_beam_size"]),
                     (NUM_BLOCKS, 5))

if __name__ == "__main__":
  tf.test.main()
