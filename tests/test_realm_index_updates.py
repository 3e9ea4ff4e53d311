"""realm-index upsert / delete: the corpus and its index after a random sequence of updates
against exact search over the resulting corpus, embedded from scratch; the refresher's next
full build; the checkpoint check; a SIGKILL in the middle of an update."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from realm_tf import model_dir as model_dir_lib
from realm_tf import modeling
from realm_tf import tokenization
from realm_tf.data import block_store
from realm_tf.data import corpus_updates
from realm_tf.data import features
from realm_tf.data import manifests
from realm_tf.retrieval import errors
from realm_tf.retrieval.index import mips_index
from realm_tf.retrieval.index import sharded_index
from realm_tf.retrieval.publication import corpus_embedding
from realm_tf.retrieval.publication import index_io
from realm_tf.retrieval.publication import publish
from realm_tf.retrieval.publication import refresher
from realm_tf.retrieval.publication import testing
from realm_tf.retrieval.publication import updates
from realm_tf.retrieval.sparse import sparse_index
from test_sparse_index import check_against_fresh_bm25s

import helpers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIM = 16
ENV = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")


def _setup(root, num_blocks=300, brute_force_below=2000, **scann):
  vocab = testing.write_vocab(str(root / "vocab.txt"))
  blocks_dir, model_dir, index_dir = (str(root / n) for n in ("blocks", "model", "index"))
  testing.make_corpus(blocks_dir, vocab, num_blocks)
  trainer = testing.TinyTrainer(model_dir, vocab, projection_size=DIM)
  trainer.perturb(0.3)
  trainer.save(10)
  options = refresher.BuildOptions(index_type="scann", recall_queries=50, progress=False,
                                   tensorboard_dir="",
                                   scann=mips_index.ScannSettings(
                                       brute_force_below=brute_force_below, tuning_queries=100,
                                       **scann))
  refresher.build_index_for_checkpoint(None, model_dir, blocks_dir, index_dir, options)
  return dict(vocab=vocab, blocks=blocks_dir, model=model_dir, index=index_dir,
              trainer=trainer, options=options)


def _corpus_table(model_dir, blocks_dir):
  """Every row of the corpus's current version embedded from scratch with the model's newest
  checkpoint (the reference)."""
  config = model_dir_lib.load_config(model_dir)
  _, tower = modeling.build_embedders(config.retriever)
  model_dir_lib.restore(model_dir_lib.latest_checkpoint(model_dir), block_embedder=tower)
  manifest = manifests.load_blocks_manifest(blocks_dir)
  ids, emb = corpus_embedding.embed_corpus(tower, blocks_dir, config.retriever.block_seq_length,
                                           config.vocab_file, progress=False)
  return corpus_embedding.assemble_rows(ids, emb, int(manifest["num_blocks"]))


def _live_rows(store, expected):
  """Rows whose (title, text) is a document the test expects to be indexed."""
  rows = [r for r in range(len(store)) if (store.titles[r], store.text(r)) in expected]
  assert len(rows) == len(expected), "each expected block is one row"
  return np.array(rows)


def _check_against_exact(setup, expected, queries, k=10):
  """The published index against NumPy over the live rows of a from-scratch embedding."""
  store = block_store.BlockStore.open(setup["blocks"])
  live = _live_rows(store, expected)
  np.testing.assert_array_equal(np.setdiff1d(np.arange(len(store)), live), store.deleted)
  table = _corpus_table(setup["model"], setup["blocks"])
  index = index_io.load_index(publish.read_latest(setup["index"]),
                                expected_fingerprint=store.fingerprints, load_embeddings=True)
  np.testing.assert_allclose(np.asarray(index.embeddings[np.arange(len(table))]), table,
                             rtol=1e-5, atol=1e-5)  # The appended rows: as a full embedding.
  scores = np.full([len(queries), len(store)], -np.inf)
  scores[:, live] = queries.astype(np.float64) @ table[live].T.astype(np.float64)
  want = np.argsort(-scores, axis=1, kind="stable")[:, :k]
  ids, _ = index.search(queries, k)
  _check_sparse(index, store, live)
  return index, store, ids, want, scores


def _check_sparse(index, store, live):
  """The index's BM25 part: bm25s over the live blocks' texts, indexed afresh."""
  check_against_fresh_bm25s(index.sparse, {
      r: sparse_index.block_text(store.titles[r], store.text(r)) for r in live})


def test_random_updates_equal_exact_search(tmp_path):
  setup = _setup(tmp_path)
  base = manifests.read_blocks(setup["blocks"])
  expected = {(b["title"], b["body"]) for b in base}
  updater = updates.Updater(setup["index"], setup["model"])
  rng = np.random.default_rng(0)
  queries = rng.standard_normal((30, DIM)).astype(np.float32)
  words = testing.WORDS
  for step in range(6):
    op = ["new", "replace", "delete_uid", "delete_title"][step % 4]
    if op in ("new", "replace"):
      docs = []
      titles = sorted({t for t, _ in expected})
      for j in range(4):
        title = (f"update {step} {j}" if op == "new" else titles[rng.integers(len(titles))])
        text = " ".join(rng.choice(words, 12)) + f" number {step} {j}."
        docs.append(updates.Document(title, text))
        expected = {(t, b) for t, b in expected if t != title} | {(title, text)}
      result = updater.upsert(docs)
      assert len(result.added) == 4 and not result.skipped
    else:
      live = sorted(expected)
      pick = [live[i] for i in rng.choice(len(live), 3, replace=False)]
      if op == "delete_uid":
        result = updater.delete(uids=[features.block_uid(t, b) for t, b in pick])
      else:
        result = updater.delete(titles=[t for t, _ in pick])
        pick = [(t, b) for t, b in expected if t in {p[0] for p in pick}]
      expected -= set(pick)
      assert sorted((d["title"], d["uid"]) for d in result.deleted) == sorted(
          (t, features.block_uid(t, b)) for t, b in pick)
    assert os.path.basename(result.index) == f"step-10-u{step + 1}"
    index, store, ids, want, scores = _check_against_exact(setup, expected, queries)
    helpers.assert_same_top_k(ids, want, scores)
    assert not np.isin(ids, store.deleted).any()
  # An unchanged document is skipped; an unknown uid is an error naming it.
  title, text = sorted(expected)[0]
  assert updater.upsert([updates.Document(title, text)]).skipped == [title]
  with pytest.raises(errors.IndexUpdateError, match="no live block .* uid 00ab"):
    updater.delete(uids=["00ab"])
  # The refresher's next full build includes the updates: the same results.
  setup["trainer"].save(20)  # The same weights at a later step.
  refresher.build_index_for_checkpoint(None, setup["model"], setup["blocks"], setup["index"],
                                       setup["options"])
  rebuilt = index_io.load_index(publish.read_latest(setup["index"]))
  assert rebuilt.manifest["model_step"] == 20 and rebuilt.num_live == len(expected)
  helpers.assert_same_top_k(rebuilt.search(queries, 10)[0], want, scores)
  _check_sparse(rebuilt, store, _live_rows(store, expected))
  # Now the index's tower is step 20's: an update with step 10's is refused.
  with pytest.raises(errors.IndexUpdateError, match="never mixes two towers"):
    updates.Updater(setup["index"], setup["model"],
                    checkpoint=os.path.join(setup["model"], "ckpt-10")).delete(titles=[title])


def test_scann_ah_index_keeps_its_tuned_recall(tmp_path):
  """ScaNN hashing over 1,200 blocks (exact scoring only below 500 here): after updates, the
  recall@10 against exact search over the live rows stays at the index's tuned target."""
  setup = _setup(tmp_path, num_blocks=1200, brute_force_below=500)
  start = index_io.load_index(publish.read_latest(setup["index"]))
  assert start.settings()["mode"] == "ah"
  target = start.settings()["tuning"]["target_recall"]
  expected = {(b["title"], b["body"]) for b in manifests.read_blocks(setup["blocks"])}
  updater = updates.Updater(setup["index"])
  rng = np.random.default_rng(1)
  docs = [updates.Document(f"new {i}", " ".join(rng.choice(testing.WORDS, 15)) + f" {i}.")
          for i in range(12)]
  updater.upsert(docs)
  expected |= {(d.title, d.text) for d in docs}
  gone = sorted(expected)[:12]
  updater.delete(uids=[features.block_uid(t, b) for t, b in gone])
  expected -= set(gone)
  queries = _corpus_table(setup["model"], setup["blocks"])[rng.choice(1200, 200)] + 0.05
  index, store, ids, want, _ = _check_against_exact(setup, expected, queries)
  recall = np.mean([len(set(a) & set(w)) / 10 for a, w in zip(ids.tolist(), want.tolist())])
  print(f"ScaNN ah after updates: recall@10 {recall:.4f} (target {target})")
  assert recall >= target - 0.01
  assert not np.isin(ids, store.deleted).any()


