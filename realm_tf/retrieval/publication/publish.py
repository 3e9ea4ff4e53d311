"""The index directory contract: ``index_dir/step-<N>/``, ``index_dir/LATEST``.

::

    index_dir/
      LATEST                  "step-1200-u2\n", replaced atomically (temp file + os.replace)
      PUBLICATION             the last publication number given (see below)
      LOCK                    the lock file of publications and updates (``lock``)
      step-1000/              a complete index, never modified after its rename
      step-1200/
      step-1200-u1/           the index of step 1200 after one corpus update (realm-index
      step-1200-u2/           upsert|delete): a new directory each time, copy-on-write
        manifest.json         written last: model_step, update, publication, num_blocks, dim,
                              corpus_fingerprint, index_type, settings, build time, recall,
                              query checkpoint
        embeddings.npy        float32 [num_blocks, dim], row = block_id
        scann/                ScaNN artifacts (serialized with relative paths)
        query_embedder/ckpt*  the query tower the index was built with:
                              model_dir.restore(path, query_embedder=...)
      .tmp-step-1400-<pid>/   a build in progress (removed on restart, never loaded)
      tensorboard/            the refresher's summaries

A build from the checkpoint of step N is ``step-<N>``, the k-th update on top of the index of
step N ``step-<N>-u<k>``. Publications are ordered by their **publication number**
(``manifest["publication"]``), one more than any given before in this directory (``PUBLICATION``
remembers the last, so that it never goes back even when directories are deleted by hand):
a rebuild at the step of an updated index (``realm-index build`` after ``step-N-u3``) is newer
than its updates, becomes ``LATEST`` and is what the next update applies on top of (as
``step-N-u4``). ``LATEST`` moves to each new publication unless its model step is older than
the one ``LATEST`` names (a build from an old checkpoint never replaces a newer model's
index); ``prune`` keeps the newest publications. Directories written before publication numbers
existed count as number 0, ordered among themselves by ``(N, update)`` as they were then.
Readers (``IndexHandle``, ``realm-serve``) swap in the index ``LATEST`` names when its
:func:`publication_key` is greater than their current one's.

Each publication is written under ``.tmp-<name>-<pid>``, renamed to ``<name>`` and only then is
``LATEST`` moved, so a reader that follows ``LATEST`` never sees a half-written index. Old
indexes are renamed to a temporary name before being deleted, for the same reason. ``rename``
must be atomic (a local POSIX filesystem, or NFS); the lock is a ``flock`` on a file opened for
writing (``index_dir/LOCK``), which NFS supports (as ``fcntl`` locks) where a lock on the
directory itself may be refused. Publishing needs the lock (``with lock(index_dir):``, as the
refresher and updates do): the publication number is taken under it.
"""

import contextlib
import os
import re
import shutil
import signal
import time
from typing import Dict, List, Optional, Tuple

from absl import logging
import tensorflow as tf

from realm_tf.data import corpus_updates
from realm_tf.data import manifests
from realm_tf.retrieval import errors
from realm_tf.retrieval.index import mips_index

LATEST_NAME = "LATEST"
PUBLICATION_NAME = "PUBLICATION"
LOCK_NAME = "LOCK"
STEP_PREFIX = "step-"
TMP_PREFIX = ".tmp-"
QUERY_CHECKPOINT = os.path.join("query_embedder", "ckpt")
_STEP_RE = re.compile(r"^step-(\d+)(?:-u(\d+))?$")
_TMP_PID_RE = re.compile(r"^\.tmp-.*-(\d+)$")
# Test only: seconds to sleep half-way through writing each index (after the query tower,
# before the index and its manifest), so that a test can kill a build in the middle. Read in
# _testonly_build_delay(), nowhere else; production never sets it.
TESTONLY_BUILD_DELAY_ENV = "REALM_TF_TESTONLY_BUILD_DELAY"
# Test only: the phase of an update (``updates.CRASH_PHASES``) at which the process kills itself
# with SIGKILL, so that a test can check what a crash there leaves. Read in
# testonly_crash_point(), nowhere else; production never sets it.
TESTONLY_CRASH_ENV = "REALM_TF_TESTONLY_CRASH_AT"


