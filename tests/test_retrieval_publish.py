"""The index directory contract and the reader side (IndexHandle)."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from unittest import mock

import numpy as np
import tensorflow as tf

from realm_tf import model_dir as model_dir_lib
from realm_tf import modeling
from realm_tf.retrieval import errors
from realm_tf.retrieval.index import mips_index
from realm_tf.retrieval.publication import handle as handle_lib
from realm_tf.retrieval.publication import publish
from realm_tf.retrieval.publication import testing


def _index(step, n=40, d=8):
  return mips_index.BruteForceIndex(
      np.random.default_rng(step).standard_normal((n, d)).astype(np.float32))


# A flock that refuses what NFS may refuse: a descriptor not opened for writing (NFS emulates
# flock with fcntl locks, whose exclusive kind needs a file opened for writing) or one that is
# not a regular file (a directory). As source, for the second process of the lock test.
_STRICT_FLOCK = """
import errno, fcntl, os, stat
_real_flock = fcntl.flock
def _strict(fd, operation, _real=_real_flock):
  mode = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
  if mode not in (os.O_WRONLY, os.O_RDWR) or not stat.S_ISREG(os.fstat(fd).st_mode):
    raise OSError(errno.EBADF, "flock refused: not a regular file opened for writing")
  return _real(fd, operation)
