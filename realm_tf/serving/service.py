"""The answering service behind ``realm-serve``: one model, the newest index, live updates.

Threads:

* **the worker** runs the model: it takes up to ``max_batch`` waiting questions at a time,
  retrieves and reads them as one batch and resolves each request's future. Between batches
  it swaps in a newer index if one is ready, so a request never sees the index change half-way
  and never waits for a load.
* **the watcher** polls ``index_dir/LATEST``; when it names a newer publication (a refresh, or
  an update made by another process) it opens it (the index and the corpus version it covers),
  warms it up and hands it to the worker.
* **updates** (``upsert``/``delete``) run on the caller's thread, one at a time (``Updater``);
  the published index is loaded at once and the call returns once the worker has swapped it
  in, so the next question sees it (else :class:`PublishedNotServed`, whose message says the
  update was published).

At start-up, an index ``LATEST`` names that covers an older version of its corpus (an update
cut short by a crash after writing the corpus) is rolled forward to the corpus and published
before anything is served (``updates.reconcile_if_behind``; ``reconciled`` says what it did).

One block tower only: the tower the model was fine-tuned against (:func:`pinned_block_tower`).
The service refuses to start on an index of another (``BlockTowerMismatchError``: a clear error
rather than a wait), never swaps one in, and refuses updates (:class:`Conflict`) while
``LATEST`` names one.

Admission is bounded (``max_in_flight``): beyond it ``submit`` raises :class:`Overloaded`
(HTTP 429); the app answers 503 to a question that waited longer than ``timeout_seconds``.

Each answer comes with its alternatives: the best span of each block read, best first (the
first is ``OpenQA.answer``'s answer: ORQA's best span over every span of every read block), each
in whole words by ``OpenQA``'s rule (``predict.answer_chars``).
"""

import concurrent.futures
import dataclasses
import os
import queue
import threading
import time
from typing import Dict, List, Optional, Sequence

from absl import logging
import numpy as np
import tensorflow as tf

from realm_tf import errors
from realm_tf import model_dir as model_dir_lib
from realm_tf.data import features as features_lib
from realm_tf.modeling import embedder as embedder_lib
from realm_tf.openqa import host
from realm_tf.openqa import inputs as inputs_lib
from realm_tf.openqa import predict
from realm_tf.retrieval import errors as retrieval_errors
from realm_tf.retrieval.publication import handle as handle_lib
from realm_tf.retrieval.publication import publish
from realm_tf.retrieval.publication import refresher
from realm_tf.retrieval.publication import updates
from realm_tf.retrieval.sparse import hybrid


class Overloaded(errors.RealmError, RuntimeError):
  """Too many requests in flight (HTTP 429)."""


class Unavailable(errors.RealmError, RuntimeError):
  """The service cannot answer now: not started, stopped, or the request waited too long
  (HTTP 503)."""


class NotFound(errors.RealmError, LookupError):
  """A deletion that names no live block (HTTP 404)."""


class InvalidUpdate(errors.RealmError, ValueError):
  """An update whose documents cannot be indexed, or that names nothing (HTTP 422)."""


class Conflict(errors.RealmError, RuntimeError):
  """An update refused by the server's state: ``LATEST`` names an index of another block tower
  than the served model's, which the service does not serve (HTTP 409)."""


class PublishedNotServed(Unavailable):
  """An update that was published but is not answering yet (HTTP 503): the message says so,
  and that it must not be sent again."""


class _Updater(updates.Updater):
  """``updates.Updater`` that tells the request's faults from the index's state: an
  ``IndexUpdateError`` of the update's plan (a document that cannot be indexed, a uid or
  title that names no live block) is the request's, :class:`InvalidUpdate`; the others
  (another corpus, another block tower, an index that cannot be read) stay the index's. An
  index ``LATEST`` names that ``guard`` refuses (another block tower than the served model's)
  takes no update (:class:`Conflict`): it would be published on top of an index the service
  never serves."""

  def __init__(self, index_dir: str, guard: handle_lib.TowerGuard, serving, **kwargs):
    super().__init__(index_dir, **kwargs)
    self.guard = guard
    self._serving = serving  # () -> the name of the index answering now.

  def _latest(self):
    path, manifest = super()._latest()
    if not self.guard.admits(path, manifest):
      raise Conflict(
          f"LATEST names {os.path.basename(path)}, an index of another block tower than the "
          "one the served model was fine-tuned against: the server keeps answering with "
          f"{self._serving()} and takes no update until LATEST names an index of its block "
          "tower (build one from the model's block tower: realm-index build)")
    return path, manifest

  def _update(self, plan):
    def checked(*args):
      try:
        return plan(*args)
      except retrieval_errors.IndexUpdateError as e:
        raise InvalidUpdate(str(e)) from e
    return super()._update(checked)


