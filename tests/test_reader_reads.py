"""The reader can read its second segment: a fresh demo-size reader learns to copy from it.

This guards the path REALM's learning signal depends on (attention from the masked query
positions into the block, the segment ids, the MLM head tied to the word embeddings): a bug
there leaves the reader at chance on a task it otherwise learns in a few hundred steps.
"""

import numpy as np
import pytest

from experiments.benchmarks import bench_reader_copy as bench


def test_toy_batches_hide_the_answer_in_the_context():
  rng = np.random.default_rng(0)
  for task, answers in (("aligned", 0), ("typed", 20), ("content", 0)):
    ids, types, positions, labels = bench.make_batch(task, rng, 8, 389, answers)
    q, c = bench.QUERY, bench.CONTEXT
    assert ids.shape == types.shape == (8, q + c + 3)
    assert (ids[:, 0] == bench.CLS).all() and (ids[:, q + 1] == bench.SEP).all()
    assert (types[:, :q + 2] == 0).all() and (types[:, q + 2:] == 1).all()
    assert (np.take_along_axis(ids, positions, 1) == bench.MASK).all()
    for row, pos, lab in zip(ids, positions, labels):
      context = list(row[q + 2:q + 2 + c])
      assert all(t in context for t in lab)
      if task == "typed":
        assert sum(t < bench.FIRST + answers for t in context) == 1
      if task == "content":   # the query, unmasked, sits somewhere in the context
        query = list(row[1:q + 1])
        query[pos[0] - 1:pos[-1]] = lab
        assert any(context[o:o + q] == query for o in range(c - q + 1))


@pytest.mark.slow
def test_reader_learns_to_copy_from_the_block():
  # The one answer-range token of the block is the masked one: learned in ~300 steps.
  curve = bench.train_task("typed", vocab=389, answers=55, steps=400, batch_size=64)
  assert curve[0][1] < 0.3, curve    # chance: 1/55 once the answer range is learned
  assert curve[-1][1] > 0.9, curve


def test_reader_learns_to_copy_from_the_block_in_200_steps():
  """The 400-step run's fast sibling: the same reader, task and checks, at twice the learning
  rate for half the steps (it copies from step ~150: accuracy 0.02, 0.06, 0.78, 1.0)."""
  curve = bench.train_task("typed", vocab=389, answers=55, steps=200, batch_size=64,
                           learning_rate=2e-3)
  assert curve[0][1] < 0.3, curve    # chance: 1/55 once the answer range is learned
  assert curve[-1][1] > 0.9, curve
