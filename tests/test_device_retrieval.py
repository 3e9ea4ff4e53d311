"""Retrieval on the accelerator (``device_retrieval``) against the host path it replaces."""

import hashlib

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from data_prep import blocks as blocks_pipeline
from data_prep import synthetic_world
from realm_tf import configs
from realm_tf.data import block_store
from realm_tf.data import manifests
from realm_tf.data.loaders import InputError
from realm_tf.modeling.models import RealmPretrainer
from realm_tf.retrieval.publication import testing
from realm_tf.tasks import candidates
from realm_tf.tasks import device_retrieval
from realm_tf.tasks import realm_pretrain
from realm_tf.tokenization import RealmTokenizer, load_vocab

from helpers import ExactHandle

COMPARED = realm_pretrain.DEVICE_FEATURES


def random_examples(rng, b, lq, num_masks, vocab_size, source_rows, cls_id, sep_id, mask_id):
  query_ids = np.zeros([b, lq], np.int64)
  query_mask = np.zeros([b, lq], np.int64)
  for i in range(b):
    n = int(rng.integers(3, lq - 1))
    toks = rng.integers(5, vocab_size, n)
    toks[rng.integers(0, n)] = mask_id
    query_ids[i, :n + 2] = [cls_id, *toks, sep_id]
    query_mask[i, :n + 2] = 1
  return dict(query_ids=query_ids, query_mask=query_mask,
              mlm_positions=np.ones([b, num_masks], np.int64),
              mlm_ids=np.full([b, num_masks], 7, np.int64),
              mlm_weights=np.ones([b, num_masks], np.float32),
              source_block_id=np.asarray(source_rows, np.int64))


def host_inputs(retriever, examples, source_uids=None):
  if source_uids is not None:
    examples = dict(examples, source_uid=np.array(source_uids))
  return retriever.host_features(examples)


def perturbed(config, seed=0):
  """A model whose towers tell blocks apart (untrained ones score them all alike). Seeded, so
  that its weights do not depend on which tests ran before in the process."""
  tf_keras.utils.set_random_seed(seed)
  model = RealmPretrainer.from_config_dataclass(config)
  rng = np.random.default_rng(seed)
  for v in model.query_embedder.trainable_variables + model.block_embedder.trainable_variables:
    v.assign(v + 0.3 * rng.standard_normal(v.shape).astype(np.float32))
  return model


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
  """The demo's world (default size), its blocks at 32 wordpieces, a perturbed tiny model
  whose block inputs are trimmed (24) and whose reader cuts bodies (40)."""
  root = tmp_path_factory.mktemp("device_retrieval")
  world = synthetic_world.generate_world(seed=0)
  files = synthetic_world.write_world(world, str(root / "world"), vocab_size=3000,
                                      whole_word_names=True)
  blocks_dir = str(root / "blocks")
  blocks_pipeline.run_blocks(files["articles"], files["vocab"], blocks_dir, block_seq_length=32)
  config = testing.tiny_model_config(files["vocab"], query_seq_length=16, block_seq_length=24)
  config = config.replace(reader=config.reader.replace(seq_length=40))
  tokenizer = RealmTokenizer(files["vocab"])
  store = block_store.BlockStore.open(blocks_dir, store_dir=str(root / "store"))
  blocks = manifests.read_blocks(blocks_dir)
  model = perturbed(config)
  packed = candidates.pack_blocks(blocks, config.retriever.block_seq_length, tokenizer.cls_id,
                                  tokenizer.sep_id)
  emb = model.block_embedder(dict(zip(("input_word_ids", "input_mask", "input_type_ids"),
                                      packed[:3])), training=False).numpy()[:-1]
  return dict(config=config, tokenizer=tokenizer, store=store, blocks=blocks, model=model,
              emb=emb, vocab_size=len(load_vocab(files["vocab"])))


