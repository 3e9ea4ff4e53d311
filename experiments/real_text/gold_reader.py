r"""Stage A of real-text Open-QA: teach the reader to read its question's own paragraph.

  python -m experiments.real_text.gold_reader --reader_dir=<work>/minilm_reader_model \
      --output_dir=<work>/gold_reader         # real_text runs it as a stage

ORQA fine-tunes a reader that already reads: BERT fine-tuned on nothing is a poor start for 300
steps of Open-QA (experiments/NOTES.md section 25). This stage fine-tunes the converted MiniLM
reader, span scorer included, on the *train* articles' SQuAD questions with the paragraph each
was written from, and scores it on the *dev* articles' questions with theirs (the gold
paragraph: the reader's ceiling in Open-QA). The split is ``data_prep.squad.split_of``'s, the
one the questions of ``real_text`` use, so no test article is read here.

* Inputs are the Open-QA reader's rows (``inputs.reader_row``'s layout:
  ``[CLS] question [SEP] paragraph window [SEP]``, the window's type id 1) at the Open-QA
  reader length, so stage B reads what stage A trained on. A paragraph longer than the room
  after the question is cut into windows ``stride`` wordpieces apart (SQuAD's ``doc_stride``).
* Gold spans: each annotator's ``answer_start`` mapped to the wordpieces that overlap its
  characters (``inputs.tokenize_with_offsets`` keeps every wordpiece's characters); spans
  longer than the scorer's ``max_span_width`` cannot be scored and are left out. A question
  trains when one of its windows holds a gold span whole.
* Loss: ORQA's reader loss, with a question's windows in the place of its read blocks:
  ``-log sum_{gold} softmax(span scores)``, the softmax over every span of at most
  ``max_span_width`` in every window of the question (``question_loss``), so a window without
  the answer learns to score low, as prediction (the best span over the windows) needs.
* Optimizer: BERT's (``official.nlp.optimization.create_optimizer``: AdamW, weight decay 0.01,
  linear warm-up then linear decay to 0) with BERT's gradient clipping at global norm 1.
* Prediction: the best-scoring span over the question's windows, widened to whole words
  (``predict.span_text``, as ``realm-answer`` answers). EM is ORQA's (``answers.is_correct``),
  F1 is SQuAD's token F1 on the same normalization, best over the annotators' answers.

Writes into ``--output_dir`` a model directory that ``task.reader_init_checkpoint`` restores
(``model_config.yaml``, the vocabulary, ``ckpt-<steps>`` with the reader and its span scorer),
TensorBoard summaries (``train/``: loss, learning rate), the dev predictions
(``dev_predictions.jsonl``) and ``done.json`` (settings, dev EM and F1 with 95% intervals,
seconds).
"""

import collections
import dataclasses
import json
import math
import os
import time
from typing import Dict, List, Optional, Sequence, Tuple

from absl import app
from absl import flags
import numpy as np
from official.nlp import optimization
import tensorflow as tf
import tf_keras
import yaml

from data_prep import squad
from experiments import assets
from experiments.pipeline.common import Clock
from experiments.pipeline.common import proportion
from experiments.pipeline.common import write_json
from realm_tf import errors
from realm_tf import model_dir as model_dir_lib
from realm_tf import tokenization
from realm_tf.data import answers as answers_lib
from realm_tf.modeling import factory
from realm_tf.modeling import openqa_losses
from realm_tf.modeling import span_scorer
from realm_tf.openqa import inputs as inputs_lib
from realm_tf.openqa import predict as predict_lib

OPENQA_YAML = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs",
                           "openqa_cpu__real_text.yaml")


FLAGS = flags.FLAGS


class GoldReaderError(errors.RealmError):
  """A gold-reader input or setting that cannot work; the message names it and the fix."""


@dataclasses.dataclass(frozen=True)
class Settings:
  """Stage A's sizes (flags of the same names). ``epochs``: passes over the training windows;
  ``warmup``: the share of steps spent warming up; ``dev_questions``: 0 for every dev one.
  The learning rate is the one chosen on dev (experiments/NOTES.md section 25)."""
  learning_rate: float = 3e-4
  epochs: float = 2.0
  batch_size: int = 16
  warmup: float = 0.1
  seq_length: int = 192
  max_query_length: int = 64
  stride: int = 128
  dev_questions: int = 0
  eval_batch_size: int = 64
  seed: int = 0
  steps: int = 0   # 0: from epochs; else exactly this many (a dev sweep's short runs)

  def check(self) -> None:
    for name in ("learning_rate", "epochs", "batch_size", "seq_length", "max_query_length",
                 "stride", "eval_batch_size"):
      if getattr(self, name) <= 0:
        raise GoldReaderError(f"--{name}={getattr(self, name)}: must be positive")
    if not 0 <= self.warmup < 1:
      raise GoldReaderError(f"--warmup={self.warmup}: a share of the steps, in [0, 1)")
    if self.seq_length < self.max_query_length + 16:
      raise GoldReaderError(f"--seq_length={self.seq_length} leaves no room for a paragraph "
                            f"after --max_query_length={self.max_query_length} wordpieces")


