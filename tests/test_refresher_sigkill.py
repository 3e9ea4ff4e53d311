"""realm-refresh as a separate process, SIGKILLed mid-build and restarted, while a reader
follows LATEST: every index a reader loads is complete, and the last one matches the last
checkpoint."""

import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import tensorflow as tf

from realm_tf.retrieval import errors
from realm_tf.retrieval.index import mips_index
from realm_tf.retrieval.publication import corpus_embedding
from realm_tf.retrieval.publication import index_io
from realm_tf.retrieval.publication import publish
from realm_tf.retrieval.publication import testing

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUM_BLOCKS = 200
DIM = 16


class Reader(threading.Thread):
  """Loads whatever LATEST names, over and over, and checks that it is complete."""

  def __init__(self, index_dir, fingerprint):
    super().__init__(daemon=True)
    self.index_dir = index_dir
    self.fingerprint = fingerprint
    self.loaded_steps = []
    self.failures = []
    self.stop = threading.Event()

  def check(self, path):
    index = index_io.load_index(path, expected_dim=DIM, expected_fingerprint=self.fingerprint,
                                  load_embeddings=True)
    manifest = index.manifest
    step = int(os.path.basename(path).split("-")[1])
    assert manifest["model_step"] == step, manifest
    assert manifest["num_blocks"] == NUM_BLOCKS, manifest
    assert index.embeddings.shape == (NUM_BLOCKS, DIM), index.embeddings.shape
    assert os.path.exists(os.path.join(path, manifest["query_embedder_checkpoint"] + ".index"))
    ids, _ = index.search(np.ones([2, DIM], np.float32), 5)
    assert ids.shape == (2, 5) and ids.min() >= 0 and ids.max() < NUM_BLOCKS, ids
    return step

  def run(self):
    while not self.stop.is_set():
      path = publish.read_latest(self.index_dir)
      if path is not None:
        try:
          step = self.check(path)
          if not self.loaded_steps or self.loaded_steps[-1] != step:
            self.loaded_steps.append(step)
        except (errors.IndexFormatError, OSError, AssertionError, ValueError) as e:
          # Only a failure if LATEST still names this index: otherwise it was replaced and
          # pruned while we read it, which a reader must tolerate (and retries).
          if publish.read_latest(self.index_dir) == path:
            self.failures.append(f"{path}: {type(e).__name__}: {e}")
      time.sleep(0.02)


class RefresherSigkillTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    self.root = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.root, ignore_errors=True)
    self.vocab = testing.write_vocab(os.path.join(self.root, "vocab.txt"))
    self.blocks_dir = os.path.join(self.root, "blocks")
    self.model_dir = os.path.join(self.root, "model")
    self.index_dir = os.path.join(self.root, "index")
    self.manifest = testing.make_corpus(self.blocks_dir, self.vocab, NUM_BLOCKS)
    self.trainer = testing.TinyTrainer(self.model_dir, self.vocab, projection_size=DIM,
                                       max_to_keep=2)
    self.log = open(os.path.join(self.root, "refresher.log"), "w")
    self.proc = None
    self.addCleanup(self._kill)

  def _start(self):
    # Each build sleeps 1.5 s half-way through writing its index, so that a kill lands there.
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3",
               **{publish.TESTONLY_BUILD_DELAY_ENV: "1.5"})
    self.proc = subprocess.Popen(
        [sys.executable, "-m", "realm_tf.binaries.refresh", f"--model_dir={self.model_dir}",
         f"--index_dir={self.index_dir}", f"--blocks_dir={self.blocks_dir}", "--keep=2",
         "--poll_seconds=0.2", "--recall_queries=20", "--noprogress"],
        stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=REPO)

  def _kill(self):
    if self.proc is not None and self.proc.poll() is None:
      os.kill(self.proc.pid, signal.SIGKILL)
      self.proc.wait()

  def _wait(self, condition, what, timeout=60):
    deadline = time.time() + timeout
    while not condition():
      if time.time() > deadline:
        self.log.flush()
        with open(self.log.name) as f:
          log = f.read()[-3000:]
        self.fail(f"timed out waiting for {what}; refresher log:\n{log}")
      time.sleep(0.05)

  def _building(self):
    return any(n.startswith(".tmp-step-") for n in os.listdir(self.index_dir)
               ) if os.path.isdir(self.index_dir) else False

  def _save(self, step):
    self.trainer.perturb()
    self.trainer.save(step)

  def test_kill_restart_and_readers_only_see_complete_indexes(self):
    reader = Reader(self.index_dir, self.manifest["fingerprint"])
    reader.start()
    self.trainer.save(1)
    self._start()
    self._wait(lambda: publish.latest_step(self.index_dir) == 1, "the index of step 1")

    # Kill #1 lands inside a build: its temporary directory is half-written.
    self._save(2)
    self._wait(self._building, "the build of step 2 to start")
    os.kill(self.proc.pid, signal.SIGKILL)
    self.proc.wait()
    self.assertTrue(self._building())  # The leftover, which must never be loaded.
    leftover = [n for n in os.listdir(self.index_dir) if n.startswith(".tmp-step-2-")]
    self.assertLen(leftover, 1)
    self.assertFalse(os.path.exists(os.path.join(self.index_dir, leftover[0],
                                                 mips_index.MANIFEST_NAME)))  # Half-written.
    self.assertEqual(publish.latest_step(self.index_dir), 1)

    # Checkpoints keep arriving while the refresher is down; restart it.
    self._save(3)
    self._start()
    self._wait(lambda: publish.latest_step(self.index_dir) == 3, "the index of step 3")
    self.assertFalse(any(n.startswith(".tmp-step-2") for n in os.listdir(self.index_dir)))

    # Kill #2 at a random moment of the next build (or just before/after it).
    self._save(4)
    time.sleep(random.uniform(0.0, 2.0))
    os.kill(self.proc.pid, signal.SIGKILL)
    self.proc.wait()
    self._start()
    self._save(5)
    self.trainer.finish(5)
    self.assertEqual(self.proc.wait(timeout=90), 0)
    reader.stop.set()
    reader.join()

    self.assertEmpty(reader.failures)
    self.assertEqual(reader.loaded_steps[0], 1)
    self.assertEqual(reader.loaded_steps[-1], 5)
    self.assertEqual(reader.loaded_steps, sorted(reader.loaded_steps))
    self.assertEqual(publish.latest_step(self.index_dir), 5)
    self.assertLessEqual(len(publish.published_steps(self.index_dir)), 2)
    self.assertFalse(any(n.startswith(".") for n in os.listdir(self.index_dir)))
    # The newest index is the corpus embedded with the newest checkpoint's block tower.
    ids, emb = corpus_embedding.embed_corpus(self.trainer.block_embedder, self.blocks_dir, 32,
                                             self.vocab, progress=False)
    final = os.path.join(self.index_dir, "step-5")
    self.assertAllClose(np.load(os.path.join(final, "embeddings.npy")),
                        corpus_embedding.assemble_rows(ids, emb, NUM_BLOCKS), atol=1e-5)
    self.assertEqual(mips_index.read_manifest(final)["checkpoint"],
                     os.path.join(self.model_dir, "ckpt-5"))


if __name__ == "__main__":
  tf.test.main()