def test_a_rebuild_after_updates_is_latest_and_updated_on_top(tmp_path):
  """Build, 3 updates, ``realm-index build`` at the same step: the rebuild is LATEST and kept
  (keep=3), and the next update applies on top of it (``step-10-u4``, from ``step-10``)."""
  setup = _setup(tmp_path, num_blocks=100)
  expected = {(b["title"], b["body"]) for b in manifests.read_blocks(setup["blocks"])}
  updater = updates.Updater(setup["index"], setup["model"], keep=3)
  for i in range(3):
    doc = updates.Document(f"new {i}", f"the king was born in paris {i}.")
    updater.upsert([doc])
    expected.add((doc.title, doc.text))
  assert os.path.basename(publish.read_latest(setup["index"])) == "step-10-u3"
  rebuilt = refresher.build_index_for_checkpoint(None, setup["model"], setup["blocks"],
                                                 setup["index"], setup["options"])
  assert publish.read_latest(setup["index"]) == rebuilt and rebuilt.endswith("step-10")
  assert index_io.load_index(rebuilt).num_live == 103  # Over the updated corpus.
  doc = updates.Document("after", "a band from london.")
  result = updater.upsert([doc])
  expected.add((doc.title, doc.text))
  assert os.path.basename(result.index) == "step-10-u4"
  assert publish.read_latest(setup["index"]) == result.index
  assert mips_index.read_manifest(result.index)["last_update"]["from"] == "step-10"
  queries = np.random.default_rng(4).standard_normal((10, DIM)).astype(np.float32)
  _, _, ids, want, scores = _check_against_exact(setup, expected, queries)
  helpers.assert_same_top_k(ids, want, scores)


