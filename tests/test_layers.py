"""One-way layers: ``data_prep`` imports ``realm_tf``, never the reverse (issue 32, item 5).

Every module of ``realm_tf`` is parsed and no import statement (at any depth: a function's
late import counts) nor ``importlib.import_module``/``__import__`` call names ``data_prep``.
And what the library needs of the blocks pipeline's rules (documents -> blocks, for
``realm-index upsert`` and ``realm-serve``'s ``POST /documents``) runs with ``data_prep``
made unimportable.
"""

import ast
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "realm_tf"


def _imported(tree: ast.AST):
  """``(line, module)`` of every import in ``tree``: statements and import calls."""
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        yield node.lineno, alias.name
    elif isinstance(node, ast.ImportFrom):
      if node.level == 0 and node.module:
        yield node.lineno, node.module
    elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
      name = getattr(node.func, "attr", getattr(node.func, "id", ""))
      if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
        yield node.lineno, node.args[0].value


def _data_prep_imports():
  found = []
  for path in sorted(PACKAGE.rglob("*.py")):
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found += [f"{path.relative_to(ROOT)}:{line}: {name}" for line, name in _imported(tree)
              if name == "data_prep" or name.startswith("data_prep.")]
  return found


def test_the_checker_sees_late_imports_and_import_calls():
  source = ("def f():\n  from data_prep import articles\n  import data_prep.blocks as b\n"
            "importlib.import_module('data_prep.text')\nfrom realm_tf.data import articles\n")
  assert sorted(n for _, n in _imported(ast.parse(source))) == [
      "data_prep", "data_prep.blocks", "data_prep.text", "realm_tf.data"]


def test_realm_tf_never_imports_data_prep():
  assert len(list(PACKAGE.rglob("*.py"))) > 50
  assert _data_prep_imports() == []


_WITHOUT_DATA_PREP = r"""
import json, sys
sys.modules["data_prep"] = None          # any import of it now fails
from realm_tf import configs
from realm_tf.retrieval.publication import updates
path, vocab = sys.argv[1:3]
documents = updates.read_documents(path)
config = configs.RealmModelConfig()
blocks = updates._document_blocks(
    documents, {"vocab_file": vocab, "lower_case": True, "block_seq_length": 32}, config)
print(json.dumps({t: [b["body"] for b in bs] for t, bs in blocks.items()}))
"""


def test_documents_become_blocks_without_data_prep(tmp_path):
  """``realm-index upsert``'s documents -> blocks, in a process where ``data_prep`` cannot be
  imported: the same blocks as the blocks pipeline's per-article rule gives."""
  text = ("The Eiffel Tower is a wrought-iron lattice tower in Paris. It was built in 1889. "
          "Its designer was the engineer Gustave Eiffel, whose company built it.")
  path = tmp_path / "docs.jsonl"
  path.write_text(json.dumps({"title": "Eiffel Tower", "text": text}) + "\n\n")
  vocab = str(ROOT / "assets" / "vocab" / "bert-base-uncased-vocab.txt")
  run = subprocess.run([sys.executable, "-c", _WITHOUT_DATA_PREP, str(path), vocab],
                       capture_output=True, text=True, timeout=300, check=False)
  assert run.returncode == 0, run.stderr[-3000:]
  got = json.loads(run.stdout.strip().splitlines()[-1])

  from data_prep import blocks as blocks_pipeline  # pylint: disable=g-import-not-at-top
  from realm_tf.tokenization import RealmTokenizer  # pylint: disable=g-import-not-at-top
  want = blocks_pipeline.article_to_blocks("Eiffel Tower", text, RealmTokenizer(vocab), 32)
  assert got == {"Eiffel Tower": [b["body"] for b in want]} and len(want) >= 2
