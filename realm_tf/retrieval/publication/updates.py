r"""Documents added to and removed from a corpus and its index, without re-embedding the corpus.

    realm-index upsert --index_dir=idx --model_dir=runs/realm --input=docs.jsonl
    realm-index upsert --index_dir=idx --model_dir=runs/realm --new_blocks_dir=more/blocks
    realm-index delete --index_dir=idx --model_dir=runs/realm --uid=<hex> --title="Paris"

In Python (``realm-serve``'s ``POST /documents`` and ``DELETE /documents/{uid}`` call this)::

    updater = Updater("idx")            # the model dir and checkpoint the index records
    result = updater.upsert([Document("Paris", "Paris is the capital of France.")])
    updater.delete(uids=[result.added[0]["uid"]])

**The commit point of an update is the publication of its index** (``LATEST`` moving to it).
Invariant: the corpus (the blocks directory's current version) is never behind the index
``LATEST`` names, and may be ahead of it only by updates whose publication a crash cut short;
every writer rolls such an index forward to its corpus before it does anything else, so a
document counts as added or deleted only once an index that serves it is published. An update
holds the index directory's lock, then the blocks directory's, and

1. **rolls forward**: when the index ``LATEST`` names covers an older corpus version than the
   corpus's current one (an update killed after writing the corpus), brings it up to the
   corpus (steps 4-5 below) and publishes that first (:meth:`Updater.reconcile` does only
   this; ``realm-serve`` and ``realm-refresh`` run it at start-up, ``realm-index reconcile``
   on demand);
2. plans against the corpus, which the published index now covers: a document becomes blocks
   by the blocks pipeline's rules (``realm_tf.data.articles``; the corpus's vocabulary and block
   length); ready blocks (``--new_blocks_dir``) are refused unless their manifest names the
   corpus's vocabulary, casing and block length (their token ids are used as they are); a
   document whose title has live blocks replaces them (they are deleted), unless it is
   unchanged (the same uids: skipped, and served, since the published index covers the
   corpus); deletions name uids or titles of live blocks (another is an error). When nothing is
   left to add or delete, nothing more is written: the result names the index ``LATEST`` names;
3. writes the corpus's next version (``data.corpus_updates.apply``);
4. loads the index ``LATEST`` names and restores the block tower it records (``block_tower``:
   checkpoint, step, fingerprint). An update with another checkpoint is refused, so that one
   index never mixes the embeddings of two towers;
5. brings the index up to the corpus (``Refresher.catch_up``): only the rows it lacks are
   embedded; rows deleted in the corpus are deleted; ScaNN rebalances or rebuilds when its
   health says so (``scann_index``);
6. publishes the result as ``step-<N>-u<k>``, a new directory; ``LATEST`` moves last.

Killed at any point (``CRASH_PHASES``; tests/test_update_crashes.py kills a process at each),
the previous index stays published, untouched and loadable, and the next writer rolls it
forward: a retried upsert finds its document answerable, a retried delete finds it gone.
Temporary directories (``.tmp-*``) are never loaded and are removed by the next writer.
"""

import dataclasses
import functools
import os
import time
from typing import Dict, List, Optional, Sequence

from absl import logging

from realm_tf import configs
from realm_tf import model_dir as model_dir_lib
from realm_tf import tokenization
from realm_tf.data import articles
from realm_tf.data import block_store
from realm_tf.data import corpus_updates
from realm_tf.data import features
from realm_tf.data import manifests
from realm_tf.retrieval import errors
from realm_tf.retrieval.index import mips_index
from realm_tf.retrieval.publication import index_io
from realm_tf.retrieval.publication import publish
from realm_tf.retrieval.publication import refresher

# Manifest entries of a build that describe its index, not the update made on top of it.
_PER_INDEX = ("format", "index_type", "num_blocks", "num_deleted", "dim", "settings",
              "model_step", "update", "published_unix_time", "query_embedder_checkpoint",
              "corpus_fingerprint", "corpus_fingerprints", "corpus_version", "last_update",
              "caught_up")


# Where a test may crash an update (``publish.testonly_crash_point``): after its plan, after the
# corpus write, after embedding, after the index is written (before ``LATEST`` moves), after
# the publication; ``realm-serve`` adds "swap" (published, not yet swapped in).
CRASH_PHASES = ("plan", "corpus", "embedding", "index_write", "publish", "swap")


