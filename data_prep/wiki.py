"""Reading MediaWiki XML dumps and turning wiki markup into plain article text.

Pure functions, used by the blocks pipeline (``data_prep.blocks``) and testable on their own:

* :func:`iter_dump_pages` streams ``<page>`` records out of a ``.xml`` or ``.xml.bz2`` dump
  without loading it into memory;
* :func:`page_drop_reason` says why a page is not an encyclopedia article (redirect, other
  namespace, list / index / outline / disambiguation page, as ORQA filters them), or ``None``;
* :func:`clean_wikitext` strips templates, references, tables, files, categories and link markup
  with ``mwparserfromhell`` and keeps section headings as lines of their own.

Example::

    for page in iter_dump_pages("enwiki-latest-pages-articles.xml.bz2"):
      if page_drop_reason(page) is None:
        text = clean_wikitext(page["wikitext"])
"""

import bz2
import gzip
import os
import re
from typing import Dict, Iterator, List, Optional
import xml.etree.ElementTree as ET

import mwparserfromhell
from mwparserfromhell import nodes as mwnodes

from realm_tf import errors

# Title prefixes of the pages ORQA leaves out of its corpus: navigation pages, not articles.
LIST_TITLE_PREFIXES = ("List of ", "Lists of ", "Index of ", "Outline of ")
_DISAMBIG_TEMPLATES = re.compile(
    r"\{\{\s*(disambiguation|disambig|dab|disamb|hndis|geodis|set index article|sia"
    r"|[a-z ]*disambiguation)\s*(\||\}\})", re.IGNORECASE)
_INTERLANGUAGE = re.compile(r"^[a-z\-]{2,12}:")
_REDIRECT_TEXT = re.compile(r"^\s*#\s*redirect", re.IGNORECASE)
# Link namespaces whose links are media or page metadata, not running text.
_DROP_LINK_NAMESPACES = ("file:", "image:", "media:", "category:")
_DROP_TAGS = ("ref", "table", "gallery", "math", "timeline", "references", "score", "imagemap",
              "syntaxhighlight", "source", "nowiki", "div", "templatestyles", "chem", "ce",
              "graph", "mapframe", "hiero")


class DumpFormatError(errors.RealmError, ValueError):
  """A dump file cannot be parsed as MediaWiki XML."""


def _open_maybe_compressed(path: str):
  if "://" in path:
    # inside: TensorFlow is slow to import; only remote paths need it (gfile reads GCS, HDFS).
    import tensorflow as tf
    raw = tf.io.gfile.GFile(path, "rb")
  else:
    raw = open(path, "rb")
  if path.endswith(".bz2"):
    return bz2.open(raw, "rb")
  if path.endswith(".gz"):
    return gzip.open(raw, "rb")
  return raw


def _exists(path: str) -> bool:
  if "://" in path:
    import tensorflow as tf  # inside: as in _open_maybe_compressed
    return tf.io.gfile.exists(path)
  return os.path.isfile(path)


def _local(tag: str) -> str:
  return tag.rsplit("}", 1)[-1]


def iter_dump_pages(path: str) -> Iterator[Dict]:
  """Yields the pages of a MediaWiki export file one at a time.

  Each page is a dict ``{"title": str, "ns": int, "id": str, "redirect": bool,
  "wikitext": str}`` (the text of the newest revision in the file).

  Raises:
    FileNotFoundError: the file does not exist.
    DumpFormatError: the XML is malformed; the message names the file and the last page read.
  """
  if not _exists(path):
    raise FileNotFoundError(f"MediaWiki dump not found: {path}")
  last_title = None
  with _open_maybe_compressed(path) as f:
    try:
      context = ET.iterparse(f, events=("end",))
      for _, elem in context:
        if _local(elem.tag) != "page":
          continue
        page = {"title": "", "ns": 0, "id": "", "redirect": False, "wikitext": ""}
        for child in elem:
          name = _local(child.tag)
          if name == "title":
            page["title"] = (child.text or "").strip()
          elif name == "ns":
            page["ns"] = int((child.text or "0").strip() or 0)
          elif name == "id":
            page["id"] = (child.text or "").strip()
          elif name == "redirect":
            page["redirect"] = True
          elif name == "revision":
            for rev_child in child:
              if _local(rev_child.tag) == "text":
                page["wikitext"] = rev_child.text or ""
        last_title = page["title"]
        elem.clear()
        yield page
    except ET.ParseError as e:
      raise DumpFormatError(
          f"malformed MediaWiki XML in {path} (after page {last_title!r}): {e}") from e
    except (OSError, EOFError) as e:  # Truncated or corrupt compressed stream.
      raise DumpFormatError(
          f"cannot read {path} (after page {last_title!r}): {e}") from e


def page_drop_reason(page: Dict, drop_list_pages: bool = True) -> Optional[str]:
  """Why a dump page is not kept as an article, or None to keep it.

  Reasons: ``"non_article_namespace"``, ``"redirect"``, ``"list_page"`` (titles ``List of``,
  ``Lists of``, ``Index of``, ``Outline of``) and ``"disambiguation_page"`` (title ending in
  ``(disambiguation)`` or a disambiguation template); the last two only with
  ``drop_list_pages``, as ORQA does.
  """
  if page.get("ns", 0) != 0:
    return "non_article_namespace"
  if page.get("redirect") or _REDIRECT_TEXT.match(page.get("wikitext", "")):
    return "redirect"
  if drop_list_pages:
    reason = title_drop_reason(page.get("title", ""), page.get("wikitext", ""))
    if reason:
      return reason
  return None


