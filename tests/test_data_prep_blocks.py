"""Tests of data_prep.wiki and data_prep.blocks: cleaning, filtering, packing, bad input."""

import bz2
import json
import os
import pathlib

import pytest

from experiments import assets
from data_prep import blocks
from data_prep import wiki
from realm_tf.data import features
from realm_tf.data import manifests
from realm_tf.tokenization import RealmTokenizer

DUMP = str(assets.ENWIKI_DUMP)
VOCAB = str(assets.BERT_VOCAB)


@pytest.fixture(scope="module")
def tokenizer():
  return RealmTokenizer(VOCAB)


@pytest.fixture(scope="module")
def pages():
  return list(wiki.iter_dump_pages(DUMP))


def test_dump_pages_and_filters(pages):
  assert len(pages) == 206
  kept_all = [p for p in pages if wiki.page_drop_reason(p, drop_list_pages=False) is None]
  assert len(kept_all) == 106
  reasons = [wiki.page_drop_reason(p) for p in pages]
  assert reasons.count("redirect") == 99 and reasons.count("non_article_namespace") == 1
  assert all(p["redirect"] for p in pages if wiki.page_drop_reason(p) == "redirect")
  dropped = {p["title"]: r for p, r in zip(pages, reasons) if r in ("list_page",
                                                                    "disambiguation_page")}
  assert dropped["List of anthropologists"] == "list_page"
  assert dropped["Austin (disambiguation)"] == "disambiguation_page"
  assert reasons.count(None) == 106 - len(dropped)


def test_clean_wikitext():
  text = wiki.clean_wikitext(
      "'''Foo''' is a [[bar|baz]] of [[Qux]].{{cite web|x=1}}<ref>hidden</ref>\n"
      "== History ==\n[[File:a.jpg|thumb|caption]]Born in [[Paris]].\n"
      "{| class=wikitable\n|a||b\n|}\n* item one\n[[Category:Things]]")
  assert text == "Foo is a baz of Qux.\n\nHistory\n\nBorn in Paris.\n\nitem one"


def test_pack_units():
  assert blocks.pack_units([3, 4, 2, 6], 7) == [(0, 2), (2, 3), (3, 4)]
  with pytest.raises(ValueError):
    blocks.pack_units([8], 7)


def test_long_sentence_is_cut_not_dropped(tokenizer):
  long_sentence = " ".join(f"word{i} and more" for i in range(300)) + "."
  text = "A short start. " + long_sentence + " The end."
  out = blocks.article_to_blocks("Title", text, tokenizer, 64)
  assert len(out) > 3
  for b in out:
    assert len(b["token_ids"]) <= 64
    assert b["token_ids"] == tokenizer.block_inputs(["Title"], [b["body"]], 64)[
        "input_word_ids"][0].numpy()[:len(b["token_ids"])].tolist()
  assert " ".join(b["body"] for b in out).split() == text.split()


def test_parse_jsonl_article_bad_lines():
  ok, _ = blocks.parse_jsonl_article("f", 1, b'{"title": "T", "text": "x"}')
  assert ok["title"] == "T"
  for raw, reason in ((b"\xff\xfe bad", "non_utf8"), (b"{nope", "malformed_json"),
                      (b'{"title": 3}', "missing_field")):
    article, why = blocks.parse_jsonl_article("f.jsonl", 7, raw)
    assert article is None and why.startswith(reason) and "f.jsonl:7" in why


def _write_corpus(path, lines):
  with open(path, "wb") as f:
    for line in lines:
      f.write(line + b"\n")


