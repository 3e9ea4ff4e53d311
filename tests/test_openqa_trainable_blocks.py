"""Open-QA fine-tuning with a trainable block tower and the refresher beside the fine-tuner
(``OpenQaTaskConfig.trainable_blocks``)."""

import os
import threading

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from realm_tf import configs
from realm_tf import model_dir as model_dir_lib
from realm_tf import train_lib
from realm_tf.data import block_store
from realm_tf.data import manifests
from realm_tf.modeling.models import OpenQaModel
from realm_tf.openqa import inputs as inputs_lib
from realm_tf.retrieval.index import mips_index
from realm_tf.retrieval.publication import corpus_embedding
from realm_tf.retrieval.publication import handle as handle_lib
from realm_tf.retrieval.publication import publish
from realm_tf.retrieval.publication import refresher
from realm_tf.retrieval.publication import testing
from realm_tf.tasks import candidates as candidates_lib
from realm_tf.tasks import openqa as openqa_task
from realm_tf.tokenization import RealmTokenizer, load_vocab

DIM, LQ, LB, LR, BEAM, READ, FRESH = 16, 16, 24, 48, 6, 2, 3


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  root = tmp_path_factory.mktemp("trainable_blocks")
  titles, bodies = testing.random_texts(12, seed=3)
  vocab = testing.write_vocab(str(root / "vocab.txt"), titles + bodies + ["what is"])
  tokenizer = RealmTokenizer(vocab)
  blocks_dir = str(root / "blocks")
  manifests.write_blocks(blocks_dir, titles, bodies, tokenizer, LB, num_shards=1)
  blocks = manifests.read_blocks(blocks_dir)
  packed = candidates_lib.pack_blocks(blocks, LB, tokenizer.cls_id, tokenizer.sep_id)
  size = len(load_vocab(vocab))
  config = configs.RealmModelConfig(
      retriever=configs.RetrieverConfig(encoder=configs.bert_tiny(size, 16, dropout_rate=0.0),
                                        projection_size=DIM, query_seq_length=LQ,
                                        block_seq_length=LB),
      reader=configs.ReaderConfig(encoder=configs.bert_tiny(size, 16, dropout_rate=0.0),
                                  openqa_seq_length=LR, span_hidden_size=8, max_span_width=3),
      vocab_file=vocab)
  questions = [inputs_lib.Question(f"what is {b.split()[0]}", [b.split()[1]])
               for b in bodies[:4]]
  return dict(root=root, vocab=vocab, tokenizer=tokenizer, bodies=bodies, config=config,
              block_inputs=dict(zip(("word_ids", "mask", "type_ids"), packed[:3])),
              store=block_store.BlockStore.open(blocks_dir),
              questions=questions)


def _embeddings(step, n=12):
  return np.random.default_rng(step).standard_normal((n, DIM)).astype(np.float32)


def test_builder_adds_block_inputs_and_swaps_indexes(corpus, tmp_path):
  index_dir = str(tmp_path / "index")
  publish.publish(mips_index.BruteForceIndex(_embeddings(1)), index_dir, 0)
  handle = handle_lib.IndexHandle(index_dir, poll_seconds=0.05)
  handle.wait_for_first()
  builder = inputs_lib.OpenQaInputBuilder(
      corpus["bodies"], handle.embeddings(), handle.search, corpus["tokenizer"],
      query_seq_length=LQ, reader_seq_length=LR, retriever_beam_size=BEAM,
      reader_beam_size=READ, blocks=corpus["store"], block_seq_length=LB,
      trainable_blocks=FRESH, handle=handle)
  queries = np.random.default_rng(9).standard_normal((4, DIM)).astype(np.float32)
  for step in (1, 2):
    f = builder.features(corpus["questions"], queries)
    table = _embeddings(step)
    want_beam = np.argsort(-(queries @ table.T), axis=1)[:, :BEAM]
    np.testing.assert_array_equal(f["beam_ids"], want_beam)
    np.testing.assert_array_equal(f["beam_emb"], table[want_beam])
    for key, rows in corpus["block_inputs"].items():
      np.testing.assert_array_equal(f[f"beam_block_{key}"], rows[want_beam[:, :FRESH]])
    assert not builder.maybe_swap()
    if step == 1:   # the refresher publishes a newer index: the next batch uses it
      publish.publish(mips_index.BruteForceIndex(_embeddings(2)), index_dir, 10)
      for _ in range(400):
        if builder.maybe_swap():
          break
        threading.Event().wait(0.05)
      assert handle.step == 10
  handle.close()
  with pytest.raises(ValueError, match="trainable_blocks"):
    inputs_lib.OpenQaInputBuilder(corpus["bodies"], _embeddings(1), handle.search,
                                  corpus["tokenizer"], query_seq_length=LQ,
                                  reader_seq_length=LR, retriever_beam_size=BEAM,
                                  reader_beam_size=READ, trainable_blocks=FRESH)


