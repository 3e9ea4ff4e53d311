"""REALM validation's zero-shot recall on Open-QA questions (``task.qa_eval_path``).

Checked against a brute-force NumPy computation: the questions and the blocks embedded with the
same towers directly, the exact top 5 blocks by inner product, and ORQA's ``HasAnswer`` written
out again (case-sensitive substring of the block body; ``re.search`` ignoring case for regex
answers).
"""

import hashlib
import os
import re

import numpy as np
import pytest
import tensorflow as tf

from realm_tf import configs
from realm_tf import model_dir as model_dir_lib
from realm_tf import train_lib
from realm_tf.data import manifests
from realm_tf.modeling.models import RealmPretrainer
from realm_tf.tasks import realm_pretrain
from realm_tf.tokenization import RealmTokenizer, load_vocab

import helpers

LQ, LB, TOP = 32, 64, 5


@pytest.fixture(scope="module")
def world(realm_world, tmp_path_factory):
  """conftest's small world (its blocks at LB, its held-out masked sentences at LQ, its QA
  questions); this module's files go to a directory of its own."""
  return dict(realm_world, root=tmp_path_factory.mktemp("qa_recall"),
              qa_test=realm_world["files"]["qa_test"])


def _params(w, **extra):
  size = len(load_vocab(w["vocab"]))
  items = {
      "task.model.vocab_file": w["vocab"],
      "task.model.retriever.encoder.vocab_size": size,
      "task.model.reader.encoder.vocab_size": size,
      "task.model.retriever.encoder.hidden_size": 32,
      "task.model.reader.encoder.hidden_size": 32,
      "task.model.retriever.encoder.intermediate_size": 64,
      "task.model.reader.encoder.intermediate_size": 64,
      # Fresh towers with a wide initialization: embeddings far apart, rankings clear-cut.
      "task.model.retriever.encoder.initializer_range": 0.5,
      "task.model.retriever.projection_size": 16,
      "task.train_data.input_path": os.path.join(w["pretrain"], "train-*"),
      "task.train_data.blocks_dir": w["blocks"],
      "task.validation_data.input_path": os.path.join(w["pretrain"], "eval-*"),
      "task.validation_data.blocks_dir": w["blocks"],
  }
  items.update(extra)
  return configs.load_experiment("realm_pretrain_cpu", params_override=",".join(
      f"{k}={v}" for k, v in items.items()))


