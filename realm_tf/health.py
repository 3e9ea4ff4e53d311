"""Retrieval health: is REALM's retriever learning, or collapsing?

REALM trains its retriever only through the reader: a candidate's score rises when reading it
predicts the masked words better than the other candidates do. When that signal is wrong or
too weak, the retriever degrades quietly while the masked-LM loss still falls (RAG and Atlas
users call it "retrieval collapse"). These signals make it visible while training.

On the device, per batch (``retrieval_signals``; each a ``(values, weights)`` pair for a
weighted mean, so they pass through Keras ``Mean`` metrics and Model Garden's summaries):

* ``retrieval_entropy_ratio``: entropy of ``p(z|x)`` over the k candidates / ``log k``
  (1: the retriever no longer tells the candidates apart); ``p_null``: the null block's mass;
  ``retrieval_margin``: the top candidate's score less the mean of the others';
* ``candidates_with_answer`` (share of the k - 1 retrieved blocks that hold the masked answer)
  and ``any_candidate_with_answer`` (the training batch's recall@k-1), when the host marks
  the candidates (``candidate_holds_answer``);
* ``reader_gain_answer`` / ``reader_gain_other``: ``log p(y|z,x) - log p(y|null,x)`` per masked
  token, over the retrieved blocks that hold the answer / that do not (without the marks:
  ``reader_gain`` over all). The retriever's gradient pushes a block up exactly when reading it
  beats the marginal, so a reader that gains from answer blocks and loses little on the others
  is what teaches retrieval;
* ``query_cosine`` / ``block_cosine``: mean pairwise cosine of the batch's query embeddings and
  of its retrieved blocks' embeddings (towards 1: a tower maps everything to one vector);
  ``distinct_candidates``: distinct retrieved blocks / retrieved blocks in the batch (low: the
  same blocks for every input).

On the host, ``HealthMonitor`` watches the logged values at every summary and validation and
raises alarms (a logged warning and an ``alarm/<name>`` summary) when a signal crosses its
``configs.HealthConfig`` threshold: the entropy ratio, ``p_null`` or a cosine stays above its
bound for ``patience`` summaries in a row, ``distinct_candidates`` below its bound, or a
validation recall (masked sentences' ``recall@k``, questions' ``qa_recall@k``) below
``recall_drop`` times its first (step-0) value. ``realm-train`` keeps those first values in
``<model_dir>/health_baseline.json`` (``HealthMonitor.persist_to``), so that a resumed run
compares against step 0, not against its first validation after the restart.
``summary_line`` is the one-line health report ``realm-train`` prints at each validation.
"""

import json
import math
from typing import Dict, List, Optional, Tuple

from absl import logging
import tensorflow as tf

# Training-summary signals the alarms watch (name -> HealthConfig threshold field, direction).
_ABOVE = {"retrieval_entropy_ratio": "max_entropy_ratio", "p_null": "max_p_null",
          "query_cosine": "max_cosine", "block_cosine": "max_cosine"}
_BELOW = {"distinct_candidates": "min_distinct_candidates"}

SIGNALS = ("retrieval_entropy_ratio", "p_null", "retrieval_margin", "candidates_with_answer",
           "any_candidate_with_answer", "reader_gain_answer", "reader_gain_other",
           "reader_gain", "query_cosine", "block_cosine", "distinct_candidates")
# With the host's answer marks (``holds_answer``), and without them.
MARKED_SIGNALS = ("candidates_with_answer", "any_candidate_with_answer", "reader_gain_answer",
                  "reader_gain_other")
UNMARKED_SIGNALS = ("reader_gain",)
# The validation recalls' first values, in the model directory.
BASELINE_FILE = "health_baseline.json"


