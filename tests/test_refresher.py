"""The refresher loop in-process, the realm-index binary, and the binaries' error messages
(the binaries run in this process)."""

import contextlib
import glob
import io
import os
import shutil
import tempfile
from unittest import mock

import numpy as np
import tensorflow as tf

from realm_tf import model_dir as model_dir_lib
from realm_tf.retrieval import errors
from realm_tf.retrieval.index import mips_index
from realm_tf.retrieval.publication import corpus_embedding
from realm_tf.retrieval.publication import publish
from realm_tf.retrieval.publication import refresher
from realm_tf.retrieval.publication import testing

import helpers


class RefreshLoopTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = tempfile.mkdtemp()
    cls.vocab = testing.write_vocab(os.path.join(cls.root, "vocab.txt"))
    cls.blocks_dir = os.path.join(cls.root, "blocks")
    cls.manifest = testing.make_corpus(cls.blocks_dir, cls.vocab, 120)

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.root, ignore_errors=True)
    super().tearDownClass()

  def setUp(self):
    super().setUp()
    self.dir = tempfile.mkdtemp(dir=self.root)
    self.model_dir = os.path.join(self.dir, "model")
    self.index_dir = os.path.join(self.dir, "index")
    self.options = refresher.BuildOptions(progress=False, recall_queries=20)

  def _loop(self, trainer, script, **kwargs):
    """Runs refresh_loop; each poll sleep performs the next trainer action of ``script``."""
    script = list(script)

    def sleep(_):
      if not script:
        self.fail("the refresher kept polling after the script ended")
      script.pop(0)(trainer)

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
      builds = refresher.refresh_loop(self.model_dir, self.index_dir, self.blocks_dir,
                                      poll_seconds=0, options=self.options, sleep=sleep,
                                      **kwargs)
    return builds, out.getvalue()

  def test_builds_newest_respects_interval_and_exits_when_done(self):
    trainer = testing.TinyTrainer(self.model_dir, self.vocab, max_to_keep=5)
    trainer.save(10)
    trainer.save(20)

    def save(step):
      def act(t):
        t.perturb()
        t.save(step)
      return act

    def finish(t):
      t.perturb()
      t.save(60)
      t.finish(60)

    builds, out = self._loop(trainer, [save(30), save(50), finish], keep=2,
                             min_step_interval=25)
    # 20 at startup (the newest), 30 skipped (< 25 steps later), 50, and the final 60.
    self.assertEqual(builds, 3)
    self.assertRegex(out, r"published .*step-20: step 20, 120 blocks")
    self.assertNotIn("step-30", out)
    self.assertEqual(publish.published_steps(self.index_dir), [50, 60])
    self.assertEqual(publish.latest_step(self.index_dir), 60)
    self.assertIn("is final", out)
    # The final index holds the final block tower's embeddings of the corpus.
    ids, emb = corpus_embedding.embed_corpus(trainer.block_embedder, self.blocks_dir, 32,
                                             self.vocab, progress=False)
    loaded = np.load(os.path.join(self.index_dir, "step-60", "embeddings.npy"))
    self.assertAllClose(loaded, corpus_embedding.assemble_rows(ids, emb, 120), atol=1e-5)
    manifest = mips_index.read_manifest(os.path.join(self.index_dir, "step-60"))
    self.assertEqual(manifest["corpus_fingerprint"], self.manifest["fingerprint"])
    self.assertEqual(manifest["recall_at_10"], 1.0)  # 120 blocks: exact scoring.
    self.assertNotEmpty(glob.glob(os.path.join(self.index_dir, "tensorboard", "events.*")))

  def test_restart_resumes_from_latest(self):
    trainer = testing.TinyTrainer(self.model_dir, self.vocab)
    trainer.save(10)
    self.assertEqual(self._loop(trainer, [], max_builds=1)[0], 1)
    os.makedirs(os.path.join(self.index_dir, ".tmp-step-20-999999999"))  # A killed build.
    trainer.finish(10)
    builds, out = self._loop(trainer, [])
    self.assertEqual(builds, 0)  # Step 10 is already indexed.
    self.assertIn("removed leftover", out)
    self.assertEqual(sorted(os.listdir(self.index_dir)),
                     ["LATEST", "LOCK", "PUBLICATION", "step-10", "tensorboard"])

  def test_tolerates_a_checkpoint_that_disappears(self):
    trainer = testing.TinyTrainer(self.model_dir, self.vocab, max_to_keep=1)
    trainer.save(10)
    real_restore = model_dir_lib.restore
    vanished = []

    def flaky_restore(path, **items):
      if path.endswith("ckpt-10") and not vanished:  # The trainer deletes it as we read it.
        vanished.append(path)
        for f in glob.glob(path + ".*"):
          os.remove(f)
      return real_restore(path, **items)

    def finish(t):
      t.save(20)
      t.finish(20)

    with mock.patch.object(model_dir_lib, "restore", flaky_restore):
      builds, _ = self._loop(trainer, [finish])
    self.assertEqual(vanished, [os.path.join(self.model_dir, "ckpt-10")])
    self.assertEqual(builds, 1)
    self.assertEqual(publish.published_steps(self.index_dir), [20])

  def test_clear_errors(self):
    with self.assertRaisesRegex(errors.CheckpointNotFoundError, "model directory not found"):
      refresher.refresh_loop(os.path.join(self.dir, "nope"), self.index_dir, self.blocks_dir)
    os.makedirs(self.model_dir)
    with self.assertRaisesRegex(errors.CheckpointNotFoundError, "no checkpoint in"):
      refresher.build_index_for_checkpoint(None, self.model_dir, self.blocks_dir,
                                           self.index_dir)
    with self.assertRaisesRegex(errors.CorpusFormatError, "blocks directory not found"):
      refresher.Refresher(self.model_dir, os.path.join(self.dir, "no_blocks"), self.index_dir)