@dataclasses.dataclass
class Document:
  """A document to index: its blocks are cut from ``text`` under ``title``."""
  title: str
  text: str


@dataclasses.dataclass
class UpdateResult:
  """What an update did.

  Attributes:
    index: the published index directory (``step-<N>-u<k>``).
    corpus_fingerprint: the corpus version it covers.
    added: ``{"row", "uid", "title"}`` of each block appended.
    deleted: ``{"row", "uid", "title"}`` of each block deleted.
    skipped: titles of documents that were already indexed unchanged.
    maintenance: ``"rebalance"``, ``"rebuild"`` or None (``ScannIndex.maintenance``).
    seconds: time spent planning (a roll-forward included), writing the corpus, embedding,
      updating and publishing the index, and in all.
  """
  index: str
  corpus_fingerprint: str
  added: List[Dict]
  deleted: List[Dict]
  skipped: List[str]
  maintenance: Optional[str]
  seconds: Dict[str, float]

  def to_json(self) -> Dict:
    return dataclasses.asdict(self)


def read_documents(path: str) -> List[Document]:
  """The ``{"title", "text"}`` lines of a JSON-lines file (``data_prep.blocks``' input format);
  a line that is not one is an error naming it."""
  if not os.path.exists(path):
    raise manifests.MissingDataError(f"documents file not found: {path}")
  documents = []
  with open(path, "rb") as f:
    for number, raw in enumerate(f, 1):
      article, reason = articles.parse_jsonl_article(path, number, raw)
      if article is not None:
        documents.append(Document(article["title"], article["text"]))
      elif reason != "blank_line":
        raise manifests.CorpusFormatError(reason)
  if not documents:
    raise manifests.EmptyCorpusError(f"{path} holds no documents")
  return documents


def _block(title: str, body: str, token_ids) -> Dict:
  return {"uid": features.block_uid(title, body), "title": title, "body": body,
          "token_ids": [int(t) for t in token_ids]}