def both_paths(demo, step):
  """The host builder (exact search with the model's current query tower) and the device
  retriever over the demo's corpus, both with its embeddings at ``step``."""
  config, tok, store, model, emb = (demo[k] for k in ("config", "tokenizer", "store", "model",
                                                     "emb"))
  builder = candidates.CandidateBuilder(store, config, ExactHandle(emb, step=step), tok.cls_id,
                                        tok.sep_id)
  builder._query_embedder = lambda: (lambda x: model.query_embedder(x, training=False))
  retriever = device_retrieval.DeviceRetriever(store, config, tok.cls_id, tok.sep_id)
  retriever.load(emb, step=step)
  return builder, retriever


def test_same_candidates_and_features_as_the_host_path_on_the_demo_corpus(demo):
  """Exact retrieval with the current query tower, in the step, gives today's candidates
  (null first, the source block's uid dropped) and the same block and reader inputs."""
  config, tok, store, model, emb = (demo[k] for k in ("config", "tokenizer", "store", "model",
                                                     "emb"))
  n = len(store)
  assert n > 300 and int(store.gather_packed(np.arange(n), 64)["input_mask"].sum(1).max()) > 24
  builder, retriever = both_paths(demo, step=7)
  rng = np.random.default_rng(1)
  b = 24
  examples = random_examples(rng, b, 16, config.max_masks, demo["vocab_size"],
                             rng.integers(0, n, b),
                             tok.cls_id, tok.sep_id, tok.mask_id)
  uids = [demo["blocks"][s]["uid"] for s in examples["source_block_id"]]
  examples["source_uid"] = np.array(uids)
  want = builder.features(examples)
  got = tf.function(lambda x: retriever.features(x, model.query_embedder))(
      host_inputs(retriever, examples, uids))
  for key in COMPARED:
    np.testing.assert_array_equal(np.asarray(got[key]), np.asarray(want[key]), err_msg=key)
  rows = want["candidate_rows"]
  assert (rows[:, 0] == n).all()
  for i, s in enumerate(examples["source_block_id"]):
    assert s not in rows[i]
  # Trimmed blocks and cut bodies were exercised.
  assert (want["candidate_mask"][:, 1:].sum(-1) == 24).any()
  assert (want["reader_mask"].sum(-1) == 40).any()


def test_examples_from_another_corpus_exclude_nothing_on_both_paths(demo):
  """X != Z: a query whose sentence is not from the corpus (source_block_id -1, no uid) keeps
  its exact top k - 1 blocks, as brute force ranks them, on the host and on the device path;
  a query from the corpus in the same batch still drops its own block."""
  config, tok, store, model, emb = (demo[k] for k in ("config", "tokenizer", "store", "model",
                                                     "emb"))
  builder, retriever = both_paths(demo, step=3)
  rng = np.random.default_rng(2)
  b = 16
  examples = random_examples(rng, b, 16, config.max_masks, demo["vocab_size"],
                             np.zeros(b, np.int64), tok.cls_id, tok.sep_id, tok.mask_id)
  # Every query from the corpus names the block it would retrieve first, so that excluding
  # it shows; every other query is from another corpus.
  q = model.query_embedder(dict(input_word_ids=examples["query_ids"],
                                input_mask=examples["query_mask"],
                                input_type_ids=np.zeros_like(examples["query_ids"])),
                           training=False).numpy()
  order = np.argsort(-(q @ emb.T), axis=1, kind="stable")
  external = np.arange(b) % 2 == 0
  examples["source_block_id"] = np.where(external, -1, order[:, 0])
  examples["source_uid"] = np.array(["" if e else demo["blocks"][r]["uid"]
                                     for e, r in zip(external, order[:, 0])])
  examples["source_corpus"] = np.array([b"news" if e else b"knowledge" for e in external])
  want = builder.features(examples)
  got = tf.function(lambda x: retriever.features(x, model.query_embedder))(
      retriever.host_features(examples))
  for key in COMPARED:
    np.testing.assert_array_equal(np.asarray(got[key]), np.asarray(want[key]), err_msg=key)
  rows = want["candidate_rows"]
  k = config.num_candidates
  for i in range(b):
    if external[i]:
      # Nothing excluded: the brute-force top k - 1 (the first no duplicate uid of the first).
      top = [int(r) for r in order[i] if not store.same_uid(np.array([r]),
                                                            store.uid_digest(int(order[i, 0])))
             or r == order[i, 0]][:k - 1]
      assert rows[i, 1] == order[i, 0]
      assert list(rows[i, 1:]) == top
    else:
      assert order[i, 0] not in rows[i]


