"""Versions of a blocks directory: blocks appended and deleted, addressed by uid, rows kept.

The blocks pipeline writes version 0 (``manifests``' format). Each update (``realm-index
upsert|delete``, ``realm-serve``'s ``/documents``) writes a new version::

  blocks_dir/
    blocks-*.tfrecord, manifest.json   version 0's shards; the manifest is replaced (atomically)
                                       by each update's
    updates/update-000001.tfrecord     the blocks update 1 appended (block ids continue after
                                       version 0's), in ``manifests``' tf.Example format;
                                       written before the manifest names it, never modified

and the manifest gains::

  num_blocks    every row: version 0's and the appended ones, deleted rows included
  fingerprint   this version's: SHA1 over the previous version's fingerprint, "\\n", then
                "+<uid>\\n" per appended block and "-<row>\\n" per deleted row
  base          {"num_blocks", "fingerprint"} of version 0
  updates       [{"version", "file", "first_block_id", "num_added", "deleted": [rows],
                  "fingerprint", "unix_time"}, ...], one per update, in order
  num_deleted   the rows deleted by all of them

Rows never move or get reused: a row's block id means the same block in every version, so an
index or a store of an older version stays valid for its rows (:func:`fingerprints` lists the
versions, oldest first; ``mips_index.check_manifest`` accepts an index over any of them). A
deleted row keeps its data; readers leave it out (the index never returns it, the block store
lists it in ``deleted``). A changed document is its old blocks deleted and its new ones
appended. The stages derived from the blocks (salient spans, masked examples, ICT) read
version 0's shards only.
"""

import contextlib
import fcntl
import hashlib
import json
import os
import time
from typing import Dict, Iterable, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from realm_tf.data import features
from realm_tf.data import manifests

UPDATES_DIR = "updates"


def updates(manifest: Dict) -> List[Dict]:
  """The updates a blocks manifest lists, oldest first (none for the pipeline's output)."""
  return list(manifest.get("updates", ()))


def version(manifest: Dict) -> int:
  return len(updates(manifest))


def base_manifest(manifest: Dict) -> Dict:
  """Version 0's manifest, as the blocks pipeline wrote it (what the block store is keyed on)."""
  if not updates(manifest):
    return dict(manifest)
  out = {k: v for k, v in manifest.items() if k not in ("updates", "base", "num_deleted")}
  out.update(manifest["base"])
  return out


def fingerprints(manifest: Dict) -> List[str]:
  """The fingerprints of every version up to this manifest's, oldest first."""
  done = updates(manifest)
  if not done:
    return [manifest["fingerprint"]]
  return [manifest["base"]["fingerprint"]] + [u["fingerprint"] for u in done]


def manifest_at(manifest: Dict, fingerprint: str) -> Dict:
  """The manifest of the version whose fingerprint is ``fingerprint`` (this one or older)."""
  known = fingerprints(manifest)
  if fingerprint not in known:
    raise manifests.CorpusFormatError(
        f"the corpus has no version with fingerprint {fingerprint} (versions: "
        f"{', '.join(f[:12] for f in known)}): another corpus")
  v = known.index(fingerprint)
  if v == len(known) - 1:
    return dict(manifest)
  if v == 0:
    return base_manifest(manifest)
  kept = updates(manifest)[:v]
  out = dict(manifest, updates=kept, fingerprint=fingerprint,
             num_blocks=kept[-1]["first_block_id"] + kept[-1]["num_added"])
  out["num_deleted"] = sum(len(u["deleted"]) for u in kept)
  return out


def deleted_rows(manifest: Dict) -> np.ndarray:
  """Sorted int64 rows deleted up to this manifest's version."""
  rows = [r for u in updates(manifest) for r in u["deleted"]]
  return np.unique(np.asarray(rows, np.int64))


def update_files(blocks_dir: str, manifest: Dict, first_version: int = 1) -> List[str]:
  """The appended blocks' files of versions ``first_version ..`` of this manifest."""
  return [os.path.join(blocks_dir, u["file"]) for u in updates(manifest)
          if u["version"] >= first_version]


def corpus_files(blocks_dir: str, manifest: Dict) -> List[str]:
  """Every TFRecord file of this version: version 0's shards, then the updates' files."""
  base = manifests.block_shard_files(blocks_dir, base_manifest(manifest))
  return base + update_files(blocks_dir, manifest)


def chain_fingerprint(previous: str, added_uids: Iterable, deleted: Iterable[int]) -> str:
  """The fingerprint of a version from its predecessor's and its changes (module doc)."""
  h = hashlib.sha1(previous.encode("ascii") + b"\n")
  for uid in added_uids:
    h.update(b"+" + (uid if isinstance(uid, bytes) else uid.encode("ascii")) + b"\n")
  for row in deleted:
    h.update(f"-{int(row)}\n".encode("ascii"))
  return h.hexdigest()