class Updater:
  """Applies upserts and deletions to the index in ``index_dir`` and its corpus.

  Args:
    index_dir: the index directory (its ``LATEST`` names the index to update; its manifest
      names the blocks directory).
    model_dir: the model directory the index was built from (default: the one it records).
    checkpoint: the checkpoint to embed with (default: ``model_dir``'s newest when
      ``model_dir`` is given, else the one the index records); it must be the index's own.
    keep: indexes kept in ``index_dir``.
    progress: show progress bars while embedding.
  """

  def __init__(self, index_dir: str, model_dir: Optional[str] = None,
               checkpoint: Optional[str] = None, keep: int = 3, progress: bool = False):
    self.index_dir = index_dir
    self.model_dir = model_dir
    self.checkpoint = checkpoint
    self.keep = keep
    self.progress = progress
    self._refresher: Optional[refresher.Refresher] = None

  # ---- the two operations ----
  def upsert(self, documents: Sequence[Document] = (), blocks: Sequence[Dict] = (),
             blocks_dir: Optional[str] = None) -> UpdateResult:
    """Adds or replaces ``documents``, ready ``blocks`` (dicts with ``title``, ``body``,
    ``token_ids``, made with the corpus's vocabulary, casing and block length: the caller's
    word) and/or the blocks of ``blocks_dir`` (a ``data_prep.blocks`` output, refused unless
    its manifest names the corpus's vocabulary, casing and block length); a title's blocks
    replace its live ones."""
    new_manifest = None
    if blocks_dir:
      new_manifest = manifests.load_blocks_manifest(blocks_dir)
      blocks = list(blocks) + manifests.read_blocks(blocks_dir)
    if not documents and not blocks:
      raise errors.IndexUpdateError("nothing to upsert: give documents or blocks")
    for d in documents:
      if not isinstance(d.title, str) or not isinstance(d.text, str):
        raise errors.IndexUpdateError(f"a document needs a string title and text, got {d!r}")

    def plan(store, corpus, config):
      if new_manifest is not None:
        _check_new_blocks(blocks_dir, new_manifest, corpus, config)
      by_title: Dict[str, List[Dict]] = {}
      for title, blocks_of in _document_blocks(documents, corpus, config).items():
        by_title.setdefault(title, []).extend(blocks_of)
      for b in blocks:
        by_title.setdefault(b["title"], []).append(_block(b["title"], b["body"],
                                                          b["token_ids"]))
      added, deleted, skipped = [], [], []
      for (title, new), old in zip(by_title.items(), store.rows_with_titles(list(by_title))):
        if [store.uid_digest(r) for r in old] == [block_store.uid_digest(b["uid"])
                                                   for b in new]:
          skipped.append(title)
          continue
        added.extend(new)
        deleted.extend(int(r) for r in old)
      return added, deleted, skipped
    return self._update(plan)

  def delete(self, uids: Sequence[str] = (), titles: Sequence[str] = ()) -> UpdateResult:
    """Deletes the live blocks with these uids and every live block of these titles."""
    if not uids and not titles:
      raise errors.IndexUpdateError("nothing to delete: give uids or titles")

    def plan(store, unused_corpus, unused_config):
      rows = []
      for what, found in [(f"uid {u}", store.rows_with_uid(u)) for u in uids] + [
          (f"title {t!r}", store.rows_with_title(t)) for t in titles]:
        if not len(found):
          raise errors.IndexUpdateError(f"no live block of the corpus has the {what}")
        rows.extend(int(r) for r in found)
      return [], sorted(set(rows)), []
    return self._update(plan)

  # ---- the steps ----
  def _latest(self):
    path = publish.read_latest(self.index_dir)
    if path is None:
      raise errors.IndexNotReadyError(f"no index in {self.index_dir} (no LATEST): build one "
                                      "first (realm-index build)")
    return path, mips_index.read_manifest(path)

  def _model_dir(self) -> str:
    return self.model_dir or self._latest()[1]["model_dir"]

  def _tower(self, path: str, manifest: Dict) -> refresher.Refresher:
    """The refresher holding the index's own block tower, restored and checked."""
    recorded = manifest.get("block_tower")
    if not recorded:
      raise errors.IndexUpdateError(
          f"index {path} records no block tower (built from precomputed embeddings, or "
          "before updates existed): there is nothing to embed new blocks with; rebuild it "
          "with realm-index build")
    if self.checkpoint:
      checkpoint = refresher.find_checkpoint(self._model_dir(), self.checkpoint)
    elif self.model_dir:
      checkpoint = refresher.find_checkpoint(self.model_dir)
    else:
      checkpoint = refresher.find_checkpoint(manifest["model_dir"], recorded["checkpoint"])
    step = model_dir_lib.checkpoint_step(checkpoint)
    mismatch = ("" if step == recorded["step"] else
                f"checkpoint {checkpoint} is of step {step}, ")
    cached = self._refresher
    if not mismatch and not (cached and cached.block_tower and
                             cached.block_tower["checkpoint"] == os.path.abspath(checkpoint)):
      options = refresher.BuildOptions.from_config(
          _index_config(manifest), keep=self.keep, tensorboard_dir="", progress=self.progress)
      cached = refresher.Refresher(self._model_dir(), manifest["blocks_dir"], self.index_dir,
                                   options)
      cached.restore_block_tower(checkpoint)
    if not mismatch and cached.block_tower["fingerprint"] != recorded["fingerprint"]:
      mismatch = (f"checkpoint {checkpoint} holds other weights (fingerprint "
                  f"{cached.block_tower['fingerprint'][:12]}), ")
    if mismatch:
      raise errors.IndexUpdateError(
          f"the index {path} was embedded with the block tower of {recorded['checkpoint']} "
          f"(step {recorded['step']}, fingerprint {recorded['fingerprint'][:12]}); {mismatch}"
          "and one index never mixes two towers: update with "
          f"--checkpoint={recorded['checkpoint']}, or rebuild the index (realm-index build)")
    self._refresher = cached
    return cached

  def reconcile(self) -> Optional[Dict]:
    """Rolls the index ``LATEST`` names forward to its corpus when it covers an older version
    (an update cut short after writing the corpus): embeds what it lacks, deletes what the
    corpus deleted and publishes the result. Returns ``{"index", "from", "appended",
    "deleted", "corpus_version"}``, or None when the index already covers the corpus."""
    with publish.lock(self.index_dir):
      publish.clean_temporaries(self.index_dir)
      path, manifest = self._latest()
      blocks_dir = manifest["blocks_dir"]
      with corpus_updates.lock(blocks_dir):
        corpus = manifests.load_blocks_manifest(blocks_dir)
        if not self._behind(path, manifest, corpus):
          return None
        published, changes = self._roll_forward(self._tower(path, manifest), path, manifest,
                                                corpus)
    return dict(index=published, corpus_version=corpus_updates.version(corpus),
                **{"from": path, "appended": changes["appended"],
                   "deleted": changes["deleted"]})

  @staticmethod
  def _behind(path: str, manifest: Dict, corpus: Dict) -> bool:
    """Whether the index (``path``, ``manifest``) covers an older version than ``corpus``'s
    current one; an index over another corpus is an error."""
    if manifest.get("corpus_fingerprint") not in corpus_updates.fingerprints(corpus):
      raise errors.FingerprintMismatchError(
          f"the index {path} was built over another corpus than {manifest['blocks_dir']}")
    return manifest.get("corpus_fingerprint") != corpus["fingerprint"]

  def _roll_forward(self, tower, path: str, manifest: Dict, corpus: Dict):
    """Publishes the index ``path`` brought up to ``corpus``; (published dir, changes)."""
    published, changes = self._catch_up_and_publish(tower, path, manifest, corpus)
    logging.warning("realm-index: %s covered corpus version %s of %s, behind the corpus "
                    "(an update was cut short): rolled forward to version %d as %s (%d blocks "
                    "appended, %d deleted)", os.path.basename(path),
                    manifest.get("corpus_version", "?"), manifest["blocks_dir"],
                    corpus_updates.version(corpus), os.path.basename(published),
                    changes["appended"], changes["deleted"])
    return published, changes

  def _catch_up_and_publish(self, tower, path: str, manifest: Dict, corpus: Dict):
    index = index_io.load_index(path, load_embeddings=True)
    index, corpus, changes = tower.catch_up(index, corpus)
    publish.testonly_crash_point("embedding")
    metadata = {k: v for k, v in manifest.items() if k not in _PER_INDEX}
    metadata.update(refresher.corpus_metadata(corpus))
    metadata["last_update"] = {"from": os.path.basename(path), "appended": changes["appended"],
                               "deleted": changes["deleted"],
                               "maintenance": changes["maintenance"]}
    step = int(manifest["model_step"])
    published = publish.publish(index, self.index_dir, step, metadata, keep=self.keep,
                                update=publish.next_update(self.index_dir, step),
                                query_embedder_from=path)
    publish.testonly_crash_point("publish")
    return published, changes

  def _update(self, plan) -> UpdateResult:
    start = time.time()
    with publish.lock(self.index_dir):
      publish.clean_temporaries(self.index_dir)  # A killed update's, say.
      path, manifest = self._latest()
      tower = self._tower(path, manifest)
      blocks_dir = manifest["blocks_dir"]
      with corpus_updates.lock(blocks_dir):
        corpus = manifests.load_blocks_manifest(blocks_dir)
        if self._behind(path, manifest, corpus):  # The commit point first.
          path, _ = self._roll_forward(tower, path, manifest, corpus)
          manifest = mips_index.read_manifest(path)
        store = block_store.BlockStore.open(blocks_dir)
        added, deleted, skipped = plan(store, corpus, tower.config)
        planned = time.time()
        if not added and not deleted:  # Every document unchanged and served: nothing to do.
          return UpdateResult(
              index=path, corpus_fingerprint=corpus["fingerprint"], added=[], deleted=[],
              skipped=skipped, maintenance=None,
              seconds={"plan": round(planned - start, 3), "total": round(planned - start, 3)})
        publish.testonly_crash_point("plan")
        corpus = corpus_updates.apply(blocks_dir, added, deleted)
        publish.testonly_crash_point("corpus")
        deleted_blocks = [{"row": r, "uid": features.block_uid(store.titles[r], store.texts[r]),
                           "title": store.titles[r]} for r in deleted]
      written = time.time()
      published, changes = self._catch_up_and_publish(tower, path, manifest, corpus)
      first = int(corpus["num_blocks"]) - len(added)
    seconds = {"plan": planned - start, "corpus": written - planned,
               "index and publish": time.time() - written, "total": time.time() - start}
    return UpdateResult(
        index=published, corpus_fingerprint=corpus["fingerprint"],
        added=[{"row": first + i, "uid": b["uid"], "title": b["title"]}
               for i, b in enumerate(added)],
        deleted=deleted_blocks, skipped=skipped, maintenance=changes["maintenance"],
        seconds={k: round(v, 3) for k, v in seconds.items()})