def _mean_pairwise_cosine(vectors: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
  """Mean cosine over the distinct pairs of ``vectors`` ``[n, d]`` (weight 0 when n < 2)."""
  v = tf.math.l2_normalize(tf.cast(vectors, tf.float32), axis=-1)
  n = tf.cast(tf.shape(v)[0], tf.float32)
  total = tf.reduce_sum(tf.square(tf.reduce_sum(v, axis=0)))    # sum over all ordered pairs
  self_pairs = tf.reduce_sum(tf.square(v))                        # n, less any zero vectors
  pairs = n * (n - 1.0)
  return (total - self_pairs) / tf.maximum(pairs, 1.0), tf.cast(pairs > 0, tf.float32)


def _distinct_share(rows: tf.Tensor) -> tf.Tensor:
  """Distinct values / number of values, with static shapes (sort, count the changes)."""
  flat = tf.sort(tf.reshape(tf.cast(rows, tf.int32), [-1]))
  changes = tf.reduce_sum(tf.cast(flat[1:] != flat[:-1], tf.float32))
  size = tf.cast(tf.size(flat), tf.float32)
  return tf.where(size > 0, (changes + 1.0) / tf.maximum(size, 1.0), 1.0)


def retrieval_signals(retrieval_logits, token_log_p_given_z, mlm_weights, query_embedding,
                      candidate_embeddings, candidate_rows=None, holds_answer=None
                      ) -> Dict[str, Tuple[tf.Tensor, tf.Tensor]]:
  """The device-side health signals of one batch (see the module doc); candidate 0 is the
  null block.

  Args:
    retrieval_logits: ``f(x, z)`` ``[b, k]``.
    token_log_p_given_z: ``log p(y_j|z,x)`` ``[b, k, m]`` (``losses.realm_metrics``).
    mlm_weights: ``[b, m]``, 1 for the real mask tokens.
    query_embedding: ``[b, d]``; candidate_embeddings: ``[b, k, d]``.
    candidate_rows: the candidates' corpus rows ``[b, k]``, or None.
    holds_answer: ``[b, k]``, 1 where a candidate holds the masked answer, or None.

  Returns:
    name -> ``(values, weights)``, each broadcastable to the other, for a weighted mean.
  """
  logits = tf.cast(retrieval_logits, tf.float32)
  k = logits.shape[-1]
  log_p_z = tf.nn.log_softmax(logits, axis=-1)
  p_z = tf.exp(log_p_z)
  ones = tf.ones_like(logits[:, 0])
  entropy = -tf.reduce_sum(p_z * log_p_z, axis=-1)
  top = tf.reduce_max(logits, axis=-1)
  rest = (tf.reduce_sum(logits, axis=-1) - top) / max(k - 1, 1)
  # One candidate (the null block alone): the entropy is 0 and the ratio undefined (weight 0).
  out = {"retrieval_entropy_ratio": ((entropy / math.log(k), ones) if k > 1
                                     else (tf.zeros_like(entropy), tf.zeros_like(ones))),
         "p_null": (p_z[:, 0], ones),
         "retrieval_margin": (top - rest, ones)}

  weights = tf.cast(mlm_weights, tf.float32)
  tokens = tf.reduce_sum(weights, axis=-1)                                       # [b]
  per_token = (tf.reduce_sum(tf.cast(token_log_p_given_z, tf.float32) * weights[:, None, :],
                             axis=-1) / tf.maximum(tokens, 1.0)[:, None])        # [b, k]
  gain = per_token[:, 1:] - per_token[:, :1]                                     # [b, k-1]
  real = tf.cast(tokens > 0, tf.float32)[:, None] * tf.ones_like(gain)
  if holds_answer is not None:
    holds = tf.cast(holds_answer, tf.float32)[:, 1:]
    out["candidates_with_answer"] = (tf.reduce_mean(holds, axis=-1), ones)
    out["any_candidate_with_answer"] = (tf.reduce_max(holds, axis=-1), ones)
    out["reader_gain_answer"] = (gain, real * holds)
    out["reader_gain_other"] = (gain, real * (1.0 - holds))
  else:
    out["reader_gain"] = (gain, real)

  out["query_cosine"] = _mean_pairwise_cosine(query_embedding)
  d = tf.shape(candidate_embeddings)[-1]
  out["block_cosine"] = _mean_pairwise_cosine(tf.reshape(candidate_embeddings[:, 1:], [-1, d]))
  if candidate_rows is not None:
    out["distinct_candidates"] = (_distinct_share(candidate_rows[:, 1:]), tf.constant(1.0))
  return out


class HealthMonitor:
  """Host-side alarms over the logged health signals (see the module doc).

  Args:
    config: a ``configs.HealthConfig`` (thresholds, patience).
    recall_keys: the validation recalls watched against their first value.
  """

  def __init__(self, config, recall_keys=("recall@5", "qa_recall@5")):
    self.config = config
    self.recall_keys = tuple(recall_keys)
    self.baseline: Dict[str, float] = {}     # the first validation's recalls (step 0)
    self.baseline_path: Optional[str] = None
    self._streak: Dict[str, int] = {}

  def persist_to(self, path: str):
    """Keeps the baseline in the JSON file ``path`` (e.g. ``<model_dir>/health_baseline.json``):
    loads it when it exists (a resumed run), and writes it whenever a first value is set."""
    self.baseline_path = path
    if tf.io.gfile.exists(path):
      with tf.io.gfile.GFile(path) as f:
        self.baseline = {k: float(v) for k, v in json.load(f).items()}
      logging.info("health baseline from %s: %s", path, self.baseline)

  def _save_baseline(self):
    if self.baseline_path:
      tmp = self.baseline_path + ".tmp"
      with tf.io.gfile.GFile(tmp, "w") as f:
        json.dump(self.baseline, f, indent=1, sort_keys=True)
      tf.io.gfile.rename(tmp, self.baseline_path, overwrite=True)

  def _bound(self, field: str) -> float:
    return float(getattr(self.config, field))

  def observe_train(self, logs: Dict[str, float]) -> List[str]:
    """Alarms raised by one training summary's logs (``name: why`` strings)."""
    alarms = []
    for name, field in list(_ABOVE.items()) + list(_BELOW.items()):
      if name not in logs:
        continue
      value, bound = float(logs[name]), self._bound(field)
      bad = value > bound if name in _ABOVE else value < bound
      self._streak[name] = self._streak.get(name, 0) + 1 if bad else 0
      if self._streak[name] >= self.config.patience:
        side = "above" if name in _ABOVE else "below"
        alarms.append(f"{name}: {value:.3f} {side} {bound:g} for {self._streak[name]} "
                      "summaries in a row")
    return alarms

  def observe_validation(self, logs: Dict[str, float]) -> List[str]:
    """Alarms raised by one validation pass; the first pass sets the recalls' baselines."""
    alarms, first = [], False
    for key in self.recall_keys:
      if key not in logs:
        continue
      value = float(logs[key])
      if key not in self.baseline:
        self.baseline[key], first = value, True
        continue
      floor = self.config.recall_drop * self.baseline[key]
      if self.baseline[key] > 0 and value < floor:
        alarms.append(f"{key}: {value:.3f} below {self.config.recall_drop:g} x its first value "
                      f"{self.baseline[key]:.3f}")
    if first:
      self._save_baseline()
    return alarms

  def check(self, phase: str, step: int, logs: Dict[str, float]) -> Dict[str, float]:
    """Observes ``logs`` (``phase``: "train" or "validation"), logs a warning per alarm and
    returns the summaries to add: ``health_alarms`` (their count) and ``alarm/<signal>`` = 1."""
    if not self.config.enabled:
      return {}
    if phase == "validation" and step == 0:
      self.baseline.clear()     # step 0 sets the baseline, whatever a file from before held
    alarms = (self.observe_train if phase == "train" else self.observe_validation)(logs)
    for alarm in alarms:
      logging.warning("retrieval health alarm at step %d (%s): %s", step, phase, alarm)
    out = {"health_alarms": float(len(alarms))}
    out.update({f"alarm/{a.split(':')[0]}": 1.0 for a in alarms})
    return out

  def summary_line(self, step: int, logs: Dict[str, float], alarms: Optional[Dict] = None) -> str:
    """One line: the validation's health signals, the recalls against step 0, the alarms."""
    def get(name, fmt="{:.2f}"):
      return fmt.format(logs[name]) if name in logs else "n/a"
    parts = [f"entropy {get('retrieval_entropy_ratio')} log k", f"p(null) {get('p_null')}",
             f"margin {get('retrieval_margin')}",
             f"answer in candidates {get('candidates_with_answer')}",
             f"reader gain answer {get('reader_gain_answer', '{:+.2f}')} / other "
             f"{get('reader_gain_other', '{:+.2f}')}",
             f"cosine q {get('query_cosine')} b {get('block_cosine')}",
             f"distinct {get('distinct_candidates')}"]
    for key in self.recall_keys:
      if key in logs:
        first = self.baseline.get(key)
        parts.append(f"{key} {logs[key]:.3f}" + (f" (first {first:.3f})" if first is not None
                                                   else ""))
    names = sorted(k.split("/", 1)[1] for k in (alarms or {}) if k.startswith("alarm/"))
    verdict = "ALARM: " + ", ".join(names) if names else "ok"
    return f"health @ step {step}: " + "; ".join(parts) + f" -> {verdict}"
