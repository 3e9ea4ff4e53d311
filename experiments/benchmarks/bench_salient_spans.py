"""Benchmark: salient-span annotation vs spaCy's own ``nlp.pipe`` on the same sentences.

Prints sentences per second for
  (a) spaCy's full pipeline, ``spacy.load(model).pipe(sentences)`` (what a user would write),
  (b) our annotator, ``data_prep.salient_spans.SpanAnnotator.annotate`` (NER only + ruler +
      date regex + span merging),
and their ratio, all measured in one run on the same sentences (the cleaned articles of the
Wikipedia dump slice in assets/, cleaned by ``data_prep.wiki``, split by
``data_prep.text.sentence_spans``).

  python experiments/benchmarks/bench_salient_spans.py [--max_sentences 3000] [--model auto]
"""

import json
import pathlib
import sys
import time

from absl import app
from absl import flags

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from data_prep import salient_spans  # pylint: disable=g-import-not-at-top
from data_prep import text as text_lib  # pylint: disable=g-import-not-at-top
from data_prep import wiki  # pylint: disable=g-import-not-at-top

DEFAULT_ARTICLES = ROOT / "assets" / "wikipedia" / "enwiki-shortened.xml.bz2"

FLAGS = flags.FLAGS
flags.DEFINE_string("articles", str(DEFAULT_ARTICLES),
                    "A MediaWiki dump, or JSON lines of {\"text\": ...}.")
flags.DEFINE_integer("max_sentences", 3000, "Sentences annotated.")
flags.DEFINE_string("model", "auto", "The spaCy model (SpanAnnotator's; auto: the installed one).")
flags.DEFINE_integer("batch_size", 256, "Sentences per batch of both annotators.")


def load_sentences(path, limit):
  """Sentences of the articles of a MediaWiki dump (or of a JSON-lines file of ``"text"``)."""
  if path.endswith((".xml", ".xml.bz2")):
    texts = [wiki.clean_wikitext(p["wikitext"]) for p in wiki.iter_dump_pages(path)
             if wiki.page_drop_reason(p) is None]
  else:
    texts = [json.loads(l)["text"] for l in open(path, encoding="utf-8")]
  out = []
  for text, spans in zip(texts, text_lib.batch_sentence_spans(texts)):
    out.extend(text[s:e] for s, e in spans)
    if len(out) >= limit:
      break
  return out[:limit]


def main(argv):
  del argv
  import spacy  # pylint: disable=g-import-not-at-top  # Heavy: not loaded for --help.
  sentences = load_sentences(FLAGS.articles, FLAGS.max_sentences)
  ours = salient_spans.SpanAnnotator(FLAGS.model, batch_size=FLAGS.batch_size)
  if not ours.has_statistical_model:
    sys.exit("no spaCy statistical model installed; nothing to compare with")
  full = spacy.load(ours.model_name)
  ours.annotate(sentences[:50])  # Warm up both.
  list(full.pipe(sentences[:50]))

  start = time.perf_counter()
  docs = list(full.pipe(sentences, batch_size=FLAGS.batch_size))
  t_spacy = time.perf_counter() - start
  start = time.perf_counter()
  spans = ours.annotate(sentences)
  t_ours = time.perf_counter() - start

  n = len(sentences)
  print(f"sentences: {n} (from {FLAGS.articles})")
  print(f"model: {ours.model_name}; ours: {ours.description}; spaCy: {'+'.join(full.pipe_names)}")
  print(f"spaCy nlp.pipe (full pipeline): {n / t_spacy:8.1f} sentences/s ({t_spacy:.2f} s, "
        f"{sum(len(d.ents) for d in docs)} entities)")
  print(f"ours (salient spans):           {n / t_ours:8.1f} sentences/s ({t_ours:.2f} s, "
        f"{sum(len(s) for s in spans)} spans)")
  print(f"ratio ours / spaCy: {t_spacy / t_ours:.2f}x")


if __name__ == "__main__":
  app.run(main)