def _towers(params, path):
  """A model with fresh towers, its towers saved at ``path`` (an init checkpoint)."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  model = RealmPretrainer.from_config_dataclass(params.task.model)
  dummy = {k: np.zeros([1, LQ], np.int32) for k in
           ("input_word_ids", "input_mask", "input_type_ids")}
  model.query_embedder(dummy)
  model.block_embedder(dummy)
  return model, model_dir_lib.make_checkpoint(query_embedder=model.query_embedder,
                                              block_embedder=model.block_embedder).write(path)


def _numpy_blocks(model, w):
  """The blocks (``read_blocks``) and their embeddings, the block tower applied directly."""
  blocks = manifests.read_blocks(w["blocks"])
  tokenizer = RealmTokenizer(w["vocab"])
  # [CLS] title [SEP] body [SEP] (the stored token_ids, made for LB), segment 1 after the
  # first [SEP], zero-padded to LB.
  word_ids = np.zeros([len(blocks), LB], np.int32)
  type_ids = np.zeros([len(blocks), LB], np.int32)
  for i, block in enumerate(blocks):
    tokens = block["token_ids"]
    assert len(tokens) <= LB and tokens[0] == tokenizer.cls_id
    word_ids[i, :len(tokens)] = tokens
    type_ids[i, tokens.index(tokenizer.sep_id) + 1:len(tokens)] = 1
  block_emb = model.block_embedder(dict(input_word_ids=word_ids, input_mask=(
      word_ids > 0).astype(np.int32), input_type_ids=type_ids)).numpy()
  return blocks, block_emb


def _numpy_top(model, w, questions):
  """The exact top ``TOP`` block ids of each question and the block bodies, from the towers
  applied directly and NumPy."""
  blocks, block_emb = _numpy_blocks(model, w)
  tokenizer = RealmTokenizer(w["vocab"])
  # [CLS] question [SEP], zero-padded to LQ, built by hand.
  q_ids = np.zeros([len(questions), LQ], np.int32)
  for i, question in enumerate(questions):
    pieces = tokenizer.tokenize([question])[0].numpy()[:LQ - 2]
    q_ids[i, :len(pieces) + 2] = [tokenizer.cls_id, *pieces, tokenizer.sep_id]
  q_emb = model.query_embedder(dict(input_word_ids=q_ids, input_mask=(q_ids > 0).astype(
      np.int32), input_type_ids=np.zeros_like(q_ids))).numpy()
  scores = q_emb.astype(np.float64) @ block_emb.astype(np.float64).T
  assert scores.shape == (len(questions), len(blocks))
  return np.argsort(-scores, axis=1)[:, :TOP], [b["body"] for b in blocks]


def test_qa_recall_in_eval_logs_matches_numpy(world):
  """``--mode=eval``: ``qa_recall@5`` and ``qa_questions`` in the returned logs and in the
  validation summaries, equal to the brute-force fraction."""
  records = helpers.read_jsonl(world["qa_test"])
  # Each question again with its answers lower-cased (the test is case-sensitive), and one
  # whose answer is in no block.
  records += [dict(r, answers=[a.lower() for a in r["answers"]]) for r in records]
  records.append(dict(question=records[0]["question"], answers=["Zzqx no such answer"]))
  qa_path = helpers.write_lines(str(world["root"] / "qa-text.jsonl"), records)
  init = str(world["root"] / "towers_text" / "ckpt")
  params = _params(world, **{"task.qa_eval_path": qa_path,
                             "task.retriever_init_checkpoint": init})
  model, _ = _towers(params, init)
  model_dir = str(world["root"] / "eval_text")
  os.makedirs(model_dir)

  logs = train_lib.run_experiment(params, model_dir, mode="eval")

  top, bodies = _numpy_top(model, world, [r["question"] for r in records])
  hits = [any(a in bodies[b] for b in row for a in r["answers"])
          for row, r in zip(top, records)]
  want = sum(hits) / len(hits)
  assert 0.0 < want < 1.0   # a fraction that tells hits from misses
  # Lower-casing the answers loses some hits: the rule is case-sensitive.
  n = (len(records) - 1) // 2
  assert sum(hits[n:2 * n]) < sum(hits[:n])
  assert logs["qa_recall@5"] == want
  assert logs["qa_questions"] == len(records)
  assert {"recall@5", "retrieval_utility", "examples", "validation_loss"} <= set(logs)
  summaries = {tag: values[max(values)] for tag, values in
               helpers.scalars(os.path.join(model_dir, "validation")).items()}
  assert summaries["qa_recall@5"] == pytest.approx(want)
  assert summaries["qa_questions"] == len(records)
  # The pass's per-question hits, in the file's order, beside its per-sentence ones.
  (step, got), = model_dir_lib.read_validation_hits(model_dir).items()
  assert step == 0 and got["k"] == TOP and [c == "1" for c in got["qa"]] == hits
  assert got["qa_file"] == qa_path and got["qa_sha256"] == hashlib.sha256(
      open(qa_path, "rb").read()).hexdigest()
  assert got["held_out"].count("1") / len(got["held_out"]) == pytest.approx(
      logs["held_out_recall@5"])
  assert len(got["held_out"]) == logs["held_out_sentences"]


def test_qa_recall_regex_answers_and_off_by_default(world):
  """``qa_answer_type=regex`` (CuratedTrec): ``re.search`` ignoring case; recall_at names
  the metric; without ``qa_eval_path`` no QA numbers are reported."""
  records = helpers.read_jsonl(world["qa_test"])
  # Lower-cased literal patterns match ignoring case; "." stands for any first character.
  records = [dict(question=r["question"], answers=[re.escape(a.lower()) for a in r["answers"]])
             for r in records]
  records += [dict(question=r["question"], answers=["." + r["answers"][0][2:]])
              for r in records[:6]]
  records.append(dict(question=records[0]["question"], answers=["("]))   # never compiles
  qa_path = helpers.write_lines(str(world["root"] / "qa-regex.jsonl"), records)
  params = _params(world, **{"task.qa_eval_path": qa_path, "task.qa_answer_type": "regex",
                             "task.recall_at": TOP})
  task = realm_pretrain.RealmPretrainTask(params.task)
  model, _ = _towers(params, str(world["root"] / "towers_regex" / "ckpt"))
  task.build_inputs(params.task.validation_data)
  task.validation_begin(model)
  state = task.aggregate_logs(None, {})
  logs = task.reduce_aggregated_logs(task.aggregate_logs(state, {}))

  top, bodies = _numpy_top(model, world, [r["question"] for r in records])

  def matches(pattern, text):
    try:
      return re.search(pattern, text, re.IGNORECASE) is not None
    except re.error:
      return False
  hits = [any(matches(p, bodies[b]) for b in row for p in r["answers"])
          for row, r in zip(top, records)]
  assert 0.0 < np.mean(hits) < 1.0
  assert {k: logs[k] for k in ("qa_recall@5", "qa_questions")} == {
      "qa_recall@5": sum(hits) / len(hits), "qa_questions": float(len(records))}

  off = realm_pretrain.RealmPretrainTask(_params(world).task)
  off.build_inputs(params.task.validation_data)
  off.validation_begin(model)
  assert set(off.reduce_aggregated_logs(off.aggregate_logs(None, {}))) == {
      "held_out_recall@5", "held_out_sentences"}


def test_exact_candidates_match_numpy(world):
  """``exact_candidates``, the exact retrieval that validation and Table 3 share: every block
  ranked by its inner product with the held-out query (towers applied directly, NumPy), and the
  candidates the training rules pick: the null block, then the best blocks of another uid."""
  params = _params(world)
  task = realm_pretrain.RealmPretrainTask(params.task)
  model, _ = _towers(params, str(world["root"] / "towers_exact" / "ckpt"))
  examples = task.loader(params.task.validation_data).read_all()
  candidates, ranked, index = task.exact_candidates(model, examples)

  blocks, block_emb = _numpy_blocks(model, world)
  q_emb = model.query_embedder(dict(
      input_word_ids=examples["query_ids"], input_mask=examples["query_mask"],
      input_type_ids=np.zeros_like(examples["query_ids"]))).numpy()
  scores = q_emb.astype(np.float64) @ block_emb.astype(np.float64).T
  n, k = len(scores), params.task.model.num_candidates
  assert n > 10 and ranked.shape == (n, len(blocks)) and candidates.shape == (n, k)
  assert (np.sort(ranked, axis=1) == np.arange(len(blocks))).all()   # every block, once
  np.testing.assert_allclose(np.take_along_axis(scores, ranked, 1), -np.sort(-scores, axis=1),
                             rtol=1e-4, atol=1e-4)
  assert index.search(q_emb[:3], 4)[0].tolist() == ranked[:3, :4].tolist()
  uids = [b["uid"] for b in blocks]
  for row, source, got in zip(ranked, examples["source_uid"], candidates):
    other = [b for b in row if uids[b] != source.decode()]
    assert got.tolist() == [len(blocks)] + other[:k - 1]


def test_held_out_recall_over_every_sentence(world):
  """``held_out_recall@k``: over every held-out sentence (not only the pass's batches), does
  one of the top k blocks by the towers' NumPy scores, the sentence's own block skipped,
  hold its answer?"""
  params = _params(world, **{"task.recall_at": 3, "task.validation_data.global_batch_size": 8,
                             "trainer.validation_steps": 1})
  task = realm_pretrain.RealmPretrainTask(params.task)
  model, _ = _towers(params, str(world["root"] / "towers_held_out" / "ckpt"))
  task.build_inputs(params.task.validation_data)
  task.validation_begin(model)
  logs = task.reduce_aggregated_logs(task.aggregate_logs(None, {}))

  examples = task.loader(params.task.validation_data).read_all()
  blocks, block_emb = _numpy_blocks(model, world)
  q_emb = model.query_embedder(dict(
      input_word_ids=examples["query_ids"], input_mask=examples["query_mask"],
      input_type_ids=np.zeros_like(examples["query_ids"]))).numpy()
  ranked = np.argsort(-(q_emb.astype(np.float64) @ block_emb.astype(np.float64).T), axis=1)
  hits = []
  for row, source, answer in zip(ranked, examples["source_uid"], examples["answer"]):
    other = [b for b in row if blocks[b]["uid"] != source.decode()][:3]
    # The documented rule: the answer's words, a run of whole [0-9a-z] words of the body.
    pattern = r"(?<![0-9a-z])" + r"[^0-9a-z]+".join(re.findall(
        "[0-9a-z]+", answer.decode().lower())) + r"(?![0-9a-z])"
    hits.append(any(re.search(pattern, blocks[b]["body"].lower()) for b in other))
  assert len(hits) > params.task.validation_data.global_batch_size   # more than one batch
  assert 0.0 < np.mean(hits) < 1.0
  assert logs == {"held_out_recall@3": pytest.approx(np.mean(hits)),
                  "held_out_sentences": float(len(hits))}
  # With a model directory and the trainer's step, the same hits are kept sentence by sentence;
  # a step validated again (a resumed run) keeps its last pass.
  model_dir = str(world["root"] / "held_out_hits")
  task = realm_pretrain.RealmPretrainTask(params.task, logging_dir=model_dir)
  task.build_inputs(params.task.validation_data)
  for step in (0, 4, 4):
    task.validation_begin(model)
    task.reduce_aggregated_logs(task.aggregate_logs(None, {}), global_step=tf.constant(step))
  got = model_dir_lib.read_validation_hits(model_dir)
  assert sorted(got) == [0, 4] and "qa" not in got[4]
  assert [c == "1" for c in got[4]["held_out"]] == hits
  with open(os.path.join(model_dir, model_dir_lib.VALIDATION_HITS_NAME), "a") as f:
    f.write("{not json\n")
  with pytest.raises(model_dir_lib.ModelDirError, match="line 4"):
    model_dir_lib.read_validation_hits(model_dir)