def test_a_sharded_index_is_built_updated_and_rebuilt(tmp_path, monkeypatch):
  """Under a memory budget too small for one piece, the refresher builds the 300 blocks in 3
  shards; upserts and deletes land across the shards, equal to exact search each time; the
  next build over the updated corpus is sharded again, and the same."""
  monkeypatch.setattr(sharded_index, "MIN_ROWS_PER_SHARD", 100)
  setup = _setup(tmp_path, build_memory_gib=1e-5)
  first = index_io.load_index(publish.read_latest(setup["index"]))
  assert first.index_type == "scann_sharded" and len(first.shards) == 3
  expected = {(b["title"], b["body"]) for b in manifests.read_blocks(setup["blocks"])}
  updater = updates.Updater(setup["index"], setup["model"])
  queries = np.random.default_rng(5).standard_normal((20, DIM)).astype(np.float32)
  docs = [updates.Document(f"new {i}", f"the king was born in paris {i}.") for i in range(3)]
  updater.upsert(docs)
  expected |= {(d.title, d.text) for d in docs}
  gone = [sorted(expected)[i] for i in (0, 150, 299)]  # In different shards.
  updater.delete(uids=[features.block_uid(t, b) for t, b in gone])
  expected -= set(gone)
  index, store, ids, want, scores = _check_against_exact(setup, expected, queries)
  assert index.index_type == "scann_sharded" and index.num_live == 300
  helpers.assert_same_top_k(ids, want, scores)
  setup["trainer"].save(20)
  refresher.build_index_for_checkpoint(None, setup["model"], setup["blocks"], setup["index"],
                                       setup["options"])
  index, _, ids, want, scores = _check_against_exact(setup, expected, queries)
  assert index.manifest["model_step"] == 20 and len(index.shards) == 4
  helpers.assert_same_top_k(ids, want, scores)


