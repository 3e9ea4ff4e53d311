r"""SQuAD v1.1 as an Open-QA corpus and question set: paragraphs -> documents, questions -> QA.

SQuAD's questions were written while reading one paragraph of one Wikipedia article, so every
paragraph becomes a document of its own, titled by its article, and every question a QA record
(``realm_tf.data.qa``: ``{"question", "answers", "answer_type": "text"}``) whose answers are the
distinct answer strings the annotators gave, in their order.

Titles: SQuAD stores an article's title in its URL form (``Fresno,_California``,
``Sky_(United_Kingdom)``); :func:`display_title` gives the title Wikipedia shows (``Fresno,
California``), so that a SQuAD document is titled as a dump article of the same page would be:
with the underscores, every block of the article would carry an ``_`` wordpiece between its
title words, and to a word tokenizer such as BM25's (``\w+``) ``Super_Bowl_50`` is one word that
no question contains.

Splits: by article, never by question (questions of one article share its paragraphs, so a
question split would leak the test articles into training). :func:`split_of` puts an article
in ``train``, ``dev`` or ``test`` by the MD5 of its display title, so the split is the same on
every machine and in every Python process (unlike ``hash()``).
"""

import gzip
import hashlib
import json
import os
import urllib.parse
from typing import Dict, Iterator, List, Sequence, Tuple

from realm_tf import errors
from realm_tf.data import manifests
from realm_tf.data import qa

SPLITS = qa.SPLITS
DEFAULT_FRACTIONS = (0.6, 0.2, 0.2)


class SquadFormatError(manifests.DataError):
  """A SQuAD file that is not SQuAD v1.1 JSON; the message names the file and the fix."""


class SplitError(errors.RealmError, ValueError):
  """Split fractions that are not three shares summing to 1."""


def display_title(title: str) -> str:
  """SQuAD's URL-form article title -> the title Wikipedia shows.

  Percent escapes are decoded and underscores become spaces: ``Fresno,_California`` ->
  ``Fresno, California``; ``Beyonc%C3%A9`` -> ``Beyoncé``.
  """
  return " ".join(urllib.parse.unquote(title).replace("_", " ").split())


def read_squad(path: str) -> List[Dict]:
  """The ``data`` list of a SQuAD v1.1 file (``.json`` or ``.json.gz``).

  Raises:
    manifests.MissingDataError: ``path`` does not exist.
    SquadFormatError: not JSON, or not ``{"data": [{"title", "paragraphs": [...]}, ...]}``.
  """
  if not os.path.exists(path):
    raise manifests.MissingDataError(f"SQuAD file not found: {path} (assets/squad/ has the v1.1 "
                                     "dev set; see assets/SOURCES.md)")
  opener = gzip.open if path.endswith(".gz") else open
  try:
    with opener(path, "rt", encoding="utf-8") as f:
      data = json.load(f)
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    raise SquadFormatError(f"{path} is not a SQuAD JSON file ({e}); pass the official "
                           "dev-v1.1.json or its gzip") from e
  articles = data.get("data") if isinstance(data, dict) else None
  if not isinstance(articles, list) or not all(
      isinstance(a, dict) and isinstance(a.get("title"), str)
      and isinstance(a.get("paragraphs"), list) for a in articles):
    raise SquadFormatError(f"{path}: expected {{\"data\": [{{\"title\", \"paragraphs\"}}, ...]}} "
                           "(SQuAD v1.1); pass the official dev-v1.1.json or its gzip")
  return articles


def read_articles(path: str, max_articles: int = 0, max_paragraphs: int = 0) -> List[Dict]:
  """``read_squad``'s articles, the first ``max_articles`` with their first ``max_paragraphs``
  (0: all): the corpus and the questions of a quick run come from the same paragraphs."""
  articles = read_squad(path)
  if max_articles:
    articles = articles[:max_articles]
  if max_paragraphs:
    articles = [dict(a, paragraphs=a["paragraphs"][:max_paragraphs]) for a in articles]
  return articles

def documents(articles: Sequence[Dict]) -> Iterator[Dict]:
  """One ``{"title", "text"}`` per paragraph (the blocks pipeline's JSON-lines input)."""
  for article in articles:
    title = display_title(article["title"])
    for paragraph in article["paragraphs"]:
      yield {"title": title, "text": paragraph["context"]}


def questions(articles: Sequence[Dict]) -> Iterator[Tuple[str, qa.QARecord]]:
  """``(display title, QA record)`` of every question that has an answer, in file order."""
  for article in articles:
    title = display_title(article["title"])
    for paragraph in article["paragraphs"]:
      for item in paragraph.get("qas", []):
        answers = list(dict.fromkeys(a["text"] for a in item.get("answers", [])
                                     if a.get("text", "").strip()))
        if item.get("question", "").strip() and answers:
          yield title, qa.QARecord(item["question"], answers, qa.TEXT)


def split_of(title: str, fractions: Sequence[float] = DEFAULT_FRACTIONS) -> str:
  """``train``, ``dev`` or ``test`` for an article, from the MD5 of its title.

  ``fractions`` are the shares of train, dev and test (they must sum to 1). The first 8 bytes
  of the digest, read as a number in [0, 1), fall into one of the three intervals.
  """
  if len(fractions) != 3 or min(fractions) < 0 or abs(sum(fractions) - 1.0) > 1e-6:
    raise SplitError(f"split fractions {list(fractions)}: give three shares (train, dev, "
                     "test) summing to 1, e.g. 0.6,0.2,0.2")
  digest = hashlib.md5(title.encode("utf-8")).digest()
  point = int.from_bytes(digest[:8], "big") / 2.0**64
  edge = 0.0
  for name, share in zip(SPLITS, fractions):
    edge += share
    if point < edge:
      return name
  return SPLITS[-1]