def pinned_block_tower(model_dir: str, checkpoint: str, start_manifest: Dict) -> Optional[str]:
  """The block tower (``handle.block_tower_id``) the model of ``model_dir`` answers against:
  the one its fine-tuning recorded (``model_dir.read_block_tower``), the served
  ``checkpoint``'s own for a model that trained its block tower, and for a model directory
  written before the record existed the tower of the index the service starts with
  (``start_manifest``'s; logged)."""
  record = model_dir_lib.read_block_tower(model_dir)
  if record is None:
    logging.info("realm-serve: %s records no block tower (%s; written before it was "
                 "recorded, or not fine-tuned for Open-QA): pinning the block tower of the index "
                 "it starts with", model_dir, model_dir_lib.BLOCK_TOWER_NAME)
    return handle_lib.block_tower_id(start_manifest)
  if record.get("own"):
    return refresher.block_tower_fingerprint(model_dir, checkpoint)
  return str(record["fingerprint"])


@dataclasses.dataclass
class _Index:
  """An index and the input builder over it (its corpus version's texts)."""
  builder: inputs_lib.OpenQaInputBuilder
  path: str
  key: tuple
  manifest: Dict


@dataclasses.dataclass
class _Request:
  question: str
  top_k: int
  future: concurrent.futures.Future
  enqueued: float
  retriever: str = hybrid.DEFAULT


