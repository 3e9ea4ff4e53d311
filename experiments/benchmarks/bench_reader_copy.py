r"""Can the demo's from-scratch reader learn to read its second segment? Three synthetic tasks.

    python -m experiments.benchmarks.bench_reader_copy --steps=800

REALM's retriever learns only when the reader predicts a masked span better from the block
that holds it than from other blocks. The paper's reader starts from BERT and can already read;
the CPU demo's reader (the 2-layer, 64-wide BERT of ``realm_pretrain_cpu``) starts from scratch.
This benchmark trains fresh copies of that reader, in one run, on three toy tasks (the typed
one at two sizes, so four trainings) of the input layout ``[CLS] query [SEP] context [SEP]``,
and prints the masked-token accuracy they reach:

* ``aligned``: the context repeats the query at the same offset; 3 masked query tokens
  (attention by relative position: the baseline);
* ``typed, N answers``: one masked query token; the context holds, among tokens of another
  range, exactly one token of the answer range (N distinct ids): copy the one of the right
  kind, which needs per-token embeddings to learn each answer id's kind;
* ``content``: a whole 3-token span of the query is masked; the context holds the query's 12
  tokens at a random offset among random tokens: find where the query's neighbours of the span
  occur and copy what follows (an induction head, the skill needed to read a block that states
  the fact in another place).

Tokens are random ids, so nothing can be memorized; chance accuracy is 1/vocab.
"""

import time

from absl import flags
import numpy as np
import tensorflow as tf
import tf_keras

from realm_tf import configs
from realm_tf import modeling
from realm_tf.binaries import cli

FLAGS = flags.FLAGS


def define_flags():
  """Only when run as a program: the tests import this module beside other absl flags."""
  flags.DEFINE_integer("steps", 800, "Training steps per task.")
  flags.DEFINE_integer("batch_size", 64, "Sequences per step.")
  flags.DEFINE_float("learning_rate", 1e-3, "Adam learning rate.")
  flags.DEFINE_integer("vocab_size", 389, "Vocabulary of the toy tasks (389: the demo's); a "
                       "typed task with N answers uses at least N + 200.")
  flags.DEFINE_list("answer_kinds", ["55", "1500"], "Sizes of the answer range, typed tasks.")
  flags.DEFINE_integer("seed", 0, "Seed of the data and of TF.")


CLS, SEP, MASK, FIRST = 2, 3, 4, 5   # ids below FIRST are special
QUERY, CONTEXT = 12, 40


def _pack(query, context):
  b = len(query)
  ids = np.concatenate([np.full([b, 1], CLS), query, np.full([b, 1], SEP), context,
                        np.full([b, 1], SEP)], 1)
  types = np.concatenate([np.zeros([b, QUERY + 2]), np.ones([b, CONTEXT + 1])], 1)
  return ids.astype(np.int32), types.astype(np.int32)


def make_batch(task: str, rng: np.random.Generator, b: int, vocab: int, answers: int = 0):
  """``(word_ids, type_ids, masked positions, labels)`` of one batch of ``task``."""
  rows = np.arange(b)[:, None]
  if task == "aligned":
    query = rng.integers(FIRST, vocab, [b, QUERY])
    context = np.concatenate([query, rng.integers(FIRST, vocab, [b, CONTEXT - QUERY])], 1)
    pos = np.sort(np.stack([rng.choice(QUERY, 3, replace=False) for _ in range(b)]), 1)
  elif task == "typed":
    query = rng.integers(FIRST + answers, vocab, [b, QUERY])
    context = rng.integers(FIRST + answers, vocab, [b, CONTEXT])
    pos = rng.integers(0, QUERY, [b, 1])
    answer = rng.integers(FIRST, FIRST + answers, b)
    context[rows[:, 0], rng.integers(0, CONTEXT, b)] = answer
    query[rows, pos] = answer[:, None]
  elif task == "content":
    query = rng.integers(FIRST, vocab, [b, QUERY])
    context = rng.integers(FIRST, vocab, [b, CONTEXT])
    offset = rng.integers(0, CONTEXT - QUERY + 1, b)
    for i in range(b):
      context[i, offset[i]:offset[i] + QUERY] = query[i]
    pos = rng.integers(0, QUERY - 2, [b, 1]) + np.arange(3)[None, :]
  else:
    raise ValueError(task)
  labels = query[rows, pos]
  query = query.copy()
  query[rows, pos] = MASK
  ids, types = _pack(query, context)
  return ids, types, (pos + 1).astype(np.int32), labels.astype(np.int32)


def train_task(task: str, vocab: int, answers: int = 0, steps: int = 800, batch_size: int = 64,
               learning_rate: float = 1e-3, seed: int = 0):
  """Trains a fresh demo-size reader on ``task``; returns ``[(step, mean accuracy)]``, one per
  quarter of training."""
  tf_keras.utils.set_random_seed(seed)
  rng = np.random.default_rng(seed)
  reader = modeling.build_reader(configs.ReaderConfig(
      encoder=configs.bert_tiny(vocab, 64, dropout_rate=0.0), seq_length=96))
  optimizer = tf_keras.optimizers.Adam(learning_rate)

  @tf.function
  def step(ids, types, positions, labels):
    with tf.GradientTape() as tape:
      logits = reader(dict(input_word_ids=ids, input_mask=tf.ones_like(ids),
                           input_type_ids=types, masked_lm_positions=positions),
                      training=True)["mlm_logits"]
      loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
    variables = reader.trainable_variables
    grads = tape.gradient(loss, variables)
    optimizer.apply_gradients((g, v) for g, v in zip(grads, variables) if g is not None)
    return tf.reduce_mean(tf.cast(tf.argmax(logits, -1, output_type=tf.int32) == labels,
                                  tf.float32))

  curve, recent = [], []
  for i in range(steps):
    recent.append(float(step(*make_batch(task, rng, batch_size, vocab, answers))))
    if (i + 1) % max(steps // 4, 1) == 0:
      curve.append((i + 1, float(np.mean(recent))))
      recent = []
  return curve


def main(argv):
  del argv
  tasks = ([("aligned", 0)] + [("typed", int(n)) for n in FLAGS.answer_kinds] +
           [("content", 0)])
  print(f"reader: 2 layers, hidden 64, 2 heads, no dropout; {FLAGS.steps} steps of "
        f"{FLAGS.batch_size}; masked-token accuracy over each quarter of training")
  for task, answers in tasks:
    start = time.time()
    vocab = max(FLAGS.vocab_size, answers + 200)
    curve = train_task(task, vocab, answers, FLAGS.steps, FLAGS.batch_size,
                       FLAGS.learning_rate, FLAGS.seed)
    name = f"typed, {answers} answers" if task == "typed" else task
    print(f"{name:22s} vocab {vocab:5d}  " +
          "  ".join(f"{s:5d}: {a:.3f}" for s, a in curve) +
          f"   ({time.time() - start:.0f} s)", flush=True)


if __name__ == "__main__":
  define_flags()
  cli.run_main(main)