def index_name(step: int, update: int = 0) -> str:
  """``step-<step>``, or ``step-<step>-u<update>`` for an update on top of it."""
  return f"{STEP_PREFIX}{int(step)}" + (f"-u{int(update)}" if update else "")


def parse_name(name: str) -> Optional[Tuple[int, int]]:
  """``(step, update)`` of a published directory's name (``step-N`` or ``step-N-uK``), or
  None for another name."""
  m = _STEP_RE.match(os.path.basename(name))
  return None if m is None else (int(m.group(1)), int(m.group(2) or 0))


def read_latest(index_dir: str) -> Optional[str]:
  """The directory ``LATEST`` names (e.g. ``/x/step-1200``), or None when there is none."""
  try:
    with open(os.path.join(index_dir, LATEST_NAME)) as f:
      name = f.read().strip()
  except FileNotFoundError:
    return None
  if not _STEP_RE.match(name):
    logging.warning("ignoring %s/LATEST with unexpected content %r", index_dir, name)
    return None
  return os.path.join(index_dir, name)


def publication_key(path: str, manifest: Optional[Dict] = None) -> Tuple[int, int, int]:
  """``(publication, step, update)`` of a published directory: which one is newer (greater).

  ``manifest``: its manifest if already read (else read from ``path``; IndexFormatError when
  it cannot be). A directory published before publication numbers existed counts as 0.
  """
  if manifest is None:
    manifest = mips_index.read_manifest(path)
  step, update = parse_name(path) or (int(manifest.get("model_step", 0)),
                                      int(manifest.get("update", 0)))
  return int(manifest.get("publication", 0)), step, update


def _read_counter(index_dir: str) -> int:
  try:
    with open(os.path.join(index_dir, PUBLICATION_NAME)) as f:
      return int(f.read().strip() or 0)
  except FileNotFoundError:
    return 0
  except ValueError:
    logging.warning("ignoring %s/%s: not a number", index_dir, PUBLICATION_NAME)
    return 0


def publications(index_dir: str) -> List[Tuple[Tuple[int, int, int], str]]:
  """``(publication_key, name)`` of the complete published directories, oldest first."""
  out = []
  for step, update in published(index_dir):
    name = index_name(step, update)
    try:
      out.append((publication_key(os.path.join(index_dir, name)), name))
    except (OSError, errors.IndexFormatError):
      continue  # Removed meanwhile, or not an index: neither ordered nor pruned.
  return sorted(out)


def next_publication(index_dir: str) -> int:
  """The publication number the next publication gets: one more than any given here before."""
  given = [key[0] for key, _ in publications(index_dir)]
  return 1 + max([_read_counter(index_dir)] + given)


def latest_key(index_dir: str) -> Optional[Tuple[int, int]]:
  """``(step, update)`` of the index ``LATEST`` names, or None."""
  path = read_latest(index_dir)
  return None if path is None else parse_name(path)


def latest_step(index_dir: str) -> Optional[int]:
  """The model step of the index ``LATEST`` names, or None."""
  key = latest_key(index_dir)
  return None if key is None else key[0]


def published(index_dir: str) -> List[Tuple[int, int]]:
  """``(step, update)`` of the complete published directories, ascending."""
  if not os.path.isdir(index_dir):
    return []
  keys = []
  for name in os.listdir(index_dir):
    key = parse_name(name)
    if key and os.path.exists(os.path.join(index_dir, name, mips_index.MANIFEST_NAME)):
      keys.append(key)
  return sorted(keys)


def published_steps(index_dir: str) -> List[int]:
  """Model steps of the complete published directories, ascending (each once)."""
  return sorted({step for step, _ in published(index_dir)})


def next_update(index_dir: str, step: int) -> int:
  """The update number the next update on top of the index of ``step`` gets."""
  return 1 + max([u for s, u in published(index_dir) if s == step] +
                 [u for s, u in [latest_key(index_dir) or (None, 0)] if s == step])


@contextlib.contextmanager
def lock(index_dir: str):
  """Holds the lock of ``index_dir``: one update or refresh publishes at a time; released when
  the process dies. An exclusive ``flock`` on ``index_dir/LOCK``, a file opened for writing
  (see the module doc: NFS locks such a file, not a directory opened read-only)."""
  with corpus_updates.file_lock(os.path.join(index_dir, LOCK_NAME)):
    yield


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