def reconcile_if_behind(index_dir: str, keep: int = 3) -> Optional[Dict]:
  """At a reader's start-up (``realm-serve``): rolls the index forward to its corpus when an
  update was cut short (:meth:`Updater.reconcile`; what it did, or None when nothing was
  behind). An index that records no block tower cannot embed what it lacks: refused with the
  command that rebuilds it."""
  behind = publish.index_behind_corpus(index_dir)
  if behind is None:
    return None
  if not behind["block_tower"]:
    raise errors.IndexNotReadyError(
        f"{behind['index']} covers version {behind['index_version']} of the corpus "
        f"{behind['blocks_dir']}, which is at version {behind['corpus_version']} (an update was "
        "cut short), and records no block tower to embed the missing blocks with: rebuild it, "
        f"realm-index build --blocks_dir={behind['blocks_dir']} --index_dir={index_dir} "
        "--model_dir=<the model it was built from>")
  return Updater(index_dir, keep=keep).reconcile()


@functools.lru_cache(maxsize=4)
def _tokenizer(vocab_file: str, lower_case: bool) -> tokenization.RealmTokenizer:
  return tokenization.RealmTokenizer(vocab_file, lower_case=lower_case)


def _document_blocks(documents: Sequence[Document], corpus: Dict,
                     config: configs.RealmModelConfig) -> Dict[str, List[Dict]]:
  """Each document's blocks by ``data_prep.blocks``' rules, with the corpus's vocabulary,
  casing and block length (the model's where the corpus does not name them)."""
  if not documents:
    return {}
  vocab = _corpus_vocab(corpus, config)
  tokenizer = _tokenizer(vocab, bool(corpus.get("lower_case", config.lower_case)))
  length = int(corpus.get("block_seq_length") or config.retriever.block_seq_length)
  try:  # Two tokenizer calls for all the documents.
    cut = articles.articles_to_blocks([(d.title, d.text) for d in documents], tokenizer,
                                      length)
  except ValueError as e:
    raise errors.IndexUpdateError(f"a document cannot be indexed: {e}") from None
  out = {}
  for d, blocks_of in zip(documents, cut):
    if not blocks_of:
      raise errors.IndexUpdateError(f"document {d.title!r} has no text to index")
    out.setdefault(d.title, []).extend(_block(d.title, b["body"], b["token_ids"])
                                       for b in blocks_of)
  return out


