"""Answer matching: the block rule, and exact match as ORQA's eval_utils defines it."""

import json
import pathlib
import re

import pytest

from experiments import assets
from realm_tf.data import answers



def test_holds_answer_is_whole_words():
  assert answers.holds_answer("He moved to Paris, in 1820.", "paris")
  assert answers.holds_answer("born in New  York City", "new york")
  assert not answers.holds_answer("Anne Boleyn", "Ann")
  assert not answers.holds_answer("anything", "")


@pytest.mark.parametrize("prediction,answer,want", [
    ("The Beatles", "beatles", True),               # articles
    ("a dog", "the dog", True),
    ("theatre", "atre", False),                     # an article only as a whole word
    ("U.S.", "US", True),                           # punctuation
    ("rock 'n' roll", "rock n roll", True),
    ("  New\tYork  ", "new york", True),            # whitespace
    ("Caf\u00e9", "Cafe\u0301", True),              # composed vs decomposed accent
    ("Caf\u00e9", "Cafe", False),                   # the accent stays a difference
    ("Ni\u00f1o", "NI\u00d1O", True),               # case, beyond ASCII
    ("1,000", "1000", True),
    ("", "", True),
])
def test_exact_match_table(prediction, answer, want):
  assert answers.exact_match(prediction, answer) is want


@pytest.mark.parametrize("prediction,pattern,want", [
    ("Paris, France", "Paris", True),               # re.match: anchored at the start...
    ("in Paris", "Paris", False),
    ("Parisian", "Paris$", False),                  # ...and at the end only with $
    ("paris", "PARIS", True),                       # ignore case
    ("Abraham Lincoln", r"(Abe|Abraham)\s?Lincoln", True),
    ("anything", "(unclosed", False),               # an invalid pattern never matches
    ("anything", "*", False),
])
def test_regex_match_table(prediction, pattern, want):
  assert answers.regex_match(prediction, pattern) is want


def test_is_correct_takes_any_answer():
  assert answers.is_correct("Lincoln", ["Washington", "lincoln"])
  assert not answers.is_correct("Lincoln", [])
  assert answers.is_correct("Lincoln", ["(bad", "Lin"], is_regex=True)


def test_every_curated_trec_test_pattern_loads():
  """The 694 CuratedTrec test questions: every pattern is tried, an invalid one is no match."""
  rows = [json.loads(l) for l in open(assets.CURATED_TREC_TEST, encoding="utf-8")]
  assert len(rows) == 694
  invalid = 0
  for row in rows:
    for pattern in row["answer"]:
      try:
        re.compile(pattern)
      except re.error:
        invalid += 1
        assert not answers.regex_match("anything", pattern)
    assert answers.is_correct(row["question"], row["answer"], is_regex=True) in (True, False)
  # A string that the pattern itself describes literally matches when the pattern is literal.
  literal = [p for r in rows for p in r["answer"] if re.fullmatch(r"[A-Za-z ]+", p)]
  assert literal and all(answers.regex_match(p, p) for p in literal)
  print(f"{invalid} invalid patterns")