# -------------------------------------------------------------------------------- examples --

@dataclasses.dataclass
class Question:
  """A SQuAD question with its paragraph (index into the paragraphs) and answers."""
  question: str
  paragraph: int
  answers: List[str]
  char_spans: List[Tuple[int, int]]   # each annotator's [start, end) in the paragraph


def read_split(squad_file: str, split: str, max_articles: int = 0, max_paragraphs: int = 0
               ) -> Tuple[List[str], List[Question]]:
  """The paragraphs and questions of one split's articles (``squad.split_of`` on the display
  title, as ``text_stages.make_questions``; the first ``max_articles`` with their first
  ``max_paragraphs``, 0: all), in file order: the order of ``qa/squad-<split>.jsonl``."""
  articles = squad.read_articles(squad_file, max_articles, max_paragraphs)
  paragraphs, questions = [], []
  for article in articles:
    if squad.split_of(squad.display_title(article["title"])) != split:
      continue
    for paragraph in article["paragraphs"]:
      context = paragraph["context"]
      for item in paragraph.get("qas", []):
        spans, texts = [], []
        for a in item.get("answers", []):
          text = a.get("text", "")
          start = int(a.get("answer_start", -1))
          if not text.strip() or start < 0:
            continue
          if context[start:start + len(text)] != text:
            raise GoldReaderError(
                f"{squad_file}: question {item.get('id')!r}: answer {text!r} is not at "
                f"answer_start {start} of its paragraph; the file is not SQuAD v1.1")
          spans.append((start, start + len(text)))
          texts.append(text)
        if spans and item.get("question", "").strip():
          questions.append(Question(item["question"], len(paragraphs),
                                    list(dict.fromkeys(texts)), sorted(set(spans))))
      paragraphs.append(context)
  return paragraphs, questions


def token_span(block, char_start: int, char_end: int) -> Optional[Tuple[int, int]]:
  """The wordpieces (inclusive) of ``block`` whose characters overlap ``[char_start,
  char_end)``; None when none does."""
  hit = np.flatnonzero((block.char_ends > char_start) & (block.char_starts < char_end))
  return (int(hit[0]), int(hit[-1])) if len(hit) else None


@dataclasses.dataclass
class Window:
  """One reader row: question ``question`` over paragraph wordpieces ``[start, start + n)``,
  and the gold spans inside it as positions of the row."""
  question: int
  start: int
  offset: int       # the row position of the window's first wordpiece
  word_ids: np.ndarray
  mask: np.ndarray
  type_ids: np.ndarray
  gold: List[Tuple[int, int]]


def make_windows(tokenizer, paragraphs: Sequence[str], questions: Sequence[Question],
                 settings: Settings, max_span_width: int):
  """The paragraphs' ``BlockText``s, every question's windows, and counts (answers too long
  for the scorer, answers the tokenization cannot place)."""
  blocks = inputs_lib.tokenize_with_offsets(tokenizer, list(paragraphs))
  q_ids = tokenizer.tokenize([q.question for q in questions]).to_list() if questions else []
  counts = collections.Counter()
  windows: List[Window] = []
  for i, (q, ids) in enumerate(zip(questions, q_ids)):
    ids = np.asarray(ids[:settings.max_query_length], np.int32)
    block = blocks[q.paragraph]
    room = settings.seq_length - len(ids) - 3
    spans = []
    for s, e in q.char_spans:
      span = token_span(block, s, e)
      if span is None:
        counts["answers_unplaced"] += 1
      elif span[1] - span[0] + 1 > max_span_width:
        counts["answers_too_long"] += 1
      else:
        spans.append(span)
    start = 0
    while True:
      body = block.token_ids[start:start + room]
      word_ids, mask, type_ids, offset, _ = inputs_lib.reader_row(
          ids, body, settings.seq_length, tokenizer.cls_id, tokenizer.sep_id)
      gold = sorted({(s - start + offset, e - start + offset) for s, e in spans
                     if s >= start and e < start + len(body)})
      windows.append(Window(i, start, offset, word_ids, mask, type_ids, gold))
      if start + room >= len(block.token_ids):
        break
      start += min(settings.stride, room)
  counts["windows"] = len(windows)
  counts["training_windows"] = sum(bool(w.gold) for w in windows)
  return blocks, windows, dict(counts)