def clean_temporaries(index_dir: str) -> List[str]:
  """Removes leftovers (``.tmp-*``) of builders that are no longer running. Returns them."""
  removed = []
  if not os.path.isdir(index_dir):
    return removed
  for name in os.listdir(index_dir):
    if not name.startswith(TMP_PREFIX) and not name.startswith(f".{LATEST_NAME}.tmp-"):
      continue
    m = _TMP_PID_RE.match(name) or re.match(r"^\.LATEST\.tmp-(\d+)$", name)
    if m and int(m.group(1)) != os.getpid() and _pid_alive(int(m.group(1))):
      continue  # Another live builder's work in progress.
    path = os.path.join(index_dir, name)
    if os.path.isdir(path):
      shutil.rmtree(path, ignore_errors=True)
    else:
      try:
        os.remove(path)
      except FileNotFoundError:
        pass
    removed.append(path)
  return removed


def _write_atomically(index_dir: str, name: str, text: str, tmp_name: str) -> None:
  """Replaces ``index_dir/name`` with ``text`` at once: written to ``tmp_name`` (a name that
  ``clean_temporaries`` removes if the writer dies), synced, renamed over it, and the rename
  synced too (the directory), so that a crash leaves the old file or the new, never less."""
  tmp = os.path.join(index_dir, tmp_name)
  with open(tmp, "w") as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, os.path.join(index_dir, name))
  _fsync_dir(index_dir)


def _write_latest(index_dir: str, name: str) -> None:
  _write_atomically(index_dir, LATEST_NAME, name + "\n", f".{LATEST_NAME}.tmp-{os.getpid()}")


def _write_counter(index_dir: str, number: int) -> None:
  _write_atomically(index_dir, PUBLICATION_NAME, f"{int(number)}\n",
                    f"{TMP_PREFIX}{PUBLICATION_NAME.lower()}-{os.getpid()}")


def _fsync_dir(path: str) -> None:
  try:
    fd = os.open(path, os.O_RDONLY)
  except OSError:
    return
  try:
    os.fsync(fd)
  except OSError:
    pass
  finally:
    os.close(fd)


def _remove_dir(index_dir: str, name: str) -> None:
  """Renames ``name`` away first, so that nobody sees a half-deleted index, then deletes it."""
  doomed = os.path.join(index_dir, f"{TMP_PREFIX}delete-{name}-{os.getpid()}")
  try:
    os.rename(os.path.join(index_dir, name), doomed)
  except FileNotFoundError:
    return
  shutil.rmtree(doomed, ignore_errors=True)


def prune(index_dir: str, keep: int) -> List[str]:
  """Deletes all but the newest ``keep`` publications (by publication number; never the one
  ``LATEST`` names); returns the names deleted."""
  if keep < 1:
    raise ValueError(f"keep must be at least 1, got {keep}")
  current = read_latest(index_dir)
  current = None if current is None else os.path.basename(current)
  names = [name for _, name in publications(index_dir)]
  doomed = [n for n in names[:-keep] if n != current] if len(names) > keep else []
  for name in doomed:
    _remove_dir(index_dir, name)
  return doomed


def testonly_crash_point(phase: str) -> None:
  """Kills this process with SIGKILL when ``$REALM_TF_TESTONLY_CRASH_AT`` is ``phase`` (tests
  only: a crash exactly there, with no cleanup of any kind)."""
  if os.environ.get(TESTONLY_CRASH_ENV) == phase:
    os.kill(os.getpid(), signal.SIGKILL)


def _testonly_build_delay() -> None:
  """Sleeps ``$REALM_TF_TESTONLY_BUILD_DELAY`` seconds if that is set (tests only)."""
  seconds = float(os.environ.get(TESTONLY_BUILD_DELAY_ENV) or 0)
  if seconds > 0:
    time.sleep(seconds)