def test_blocks_pipeline_bad_input_and_rerun(tmp_path):
  corpus = tmp_path / "corpus.jsonl"
  good = [json.dumps({"title": f"Article {i}", "text": f"Sentence one of {i}. Sentence two."})
          .encode() for i in range(4)]
  _write_corpus(corpus, good + [b"{not json", b'{"title": "Empty", "text": "   "}',
                                b"\xff\xfe\xfa", b'{"title": "List of things", "text": "x."}',
                                good[0]])
  out = tmp_path / "blocks"
  m = blocks.run_blocks(str(corpus), VOCAB, str(out))
  assert m["num_blocks"] == 4 and m["num_documents"] == 4
  c = m["counts"]
  assert c["skip:malformed_json"] == 1 and c["skip:non_utf8"] == 1
  assert c["skip:empty_article"] == 1 and c["drop:list_page"] == 1
  assert c["drop:duplicate_article"] == 1
  got = manifests.read_blocks(str(out))
  assert [b["block_id"] for b in got] == [0, 1, 2, 3]
  assert [b["title"] for b in got] == [f"Article {i}" for i in range(4)]
  assert all(b["uid"] == features.block_uid(b["title"], b["body"]) for b in got)
  # Rerun overwrites cleanly, with the same ids and fingerprint.
  m2 = blocks.run_blocks(str(corpus), VOCAB, str(out))
  assert m2["fingerprint"] == m["fingerprint"]
  assert sorted(os.listdir(tmp_path)) == ["blocks", "corpus.jsonl"]
  # A failing run (nothing usable) leaves the previous output untouched and no temp dirs.
  bad = tmp_path / "bad.jsonl"
  _write_corpus(bad, [b"{broken"])
  with pytest.raises(blocks.CorpusInputError):
    blocks.run_blocks(str(bad), VOCAB, str(out))
  assert manifests.load_manifest(str(out))["fingerprint"] == m["fingerprint"]
  assert sorted(os.listdir(tmp_path)) == ["bad.jsonl", "blocks", "corpus.jsonl"]
  with pytest.raises(FileNotFoundError):
    blocks.run_blocks(str(tmp_path / "missing.jsonl"), VOCAB, str(tmp_path / "x"))
  with pytest.raises(manifests.MissingDataError):
    manifests.load_manifest(str(tmp_path / "x"))


def test_malformed_dump_is_a_clear_error(tmp_path):
  path = tmp_path / "broken.xml.bz2"
  path.write_bytes(bz2.compress(b"<mediawiki><page><title>A</title><ns>0</ns></page><page>"))
  with pytest.raises(wiki.DumpFormatError, match="broken.xml.bz2"):
    list(wiki.iter_dump_pages(str(path)))


def _excerpt(path, max_chars):
  """A dump of the slice's pages shorter than ``max_chars`` (header and footer kept)."""
  with bz2.open(DUMP, "rt", encoding="utf-8") as f:
    head, rest = f.read().split("<page>", 1)
  pages = [p[:p.rindex("</page>") + len("</page>")] for p in rest.split("<page>")]
  with bz2.open(path, "wt", encoding="utf-8") as f:
    f.write(head + "".join(f"<page>{p}\n  " for p in pages if len(p) < max_chars)
            + "</mediawiki>\n")
  return str(path)


def _check_blocks_reproduce_the_pages(dump, out, tokenizer):
  """Runs the blocks pipeline on ``dump``: each kept page's cleaned text is its blocks'
  bodies, in order; every block fits 288 wordpieces with its title. Returns the manifest."""
  m = blocks.run_blocks(dump, VOCAB, str(out), drop_list_pages=False)
  pages = list(wiki.iter_dump_pages(dump))
  reasons = [wiki.page_drop_reason(p, drop_list_pages=False) for p in pages]
  kept = [p for p, reason in zip(pages, reasons) if reason is None]
  assert m["num_documents"] == len(kept)
  assert m["counts"].get("drop:redirect", 0) == reasons.count("redirect")
  got = manifests.read_blocks(str(out))  # Also checks count and fingerprint against the manifest.
  assert [b["block_id"] for b in got] == list(range(len(got)))
  counts = tokenizer.count_wordpieces([b["title"] for b in got] + [b["body"] for b in got])
  n = len(got)
  for b, nt, nb in zip(got, counts[:n], counts[n:]):
    assert len(b["token_ids"]) == 3 + nt + nb <= 288
  bodies = {}
  for b in got:
    bodies.setdefault(b["title"], []).append(b["body"])
  assert len(bodies) == len(kept)
  for p in kept:
    cleaned = wiki.clean_wikitext(p["wikitext"])
    # Up to whitespace: a block boundary can fall where the text had no space ("(" | "Rust").
    assert "".join("".join(bodies[p["title"]]).split()) == "".join(cleaned.split()), p["title"]
  return m


def test_blocks_pipeline_on_a_wikipedia_excerpt(tmp_path, tokenizer):
  """The fast sibling of the next test: the slice's pages under 10,000 characters (22
  articles, 2% of the text, and the redirects)."""
  m = _check_blocks_reproduce_the_pages(_excerpt(tmp_path / "excerpt.xml.bz2", 10_000),
                                        tmp_path / "blocks", tokenizer)
  assert m["num_documents"] == 22 and m["counts"]["drop:redirect"] == 99, m


@pytest.mark.slow
def test_blocks_pipeline_on_wikipedia_dump(tmp_path, tokenizer):
  m = _check_blocks_reproduce_the_pages(DUMP, tmp_path / "blocks", tokenizer)
  assert m["num_documents"] == 106
  assert m["counts"]["drop:redirect"] == 99