def batch_arrays(windows: Sequence[Window], segments: Optional[Sequence[int]] = None,
                 max_gold: int = 8) -> Dict[str, np.ndarray]:
  """The model's features of a list of windows (gold spans padded to ``max_gold``) and, for
  training, ``segment``: which question of the batch each window belongs to (-1: padding)."""
  n = len(windows)
  gold = {k: np.zeros([n, max_gold], np.int32) for k in ("gold_starts", "gold_ends", "gold_mask")}
  for r, w in enumerate(windows):
    for g, (s, e) in enumerate(w.gold[:max_gold]):
      gold["gold_starts"][r, g], gold["gold_ends"][r, g], gold["gold_mask"][r, g] = s, e, 1
  arrays = dict(input_word_ids=np.stack([w.word_ids for w in windows]),
                input_mask=np.stack([w.mask for w in windows]),
                input_type_ids=np.stack([w.type_ids for w in windows]), **gold)
  if segments is not None:
    arrays["segment"] = np.asarray(segments, np.int32)
  return arrays


def plan_batches(sizes: Sequence[int], batch_size: int, epochs: float,
                 rng: np.random.RandomState, steps: int = 0) -> List[List[int]]:
  """Training batches as lists of questions (indices into ``sizes``, each question's window
  count): whole questions, shuffled each pass and packed in order into ``batch_size`` rows (a
  batch that the next question does not fit is closed and padded). ``epochs`` passes, so that
  every question is seen ``epochs`` times (a fractional last pass takes the first questions of
  its shuffle), unless ``steps`` > 0 asks for exactly that many batches."""
  if max(sizes) > batch_size:
    raise GoldReaderError(f"a question has {max(sizes)} windows, more than "
                          f"--batch_size={batch_size}; raise --batch_size or --stride")
  batches: List[List[int]] = [[]]
  filled, taken = 0, 0
  total = max(1, round(epochs * len(sizes)))
  while (len(batches) <= steps) if steps else (taken < total):
    for i in rng.permutation(len(sizes)):
      if not steps and taken == total:
        break
      if filled + sizes[i] > batch_size:
        batches.append([])
        filled = 0
      batches[-1].append(int(i))
      filled += sizes[i]
      taken += 1
  return batches[:steps] if steps else batches


def batch_of(groups: Sequence[Sequence[Window]], questions: Sequence[int],
             batch_size: int) -> Dict[str, np.ndarray]:
  """The features of one planned batch: its questions' windows, each window's ``segment``
  (its question's place in the batch; -1 for the padding rows after them)."""
  rows = [w for q in questions for w in groups[q]]
  segments = [n for n, q in enumerate(questions) for _ in groups[q]]
  pad = batch_size - len(rows)
  return batch_arrays(rows + [rows[0]] * pad, segments + [-1] * pad)


def question_loss(logits, correct, segment):
  """ORQA's reader loss per question, over every span of all its windows (as over its read
  blocks): ``logsumexp(all) - logsumexp(gold)``, averaged over the batch's questions."""
  n = tf.shape(logits)[0]
  real = segment >= 0
  ids = tf.where(real, segment, n - 1)   # padding joins a segment its weight then drops

  def segment_logsumexp(x):
    top = tf.math.unsorted_segment_max(tf.where(real, x, -1e9), ids, n)
    present = tf.math.unsorted_segment_max(tf.cast(real, tf.float32), ids, n) > 0
    top = tf.where(present, top, 0.0)
    total = tf.math.unsorted_segment_sum(tf.where(real, tf.exp(x - tf.gather(top, ids)), 0.0),
                                         ids, n)
    return top + tf.math.log(tf.where(present, total, 1.0)), present

  everything, present = segment_logsumexp(tf.reduce_logsumexp(logits, -1))
  gold, _ = segment_logsumexp(
      tf.reduce_logsumexp(logits + openqa_losses.mask_to_score(correct), -1))
  per_question = tf.where(present, everything - gold, 0.0)
  return tf.reduce_sum(per_question) / tf.maximum(tf.reduce_sum(tf.cast(present, tf.float32)),
                                                  1.0)