fcntl.flock = _strict
"""


def _strict_flock(locked):
  """``_STRICT_FLOCK``'s flock, which also appends the path of each file it locks to
  ``locked``."""
  import fcntl  # pylint: disable=g-import-not-at-top
  scope = {}
  exec(_STRICT_FLOCK.replace("fcntl.flock = _strict\n", ""), scope)  # pylint: disable=exec-used
  strict = scope["_strict"]

  def flock(fd, operation, _real=fcntl.flock):
    result = strict(fd, operation, _real=_real)
    locked.append(os.readlink(f"/proc/self/fd/{fd}"))
    return result
  return flock


class PublishTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)

  def test_publish_moves_latest_and_keeps_k(self):
    self.assertIsNone(publish.latest_step(self.dir))
    for step in (100, 200, 300, 400):
      path = publish.publish(_index(step), self.dir, step, {"corpus_fingerprint": "fp"}, keep=2)
      self.assertEqual(path, os.path.join(self.dir, f"step-{step}"))
      self.assertEqual(publish.latest_step(self.dir), step)
    self.assertEqual(publish.published_steps(self.dir), [300, 400])
    self.assertEqual(sorted(os.listdir(self.dir)),
                     ["LATEST", "PUBLICATION", "step-300", "step-400"])
    manifest = mips_index.read_manifest(os.path.join(self.dir, "step-400"))
    self.assertEqual((manifest["model_step"], manifest["num_blocks"], manifest["dim"],
                      manifest["corpus_fingerprint"]), (400, 40, 8, "fp"))

  def test_older_step_does_not_move_latest(self):
    publish.publish(_index(1), self.dir, 500)
    publish.publish(_index(2), self.dir, 300)
    self.assertEqual(publish.latest_step(self.dir), 500)

  def test_a_rebuild_after_updates_is_latest_and_kept(self):
    """Build, 3 updates, a rebuild at the same step: the rebuild is LATEST, survives the
    pruning (keep=3), and a handle holding the 3rd update swaps it in; the next update is
    numbered after the earlier ones and is newer still."""
    publish.publish(_index(1), self.dir, 100, keep=3)
    for update in (1, 2, 3):
      publish.publish(_index(1 + update), self.dir, 100, keep=3, update=update)
    self.assertEqual(publish.read_latest(self.dir), os.path.join(self.dir, "step-100-u3"))
    handle = handle_lib.IndexHandle(self.dir, poll_seconds=0.05)
    self.addCleanup(handle.close)
    handle.wait_for_first()
    rebuilt = _index(10)
    path = publish.publish(rebuilt, self.dir, 100, keep=3)
    self.assertEqual(publish.read_latest(self.dir), path)
    self.assertEqual(sorted(n for n in os.listdir(self.dir) if n.startswith("step-")),
                     ["step-100", "step-100-u2", "step-100-u3"])
    self.assertEqual([n for _, n in publish.publications(self.dir)],
                     ["step-100-u2", "step-100-u3", "step-100"])
    deadline = time.time() + 20
    while not handle.maybe_swap() and time.time() < deadline:
      time.sleep(0.05)
    self.assertEqual(handle.path, path)
    queries = np.random.default_rng(5).standard_normal((3, 8)).astype(np.float32)
    self.assertAllEqual(handle.search(queries, 4)[0], rebuilt.search(queries, 4)[0])
    update = publish.next_update(self.dir, 100)
    self.assertEqual(update, 4)
    path = publish.publish(_index(11), self.dir, 100, keep=3, update=update)
    self.assertEqual(publish.read_latest(self.dir), path)
    self.assertEqual(publish.publication_key(path)[0], 6)
    self.assertEqual([n for _, n in publish.publications(self.dir)],
                     ["step-100-u3", "step-100", "step-100-u4"])

  def test_directories_written_before_publication_numbers(self):
    """Publications written before publication numbers existed still load and order as they
    did; a new publication is newer than all of them, even with every directory gone."""
    for step in (100, 200):
      path = publish.publish(_index(step), self.dir, step)
      manifest = mips_index.read_manifest(path)
      del manifest["publication"]
      with open(os.path.join(path, mips_index.MANIFEST_NAME), "w") as f:
        json.dump(manifest, f)
    os.remove(os.path.join(self.dir, publish.PUBLICATION_NAME))
    self.assertEqual([n for _, n in publish.publications(self.dir)], ["step-100", "step-200"])
    handle = handle_lib.IndexHandle(self.dir, expected_dim=8, watch=False)
    self.assertEqual((handle.wait_for_first().step, handle.index.num_blocks), (200, 40))
    path = publish.publish(_index(3), self.dir, 200, update=publish.next_update(self.dir, 200))
    self.assertEqual(publish.publication_key(path), (1, 200, 1))
    self.assertEqual(publish.read_latest(self.dir), path)
    shutil.rmtree(path)
    path = publish.publish(_index(4), self.dir, 200, update=publish.next_update(self.dir, 200))
    self.assertEqual(publish.publication_key(path)[0], 2)  # PUBLICATION remembers 1.

  def test_the_lock_excludes_another_process(self):
    """``lock`` is a flock on ``index_dir/LOCK``, a regular file opened for writing: a second
    process waits for it (and gets it once the first lets go). Both processes run with a
    ``flock`` that refuses a descriptor not opened for writing or not a regular file, as NFS
    can (it emulates ``flock`` with ``fcntl`` write locks)."""
    script = (_STRICT_FLOCK +
              "import sys, time\n"
              "from realm_tf.retrieval.publication import publish\n"
              "print('waiting', flush=True)\n"
              "with publish.lock(sys.argv[1]):\n"
              "  print(f'{time.time():.6f}', flush=True)\n")
    locked = []
    with mock.patch("fcntl.flock", _strict_flock(locked)):
      with publish.lock(self.dir):
        self.assertEqual(locked, [os.path.join(os.path.realpath(self.dir), publish.LOCK_NAME)])
        proc = subprocess.Popen([sys.executable, "-c", script, self.dir],
                                stdout=subprocess.PIPE, text=True, env=dict(
                                    os.environ, PYTHONPATH=os.path.dirname(
                                        os.path.dirname(os.path.abspath(__file__)))))
        self.assertEqual(proc.stdout.readline().strip(), "waiting")  # Imported: now it waits.
        time.sleep(1.0)
        self.assertIsNone(proc.poll())
        released = time.time()
    out, _ = proc.communicate(timeout=120)
    self.assertEqual(proc.returncode, 0)
    self.assertGreaterEqual(float(out.strip()), released)

  def test_every_lock_is_a_file_opened_for_writing(self):
    """Every lock of the index directory, the blocks directory (corpus updates) and the block
    store goes through ``corpus_updates.file_lock``: each is refused by nothing under a
    ``flock`` that refuses what NFS may (a descriptor opened read-only, a directory), and
    ``flock`` is called nowhere else in the code."""
    from realm_tf.data import block_store  # pylint: disable=g-import-not-at-top
    from realm_tf.data import corpus_updates  # pylint: disable=g-import-not-at-top
    blocks_dir = os.path.join(self.dir, "blocks")
    os.makedirs(blocks_dir)
    locked = []
    strict = _strict_flock(locked)
    with mock.patch("fcntl.flock", strict):
      with publish.lock(self.dir):
        pass
      with corpus_updates.lock(blocks_dir):
        pass
      with block_store._store_lock(blocks_dir):  # pylint: disable=protected-access
        pass
      # What the lock of issue 31 replaced, refused here as NFS may refuse it.
      fd = os.open(self.dir, os.O_RDONLY)
      try:
        with self.assertRaises(OSError):
          strict(fd, __import__("fcntl").LOCK_EX)
      finally:
        os.close(fd)
    real = lambda p: os.path.realpath(p)
    self.assertEqual(locked, [os.path.join(real(self.dir), publish.LOCK_NAME),
                              os.path.join(real(blocks_dir), corpus_updates.LOCK_NAME),
                              os.path.join(real(blocks_dir), block_store.LOCK_NAME)])
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    callers = []
    for top in ("realm_tf", "data_prep", "experiments"):
      for root, _, files in os.walk(os.path.join(repo, top)):
        for name in files:
          if name.endswith(".py"):
            with open(os.path.join(root, name)) as f:
              if any(w in f.read() for w in ("flock(", "lockf(", "F_SETLK")):
                callers.append(os.path.relpath(os.path.join(root, name), repo))
    self.assertEqual(callers, [os.path.join("realm_tf", "data", "corpus_updates.py")])

  def test_latest_and_the_counter_are_replaced_and_synced_alike(self):
    """``LATEST`` and ``PUBLICATION`` are each written to a temporary file, synced, renamed
    over the old one, and the rename synced (the directory) before anything else happens."""
    events = []
    real_replace, real_sync = os.replace, publish._fsync_dir  # pylint: disable=protected-access

    def replace(src, dst):
      if os.path.dirname(dst) == self.dir:  # Not the index's own files.
        events.append(("replace", os.path.basename(dst)))
      return real_replace(src, dst)

    def sync(path):
      events.append(("sync", path))
      return real_sync(path)

    with mock.patch.object(publish.os, "replace", replace), \
        mock.patch.object(publish, "_fsync_dir", sync):
      publish.publish(_index(1), self.dir, 100)
    replaced = [i for i, e in enumerate(events) if e[0] == "replace"]
    self.assertEqual([events[i][1] for i in replaced], ["PUBLICATION", "LATEST"])
    for i in replaced:
      self.assertEqual(events[i + 1], ("sync", self.dir), events)

  def test_leftovers_are_cleaned_and_never_loaded(self):
    publish.publish(_index(1), self.dir, 100)
    dead = os.path.join(self.dir, ".tmp-step-200-999999999")  # A builder killed mid-write.
    os.makedirs(dead)
    open(os.path.join(dead, "embeddings.npy"), "w").close()
    with open(os.path.join(self.dir, ".LATEST.tmp-999999999"), "w") as f:
      f.write("step-200")
    self.assertEqual(publish.published_steps(self.dir), [100])
    self.assertEqual(publish.latest_step(self.dir), 100)
    removed = publish.clean_temporaries(self.dir)
    self.assertLen(removed, 2)
    self.assertEqual(sorted(os.listdir(self.dir)), ["LATEST", "PUBLICATION", "step-100"])

  def test_testonly_build_delay_holds_a_build_half_written(self):
    """The test-only hook of the kill -9 test: a build waits with its index half written."""
    with mock.patch.dict(os.environ, {publish.TESTONLY_BUILD_DELAY_ENV: "1.0"}):
      start = time.time()
      thread = threading.Thread(target=publish.publish, args=(_index(1), self.dir, 100))
      thread.start()
      deadline = start + 20
      tmp = []
      while not tmp and time.time() < deadline:
        tmp = [n for n in os.listdir(self.dir) if n.startswith(".tmp-step-100-")]
        time.sleep(0.01)
      self.assertLen(tmp, 1)
      self.assertFalse(os.path.exists(os.path.join(self.dir, tmp[0], mips_index.MANIFEST_NAME)))
      self.assertIsNone(publish.latest_step(self.dir))
      thread.join()
    self.assertGreaterEqual(time.time() - start, 1.0)
    self.assertEqual(publish.latest_step(self.dir), 100)

  def test_query_embedder_snapshot_restores(self):
    vocab = testing.write_vocab(os.path.join(self.dir, "vocab.txt"))
    config = testing.tiny_model_config(vocab)
    query, _ = modeling.build_embedders(config.retriever)
    path = publish.publish(_index(1, d=16), os.path.join(self.dir, "index"), 7,
                           query_embedder=query)
    other, _ = modeling.build_embedders(config.retriever)
    handle = handle_lib.IndexHandle(os.path.join(self.dir, "index"), watch=False)
    self.assertEqual(handle.query_embedder_checkpoint,
                     os.path.join(path, "query_embedder", "ckpt"))
    model_dir_lib.restore(handle.query_embedder_checkpoint, query_embedder=other)
    for a, b in zip(query.weights, other.weights):
      self.assertAllEqual(a, b)


class IndexHandleTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)

  def test_waits_with_a_helpful_message(self):
    handle = handle_lib.IndexHandle(self.dir, wait_seconds=0.3, poll_seconds=0.1)
    with self.assertRaisesRegex(TimeoutError, "realm-refresh --model_dir=.* --index_dir="):
      handle.wait_for_first()
    with self.assertRaisesRegex(errors.IndexNotReadyError, "realm-index build"):
      handle.search(np.zeros([1, 8], np.float32), 1)

  def test_waits_for_the_first_index(self):
    threading.Timer(0.5, lambda: publish.publish(_index(1), self.dir, 10)).start()
    handle = handle_lib.IndexHandle(self.dir, wait_seconds=20, poll_seconds=0.1)
    handle.wait_for_first()
    self.assertEqual(handle.step, 10)
    handle.close()

  def test_swaps_only_when_asked(self):
    publish.publish(_index(1), self.dir, 10, {"corpus_fingerprint": "fp"})
    handle = handle_lib.IndexHandle(self.dir, expected_fingerprint="fp", expected_dim=8,
                                    poll_seconds=0.05)
    self.addCleanup(handle.close)
    self.assertFalse(handle.maybe_swap())
    self.assertEqual(handle.step, 10)
    queries = np.random.default_rng(5).standard_normal((3, 8)).astype(np.float32)
    new = _index(2)
    publish.publish(new, self.dir, 20, {"corpus_fingerprint": "fp"})
    deadline = time.time() + 20
    while handle._pending is None and time.time() < deadline:  # pylint: disable=protected-access
      time.sleep(0.05)
    self.assertEqual(handle.step, 10)  # Loaded in the background, not yet swapped in.
    self.assertTrue(handle.maybe_swap())
    self.assertEqual(handle.step, 20)
    self.assertFalse(handle.maybe_swap())
    for got, want in zip(handle.search(queries, 4), new.search(queries, 4)):
      self.assertAllEqual(got, want)

  def test_refuses_mismatched_indexes(self):
    publish.publish(_index(1), self.dir, 10, {"corpus_fingerprint": "other"})
    with self.assertRaisesRegex(errors.FingerprintMismatchError, "built over corpus other"):
      handle_lib.IndexHandle(self.dir, expected_fingerprint="fp", wait_seconds=1).wait_for_first()
    with self.assertRaisesRegex(errors.DimensionMismatchError, "dimension 8 .* dimension 128"):
      handle_lib.IndexHandle(self.dir, expected_dim=128, wait_seconds=1).wait_for_first()
    # A newer index over another corpus is refused when the caller would swap it in.
    handle = handle_lib.IndexHandle(self.dir, expected_fingerprint="other", poll_seconds=0.05)
    self.addCleanup(handle.close)
    handle.wait_for_first()
    publish.publish(_index(2), self.dir, 20, {"corpus_fingerprint": "new"})
    deadline = time.time() + 20
    while handle._error is None and time.time() < deadline:  # pylint: disable=protected-access
      time.sleep(0.05)
    with self.assertRaises(errors.FingerprintMismatchError):
      handle.maybe_swap()
    self.assertEqual(handle.step, 10)


if __name__ == "__main__":
  tf.test.main()