class RealmIndexBinaryTest(tf.test.TestCase):
  """``realm-index build`` / ``embed`` / ``search`` through the binary's main (in-process)."""

  def test_build_embed_search(self):
    root = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, root, ignore_errors=True)
    vocab = testing.write_vocab(os.path.join(root, "vocab.txt"))
    titles = ["Paris", "London", "Physics"]
    bodies = ["paris is the capital of france", "london is a city on the river",
              "physics is a science"]
    from realm_tf import tokenization  # pylint: disable=g-import-not-at-top
    from realm_tf.data import manifests  # pylint: disable=g-import-not-at-top
    manifests.write_blocks(os.path.join(root, "blocks"), titles, bodies,
                           tokenization.RealmTokenizer(vocab), 32)
    trainer = testing.TinyTrainer(os.path.join(root, "model"), vocab)
    trainer.save(5)

    def run(*args):
      proc = helpers.run_cli("realm_tf.binaries.index", args[0], f"--model_dir={root}/model",
                             f"--blocks_dir={root}/blocks", f"--index_dir={root}/index",
                             "--noprogress", *args[1:])
      self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
      return proc.stdout

    run("embed", f"--embeddings_dir={root}/emb", "--shard_index=1", "--num_shards=2")
    run("embed", f"--embeddings_dir={root}/emb", "--shard_index=0", "--num_shards=2")
    self.assertIn("step-5", run("build", f"--embeddings_dir={root}/emb"))
    # Built from the shards, the index still records the tower that embedded them (updates
    # embed new blocks with it).
    recorded = mips_index.read_manifest(publish.read_latest(f"{root}/index"))["block_tower"]
    self.assertEqual(recorded["step"], 5)
    self.assertEqual(recorded["fingerprint"], refresher.block_tower_fingerprint(
        f"{root}/model", recorded["checkpoint"]))
    out = run("search", "--query=capital of france", "--query=science", "--k=3")
    self.assertIn("model step 5, 3 blocks", out)
    self.assertEqual(out.count("query: "), 2)
    self.assertIn("paris is the capital of france", out)
    self.assertRegex(out, r" 1\. \[ *-?\d+\.\d{3}\] \w+  \(block \d\)")

  def test_binary_prints_one_line_errors(self):
    """realm-refresh in this process (its process runs are test_realm_training's and
    test_refresher_sigkill's)."""
    root = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, root, ignore_errors=True)
    proc = helpers.run_cli("realm_tf.binaries.refresh", f"--model_dir={root}/missing",
                           f"--index_dir={root}/index", f"--blocks_dir={root}/blocks")
    self.assertEqual(proc.returncode, 2, proc.stderr)
    self.assertIn(f"error: model directory not found: {root}/missing", proc.stderr)
    self.assertNotIn("Traceback", proc.stderr)


if __name__ == "__main__":
  tf.test.main()