# ------------------------------------------------------------------------------- the model --

def reader_head() -> Dict[str, int]:
  """The Open-QA reader head of ``openqa_cpu__real_text.yaml`` (``span_hidden_size``,
  ``max_span_width``), so that stage B restores what stage A trained."""
  with open(OPENQA_YAML, encoding="utf-8") as f:
    reader = yaml.safe_load(f)["task"]["model"]["reader"]
  return {k: int(reader[k]) for k in ("span_hidden_size", "max_span_width")}


def span_logits(reader, features, max_span_width: int, training: bool):
  """Span scores ``[b, C]`` (invalid spans at ORQA's -10000) and the spans' starts/ends."""
  inputs = {k: features[k] for k in ("input_word_ids", "input_mask", "input_type_ids")}
  sequence = reader(inputs, training=training)["sequence_output"]
  starts, ends, valid = span_scorer.candidate_spans(inputs["input_type_ids"],
                                                    inputs["input_mask"], max_span_width)
  logits = tf.cast(reader.span_scorer(sequence, starts, ends), tf.float32)
  return logits + openqa_losses.mask_to_score(valid), starts, ends


def load_reader(reader_dir: str, require_head: bool = False):
  """The model config of ``reader_dir`` with the Open-QA head, and its reader (BERT restored
  from the directory's newest checkpoint, every BERT variable required; the span scorer fresh
  unless the checkpoint has one, which ``require_head`` requires)."""
  config = model_dir_lib.load_config(reader_dir)
  config = config.replace(reader=config.reader.replace(**reader_head()))
  reader = factory.build_reader(config.reader, with_span_scorer=True)
  checkpoint = model_dir_lib.resolve_checkpoint(reader_dir)
  has_head = any(n.startswith("reader/span_scorer/") for n in
                 tf.train.load_checkpoint(checkpoint).get_variable_to_shape_map())
  if require_head and not has_head:
    raise GoldReaderError(f"{checkpoint} has no span scorer (reader/span_scorer): it is not a "
                          "trained reader; train one with python -m "
                          "experiments.real_text.gold_reader")
  # Without a trained head the scorer starts fresh (ORQA's start): the rest must match.
  model_dir_lib.restore(checkpoint, reader=reader if has_head else tf.train.Checkpoint(
      encoder=reader.encoder, masked_lm=reader.masked_lm))
  return config, reader


def f1_score(prediction: str, answers: Sequence[str]) -> float:
  """SQuAD's token F1 (on ORQA's normalization), the best over ``answers``."""
  got = answers_lib.normalize_answer(prediction).split()
  best = 0.0
  for answer in answers:
    want = answers_lib.normalize_answer(answer).split()
    common = sum((collections.Counter(got) & collections.Counter(want)).values())
    if common:
      precision, recall = common / len(got), common / len(want)
      best = max(best, 2 * precision * recall / (precision + recall))
  return best


def mean_interval(values: Sequence[float]) -> Dict[str, float]:
  """The mean and its 95% normal interval over questions (F1 is not a proportion)."""
  values = np.asarray(values, np.float64)
  half = 1.959964 * values.std(ddof=1) / math.sqrt(len(values)) if len(values) > 1 else 0.0
  return {"value": float(values.mean()), "lo": float(values.mean() - half),
          "hi": float(values.mean() + half)}


def predict(reader, blocks, windows: Sequence[Window], questions: Sequence[Question],
            max_span_width: int, batch_size: int) -> List[Dict]:
  """Each question's best span over its windows: ``{"question", "prediction", "answers",
  "em", "f1", "score"}``, in question order."""

  @tf.function
  def best(features):
    logits, starts, ends = span_logits(reader, features, max_span_width, training=False)
    top = tf.argmax(logits, axis=-1, output_type=tf.int32)
    return (tf.gather(logits, top, batch_dims=1), tf.gather(starts, top, batch_dims=1),
            tf.gather(ends, top, batch_dims=1))

  found: Dict[int, Tuple[float, int, int]] = {}
  for b in range(0, len(windows), batch_size):
    chunk = list(windows[b:b + batch_size])
    pad = batch_size - len(chunk)   # one traced shape
    arrays = batch_arrays(chunk + [chunk[-1]] * pad)
    scores, starts, ends = best({k: tf.constant(v) for k, v in arrays.items()
                                 if k.startswith("input_")})
    for w, score, s, e in zip(chunk, scores.numpy(), starts.numpy(), ends.numpy()):
      if w.question not in found or score > found[w.question][0]:
        found[w.question] = (float(score), w.start + int(s) - w.offset,
                             w.start + int(e) - w.offset)
  rows = []
  for i, q in enumerate(questions):
    score, s, e = found[i]
    text = predict_lib.span_text(blocks[q.paragraph], s, e)
    rows.append(dict(question=q.question, prediction=text, answers=q.answers,
                     em=bool(answers_lib.is_correct(text, q.answers)),
                     f1=f1_score(text, q.answers), score=score))
  return rows