def _link_tree(src: str, dst: str) -> None:
  """``dst`` as a copy of the directory ``src`` made of hard links (a copy where linking
  fails): published files are never modified, so sharing them is safe."""
  for root, _, files in os.walk(src):
    target = os.path.join(dst, os.path.relpath(root, src))
    os.makedirs(target, exist_ok=True)
    for name in files:
      try:
        os.link(os.path.join(root, name), os.path.join(target, name))
      except OSError:
        shutil.copy2(os.path.join(root, name), os.path.join(target, name))


def publish(index: mips_index.MipsIndex,
            index_dir: str,
            step: int,
            metadata: Optional[Dict] = None,
            query_embedder: Optional[tf.Module] = None,
            keep: int = 3,
            update: int = 0,
            query_embedder_from: Optional[str] = None) -> str:
  """Writes ``index`` as ``index_dir/step-<step>[-u<update>]`` with the next publication number
  and points ``LATEST`` at it (unless ``LATEST`` names an index of a later step). The caller
  holds ``lock(index_dir)``.

  Args:
    index: the built index.
    index_dir: the index directory (created if needed).
    step: the model step the index was built from.
    metadata: more manifest entries (``corpus_fingerprint``, recall, timings, ...).
    query_embedder: the query tower to snapshot next to the index (optional).
    keep: how many indexes to keep.
    update: 0 for a build; k for the k-th update on top of the build of ``step``.
    query_embedder_from: a published directory whose query-tower snapshot the new one shares
      (hard links; an update keeps its build's tower).

  Returns:
    The published directory.
  """
  os.makedirs(index_dir, exist_ok=True)
  name = index_name(step, update)
  tmp = os.path.join(index_dir, f"{TMP_PREFIX}{name}-{os.getpid()}")
  if os.path.exists(tmp):
    shutil.rmtree(tmp)
  os.makedirs(tmp)
  metadata = dict(metadata or {})
  metadata["model_step"] = int(step)
  metadata["update"] = int(update)
  number = next_publication(index_dir)
  metadata["publication"] = number
  metadata["published_unix_time"] = time.time()
  if query_embedder is not None:
    tf.train.Checkpoint(query_embedder=query_embedder).write(os.path.join(tmp, QUERY_CHECKPOINT))
    metadata["query_embedder_checkpoint"] = QUERY_CHECKPOINT
  elif query_embedder_from and os.path.isdir(os.path.dirname(
      os.path.join(query_embedder_from, QUERY_CHECKPOINT))):
    _link_tree(os.path.dirname(os.path.join(query_embedder_from, QUERY_CHECKPOINT)),
               os.path.dirname(os.path.join(tmp, QUERY_CHECKPOINT)))
    metadata["query_embedder_checkpoint"] = QUERY_CHECKPOINT
  _testonly_build_delay()
  index.save(tmp, metadata)
  _fsync_dir(tmp)
  final = os.path.join(index_dir, name)
  if os.path.exists(final):  # A rebuild of the same step replaces the old copy.
    _remove_dir(index_dir, name)
  os.rename(tmp, final)
  _fsync_dir(index_dir)
  testonly_crash_point("index_write")  # Written whole, not yet published.
  _write_counter(index_dir, number)
  current = latest_step(index_dir)
  if current is None or int(step) >= current:
    _write_latest(index_dir, name)
  prune(index_dir, keep)
  return final


def index_behind_corpus(index_dir: str) -> Optional[Dict]:
  """When the index ``LATEST`` names covers an older version of its corpus than the current
  one: ``{"index", "blocks_dir", "index_version", "corpus_version", "block_tower"}``; else
  (no index, the corpus's version, another corpus: the loaders' own errors) None. Reads only
  manifests."""
  path = read_latest(index_dir)
  if path is None:
    return None
  manifest = mips_index.read_manifest(path)
  blocks_dir = manifest.get("blocks_dir")
  if not blocks_dir or "://" in blocks_dir or not os.path.isdir(blocks_dir):
    return None
  corpus = manifests.load_blocks_manifest(blocks_dir)
  known = corpus_updates.fingerprints(corpus)
  found = manifest.get("corpus_fingerprint")
  if found == corpus["fingerprint"] or found not in known:
    return None
  return {"index": path, "blocks_dir": blocks_dir, "index_version": known.index(found),
          "corpus_version": corpus_updates.version(corpus),
          "block_tower": bool(manifest.get("block_tower"))}