def test_no_change_publishes_nothing_and_new_blocks_must_match_the_corpus(tmp_path):
  """An upsert whose documents are all unchanged publishes nothing; ``--new_blocks_dir``
  blocks made with another vocabulary, casing or block length are refused (nothing written),
  matching ones are added."""
  setup = _setup(tmp_path, num_blocks=100)
  updater = updates.Updater(setup["index"], setup["model"])
  version = lambda: corpus_updates.version(manifests.load_blocks_manifest(setup["blocks"]))
  doc = updates.Document("Once", "a band from london.")
  first = updater.upsert([doc])
  names = sorted(os.listdir(setup["index"]))
  again = updater.upsert([doc])
  assert again.skipped == [doc.title] and not again.added and again.index == first.index
  assert sorted(os.listdir(setup["index"])) == names and version() == 1
  assert publish.read_latest(setup["index"]) == first.index

  other_vocab = testing.write_vocab(str(tmp_path / "other_vocab.txt"), ["zebra quagga okapi"])
  title, body = "Fresh", "the king was born in paris."
  cases = [("vocab_sha1", other_vocab, True, 32), ("lower_case", setup["vocab"], False, 32),
           ("block_seq_length", setup["vocab"], True, 48)]
  for wrong, vocab, lower_case, length in cases:
    new_dir = str(tmp_path / f"new_{wrong}")
    manifests.write_blocks(new_dir, [title], [body],
                           tokenization.RealmTokenizer(vocab, lower_case=lower_case), length)
    with pytest.raises(errors.IndexUpdateError, match=rf"new_{wrong}: .*differs: {wrong}"):
      updater.upsert(blocks_dir=new_dir)
  assert publish.read_latest(setup["index"]) == first.index and version() == 1
  good = str(tmp_path / "new_good")
  manifests.write_blocks(good, [title], [body], tokenization.RealmTokenizer(setup["vocab"]), 32)
  result = updater.upsert(blocks_dir=good)
  assert [a["row"] for a in result.added] == [101] and result.index.endswith("step-10-u2")
  assert version() == 2