class QAService:
  """Answers questions with a fine-tuned Open-QA model over ``index_dir``'s newest index.

  Args:
    model_dir: a fine-tuned Open-QA model directory (span scorer).
    index_dir: the index it was fine-tuned against; refreshes and updates published there are
      picked up live.
    checkpoint: the checkpoint (default: ``best_ckpt``'s, else the newest).
    reader_beam_size: blocks read per question (and the most alternatives an answer has).
    max_batch: questions run together by the worker.
    max_in_flight: requests admitted at once (waiting or running); more are refused.
    timeout_seconds: longest a request may wait for its answer.
    poll_seconds: how often the watcher looks at ``LATEST``.
    keep: indexes kept in ``index_dir`` by updates.
  """

  def __init__(self, model_dir: str, index_dir: str, checkpoint: Optional[str] = None,
               reader_beam_size: int = 5, max_batch: int = 8, max_in_flight: int = 8,
               timeout_seconds: float = 30.0, poll_seconds: float = 1.0, keep: int = 3):
    # An update cut short (by a crash) left the corpus ahead of LATEST: roll it forward first
    # (the updater logs what it did).
    self.reconciled = updates.reconcile_if_behind(index_dir, keep=keep)
    qa = predict.OpenQA.load(model_dir, index_dir, checkpoint=checkpoint,
                             reader_beam_size=reader_beam_size)
    self.model_dir, self.index_dir = model_dir, index_dir
    self.model = qa.model
    self.config = model_dir_lib.load_config(model_dir)
    self.checkpoint = qa.checkpoint
    self.model_step = model_dir_lib.trained_step(qa.checkpoint)
    self.reader_beam_size = reader_beam_size
    self.max_batch, self.max_in_flight = max_batch, max_in_flight
    self.timeout_seconds, self.poll_seconds = timeout_seconds, poll_seconds
    handle = qa.builder.handle
    # The block tower the model answers against: no index of another is served or updated.
    self._tower = handle_lib.TowerGuard(pinned_block_tower(model_dir, qa.checkpoint,
                                                           handle.manifest))
    found = handle_lib.block_tower_id(handle.manifest)
    if found != self._tower.tower:
      raise retrieval_errors.BlockTowerMismatchError(
          f"{handle.path} (what {index_dir}/LATEST names) was embedded by block tower {found}, "
          f"but the model {model_dir} answers against block tower {self._tower.tower} (its "
          f"{model_dir_lib.BLOCK_TOWER_NAME}): its retrieval would be garbage. Publish an index "
          "of that tower in the index directory (the index the model was fine-tuned against, or "
          "realm-index build from the checkpoint whose block tower built it; for a model that "
          "trained its block tower, from the served checkpoint) and start again")
    self.updater = _Updater(index_dir, self._tower, lambda: os.path.basename(self._current.path),
                            keep=keep)
    # Batches of 1 to max_batch questions: one trace with the batch dimension relaxed.
    self._embed = embedder_lib.inference_function(self.model.query_embedder,
                                                  reduce_retracing=True)
    self._forward = tf.function(lambda f: self.model(f, training=False), reduce_retracing=True)
    self._current = _Index(qa.builder, handle.path,
                           publish.publication_key(handle.path, handle.manifest), handle.manifest)
    self._pending: Optional[_Index] = None
    self._swapped = threading.Condition()
    self._queue: "queue.Queue[_Request]" = queue.Queue()
    self._in_flight = 0
    self._admission = threading.Lock()  # Guards _in_flight.
    self._load_lock = threading.Lock()  # One index opened at a time (watcher, updates).
    self._update_lock = threading.Lock()
    self._stop = threading.Event()
    self._warm_up(self._current)
    self._threads = [threading.Thread(target=self._work, name="qa-worker", daemon=True),
                     threading.Thread(target=self._watch, name="qa-watcher", daemon=True)]
    for thread in self._threads:
      thread.start()
    self.started = time.time()

  # ---- the index ----
  def _open(self, path: str) -> _Index:
    """The input builder over the index in ``path`` (what ``OpenQA.load`` builds)."""
    builder = host.build_input_builder(self.config, self.index_dir,
                                       retriever_beam_size=self.reader_beam_size,
                                       reader_beam_size=self.reader_beam_size)
    handle = builder.handle
    return _Index(builder, handle.path, publish.publication_key(handle.path, handle.manifest),
                  handle.manifest)

  def _warm_up(self, index: _Index) -> None:
    """Runs batches of one and two questions through ``index`` (traces the builder's and
    the model's functions, the second time for any batch size), so that no real question
    waits for a trace."""
    for size in (1, 2):
      self._answer_batch(index, ["warm up"] * size, 1)

  def _load_newer(self) -> Optional[_Index]:
    """Opens the publication ``LATEST`` names if it is newer than the current and pending
    ones, warms it up and makes it pending; returns it (None: nothing newer)."""
    with self._load_lock:
      path = publish.read_latest(self.index_dir)
      known = max(self._current.key, self._pending.key if self._pending else (-1, -1, -1))
      if (path is None or publish.publication_key(path) <= known or
          not self._tower.admits(path)):
        return None
      index = self._open(path)  # LATEST may have moved on since: this opens the newest.
      if not self._tower.admits(index.path, index.manifest):
        return None
      self._warm_up(index)
      with self._swapped:
        if self._pending is None or self._pending.key < index.key:
          self._pending = index
      logging.info("realm-serve: index %s ready to swap in", index.path)
      return index

  def _watch(self) -> None:
    while not self._stop.wait(self.poll_seconds):
      try:
        self._load_newer()
      except Exception as e:  # pylint: disable=broad-except
        logging.warning("realm-serve: could not load the newer index yet: %s", e)

  def _swap(self) -> None:
    with self._swapped:
      if self._pending is not None:
        self._current, self._pending = self._pending, None
        logging.info("realm-serve: now answering with %s", self._current.path)
        self._swapped.notify_all()

  def wait_for(self, path: str, timeout: float) -> bool:
    """Waits until the index in ``path`` (or a newer one) answers the questions."""
    key = publish.publication_key(path)
    deadline = time.time() + timeout
    with self._swapped:
      while self._current.key < key:
        left = deadline - time.time()
        if left <= 0:
          return False
        self._swapped.wait(left)
    return True

  # ---- answering ----
  def supports(self, retriever: str) -> bool:
    """Whether the index served now can retrieve with ``retriever`` (``bm25`` and ``hybrid``
    need its BM25 part)."""
    return retriever == "dense" or self._current.builder.handle.index.sparse is not None

  def submit(self, question: str, top_k: int,
             retriever: str = hybrid.DEFAULT) -> concurrent.futures.Future:
    """Queues a question; its future gives :meth:`_answer_batch`'s answer. Raises
    :class:`Overloaded` when ``max_in_flight`` requests are in flight."""
    if self._stop.is_set():
      raise Unavailable("the service is stopping")
    with self._admission:
      if self._in_flight >= self.max_in_flight:
        raise Overloaded(f"{self.max_in_flight} requests in flight (the server's "
                         "--max_in_flight): retry later")
      self._in_flight += 1
    future = concurrent.futures.Future()
    future.add_done_callback(self._release)
    self._queue.put(_Request(question, top_k, future, time.perf_counter(), retriever))
    return future

  def _release(self, unused_future) -> None:
    with self._admission:
      self._in_flight -= 1

  def _work(self) -> None:
    while not self._stop.is_set():
      self._swap()
      try:
        first = self._queue.get(timeout=0.05)
      except queue.Empty:
        continue
      batch = [first]
      while len(batch) < self.max_batch:
        try:
          batch.append(self._queue.get_nowait())
        except queue.Empty:
          break
      batch = [r for r in batch if r.future.set_running_or_notify_cancel()]
      if not batch:
        continue
      for retriever in dict.fromkeys(r.retriever for r in batch):   # one batch per retriever
        self._answer_requests(retriever, [r for r in batch if r.retriever == retriever])

  def _answer_requests(self, retriever: str, batch: Sequence[_Request]) -> None:
    start = time.perf_counter()
    try:
      answers = self._answer_batch(self._current, [r.question for r in batch],
                                   max(r.top_k for r in batch), retriever)
    except Exception as e:  # pylint: disable=broad-except
      logging.exception("realm-serve: a batch failed")
      for r in batch:
        r.future.set_exception(e)
      return
    for r, a in zip(batch, answers):
      a["answers"] = a["answers"][:r.top_k]
      a["timings"]["queue_ms"] = round(1000 * (start - r.enqueued), 2)
      a["timings"]["total_ms"] = round(1000 * (time.perf_counter() - r.enqueued), 2)
      r.future.set_result(a)

  def _answer_batch(self, index: _Index, questions: Sequence[str], top_k: int,
                    retriever: str = hybrid.DEFAULT) -> List[Dict]:
    """Retrieves (``retriever``) and reads a batch; per question, its best ``top_k`` answers
    (the best span of each read block, best first) with their evidence."""
    builder = index.builder
    start = time.perf_counter()
    question_inputs = builder.question_inputs(list(questions))
    embeddings = self._embed({f"input_{k[9:]}": tf.constant(v)
                              for k, v in question_inputs.items()}).numpy()
    features = builder.features([inputs_lib.Question(q, []) for q in questions], embeddings,
                                question_inputs=question_inputs, with_ranks=True,
                                retriever=retriever)
    read = builder.read
    blocks = [builder.block_texts(row[:read]) for row in features["beam_ids"]]
    retrieved = time.perf_counter()
    out = self._forward(host.model_features(features))
    logits = out["reader_logits"].numpy()                        # [b, read, spans]
    starts, ends = out["span_starts"].numpy(), out["span_ends"].numpy()
    retrieval = out["retriever_logits"].numpy()
    # The block text starts after [CLS] question [SEP]: the type-0 positions of its row.
    offsets = (features["reader_mask"] - features["reader_type_ids"]).sum(-1)  # [b, read]
    timings = {"retrieval_ms": round(1000 * (retrieved - start), 2),
               "reading_ms": round(1000 * (time.perf_counter() - retrieved), 2)}
    results = []
    for i, question in enumerate(questions):
      candidates = []
      for rank in range(read):
        span = int(np.argmax(logits[i, rank]))
        s = int(starts[i, rank, span] - offsets[i, rank])
        e = int(ends[i, rank, span] - offsets[i, rank])
        block = blocks[i][rank]
        char_start, char_end = predict.answer_chars(block, s, e)   # In whole words.
        if char_end > char_start:
          candidates.append((float(logits[i, rank, span]), rank, char_start, char_end))
      candidates.sort(key=lambda c: (-c[0], c[1]))  # Ties: the better retrieved block.
      answers = []
      for score, rank, char_start, char_end in candidates[:top_k]:
        block_id = int(features["beam_ids"][i, rank])
        block = blocks[i][rank]
        title = builder.titles[block_id]
        uid = features_lib.block_uid(title, block.text)
        answers.append({
            "answer": block.text[char_start:char_end], "score": score, "start": char_start,
            "end": char_end,
            "evidence": {"block_id": block_id, "uid": uid, "title": title, "text": block.text,
                         "rank": rank, "retrieval_score": float(retrieval[i, rank]),
                         "dense_rank": int(features["beam_dense_rank"][i, rank]),
                         "bm25_rank": int(features["beam_bm25_rank"][i, rank])}})
      results.append({
          "question": question, "answers": answers, "model_step": self.model_step,
          "index": os.path.basename(index.path), "index_step": int(index.key[1]),
          "index_update": int(index.key[2]),
          "corpus_fingerprint": index.manifest.get("corpus_fingerprint"),
          "timings": dict(timings)})
    return results

  # ---- updates ----
  def _update(self, run) -> Dict:
    if not self._update_lock.acquire(blocking=False):
      raise Overloaded("another update is in progress: retry when it is done")
    try:
      result = run()
      publish.testonly_crash_point("swap")  # Published, not yet answering.
      name = os.path.basename(result.index)
      try:
        self._load_newer()
        served = self.wait_for(result.index, self.timeout_seconds)
        why = f"not swapped in within {self.timeout_seconds:.0f} s"
      except Exception as e:  # pylint: disable=broad-except
        logging.exception("realm-serve: the update %s was published but could not be loaded",
                          name)
        served, why = False, f"loading it failed: {type(e).__name__}, see the server's log"
      if not served:
        raise PublishedNotServed(
            f"the update was published as {name} but is not answering yet ({why}); it will be "
            "once the server loads it (GET /healthz names the index answering): do not send "
            "the update again")
      return result.to_json()
    finally:
      self._update_lock.release()

  def upsert(self, documents: Sequence[updates.Document]) -> Dict:
    """Adds or replaces documents (``Updater.upsert``); returns once they are answerable.
    Raises :class:`InvalidUpdate` for documents that cannot be indexed."""
    if not documents:
      raise InvalidUpdate("nothing to upsert: give documents")
    return self._update(lambda: self.updater.upsert(documents))

  def delete(self, uids: Sequence[str] = (), titles: Sequence[str] = ()) -> Dict:
    """Deletes blocks by uid or title (``Updater.delete``); returns once they are gone.
    Raises :class:`NotFound` when a uid or title names no live block."""
    if not uids and not titles:
      raise InvalidUpdate("nothing to delete: give uids or titles")
    try:
      return self._update(lambda: self.updater.delete(uids=uids, titles=titles))
    except InvalidUpdate as e:  # A deletion's plan fails only on what it cannot find.
      raise NotFound(str(e)) from e

  # ---- state ----
  def health(self) -> Dict:
    index = self._current
    handle = index.builder.handle
    return {"status": "ok", "model_step": self.model_step,
            "checkpoint": os.path.basename(self.checkpoint),
            "index": os.path.basename(index.path),
            "index_step": int(index.key[1]), "index_update": int(index.key[2]),
            "num_blocks": int(handle.index.num_live),
            "corpus_fingerprint": index.manifest.get("corpus_fingerprint"),
            "corpus_version": int(index.manifest.get("corpus_version", 0)),
            "in_flight": self._in_flight, "max_in_flight": self.max_in_flight,
            "max_top_k": self.reader_beam_size,
            "retrievers": [r for r in hybrid.RETRIEVERS if self.supports(r)],
            "uptime_seconds": round(time.time() - self.started, 1)}

  def close(self) -> None:
    """Stops the threads; the questions still queued fail with :class:`Unavailable`, except
    those whose requests already gave up (timed out: their futures were cancelled), which are
    dropped. Closing again does nothing more."""
    self._stop.set()
    for thread in self._threads:
      thread.join(timeout=5)
    while True:
      try:
        request = self._queue.get_nowait()
      except queue.Empty:
        break
      if request.future.set_running_or_notify_cancel():  # False: cancelled.
        request.future.set_exception(Unavailable("the service stopped"))