# ---------------------------------------------------------------------------- the training --

def train(reader_dir: str, output_dir: str, squad_file: str, settings: Settings = Settings(),
          max_articles: int = 0, max_paragraphs: int = 0, say=print) -> Dict:
  """Stage A (module docstring); returns ``done.json``'s summary."""

  settings.check()
  start_time = time.time()
  config, reader = load_reader(reader_dir)
  width = config.reader.max_span_width
  tokenizer = tokenization.RealmTokenizer(config.vocab_file)
  paragraphs, questions = read_split(squad_file, "train", max_articles, max_paragraphs)
  if not questions:
    raise GoldReaderError(f"{squad_file}: no train question (too few --max_articles?)")
  _, windows, counts = make_windows(tokenizer, paragraphs, questions, settings, width)
  # A question trains when one of its windows holds a gold span; all its windows train with it.
  by_question = collections.defaultdict(list)
  for w in windows:
    by_question[w.question].append(w)
  groups = [g for g in by_question.values() if any(w.gold for w in g)]
  plan = plan_batches([len(g) for g in groups], settings.batch_size, settings.epochs,
                      np.random.RandomState(settings.seed), settings.steps)
  steps = len(plan)
  warmup = int(settings.warmup * steps)
  say(f"gold reader: {len(questions)} train questions, {len(groups)} with an answer span "
      f"({counts}); {steps} steps of {settings.batch_size} (lr {settings.learning_rate}, "
      f"warm-up {warmup})")

  optimizer = optimization.create_optimizer(settings.learning_rate, steps, warmup)
  # The span loss reaches neither the pooler nor the masked-LM head: they stay as they were.
  variables = [v for v in reader.trainable_variables
               if "pooler_transform" not in v.name and "/cls/predictions/" not in v.name]

  @tf.function
  def train_step(features):
    with tf.GradientTape() as tape:
      logits, starts, ends = span_logits(reader, features, width, training=True)
      correct = openqa_losses.correct_spans(starts, ends, features["gold_starts"],
                                            features["gold_ends"], features["gold_mask"])
      loss = question_loss(logits, correct, features["segment"])
    grads = tape.gradient(loss, variables)
    grads, _ = tf.clip_by_global_norm(grads, 1.0)
    optimizer.apply_gradients(zip(grads, variables))
    return loss

  tf_keras.utils.set_random_seed(settings.seed)
  writer = tf.summary.create_file_writer(os.path.join(output_dir, "train"))
  losses, train_start = [], time.time()
  for step, questions_of_batch in enumerate(plan, start=1):
    arrays = batch_of(groups, questions_of_batch, settings.batch_size)
    loss = float(train_step({k: tf.constant(v) for k, v in arrays.items()}))
    losses.append(loss)
    if step % 10 == 0 or step == steps:
      with writer.as_default():
        tf.summary.scalar("loss", np.mean(losses[-10:]), step=step)
        tf.summary.scalar("learning_rate", optimizer.learning_rate(step), step=step)
    if step % 50 == 0 or step == steps:
      per_step = (time.time() - train_start) / step
      say(f"gold reader: step {step}/{steps}, loss {np.mean(losses[-50:]):.3f}, "
          f"{per_step:.2f} s/step, {per_step * (steps - step) / 60:.1f} min left")
  writer.flush()
  train_seconds = time.time() - train_start

  checkpoint_dir = os.path.abspath(output_dir)
  model_dir_lib.write_metadata(checkpoint_dir, config, config.vocab_file)
  manager = tf.train.CheckpointManager(model_dir_lib.make_checkpoint(reader=reader),
                                       checkpoint_dir, max_to_keep=1, checkpoint_name="ckpt")
  checkpoint = manager.save(checkpoint_number=steps)

  dev = score_split(reader, config, squad_file, "dev", settings,
                    range(settings.dev_questions) if settings.dev_questions else None,
                    max_articles, max_paragraphs,
                    os.path.join(output_dir, "dev_predictions.jsonl"))
  em, f1 = dev["exact_match"], dev["f1"]
  summary = dict(settings=dataclasses.asdict(settings), checkpoint=checkpoint, steps=steps,
                 warmup_steps=warmup, train_questions=len(questions),
                 train_counts=counts, dev_questions=dev["questions"], dev_counts=dev["counts"],
                 first_losses=[round(x, 4) for x in losses[:10]],
                 last_loss=round(float(np.mean(losses[-50:])), 4),
                 dev_exact_match=em, dev_f1=f1, train_seconds=round(train_seconds, 1),
                 seconds=round(time.time() - start_time, 1))
  write_json(os.path.join(output_dir, "done.json"), summary)
  say(f"gold reader: dev EM {em['value']:.3f} [{em['lo']:.3f}, {em['hi']:.3f}], F1 "
      f"{f1['value']:.3f} on {dev['questions']} dev questions; {summary['seconds']:.0f} s")
  return summary


