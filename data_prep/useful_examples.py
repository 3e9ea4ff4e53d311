r"""How much a pre-training corpus X can teach a retriever over Z, counted without any model.

A masked sentence teaches retrieval only when retrieving helps to fill it. A *possible example*
is a training sentence of X with one of its salient spans as the answer (training draws a
sentence's salient span afresh at each read, so every span is one). It is **useful** when:

* the sentence keeps at least one other salient span (entity or date) unmasked, and
* some block of Z that the example may retrieve (for X = Z, any block but the sentence's own)
  names the answer together with every salient span left in the sentence, and names no other
  candidate of the answer's kind (no other span with the answer's label, beyond those spans).

Such a block both can be found from what the sentence shows and gives the answer away. A
useful example counts for every fact the sentence states (it contains the fact's subject and
object) whose subject or object is the answer. Reported for the facts of a world: useful
examples per fact, and the share of facts with at least one, over all facts and over the facts
of the test questions. A block "names" a span when one of its sentences has it as a salient
span or its title is that span's text, as annotated by ``data_prep.salient_spans``.

Command line, over the sentences of Z and of X (``data_prep.salient_spans``' output)::

  python -m data_prep.useful_examples --z_sentences_dir data/sentences --facts_file \
      world/facts.jsonl --eval_fraction 0.2 [--x_sentences_dir news/sentences \
      --x_eval_fraction 0] [--qa_test_file world/qa-test.jsonl]

``python -m experiments.synthetic.tables --check_news`` prints it for the tables' world.
"""

import collections
import glob
import json
import os
import re
from typing import Dict, Iterable, List, Optional, Sequence

from absl import flags

from data_prep import cli
from data_prep import pretrain_examples


def read_sentences(sentences_dir: str) -> List[Dict]:
  """Every sentence record (``realm_tf.data.features.SENTENCE_FIELDS``) of ``sentences_dir``,
  each with ``spans_text``: ``[(text, label)]`` of its salient spans."""
  paths = sorted(glob.glob(os.path.join(sentences_dir, "sentences-*.jsonl")))
  if not paths:
    raise FileNotFoundError(f"no sentences-*.jsonl in {sentences_dir} (data_prep.salient_spans "
                            "writes them)")
  out = []
  for path in paths:
    with open(path, encoding="utf-8") as f:
      for line in f:
        if line.strip():
          r = json.loads(line)
          raw = r["sentence"].encode("utf-8")
          r["spans_text"] = [(raw[s["span_byte_start"]:s["span_byte_limit"]].decode("utf-8"),
                              s["label"]) for s in r["spans"]]
          out.append(r)
  return out


class Blocks:
  """Z's blocks as the names they hold: ``{block_uid: {span text: label}}`` and its inverse."""

  def __init__(self, sentences: Iterable[Dict]):
    sentences = list(sentences)
    label_of = {t: l for r in sentences for t, l in r["spans_text"]}
    self.names = collections.defaultdict(dict)
    for r in sentences:
      names = self.names[r["block_uid"]]
      names.update(r["spans_text"])
      if r["title"] in label_of:
        names.setdefault(r["title"], label_of[r["title"]])
    self.holding = collections.defaultdict(set)
    for uid, names in self.names.items():
      for text in names:
        self.holding[text].add(uid)

  def teaches(self, answer: str, label: str, kept: Sequence[str], own: Optional[str]) -> bool:
    """Whether a block other than ``own`` names ``answer`` and every span of ``kept`` and no
    other span labelled ``label``."""
    if not kept:
      return False
    found = set.intersection(*(self.holding.get(t, set()) for t in [answer, *kept]))
    found.discard(own)
    allowed = {answer, *kept}
    return any(all(t in allowed for t, l in self.names[uid].items() if l == label)
               for uid in found)


def count_useful(z_sentences: Sequence[Dict], facts: Sequence[Dict], eval_fraction: float,
                 x_sentences: Optional[Sequence[Dict]] = None, x_eval_fraction: float = 0.0,
                 test_facts: Optional[Sequence[int]] = None) -> Dict:
  """Useful examples of X's training sentences (X = Z when ``x_sentences`` is None), per fact.

  A sentence trains when ``pretrain_examples.split_of(block_uid, eval_fraction)`` (X's
  ``x_eval_fraction``) is ``"train"``, as the pre-training examples pipeline splits. Returns
  ``{"possible", "useful", "per_fact", "share", "facts"}`` and, with ``test_facts`` (indices
  into ``facts``), ``test_per_fact``, ``test_share`` and ``test_facts``; ``counts`` holds each
  fact's useful examples.
  """
  blocks = Blocks(z_sentences)
  same = x_sentences is None
  x_sentences, fraction = (z_sentences, eval_fraction) if same else (x_sentences,
                                                                      x_eval_fraction)
  by_answer = collections.defaultdict(list)
  for i, f in enumerate(facts):
    by_answer[f["subject"]].append((i, f["object"]))
    by_answer[str(f["object"])].append((i, f["subject"]))
  counts = [0] * len(facts)
  possible = useful = 0
  for r in x_sentences:
    if pretrain_examples.split_of(r["block_uid"], fraction) != "train":
      continue
    spans = dict(r["spans_text"])
    for answer, label in spans.items():
      possible += 1
      kept = [t for t in spans if t != answer]
      if not blocks.teaches(answer, label, kept, r["block_uid"] if same else None):
        continue
      useful += 1
      for i, other in by_answer.get(answer, ()):
        if str(other) in r["sentence"]:
          counts[i] += 1

  def summary(indices):
    n = len(indices)
    return (sum(counts[i] for i in indices) / n if n else float("nan"),
            sum(1 for i in indices if counts[i]) / n if n else float("nan"))

  out = {"possible": possible, "useful": useful, "facts": len(facts), "counts": counts}
  out["per_fact"], out["share"] = summary(range(len(facts)))
  if test_facts is not None:
    out["test_per_fact"], out["test_share"] = summary(list(test_facts))
    out["test_facts"] = len(test_facts)
  return out