def _realm_index(*args, env=None):
  return subprocess.Popen([sys.executable, "-m", "realm_tf.binaries.index", *args,
                           "--noprogress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env=env or ENV, cwd=REPO)


def _tree_digest(path):
  h = hashlib.sha1()
  for root, _, files in sorted(os.walk(path)):
    for name in sorted(files):
      with open(os.path.join(root, name), "rb") as f:
        h.update(name.encode() + f.read())
  return h.hexdigest()


def test_sigkill_mid_update_then_the_next_update(tmp_path):
  """realm-index upsert killed while it publishes: the previous index stays published,
  byte for byte, and loadable; the next update rolls it forward first (the killed one's block),
  then succeeds."""
  setup = _setup(tmp_path, num_blocks=100)
  before = publish.read_latest(setup["index"])
  digest = _tree_digest(before)
  queries = np.random.default_rng(2).standard_normal((5, DIM)).astype(np.float32)
  old_ids, _ = index_io.load_index(before).search(queries, 5)
  docs = tmp_path / "docs.jsonl"
  docs.write_text(json.dumps({"title": "Killed", "text": "the king was born in paris."}) + "\n")
  env = dict(ENV, **{publish.TESTONLY_BUILD_DELAY_ENV: "30"})
  proc = _realm_index("upsert", f"--index_dir={setup['index']}", f"--model_dir={setup['model']}",
                      f"--input={docs}", env=env)
  deadline = time.time() + 120
  while not any(n.startswith(".tmp-step-10-u1") for n in os.listdir(setup["index"])):
    assert proc.poll() is None and time.time() < deadline, proc.communicate()
    time.sleep(0.1)
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait()
  assert publish.read_latest(setup["index"]) == before and _tree_digest(before) == digest
  store = block_store.BlockStore.open(setup["blocks"])
  assert len(store) == 101  # The corpus went a version ahead ...
  loaded = index_io.load_index(before, expected_fingerprint=store.fingerprints)
  np.testing.assert_array_equal(loaded.search(queries, 5)[0], old_ids)  # ... the index did not.

  # The next update first rolls the index forward to the corpus (step-10-u1, with the killed
  # update's block), then publishes its own (step-10-u2).
  result = updates.Updater(setup["index"], setup["model"]).upsert(
      [updates.Document("Next", "a band from london.")])
  assert result.index.endswith("step-10-u2") and [a["row"] for a in result.added] == [101]
  rolled = index_io.load_index(os.path.join(setup["index"], "step-10-u1"))
  assert rolled.num_blocks == 101 and rolled.num_live == 101
  index = index_io.load_index(result.index)
  assert index.num_blocks == 102 and index.num_live == 102  # The killed update's block too.
  assert not [n for n in os.listdir(setup["index"]) if n.startswith(".tmp-")]  # Cleaned.


@pytest.mark.slow
def test_cli_upsert_delete_and_one_line_errors(tmp_path):
  """The command lines: upsert from JSON lines, delete by title, and the refusals on one
  line (another checkpoint than the index's, an unknown uid)."""
  setup = _setup(tmp_path, num_blocks=100)
  docs = tmp_path / "docs.jsonl"
  docs.write_text(json.dumps({"title": "Next", "text": "a band from london."}) + "\n")
  proc = _realm_index("upsert", f"--index_dir={setup['index']}",
                      f"--model_dir={setup['model']}", f"--input={docs}")
  out, err = proc.communicate(timeout=300)
  assert proc.returncode == 0, err[-3000:]
  result = json.loads(out.strip().splitlines()[-1])
  assert result["index"].endswith("step-10-u1") and [a["row"] for a in result["added"]] == [100]
  proc = _realm_index("delete", f"--index_dir={setup['index']}", "--title=Next")
  out, err = proc.communicate(timeout=300)
  assert proc.returncode == 0, err[-3000:]
  assert [d["row"] for d in json.loads(out.strip().splitlines()[-1])["deleted"]] == [100]
  assert corpus_updates.version(manifests.load_blocks_manifest(setup["blocks"])) == 2
  setup["trainer"].perturb()
  setup["trainer"].save(30)
  runs = {"other": _realm_index("upsert", f"--index_dir={setup['index']}",
                                f"--model_dir={setup['model']}", f"--input={docs}"),
          "unknown": _realm_index("delete", f"--index_dir={setup['index']}", "--uid=abc")}
  for name, proc in runs.items():
    _, err = proc.communicate(timeout=300)
    lines = [l for l in err.splitlines() if l.startswith("error:")]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in err, err[-2000:]
    assert ("never mixes two towers" if name == "other" else "uid abc") in lines[0], lines


def test_the_top_k_check_allows_a_near_tie_swap_and_nothing_else():
  scores = np.array([[3.0, 2.0, 2.0 + 1e-7, 1.0]])
  want = np.array([[0, 2, 1]])
  helpers.assert_same_top_k(np.array([[0, 1, 2]]), want, scores)   # rows 1, 2: a near-tie
  with pytest.raises(AssertionError):
    helpers.assert_same_top_k(np.array([[0, 1, 3]]), want, scores)   # row 3 is not
  with pytest.raises(AssertionError):
    helpers.assert_same_top_k(np.array([[0, 1, 1]]), want, np.array([[3.0, 2.0, 2.0, 1.0]]))