def check_appended(manifest: Dict, uids, first_version: int = 1, where: str = "") -> None:
  """Checks the blocks that versions ``first_version ..`` (from 1) appended against those
  versions' fingerprints (:func:`chain_fingerprint`). ``uids[a:b]`` gives the uids (bytes or
  str) of the appended rows ``a .. b - 1``, counted from the first row of version
  ``first_version``. Raises ``CorpusFormatError`` (naming ``where``) on a mismatch."""
  if first_version < 1:
    raise ValueError(f"versions that append blocks start at 1, not {first_version}")
  done = updates(manifest)[first_version - 1:]
  if not done:
    return
  first_row = done[0]["first_block_id"]
  previous = fingerprints(manifest)[first_version - 1]
  for update in done:
    lo = update["first_block_id"] - first_row
    previous = chain_fingerprint(previous, uids[lo:lo + update["num_added"]], update["deleted"])
    if previous != update["fingerprint"]:
      raise manifests.CorpusFormatError(f"{where}: the blocks of update {update['version']} do "
                                        "not match its fingerprint")


def version_appending(manifest: Dict, row: int) -> Optional[int]:
  """The version whose appended blocks start at row ``row`` (None when none does)."""
  for v, update in enumerate(updates(manifest), 1):
    if update["first_block_id"] == row:
      return v
  return None


LOCK_NAME = ".update.lock"


@contextlib.contextmanager
def lock(blocks_dir: str):
  """Holds the lock of the blocks directory (``file_lock`` of ``blocks_dir/.update.lock``):
  one writer of updates at a time; released on exit or when the process dies."""
  if "://" in blocks_dir:
    raise manifests.DataError(f"{blocks_dir}: updates need a local blocks directory")
  if not os.path.isdir(blocks_dir):
    raise manifests.MissingDataError(f"blocks directory not found: {blocks_dir}")
  with file_lock(os.path.join(blocks_dir, LOCK_NAME)):
    yield


@contextlib.contextmanager
def file_lock(path: str):
  """An exclusive ``flock`` on the file ``path`` (created, with its directory, if needed),
  opened for writing; blocks until it is free, released on exit or when the process dies.

  A file opened for writing, not a directory opened read-only: NFS implements ``flock`` with
  ``fcntl`` byte-range locks, which need a regular file (and a write-locked one).
  """
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX)
    yield
  finally:
    os.close(fd)


def _fsync_dir(path: str) -> None:
  fd = os.open(path, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


def _write_manifest(blocks_dir: str, manifest: Dict) -> None:
  path = os.path.join(blocks_dir, manifests.MANIFEST)
  tmp = f"{path}.tmp-{os.getpid()}"
  with open(tmp, "w") as f:
    json.dump(manifest, f, indent=2)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)
  _fsync_dir(blocks_dir)


def apply(blocks_dir: str, added: Sequence[Dict], deleted: Sequence[int]) -> Dict:
  """Writes a new version: ``added`` blocks (dicts with ``uid``, ``title``, ``body``,
  ``token_ids``) appended as the next rows, live rows ``deleted``. Hold :func:`lock` around
  reading the rows to delete and this call. Returns the new manifest.

  The appended blocks' file is written (and synced) before the manifest that names it; the
  manifest is replaced atomically, so a reader sees the old version or the new one whole.
  """
  manifest = manifests.load_blocks_manifest(blocks_dir)
  n = int(manifest["num_blocks"])
  deleted = sorted({int(r) for r in deleted})
  gone = set(deleted_rows(manifest).tolist())
  bad = [r for r in deleted if not 0 <= r < n or r in gone]
  if bad:
    raise manifests.CorpusFormatError(f"{blocks_dir}: rows {bad[:5]} are not live blocks")
  if not added and not deleted:
    raise ValueError("an update needs blocks to add or rows to delete")
  v = version(manifest) + 1
  name = os.path.join(UPDATES_DIR, f"update-{v:06d}{manifests.TFRECORD_SUFFIX}")
  path = os.path.join(blocks_dir, name)
  os.makedirs(os.path.join(blocks_dir, UPDATES_DIR), exist_ok=True)
  tmp = os.path.join(blocks_dir, UPDATES_DIR, f".tmp-update-{v:06d}-{os.getpid()}")
  with tf.io.TFRecordWriter(tmp) as writer:
    for i, block in enumerate(added):
      writer.write(features.serialize_block(n + i, block["uid"], block["title"], block["body"],
                                            block["token_ids"]))
  with open(tmp, "rb+") as f:
    os.fsync(f.fileno())
  os.replace(tmp, path)
  _fsync_dir(os.path.dirname(path))
  fingerprint = chain_fingerprint(manifest["fingerprint"], (b["uid"] for b in added), deleted)
  out = dict(manifest)
  if not updates(manifest):
    out["base"] = {"num_blocks": n, "fingerprint": manifest["fingerprint"]}
  out["updates"] = updates(manifest) + [{
      "version": v, "file": name, "first_block_id": n, "num_added": len(added),
      "deleted": deleted, "fingerprint": fingerprint, "unix_time": round(time.time(), 3)}]
  out.update(num_blocks=n + len(added), fingerprint=fingerprint,
             num_deleted=int(manifest.get("num_deleted", 0)) + len(deleted))
  _write_manifest(blocks_dir, out)
  return out


