"""The reader's masked-LM warm start: masking, null blocks, inputs and loss."""

import numpy as np
import tensorflow as tf
import tf_keras

from realm_tf import configs
from realm_tf.tasks import reader_mlm

SEP, MASK = 3, 4


class MaskingTest(tf.test.TestCase):

  def test_masks_stay_inside_the_sentence(self):
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 50, [64, 40]).astype(np.int32)
    qlen = rng.integers(3, 30, 64).astype(np.int32)
    masked, positions, labels, weights = [t.numpy() for t in reader_mlm.mask_sentences(
        tf.constant(ids), tf.constant(qlen), MASK, 0.3, 6, seed=1)]
    for i in range(64):
      real = positions[i][weights[i] > 0]
      self.assertBetween(len(real), 1, 6)
      self.assertTrue(np.all((real >= 1) & (real <= qlen[i] - 2)), (real, qlen[i]))
      self.assertAllEqual(real, np.sort(real))
      self.assertAllEqual(labels[i][weights[i] > 0], ids[i, real])
      self.assertAllEqual(labels[i][weights[i] == 0], np.zeros(int((weights[i] == 0).sum())))
      want = ids[i].copy()
      want[real] = MASK
      self.assertAllEqual(masked[i], want)   # exactly the listed positions are masked

  def test_rate(self):
    ids = tf.fill([512, 62], 7)
    _, _, _, weights = reader_mlm.mask_sentences(ids, tf.fill([512], 62), MASK, 0.15, 60,
                                                 seed=2)
    # 60 maskable positions a row; 15% of them, with at least one.
    self.assertNear(float(tf.reduce_mean(tf.reduce_sum(weights, 1))) / 60, 0.15, 0.01)

  def test_null_blocks(self):
    ids = tf.constant([[2, 10, 11, SEP, 20, 21, SEP, 0]] * 2)
    inputs = dict(input_word_ids=ids, input_mask=tf.cast(ids > 0, tf.int32),
                  input_type_ids=tf.constant([[0, 0, 0, 0, 1, 1, 1, 0]] * 2))
    got = reader_mlm.with_null_blocks(inputs, tf.constant([4, 4]), SEP, rate=1.0)
    # REALM's reader input for the null block: [CLS] query [SEP] [SEP].
    self.assertAllEqual(got["input_word_ids"], [[2, 10, 11, SEP, SEP, 0, 0, 0]] * 2)
    self.assertAllEqual(got["input_mask"], [[1, 1, 1, 1, 1, 0, 0, 0]] * 2)
    self.assertAllEqual(got["input_type_ids"], [[0, 0, 0, 0, 1, 0, 0, 0]] * 2)
    self.assertIs(reader_mlm.with_null_blocks(inputs, tf.constant([4, 4]), SEP, 0.0), inputs)


class TrainStepTest(tf.test.TestCase):

  def test_loss_is_the_masked_token_cross_entropy(self):
    enc = configs.bert_tiny(30, 16, dropout_rate=0.0)
    task = reader_mlm.ReaderMlmTask(configs.ReaderMlmTaskConfig(
        model=configs.ReaderConfig(encoder=enc, seq_length=12)))
    model = task.build_model()
    rng = np.random.default_rng(3)
    ids = rng.integers(5, 30, [3, 12]).astype(np.int32)
    positions = np.array([[1, 2, 0], [3, 0, 0], [1, 4, 5]], np.int32)
    weights = np.array([[1, 1, 0], [1, 0, 0], [1, 1, 1]], np.float32)
    labels = np.take_along_axis(ids, positions, 1) * (weights > 0)
    inputs = dict(input_word_ids=tf.constant(ids), input_mask=tf.ones([3, 12], tf.int32),
                  input_type_ids=tf.zeros([3, 12], tf.int32),
                  masked_lm_positions=tf.constant(positions), masked_lm_ids=tf.constant(labels),
                  masked_lm_weights=tf.constant(weights))
    logits = model.reader(inputs)["mlm_logits"].numpy().astype(np.float64)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    want = -(np.take_along_axis(logp, labels[..., None], -1)[..., 0] * weights).sum() / 6
    metrics = task.build_metrics(training=True)
    logs = task.train_step(inputs, model, tf_keras.optimizers.SGD(0.0), metrics)
    self.assertAllClose(logs["loss"], want, rtol=1e-5)
    accuracy, = metrics
    self.assertEqual(float(accuracy.count), 6.0)   # the real masked tokens


if __name__ == "__main__":
  tf.test.main()