def score_split(reader, config, squad_file: str, split: str, settings: Settings,
                indices: Optional[Sequence[int]] = None, max_articles: int = 0,
                max_paragraphs: int = 0, predictions_file: str = "") -> Dict:
  """The reader on one split's questions (those at ``indices`` of ``read_split``'s order;
  all when None), each with its own paragraph: EM and F1 with 95% intervals, the window
  counts; every prediction in ``predictions_file`` (JSON lines) when given."""
  paragraphs, questions = read_split(squad_file, split, max_articles, max_paragraphs)
  if indices is not None:
    questions = [questions[i] for i in indices if i < len(questions)]
  if not questions:
    raise GoldReaderError(f"{squad_file}: no {split} question (too few --max_articles?)")
  tokenizer = tokenization.RealmTokenizer(config.vocab_file)
  width = config.reader.max_span_width
  blocks, windows, counts = make_windows(tokenizer, paragraphs, questions, settings, width)
  rows = predict(reader, blocks, windows, questions, width, settings.eval_batch_size)
  if predictions_file:
    with open(predictions_file, "w", encoding="utf-8") as f:
      for row in rows:
        f.write(json.dumps(row, ensure_ascii=False) + "\n")
  return dict(questions=len(rows), counts=counts, rows=rows,
              exact_match=proportion([r["em"] for r in rows]),
              f1=mean_interval([r["f1"] for r in rows]))


def evaluate(model_dir: str, squad_file: str, split: str, settings: Settings = Settings(),
             indices: Optional[Sequence[int]] = None, max_articles: int = 0,
             max_paragraphs: int = 0, predictions_file: str = "") -> Dict:
  """``score_split`` of a trained reader directory (restored strictly, its span scorer
  required): e.g. the gold-paragraph row of real_text's Open-QA table on its test sample."""
  config, reader = load_reader(model_dir, require_head=True)
  return score_split(reader, config, squad_file, split, settings, indices, max_articles,
                     max_paragraphs, predictions_file)


# ---------------------------------------------------------------------------- command line --

def define_flags() -> None:
  """The flags (defined only when run as a program; ``real_text`` has flags of its own)."""
  flags.DEFINE_string("reader_dir", None, "The reader to start from: a model directory "
                      "(realm-convert --hf_dir --targets=reader, e.g. real_text's "
                      "work/minilm_reader_model).")
  flags.DEFINE_string("output_dir", None, "Where the trained reader's model directory goes.")
  flags.DEFINE_string("squad_file", str(assets.SQUAD_DEV), "SQuAD v1.1 JSON (or .json.gz).")
  flags.DEFINE_integer("max_articles", 0, "Only the first N articles (0: all).")
  for field in dataclasses.fields(Settings):
    define = flags.DEFINE_integer if field.type is int else flags.DEFINE_float
    define(field.name, field.default, f"Settings.{field.name}")
  flags.mark_flags_as_required(["reader_dir", "output_dir"])


def main(argv):
  del argv
  settings = Settings(**{field.name: FLAGS[field.name].value
                         for field in dataclasses.fields(Settings)})
  os.makedirs(FLAGS.output_dir, exist_ok=True)
  train(FLAGS.reader_dir, FLAGS.output_dir, FLAGS.squad_file, settings, FLAGS.max_articles,
        say=Clock("gold_reader").say)


def run():
  define_flags()
  app.run(main)


if __name__ == "__main__":
  run()