def test_model_embeds_the_top_of_the_beam_with_the_block_tower(corpus):
  tokenizer, config = corpus["tokenizer"], corpus["config"]
  tf_keras.utils.set_random_seed(2)
  model = OpenQaModel.from_config_dataclass(config, block_tower=True)
  assert "block_embedder" in model.checkpoint_items
  assert OpenQaModel.from_config_dataclass(config).block_embedder is None
  queries = np.random.default_rng(4).standard_normal((4, DIM)).astype(np.float32)
  builder = inputs_lib.OpenQaInputBuilder(
      corpus["bodies"], _embeddings(1), mips_index.BruteForceIndex(_embeddings(1)).search,
      tokenizer, query_seq_length=LQ, reader_seq_length=LR, retriever_beam_size=BEAM,
      reader_beam_size=READ, blocks=corpus["store"], block_seq_length=LB,
      trainable_blocks=FRESH)
  f = {k: tf.constant(v) for k, v in builder.features(corpus["questions"], queries).items()}
  with tf.GradientTape() as tape:
    out = model(f, training=False)
    objective = tf.reduce_sum(out["retriever_logits"] * np.arange(BEAM, dtype=np.float32))
  # Direct computation: the towers called one by one.
  q = model.query_embedder({f"input_{k}": f[f"question_{k}"]
                            for k in ("word_ids", "mask", "type_ids")}).numpy()
  e = model.block_embedder({f"input_{k}": tf.reshape(f[f"beam_block_{k}"], [-1, LB])
                            for k in ("word_ids", "mask", "type_ids")}).numpy()
  e = e.reshape(4, FRESH, DIM)
  want = np.concatenate([np.einsum("bd,bkd->bk", q, e),
                         np.einsum("bd,bkd->bk", q, f["beam_emb"].numpy()[:, FRESH:])], 1)
  np.testing.assert_allclose(out["retriever_logits"].numpy(), want, rtol=1e-4, atol=1e-5)
  grads = tape.gradient(objective, model.block_embedder.trainable_variables)
  assert sum(float(tf.reduce_sum(tf.abs(g))) for g in grads if g is not None) > 0
  # Without the beam_block_* features the index's embeddings are used throughout.
  frozen = {k: v for k, v in f.items() if not k.startswith("beam_block_")}
  np.testing.assert_allclose(
      model(frozen, training=False)["retriever_logits"].numpy(),
      np.einsum("bd,bkd->bk", q, f["beam_emb"].numpy()), rtol=1e-4, atol=1e-5)