def test_source_checks_name_the_example_and_the_fix(demo):
  store, blocks = demo["store"], demo["blocks"]
  n = len(store)
  with pytest.raises(InputError, match=rf"example 1 names source block {n}, which this corpus "
                                       rf"of {n} blocks does not have.*--source_corpus"):
    candidates.check_sources(store, [0, n], [blocks[0]["uid"], "x"])
  with pytest.raises(InputError, match="example 0 names source block -2"):
    candidates.check_sources(store, [-2])
  with pytest.raises(InputError, match="example 0 names no source block but has source_uid"):
    candidates.check_sources(store, [-1], [blocks[0]["uid"]])
  with pytest.raises(InputError, match="example 1: source_corpus 'knowledge' disagrees"):
    candidates.check_sources(store, [-1, -1], ["", ""], ["news", "knowledge"])
  with pytest.raises(InputError, match="example 0: source_block_id 1 holds another uid"):
    candidates.check_sources(store, [1], [blocks[2]["uid"]])
  np.testing.assert_array_equal(
      candidates.check_sources(store, [-1, 2], [b"", blocks[2]["uid"]], [b"news", b"knowledge"]),
      [True, False])


def duplicate_corpus(n=11, seed=0):
  """Blocks with random lengths; rows 0, 5 and 9 share one uid."""
  rng = np.random.default_rng(seed)
  blocks = []
  for i in range(n):
    key = "shared" if i in (0, 5, 9) else f"block {i}"
    body = [int(x) for x in rng.integers(5, 40, rng.integers(1, 14))]
    blocks.append(dict(block_id=i, uid=hashlib.sha1(key.encode()).hexdigest(),
                       token_ids=[2] + [int(rng.integers(5, 40))] + [3] + body + [3]))
  return blocks


def tiny_config(lb=10, lr=18):
  enc = configs.bert_tiny(40, 16)
  enc.override(dict(dropout_rate=0.0, attention_dropout_rate=0.0, initializer_range=0.5))
  return configs.RealmModelConfig(
      retriever=configs.RetrieverConfig(encoder=enc, projection_size=8, projection_dropout=0.0, query_seq_length=8,
                                        block_seq_length=lb),
      reader=configs.ReaderConfig(encoder=enc, seq_length=lr), num_candidates=4, max_masks=2)