def unseen_wordpieces(templates: Iterable[str], z_texts: Iterable[str], tokenize) -> Dict:
  """The share of the templates' distinct wordpieces (slots ``{...}`` removed) that no text of
  ``z_texts`` has, with ``tokenize`` (text -> wordpieces); and those wordpieces."""
  seen = {p for t in z_texts for p in tokenize(t)}
  pieces = {p for t in templates for p in tokenize(re.sub(r"\{[a-z_]+\}", " ", t))}
  unseen = sorted(pieces - seen)
  return {"share_unseen": len(unseen) / len(pieces) if pieces else 0.0, "unseen": unseen,
          "wordpieces": len(pieces)}


def compare(z_sentences_dir: str, facts: Sequence[Dict], eval_fraction: float,
            x_sentences_dir: str, x_eval_fraction: float = 0.0,
            test_facts: Optional[Sequence[int]] = None) -> Dict[str, Dict]:
  """:func:`count_useful` for X = Z and for X = the corpus of ``x_sentences_dir``."""
  z = read_sentences(z_sentences_dir)
  out = {"x_is_z": count_useful(z, facts, eval_fraction, test_facts=test_facts)}
  out["x"] = count_useful(z, facts, eval_fraction, read_sentences(x_sentences_dir),
                          x_eval_fraction, test_facts)
  return out


def shortfall(result: Dict[str, Dict]) -> List[str]:
  """What X lacks against X = Z (useful examples per fact, share of facts with one); empty
  when X is at least X = Z on both."""
  z, x = result["x_is_z"], result["x"]
  return [f"{name}: X {x[key]:.3f} < X = Z {z[key]:.3f}"
          for key, name in (("per_fact", "useful examples per fact"),
                            ("share", "share of facts with a useful example"))
          if x[key] < z[key]]


def lines(result: Dict[str, Dict]) -> List[str]:
  """The check as printed lines."""
  out = []
  for key, name in (("x_is_z", "X = Z"), ("x", "X = news")):
    r = result[key]
    line = (f"{name:9s}: {r['useful']} useful of {r['possible']} possible examples; "
            f"{r['per_fact']:.2f} per fact, {100 * r['share']:.1f}% of {r['facts']} facts have "
            "one")
    if "test_facts" in r:
      line += (f"; test facts: {r['test_per_fact']:.2f} per fact, {100 * r['test_share']:.1f}% "
               f"of {r['test_facts']}")
    out.append(line)
  return out


def define_flags() -> None:
  flags.DEFINE_string("z_sentences_dir", None, "Z's sentences (data_prep.salient_spans).")
  flags.DEFINE_string("x_sentences_dir", None, "X's sentences; none: X = Z only.")
  flags.DEFINE_string("facts_file", None, "The world's facts.jsonl.")
  flags.DEFINE_string("qa_test_file", None, "qa-test.jsonl: also count the test questions' "
                      "facts (the world's qa.jsonl beside facts_file pairs them).")
  flags.DEFINE_float("eval_fraction", 0.02, "Z's held-out share (data_prep's --eval_fraction).")
  flags.DEFINE_float("x_eval_fraction", 0.0, "X's held-out share.")
  flags.mark_flags_as_required(["z_sentences_dir", "facts_file"])


def _jsonl(path: str) -> List[Dict]:
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


def test_fact_indices(qa_file: str, qa_test_file: str) -> List[int]:
  """Indices into the world's facts of the test questions (``qa.jsonl[i]`` asks fact i)."""
  index = {q["question"]: i for i, q in enumerate(_jsonl(qa_file))}
  return [index[q["question"]] for q in _jsonl(qa_test_file)]


def main(argv):
  del argv
  f = flags.FLAGS
  facts = _jsonl(f.facts_file)
  test = (test_fact_indices(os.path.join(os.path.dirname(f.facts_file), "qa.jsonl"),
                            f.qa_test_file) if f.qa_test_file else None)
  if f.x_sentences_dir:
    result = compare(f.z_sentences_dir, facts, f.eval_fraction, f.x_sentences_dir,
                     f.x_eval_fraction, test)
  else:
    result = {"x_is_z": count_useful(read_sentences(f.z_sentences_dir), facts,
                                     f.eval_fraction, test_facts=test)}
  for key, name in (("x_is_z", "X = Z"), ("x", "X")):
    if key in result:
      print(json.dumps({name: {k: v for k, v in result[key].items() if k != "counts"}}))


if __name__ == "__main__":
  cli.run(main, define_flags)