def test_finetuning_with_the_refresher_beside(openqa_world, tmp_path):
  """trainable_blocks end to end: the fine-tuner starts on the refresher's index of ckpt-0,
  trains its block tower, and the refresher's last index embeds the corpus with the final
  block tower, the one realm-serve pins for the final checkpoint; a missing blocks_dir or
  block-tower source is refused by name. (conftest's Open-QA world: its blocks and its REALM
  model of random towers.)"""
  files, blocks_dir = openqa_world["files"], openqa_world["blocks_dir"]
  realm_dir = openqa_world["realm_dir"]
  size = len(load_vocab(files["vocab"]))
  index_dir, model_dir = str(tmp_path / "openqa_index"), str(tmp_path / "openqa")
  overrides = {
      "task.model.vocab_file": files["vocab"],
      "task.model.retriever.encoder.vocab_size": size,
      "task.model.retriever.encoder.hidden_size": 16,
      "task.model.retriever.encoder.intermediate_size": 64,
      "task.model.retriever.projection_size": 16,
      "task.model.retriever.query_seq_length": 24,
      "task.model.retriever.block_seq_length": 48,
      "task.model.reader.encoder.vocab_size": size,
      "task.model.reader.encoder.hidden_size": 16,
      "task.model.reader.encoder.intermediate_size": 64,
      "task.model.reader.openqa_seq_length": 64,
      "task.model.reader.span_hidden_size": 8,
      "task.init_checkpoint": realm_dir, "task.index_dir": index_dir,
      "task.blocks_dir": blocks_dir, "task.trainable_blocks": 4,
      "task.index_wait_seconds": 300, "task.retriever_beam_size": 8,
      "task.reader_beam_size": 2, "task.top_k": "[1, 5]",
      "task.train_data.input_path": files["qa_train"],
      "task.train_data.global_batch_size": 4,
      "task.validation_data.input_path": files["qa_dev"],
      "task.validation_data.global_batch_size": 4,
      "trainer.train_steps": 4, "trainer.steps_per_loop": 2, "trainer.summary_interval": 2,
      "trainer.checkpoint_interval": 2, "trainer.validation_interval": 4,
      "trainer.optimizer_config.learning_rate.polynomial.initial_learning_rate": 1e-2,
  }

  def params(**changes):
    merged = dict(overrides, **changes)
    return configs.load_experiment(
        "openqa_cpu", params_override=",".join(f"{k}={v}" for k, v in merged.items()))

  with pytest.raises(configs.ConfigError, match="task.blocks_dir"):
    train_lib.run_experiment(params(**{"task.blocks_dir": ""}), str(tmp_path / "x"),
                             mode="train")
  built = []
  thread = threading.Thread(target=lambda: built.append(refresher.refresh_loop(
      model_dir, index_dir, blocks_dir, poll_seconds=0.2, model_dir_wait_seconds=300,
      options=refresher.BuildOptions(index_type="brute_force", recall_queries=0,
                                     progress=False, tensorboard_dir=""))))
  thread.start()
  metrics = train_lib.run_experiment(params(), model_dir, mode="train_and_eval")
  thread.join(timeout=300)
  assert not thread.is_alive() and built and built[0] >= 2
  steps = publish.published_steps(index_dir)
  assert steps[-1] == 4 and "exact_match" in metrics

  # The block tower trained: the final checkpoint's differs from the one it started from.
  config = model_dir_lib.load_config(model_dir)
  final = OpenQaModel.from_config_dataclass(config, block_tower=True)
  first = OpenQaModel.from_config_dataclass(config, block_tower=True)
  model_dir_lib.restore(model_dir_lib.latest_checkpoint(model_dir),
                        block_embedder=final.block_embedder)
  model_dir_lib.restore(model_dir_lib.resolve_checkpoint(realm_dir),
                        block_embedder=first.block_embedder)
  moved = [np.abs(a.numpy() - b.numpy()).max() for a, b in
           zip(final.block_embedder.trainable_variables, first.block_embedder.trainable_variables)]
  assert max(moved) > 1e-4
  # The refresher's last index holds the final block tower's embeddings of the corpus.
  ids, emb = corpus_embedding.embed_corpus(final.block_embedder, blocks_dir, 48,
                                           files["vocab"], True, progress=False)
  latest = handle_lib.IndexHandle(index_dir, watch=False)
  np.testing.assert_allclose(latest.embeddings()[ids], emb, rtol=1e-4, atol=1e-5)
  latest.close()
  # What realm-serve pins for this model: its own block tower, as the model directory records;
  # for the final checkpoint, the tower of the refresher's last index.
  from realm_tf.serving import service as service_lib  # pylint: disable=g-import-not-at-top
  assert model_dir_lib.read_block_tower(model_dir) == {"own": True}
  assert service_lib.pinned_block_tower(
      model_dir, model_dir_lib.latest_checkpoint(model_dir), {}) == handle_lib.block_tower_id(
          latest.manifest) == latest.manifest["block_tower"]["fingerprint"]

  # No block tower to start from.
  with pytest.raises(configs.ConfigError, match="init_checkpoint"):
    task = openqa_task.OpenQaTask(params(**{"task.init_checkpoint": ""}).task)
    task.initialize(task.build_model())
  assert os.path.exists(os.path.join(index_dir, "LATEST"))