def title_drop_reason(title: str, text: str = "") -> Optional[str]:
  """``"list_page"``, ``"disambiguation_page"`` or None, from a title (and wikitext if any)."""
  if title.startswith(LIST_TITLE_PREFIXES):
    return "list_page"
  if title.endswith("(disambiguation)") or (text and _DISAMBIG_TEMPLATES.search(text)):
    return "disambiguation_page"
  return None


def _render(nodes, out: List[str]) -> None:
  """Appends the visible text of mwparserfromhell nodes to ``out``, in one pass."""
  for node in nodes:
    if isinstance(node, mwnodes.Text):
      out.append(node.value)
    elif isinstance(node, mwnodes.Wikilink):
      target = str(node.title).strip().lower().lstrip(":")
      if target.startswith(_DROP_LINK_NAMESPACES) or _INTERLANGUAGE.match(target):
        continue  # Files, categories and interlanguage links carry no running text.
      _render((node.text if node.text is not None else node.title).nodes, out)
    elif isinstance(node, mwnodes.ExternalLink):
      if node.title is not None:
        _render(node.title.nodes, out)
    elif isinstance(node, mwnodes.Heading):
      inner: List[str] = []
      _render(node.title.nodes, inner)
      out.append("\n" + "".join(inner).strip() + "\n")
    elif isinstance(node, mwnodes.Tag):
      tag = str(node.tag).strip().lower()
      if tag in _DROP_TAGS:
        continue
      if tag in ("br", "hr", "li", "dt", "dd", "p"):
        out.append("\n")  # These start a line of their own.
      if node.contents is not None:
        _render(node.contents.nodes, out)
    elif isinstance(node, mwnodes.HTMLEntity):
      out.append(node.normalize())
    # Templates, comments and template arguments have no visible text.


def clean_wikitext(wikitext: str) -> str:
  """Wiki markup -> plain text, paragraphs separated by blank lines.

  Templates, ``<ref>``, tables, comments, files, images and categories are removed; internal
  and external links keep their visible text; bold/italic markup is dropped; section headings
  become a line of their own; list markers are removed. Returns "" for pages without text.

  Example: ``'''Foo''' is a [[bar|baz]].{{cite}}<ref>x</ref>`` -> ``Foo is a baz.``
  """
  out: List[str] = []
  _render(mwparserfromhell.parse(wikitext).nodes, out)
  return normalize_plain_text(drop_unparsed_tags("".join(out)))


# A dropped element (``<ref>...</ref>`` on one line, ``<ref name=x/>``) or an HTML tag that the
# parser left as text, as rendered text shows it.
_UNPARSED_DROPPED = re.compile(
    r"<\s*(%s)\b[^<>\n]*/\s*>|<\s*(%s)\b[^<>\n]*>[^\n]*?<\s*/\s*\2\s*>" % (
        "|".join(_DROP_TAGS), "|".join(_DROP_TAGS)), re.IGNORECASE)
_HTML_TAGS = _DROP_TAGS + (
    "small", "big", "span", "sup", "sub", "b", "i", "u", "s", "em", "strong", "font", "center",
    "blockquote", "br", "hr", "p", "code", "abbr", "cite", "poem", "section", "onlyinclude",
    "includeonly", "noinclude", "var", "del", "ins", "tt", "li", "ul", "ol", "dl", "dt", "dd")
_UNPARSED_TAG = re.compile(r"<\s*/?\s*(%s)\b[^<>\n]*>" % "|".join(_HTML_TAGS), re.IGNORECASE)


def drop_unparsed_tags(text: str) -> str:
  """Removes the markup that mwparserfromhell left as plain text.

  On malformed wikitext the parser gives up on a tag and returns its markup as text: in the
  enwiki dump, ``<ref>[[Simon Critchley#Infinitely Demanding|Infinitely Demanding]]'' by ...
  </ref>`` (an unmatched ``''`` inside the reference) came out as ``<ref>Infinitely Demanding by
  Simon Critchley. Verso. 2007. p. 125</ref>`` in the middle of a sentence. Such an element of
  a dropped tag (``ref``, ``table``, ...) is removed with its content; any other tag left as text
  (``<small>``, ``</span>``) loses its markup and keeps its content.
  """
  text = _UNPARSED_DROPPED.sub("", text)
  return _UNPARSED_TAG.sub("", text)


_MARKUP_LEFTOVERS = re.compile(r"'{2,}|^[*#:;]+\s*|^\s*\{\|.*$|^\s*\|.*$|^\s*!.*$|__[A-Z]+__",
                               re.MULTILINE)


def normalize_plain_text(text: str) -> str:
  """Drops markup leftovers, strips each line, and keeps at most one blank line in a row."""
  text = _MARKUP_LEFTOVERS.sub("", text)
  lines = [re.sub(r"[ \t\u00a0]+", " ", line).strip() for line in text.splitlines()]
  out, blank = [], False
  for line in lines:
    if not line:
      blank = bool(out)
      continue
    if blank:
      out.append("")
    out.append(line)
    blank = False
  return "\n".join(out).strip()