def test_mirrored_strategy_shards_the_corpus_and_matches_one_device():
  """Over two logical devices each replica holds half the rows (11: one padded), and the
  features of a batch split over them equal one device's; the trivial uid (three rows
  share it) is dropped everywhere."""
  blocks = duplicate_corpus()
  store = block_store.BlockStore.from_blocks(blocks, 2, 3)
  config = tiny_config()
  model = perturbed(config, seed=2)
  emb = np.random.default_rng(5).standard_normal((len(blocks), 8)).astype(np.float32)
  single = device_retrieval.DeviceRetriever(store, config, 2, 3)
  single.load(emb, step=3)
  rng = np.random.default_rng(4)
  examples = random_examples(rng, 6, 8, 2, 40, [0, 5, 1, 9, 2, 3], 2, 3, 4)
  inputs = host_inputs(single, examples)
  want = single.features({k: tf.constant(v) for k, v in inputs.items()}, model.query_embedder)
  builder = candidates.CandidateBuilder(blocks, config, ExactHandle(emb, step=3), 2, 3)
  builder._query_embedder = lambda: (lambda x: model.query_embedder(x, training=False))
  host_uids = np.array([blocks[s]["uid"] for s in examples["source_block_id"]])
  host = builder.features(dict(examples, source_uid=host_uids))
  for key in COMPARED:
    np.testing.assert_array_equal(np.asarray(want[key]), host[key], err_msg=key)
  for i in (0, 1, 3):   # sources with the shared uid: none of rows 0, 5, 9
    assert not set(host["candidate_rows"][i]) & {0, 5, 9}
  # Rows 0, 5 and 9 made every query's best match: the examples from other sources retrieve
  # two of them and are skipped, as REALM's example generator skips them, on both paths
  # (mask weights zeroed, counted in skipped_duplicates).
  q = model.query_embedder({k.replace("query", "input"): inputs[k] for k in
                            ("query_word_ids", "query_mask", "query_type_ids")}).numpy()
  dup_emb = emb.copy()
  # Not equal rows: a kernel may score equal rows at other positions of its tiles differently
  # in the last bit, and then host and device order a tie apart (issue 70).
  dup_emb[[0, 5, 9]] = np.array([[100.0], [101.0], [102.0]], np.float32) * q.mean(0)
  single.load(dup_emb, step=3)
  builder.handle = ExactHandle(dup_emb, step=3)
  dup_host = builder.features(dict(examples, source_uid=host_uids))
  dup_device = single.features({k: tf.constant(v) for k, v in inputs.items()},
                               model.query_embedder)
  assert dup_host["skipped_duplicates"].tolist() == [0, 0, 1, 0, 1, 1]   # sources 1, 2, 3
  for key in ("skipped_duplicates", "mlm_weights", "candidate_rows"):
    np.testing.assert_array_equal(np.asarray(dup_device[key]), dup_host[key], err_msg=key)
  assert not dup_host["mlm_weights"][[2, 4, 5]].any()
  assert dup_host["mlm_weights"][[0, 1, 3]].any()
  single.load(emb, step=3)

  strategy = testing.two_cpu_strategy()
  with strategy.scope():
    mirrored = device_retrieval.DeviceRetriever(store, config, 2, 3)
    tower = RealmPretrainer.from_config_dataclass(config)
    tower.set_weights(model.get_weights())
  mirrored.load(emb, step=3)
  assert mirrored.shard_rows == 6
  shards = strategy.experimental_local_results(mirrored.embeddings)
  np.testing.assert_array_equal(shards[0].numpy(), emb[:6])
  np.testing.assert_array_equal(shards[1].numpy()[:5], emb[6:])
  dataset = strategy.experimental_distribute_dataset(
      tf.data.Dataset.from_tensor_slices(inputs).batch(6))

  @tf.function
  def step(x):
    return strategy.run(lambda y: mirrored.features(y, tower.query_embedder), args=(x,))
  got = step(next(iter(dataset)))
  for key in COMPARED:
    parts = strategy.experimental_local_results(got[key])
    assert [len(p) for p in parts] == [3, 3]
    np.testing.assert_array_equal(np.concatenate([p.numpy() for p in parts]),
                                  np.asarray(want[key]), err_msg=key)

  # A newer index swaps in: the candidates follow it.
  mirrored.load(emb[::-1].copy(), step=9)
  again = step(next(iter(dataset)))
  assert {int(s) for p in strategy.experimental_local_results(again["index_step"])
          for s in p.numpy()} == {9}


def test_clear_errors():
  blocks = duplicate_corpus()
  store = block_store.BlockStore.from_blocks(blocks, 2, 3)
  retriever = device_retrieval.DeviceRetriever(store, tiny_config(), 2, 3)
  with pytest.raises(InputError, match=r"index embeddings of shape \(11, 4\).*11 blocks"):
    retriever.load(np.zeros([11, 4], np.float32), step=0)
  with pytest.raises(InputError, match="example 0 names source block 11, which this corpus of 11 blocks"):
    device_retrieval.source_groups(store, retriever.groups, [11])
  with pytest.raises(InputError, match="example 0: source_block_id 1 holds another uid"):
    device_retrieval.source_groups(store, retriever.groups, [1], [blocks[2]["uid"]])
  with pytest.raises(InputError, match="3 of them with one uid"):
    device_retrieval.DeviceRetriever(block_store.BlockStore.from_blocks(blocks[:10], 2, 3),
                                     tiny_config().replace(num_candidates=9), 2, 3)
