"""The index directory contract: ``index_dir/step-<N>/``, ``index_dir/LATEST``.

::

    index_dir/
      LATEST                  "step-1200\n", replaced atomically (temp file + os.replace)
      step-1000/              a complete index, never modified after its rename
      step-1200/
        manifest.json         written last: model_step, num_blocks, dim, corpus_fingerprint,
                              index_type, settings, build time, recall, query checkpoint
        embeddings.npy        float32 [num_blocks, dim], row = block_id
        scann/                ScaNN artifacts (serialized with relative paths)
        query_embedder/ckpt*  the query tower the index was built with:
                              model_dir.restore(path, query_embedder=...)
      .tmp-step-1400-<pid>/   a build in progress (removed on restart, never loaded)
      tensorboard/            the refresher's summaries

A build is written under ``.tmp-step-<N>-<pid>``, renamed to ``step-<N>`` and only then is
``LATEST`` moved, so a reader that follows ``LATEST`` never sees a half-written index. Old
indexes are renamed to a temporary name before being deleted, for the same reason. Paths must
be on a local (POSIX) filesystem, where ``rename`` is atomic.
"""

import os
import re
import shutil
import time
from typing import Dict, List, Optional

from absl import logging
import tensorflow as tf

from realm_tf.retrieval import mips_index

LATEST_NAME = "LATEST"
STEP_PREFIX = "step-"
TMP_PREFIX = ".tmp-"
QUERY_CHECKPOINT = os.path.join("query_embedder", "ckpt")
_STEP_RE = re.compile(r"^step-(\d+)$")
_TMP_PID_RE = re.compile(r"^\.tmp-.*-(\d+)$")
# Test only: seconds to sleep half-way through writing each index (after the query tower,
# before the index and its manifest), so that a test can kill a build in the middle. Read in
# _testonly_build_delay(), nowhere else; production never sets it.
TESTONLY_BUILD_DELAY_ENV = "REALM_TF_TESTONLY_BUILD_DELAY"


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


def latest_step(index_dir: str) -> Optional[int]:
  """The model step of the index ``LATEST`` names, or None."""
  path = read_latest(index_dir)
  return None if path is None else int(_STEP_RE.match(os.path.basename(path)).group(1))


def published_steps(index_dir: str) -> List[int]:
  """Steps of the complete ``step-<N>`` directories, ascending."""
  if not os.path.isdir(index_dir):
    return []
  steps = []
  for name in os.listdir(index_dir):
    m = _STEP_RE.match(name)
    if m and os.path.exists(os.path.join(index_dir, name, mips_index.MANIFEST_NAME)):
      steps.append(int(m.group(1)))
  return sorted(steps)


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


def _write_latest(index_dir: str, name: str) -> None:
  tmp = os.path.join(index_dir, f".{LATEST_NAME}.tmp-{os.getpid()}")
  with open(tmp, "w") as f:
    f.write(name + "\n")
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, os.path.join(index_dir, LATEST_NAME))
  _fsync_dir(index_dir)


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


def prune(index_dir: str, keep: int) -> List[int]:
  """Deletes all but the newest ``keep`` indexes (never the one ``LATEST`` names)."""
  if keep < 1:
    raise ValueError(f"keep must be at least 1, got {keep}")
  current = latest_step(index_dir)
  steps = published_steps(index_dir)
  doomed = [s for s in steps[:-keep] if s != current] if len(steps) > keep else []
  for step in doomed:
    _remove_dir(index_dir, f"{STEP_PREFIX}{step}")
  return doomed


def _testonly_build_delay() -> None:
  """Sleeps ``$REALM_TF_TESTONLY_BUILD_DELAY`` seconds if that is set (tests only)."""
  seconds = float(os.environ.get(TESTONLY_BUILD_DELAY_ENV) or 0)
  if seconds > 0:
    time.sleep(seconds)


def publish(index: mips_index.MipsIndex,
            index_dir: str,
            step: int,
            metadata: Optional[Dict] = None,
            query_embedder: Optional[tf.Module] = None,
            keep: int = 3) -> str:
  """Writes ``index`` as ``index_dir/step-<step>`` and points ``LATEST`` at it.

  Args:
    index: the built index.
    index_dir: the index directory (created if needed).
    step: the model step the index was built from.
    metadata: more manifest entries (``corpus_fingerprint``, recall, timings, ...).
    query_embedder: the query tower to snapshot next to the index (optional).
    keep: how many indexes to keep.

  Returns:
    The published directory.
  """
  os.makedirs(index_dir, exist_ok=True)
  name = f"{STEP_PREFIX}{int(step)}"
  tmp = os.path.join(index_dir, f"{TMP_PREFIX}{name}-{os.getpid()}")
  if os.path.exists(tmp):
    shutil.rmtree(tmp)
  os.makedirs(tmp)
  metadata = dict(metadata or {})
  metadata["model_step"] = int(step)
  metadata["published_unix_time"] = time.time()
  if query_embedder is not None:
    tf.train.Checkpoint(query_embedder=query_embedder).write(os.path.join(tmp, QUERY_CHECKPOINT))
    metadata["query_embedder_checkpoint"] = QUERY_CHECKPOINT
  _testonly_build_delay()
  index.save(tmp, metadata)
  _fsync_dir(tmp)
  final = os.path.join(index_dir, name)
  if os.path.exists(final):  # A rebuild of the same step replaces the old copy.
    _remove_dir(index_dir, name)
  os.rename(tmp, final)
  _fsync_dir(index_dir)
  current = latest_step(index_dir)
  if current is None or int(step) >= current:
    _write_latest(index_dir, name)
  prune(index_dir, keep)
  return final
