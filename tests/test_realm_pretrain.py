"""REALM pre-training: the marginal loss and its gradient, candidates, strategies."""

import numpy as np
import tensorflow as tf

import tf_keras

from realm_tf import configs
from realm_tf import train_lib
from realm_tf.data.loaders import InputError
from realm_tf.modeling import losses
from realm_tf.modeling.models import RealmPretrainer, tower_inputs
from realm_tf.retrieval.publication import testing
from realm_tf.tasks import candidates
from realm_tf.tasks import realm_pretrain

# The tiny REALM model and its random inputs (test_health uses them too).
from helpers import CLS, K, LB, LQ, M, SEP
from helpers import ExactHandle, make_blocks, make_examples, tiny_config


def numpy_marginal(retrieval_logits, mlm_logits, mlm_ids, weights):
  """log p(y_j|x), the loss, and r_j(z), all from first principles."""
  p_z = np.exp(retrieval_logits - retrieval_logits.max(1, keepdims=True))
  p_z /= p_z.sum(1, keepdims=True)                                     # [b, k]
  p_vocab = np.exp(mlm_logits - mlm_logits.max(-1, keepdims=True))
  p_vocab /= p_vocab.sum(-1, keepdims=True)                            # [b, k, m, V]
  b, k, m, _ = mlm_logits.shape
  p_y_given_z = np.zeros([b, k, m])
  for i in range(b):
    for z in range(k):
      for j in range(m):
        p_y_given_z[i, z, j] = p_vocab[i, z, j, mlm_ids[i, j]]
  p_y = np.einsum("bk,bkm->bm", p_z, p_y_given_z)                      # sum_z p(z|x) p(y|z,x)
  loss = -(np.log(p_y) * weights).sum() / weights.sum()
  r = (p_y_given_z / p_y[:, None, :] - 1.0) * p_z[:, :, None]          # [b, k, m]
  return np.log(p_y), loss, r


class MarginalLossTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    self.rng = np.random.default_rng(0)
    tf_keras.utils.set_random_seed(0)   # the towers' initial weights, whatever ran before
    self.blocks = make_blocks(12, self.rng)
    self.config = tiny_config()
    self.model = RealmPretrainer.from_config_dataclass(self.config)
    emb = self.model.block_embedder(dict(
        zip(["input_word_ids", "input_mask", "input_type_ids"],
            candidates.pack_blocks(self.blocks, LB, CLS, SEP)[:3]))).numpy()[:-1]
    self.builder = candidates.CandidateBuilder(
        self.blocks, self.config, ExactHandle(emb, step=3), CLS, SEP)
    self.builder._query_embedder = lambda: (lambda x: self.model.query_embedder(x))
    self.examples = make_examples(5, self.rng, self.blocks)

  def features(self):
    f = self.builder.features(self.examples)
    return {k: tf.constant(f[k]) for k in realm_pretrain.DEVICE_FEATURES}, f

  def test_loss_and_gradient_match_numpy(self):
    features, _ = self.features()
    out = self.model(features, training=False)
    logits = tf.Variable(out["retrieval_logits"])
    with tf.GradientTape() as tape:
      m = losses.realm_metrics(logits, out["mlm_logits"], features["mlm_ids"],
                               features["mlm_weights"])
      loss = tf.reduce_sum(m["nll_sum"]) / tf.reduce_sum(m["num_tokens"])
    grad = tape.gradient(loss, logits).numpy()
    w = features["mlm_weights"].numpy()
    log_p_y, want_loss, r = numpy_marginal(out["retrieval_logits"].numpy().astype(np.float64),
                                           out["mlm_logits"].numpy().astype(np.float64),
                                           features["mlm_ids"].numpy(), w)
    self.assertAllClose(m["token_log_p"].numpy() * w, log_p_y * w, rtol=1e-5, atol=1e-5)
    self.assertAllClose(loss.numpy(), want_loss, rtol=1e-5)
    # d(-mean_j log p(y_j|x)) / d f(x,z) = -(1/T) sum_j r_j(z)   (the paper's gradient)
    want_grad = -(r * w[:, None, :]).sum(-1) / w.sum()
    self.assertAllClose(grad, want_grad, rtol=1e-4, atol=1e-6)
    # The replicated loss is the same quantity and reaches both towers and the reader.
    with tf.GradientTape() as tape:
      replica, _ = realm_pretrain.replica_loss(self.model, features, training=False)
    self.assertAllClose(replica.numpy(), want_loss, rtol=1e-5)
    grads = tape.gradient(replica, self.model.trainable_variables)
    names = [v.name for v, g in zip(self.model.trainable_variables, grads)
             if g is not None and np.abs(tf.convert_to_tensor(g).numpy()).sum() > 0]
    self.assertTrue(any("embedder/dense" in n for n in names))
    self.assertTrue(any(n.startswith("reader") for n in names))

  def test_retrieval_utility_and_entropy(self):
    features, _ = self.features()
    out = self.model(features, training=False)
    m = losses.realm_metrics(out["retrieval_logits"], out["mlm_logits"], features["mlm_ids"],
                             features["mlm_weights"])
    w = features["mlm_weights"].numpy()
    log_p_y, _, _ = numpy_marginal(out["retrieval_logits"].numpy().astype(np.float64),
                                   out["mlm_logits"].numpy().astype(np.float64),
                                   features["mlm_ids"].numpy(), w)
    lp = out["mlm_logits"].numpy().astype(np.float64)
    lp = lp - np.log(np.exp(lp - lp.max(-1, keepdims=True)).sum(-1, keepdims=True)) - lp.max(
        -1, keepdims=True)
    null = np.take_along_axis(lp[:, 0], features["mlm_ids"].numpy()[..., None], -1)[..., 0]
    span_sum = ((log_p_y - null) * w).sum(1)
    self.assertAllClose(m["retrieval_utility_sum"], span_sum, atol=1e-4)
    # Per masked token: the span's sum over its number of real mask tokens.
    self.assertAllClose(m["retrieval_utility"], span_sum / np.maximum(w.sum(1), 1), atol=1e-4)
    p = tf.nn.softmax(out["retrieval_logits"]).numpy()
    self.assertAllClose(m["entropy"], -(p * np.log(p)).sum(1), atol=1e-5)

  def test_retrieval_utility_metric_is_a_mean_per_masked_token(self):
    """Over a pass, the sum over every real mask token of log p(y_j|x) - log p(y_j|null,x),
    divided by the number of those tokens; an example without one counts for nothing."""
    self.examples["mlm_weights"][1] = 0.0                  # an example with no mask token
    self.examples["mlm_weights"][3, 1:] = 0.0              # one with a single token
    _, f = self.features()
    w = f["mlm_weights"]
    self.assertGreater(len(set(w.sum(1).tolist())), 2)     # different numbers of tokens
    out = self.model({k: tf.constant(f[k]) for k in realm_pretrain.DEVICE_FEATURES},
                     training=False)
    logits = out["mlm_logits"].numpy().astype(np.float64)
    log_p_y, _, _ = numpy_marginal(out["retrieval_logits"].numpy().astype(np.float64), logits,
                                   f["mlm_ids"], w)
    log_probs = logits - logits.max(-1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
    utility = np.zeros_like(w, dtype=np.float64)
    for i in range(len(w)):
      for j in range(M):
        utility[i, j] = log_p_y[i, j] - log_probs[i, 0, j, f["mlm_ids"][i, j]]
    want = (utility * w).sum() / w.sum()
    per_example = np.mean([(utility[i] * w[i]).sum() / w[i].sum() for i in range(len(w))
                           if w[i].sum() > 0])
    self.assertGreater(abs(want - per_example), 1e-3)     # the two means differ here

    task = realm_pretrain.RealmPretrainTask(configs.RealmPretrainTaskConfig(model=self.config))
    metrics = task.build_metrics(training=False)
    for start, stop in ((0, 2), (2, 5)):                  # a pass of two batches
      batch = {k: tf.constant(f[k][start:stop]) for k in realm_pretrain.DEVICE_FEATURES}
      batch["recall_hit"] = tf.zeros([stop - start])
      task.validation_step(batch, self.model, metrics)
    got = {m.name: m.result().numpy() for m in metrics}
    self.assertAllClose(got["retrieval_utility"], want, rtol=1e-4, atol=1e-5)
    self.assertEqual(got["examples"], 5)

  def test_candidates_null_first_no_trivial_block(self):
    _, f = self.features()
    rows = f["candidate_rows"]
    self.assertTrue(np.all(rows[:, 0] == self.builder.null_row))
    null = f["candidate_word_ids"][:, 0]
    self.assertAllEqual(null[:, :4], np.tile([CLS, SEP, SEP, 0], [len(rows), 1]))
    for i, uid in enumerate(self.examples["source_uid"]):
      self.assertNotIn(uid, [self.blocks[r]["uid"] for r in rows[i, 1:]])
      self.assertLen(set(rows[i]), K)
    # The two last blocks share a uid: a query from one must drop both.
    ranked = np.array([[11, 10, 0, 1, 2, 3, 4]])
    got = self.builder.select_candidates(ranked, [self.blocks[10]["uid"]])
    self.assertAllEqual(got[0], [self.builder.null_row, 0, 1, 2])
    # Reader inputs: [CLS] query [SEP] body [SEP], the query part as in the query input.
    qlen = int(f["query_mask"][0].sum())
    self.assertAllEqual(f["reader_word_ids"][0, 1, :qlen], f["query_word_ids"][0, :qlen])
    self.assertEqual(f["reader_word_ids"][0, 0, qlen], SEP)   # null body: just [SEP]
    body = self.builder.bodies[rows[0, 1]]
    self.assertAllEqual(f["reader_word_ids"][0, 1, qlen:qlen + len(body)], body)

  def test_scores_recomputed_with_current_weights(self):
    features, _ = self.features()
    before = self.model(features, training=False)["retrieval_logits"].numpy()
    beta = self.model.query_embedder.layer_norm.beta
    beta.assign(beta + self.rng.standard_normal(beta.shape).astype(np.float32))
    after = self.model(features, training=False)["retrieval_logits"].numpy()
    self.assertGreater(np.abs(after - before).max(), 1e-3)
    q = self.model.query_embedder(dict(input_word_ids=features["query_word_ids"],
                                       input_mask=features["query_mask"],
                                       input_type_ids=features["query_type_ids"])).numpy()
    flat = {n: tf.reshape(features[f"candidate_{n}"], [-1, LB])
            for n in ("word_ids", "mask", "type_ids")}
    b = self.model.block_embedder({f"input_{n}": v for n, v in flat.items()}).numpy()
    self.assertAllClose(after, np.einsum("bd,bkd->bk", q, b.reshape(len(q), K, -1)), atol=1e-4)

  def test_query_length_mismatch_is_clear(self):
    bad = dict(self.examples, query_ids=np.zeros([5, LQ + 4], np.int64))
    with self.assertRaisesRegex(InputError, "query length 14 but the model"):
      self.builder.features(bad)

  def test_mirrored_strategy_matches_default(self):
    features, _ = self.features()
    strategy = testing.two_cpu_strategy()
    self.assertEqual(strategy.num_replicas_in_sync, 2)
    with strategy.scope():
      mirrored = RealmPretrainer.from_config_dataclass(self.config)
      mirrored.set_weights(self.model.get_weights())
    feats = {k: v[:4] for k, v in features.items()}  # an even batch
    default_loss, default_m = realm_pretrain.replica_loss(self.model, feats, training=False)
    dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensors(feats).unbatch().batch(4))

    # (XLA cannot place clusters on logical CPU devices; the XLA test is below.)
    def replica(x):
      loss, m = realm_pretrain.replica_loss(mirrored, x, training=False)
      return dict(loss=loss, retrieval_utility=tf.reduce_sum(m["retrieval_utility_sum"]),
                  num_tokens=tf.reduce_sum(m["num_tokens"]))

    @tf.function
    def step(x):
      sums = strategy.run(replica, args=(x,))
      return {k: strategy.reduce("SUM", v, axis=None) for k, v in sums.items()}
    got = step(next(iter(dataset)))
    self.assertAllClose(got["loss"], default_loss, rtol=1e-5)
    # The token sums of the utility add up over replicas (the metric is their ratio).
    self.assertAllClose(got["retrieval_utility"],
                        tf.reduce_sum(default_m["retrieval_utility_sum"]), rtol=1e-4)
    self.assertAllClose(got["num_tokens"], tf.reduce_sum(default_m["num_tokens"]))

  def test_bfloat16_policy(self):
    """runtime.mixed_precision_dtype=bfloat16: the towers compute in bfloat16, their
    variables stay float32, and the loss stays finite (and near the float32 loss)."""
    features, _ = self.features()
    want, _ = realm_pretrain.replica_loss(self.model, features, training=False)
    with train_lib.precision_policy("bfloat16"):
      model = RealmPretrainer.from_config_dataclass(self.config)
      model.set_weights(self.model.get_weights())
      query = model.query_embedder(tower_inputs(features, "query"))
      out = model(features)
      task = realm_pretrain.RealmPretrainTask(configs.RealmPretrainTaskConfig(model=self.config))
      metrics = task.build_metrics(training=True)
      logs = task.train_step(features, model, tf_keras.optimizers.SGD(1e-3), metrics)
    self.assertEqual(query.dtype, tf.bfloat16)
    self.assertEqual(tf_keras.mixed_precision.global_policy().name, "float32")  # restored
    self.assertEqual(out["retrieval_logits"].dtype, tf.bfloat16)
    self.assertEqual(out["mlm_logits"].dtype, tf.bfloat16)
    self.assertEqual({v.dtype for v in model.variables}, {tf.float32})
    self.assertTrue(np.isfinite(logs["loss"].numpy()))
    self.assertAllClose(logs["loss"], want, rtol=0.05)
    self.assertTrue(all(np.isfinite(m.result().numpy()) for m in metrics))

  def test_float16_is_refused(self):
    """runtime.mixed_precision_dtype=float16 needs loss scaling, which the tasks' train_step
    does not do: the policy and run_experiment refuse it with a ConfigError, before writing
    anything."""
    with self.assertRaisesRegex(configs.ConfigError, "float16 is not supported"):
      with train_lib.precision_policy("float16"):
        pass
    params = configs.load_experiment("realm_pretrain_cpu",
                                     params_override="runtime.mixed_precision_dtype=float16")
    model_dir = self.create_tempdir().full_path
    with self.assertRaisesRegex(configs.ConfigError, "float16 is not supported.*bfloat16"):
      train_lib.run_experiment(params, model_dir, mode="train")
    self.assertEqual(tf.io.gfile.listdir(model_dir), [])
    self.assertEqual(tf_keras.mixed_precision.global_policy().name, "float32")

  def test_train_step_compiles_with_xla(self):
    features, _ = self.features()
    eager = realm_pretrain.replica_loss(self.model, features, training=False)[0]
    xla = tf.function(lambda x: realm_pretrain.replica_loss(self.model, x, training=False)[0],
                      jit_compile=True)(features)
    self.assertAllClose(eager, xla, rtol=1e-4)


if __name__ == "__main__":
  tf.test.main()