def _corpus_vocab(corpus: Dict, config: configs.RealmModelConfig) -> str:
  """The vocabulary the corpus's token ids were made with (the model's where the corpus does
  not name an existing file)."""
  vocab = corpus.get("vocab_file")
  return vocab if vocab and os.path.exists(vocab) else config.vocab_file


def _check_new_blocks(blocks_dir: str, new: Dict, corpus: Dict,
                      config: configs.RealmModelConfig) -> None:
  """Refuses the blocks of ``blocks_dir`` (manifest ``new``) unless they were made with the
  corpus's vocabulary, casing and block length: their token ids are indexed as they are."""
  vocab = _corpus_vocab(corpus, config)
  want = {"vocab_sha1": corpus.get("vocab_sha1") or manifests.file_sha1(vocab),
          "lower_case": bool(corpus.get("lower_case", config.lower_case)),
          "block_seq_length": int(corpus.get("block_seq_length") or
                                  config.retriever.block_seq_length)}
  got = {"vocab_sha1": new.get("vocab_sha1"), "lower_case": new.get("lower_case"),
         "block_seq_length": new.get("block_seq_length")}
  wrong = [k for k in want if got[k] is None or
           (bool(got[k]) if k == "lower_case" else got[k]) != want[k]]
  if not wrong:
    return
  describe = lambda d, f: (f"vocabulary {f} (sha1 {str(d['vocab_sha1'])[:12]}), lower_case="
                           f"{d['lower_case']}, block_seq_length={d['block_seq_length']}")
  raise errors.IndexUpdateError(
      f"{blocks_dir}: its blocks were made with {describe(got, new.get('vocab_file'))} but the "
      f"corpus's with {describe(want, vocab)} (differs: {', '.join(wrong)}); their token ids "
      f"would not mean the same words: write them again with data_prep.blocks "
      f"--vocab_file={vocab} --{'' if want['lower_case'] else 'no'}lower_case "
      f"--block_seq_length={want['block_seq_length']}, or upsert the documents (--input)")


def _index_config(manifest: Dict) -> configs.IndexConfig:
  """The ``IndexConfig`` an index was built with (its manifest's; defaults for an index
  built before it was recorded)."""
  config = configs.IndexConfig()
  if manifest.get("index_config"):
    config.override(manifest["index_config"], is_strict=False)
  return config
