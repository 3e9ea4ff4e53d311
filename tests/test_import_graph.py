"""No import cycle between the modules of realm_tf, data_prep and experiments; and the layout
of ``realm_tf/retrieval/`` (only ``__init__`` and ``errors`` at its top, the dense index
importing nothing of BM25, ``realm_tf.configs`` nothing of retrieval).

The graph is read from the source (``ast``, nothing imported) and holds every import, those
inside functions and classes too: an import moved into a function only hides a cycle until
the function runs. ``import a.b`` is an edge to ``a.b``; ``from a import b`` to ``a.b`` when
``a/b.py`` or ``a/b/__init__.py`` exists, else to ``a``; relative imports are resolved
against the importing module. No edge is added to the ``__init__`` of a named module's parent
packages, and only edges between modules of the packages named are kept.
"""

import ast
import collections
import os
from typing import Dict, List, Sequence, Set, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("realm_tf", "data_prep", "experiments")

# {importer: {imported: (the importer's path relative to the root, first line importing it)}}
Graph = Dict[str, Dict[str, Tuple[str, int]]]


def module_files(root: str, packages: Sequence[str]) -> Dict[str, str]:
  """``{module name: path relative to root}`` of every .py file of ``packages``."""
  modules = {}
  for package in packages:
    for directory, subdirs, files in os.walk(os.path.join(root, package)):
      subdirs[:] = sorted(d for d in subdirs if not d.startswith((".", "__pycache__")))
      rel_dir = os.path.relpath(directory, root)
      parts = rel_dir.split(os.sep)
      for name in sorted(files):
        if not name.endswith(".py"):
          continue
        stem = name[:-3]
        module = ".".join(parts if stem == "__init__" else parts + [stem])
        modules[module] = os.path.join(rel_dir, name)
  return modules


def _imported(node, module: str, is_package: bool, modules: Dict[str, str]) -> List[str]:
  """The project modules that one import statement names."""
  if isinstance(node, ast.Import):
    names = []
    for alias in node.names:
      parts = alias.name.split(".")
      # The longest prefix that is a module of ours (``import a.b.c`` names ``a.b.c``).
      for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in modules:
          names.append(".".join(parts[:end]))
          break
    return names
  if node.level:
    package = module.split(".") if is_package else module.split(".")[:-1]
    base = package[:len(package) - node.level + 1]
    base = ".".join(base + ([node.module] if node.module else []))
  else:
    base = node.module
  names = []
  for alias in node.names:
    if f"{base}.{alias.name}" in modules:
      names.append(f"{base}.{alias.name}")
    elif base in modules:
      names.append(base)
  return names


def import_graph(root: str, packages: Sequence[str]) -> Graph:
  """Every import edge between the modules of ``packages`` (files under ``root``)."""
  modules = module_files(root, packages)
  graph: Graph = {module: {} for module in modules}
  for module, path in modules.items():
    with open(os.path.join(root, path), encoding="utf-8") as f:
      tree = ast.parse(f.read(), path)
    is_package = path.endswith("__init__.py")
    for node in ast.walk(tree):
      if isinstance(node, (ast.Import, ast.ImportFrom)):
        for target in _imported(node, module, is_package, modules):
          if target != module and node.lineno < graph[module].get(target, (path, 1 << 30))[1]:
            graph[module][target] = (path, node.lineno)
  return graph


def _components(graph: Graph) -> List[List[str]]:
  """The strongly connected components (Tarjan's algorithm, iterative)."""
  index, low, on_stack, stack, found = {}, {}, set(), [], []
  for start in sorted(graph):
    if start in index:
      continue
    work = [(start, iter(sorted(graph[start])))]
    index[start] = low[start] = len(index)
    stack.append(start)
    on_stack.add(start)
    while work:
      node, children = work[-1]
      child = next(children, None)
      if child is not None:
        if child not in index:
          index[child] = low[child] = len(index)
          stack.append(child)
          on_stack.add(child)
          work.append((child, iter(sorted(graph[child]))))
        elif child in on_stack:
          low[node] = min(low[node], index[child])
        continue
      work.pop()
      if work:
        low[work[-1][0]] = min(low[work[-1][0]], low[node])
      if low[node] == index[node]:
        component = []
        while True:
          member = stack.pop()
          on_stack.discard(member)
          component.append(member)
          if member == node:
            break
        found.append(sorted(component))
  return found


def _shortest_cycle(graph: Graph, start: str, members: Set[str]) -> List[str]:
  """The shortest cycle through ``start`` within ``members``: ``[start, ..., start]``."""
  parent = {start: None}
  queue = collections.deque([start])
  while queue:
    node = queue.popleft()
    for child in sorted(graph[node]):
      if child == start:
        path = [node]
        while parent[path[-1]] is not None:
          path.append(parent[path[-1]])
        return path[::-1] + [start]
      if child in members and child not in parent:
        parent[child] = node
        queue.append(child)
  raise AssertionError(f"{start} lies on no cycle")


def find_cycles(graph: Graph) -> List[List[str]]:
  """Import cycles as ``[a, b, a]``: for each strongly connected component of more than one
  module, the shortest cycle through each of its modules (each cycle once)."""
  cycles, seen = [], set()
  for component in _components(graph):
    if len(component) < 2:
      continue
    for module in component:
      cycle = _shortest_cycle(graph, module, set(component))
      ring = cycle[:-1]
      first = ring.index(min(ring))
      key = tuple(ring[first:] + ring[:first])
      if key not in seen:
        seen.add(key)
        cycles.append(list(key) + [key[0]])
  return sorted(cycles)


def describe(graph: Graph, cycle: List[str]) -> str:
  """``a -> b -> a`` (a cycle, or a chain ``a -> b -> c``), then where each of its imports
  is."""
  lines = [" -> ".join(cycle)]
  for source, target in zip(cycle, cycle[1:]):
    path, line = graph[source][target]
    lines.append(f"    {path}:{line}: {source} imports {target}")
  return "\n".join(lines)


def test_no_import_cycles():
  graph = import_graph(REPO, PACKAGES)
  assert ("realm_tf.retrieval.index.mips_index" in graph
          and "experiments.benchmarks.bench_index" in graph)
  cycles = find_cycles(graph)
  assert not cycles, "import cycles:\n" + "\n".join(describe(graph, c) for c in cycles)


def _write(root, files: Dict[str, str]) -> None:
  for name, text in files.items():
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_finder_reports_a_planted_cycle(tmp_path):
  _write(tmp_path, {
      "pkg/__init__.py": "",
      "pkg/alpha.py": "def f():\n  from pkg import beta\n  return beta\n",
      "pkg/beta.py": "class B:\n  def g(self):\n    from . import alpha\n    return alpha\n",
      "pkg/sub/__init__.py": "",
      "pkg/sub/leaf.py": "import os\nimport pkg.alpha\nfrom ..beta import B\n",
  })
  graph = import_graph(str(tmp_path), ["pkg"])
  assert graph["pkg.sub.leaf"] == {"pkg.alpha": (os.path.join("pkg", "sub", "leaf.py"), 2),
                                   "pkg.beta": (os.path.join("pkg", "sub", "leaf.py"), 3)}
  assert find_cycles(graph) == [["pkg.alpha", "pkg.beta", "pkg.alpha"]]
  text = describe(graph, find_cycles(graph)[0])
  assert text.startswith("pkg.alpha -> pkg.beta -> pkg.alpha\n")
  assert os.path.join("pkg", "alpha.py") + ":2" in text
  assert os.path.join("pkg", "beta.py") + ":3" in text


def test_the_finder_reports_no_cycle_in_an_acyclic_package(tmp_path):
  # With edges to parent packages' __init__, pkg.sub.leaf -> pkg -> pkg.alpha -> pkg.beta ->
  # pkg.sub.leaf would be a cycle; none is added.
  _write(tmp_path, {
      "pkg/__init__.py": "from pkg import alpha\n",
      "pkg/alpha.py": "def f():\n  from pkg import beta\n  return beta\n",
      "pkg/beta.py": "import json\nfrom pkg.sub import leaf\n",
      "pkg/sub/__init__.py": "",
      "pkg/sub/leaf.py": "from .other import CONSTANT\n",
      "pkg/sub/other.py": "CONSTANT = 1\n",
  })
  graph = import_graph(str(tmp_path), ["pkg"])
  assert graph["pkg.beta"] == {"pkg.sub.leaf": (os.path.join("pkg", "beta.py"), 2)}
  assert graph["pkg.sub.leaf"] == {"pkg.sub.other": (os.path.join("pkg", "sub", "leaf.py"), 1)}
  assert find_cycles(graph) == []


# ---------------------------------------------------------------------------------------------
# The layout of realm_tf/retrieval/ (issue 72): by concern, in subpackages; the dense index
# knows nothing of BM25; realm_tf.configs needs nothing of retrieval.

RETRIEVAL_TOP_LEVEL = ("__init__.py", "errors.py")


def stray_files(root: str, package: str, allowed: Sequence[str]) -> List[str]:
  """The Python files directly in ``package`` (a path under ``root``) other than ``allowed``."""
  directory = os.path.join(root, package)
  return sorted(name for name in os.listdir(directory)
                if name.endswith(".py") and name not in allowed
                and os.path.isfile(os.path.join(directory, name)))


def _within(module: str, package: str) -> bool:
  return module == package or module.startswith(package + ".")


def import_chains(graph: Graph, importers: str, imported: str) -> List[List[str]]:
  """For each module of ``imported`` (a module or package) that a module of ``importers``
  imports, directly or through other modules, the shortest such chain ``[importer, ...,
  module]``."""
  chains = {}
  for start in sorted(m for m in graph if _within(m, importers)):
    parent = {start: None}
    queue = collections.deque([start])
    while queue:
      node = queue.popleft()
      for child in sorted(graph[node]):
        if child in parent:
          continue
        parent[child] = node
        queue.append(child)
        if _within(child, imported):
          chain = [child]
          while parent[chain[-1]] is not None:
            chain.append(parent[chain[-1]])
          if child not in chains or len(chain) < len(chains[child]):
            chains[child] = chain[::-1]
  return [chains[m] for m in sorted(chains)]


def test_retrieval_holds_no_module_at_its_top_but_init_and_errors():
  stray = stray_files(REPO, os.path.join("realm_tf", "retrieval"), RETRIEVAL_TOP_LEVEL)
  assert not stray, (f"realm_tf/retrieval/ is split by concern (index/, sparse/, publication/): "
                     f"move {stray} into one of its subpackages")


def test_the_dense_index_imports_nothing_of_the_sparse_package():
  graph = import_graph(REPO, PACKAGES)
  assert "realm_tf.retrieval.index.base" in graph and "realm_tf.retrieval.sparse.hybrid" in graph
  chains = import_chains(graph, "realm_tf.retrieval.index", "realm_tf.retrieval.sparse")
  assert not chains, ("realm_tf.retrieval.index imports BM25 (its sparse part is a companion "
                      "part, loaded by retrieval.publication.index_io):\n"
                      + "\n".join(describe(graph, c) for c in chains))


def test_configs_imports_nothing_of_retrieval():
  graph = import_graph(REPO, PACKAGES)
  assert "realm_tf.configs" in graph and "realm_tf.scann_settings" in graph["realm_tf.configs"]
  chains = import_chains(graph, "realm_tf.configs", "realm_tf.retrieval")
  assert not chains, ("realm_tf.configs imports realm_tf.retrieval, which imports configs:\n"
                      + "\n".join(describe(graph, c) for c in chains))


def test_the_layout_checks_report_planted_violations(tmp_path):
  _write(tmp_path, {
      "pkg/__init__.py": "",
      "pkg/errors.py": "",
      "pkg/stray.py": "",
      "pkg/notes.txt": "",
      "pkg/dense/__init__.py": "",
      "pkg/dense/base.py": "from pkg import helper\n",
      "pkg/dense/clean.py": "from pkg import errors\n",
      "pkg/helper.py": "def f():\n  from pkg.sparse import bm25\n  return bm25\n",
      "pkg/sparse/__init__.py": "",
      "pkg/sparse/bm25.py": "from pkg.dense import clean\n",
      "pkg/config.py": "import pkg.sparse\n",
  })
  assert stray_files(str(tmp_path), "pkg", ("__init__.py", "errors.py")) == [
      "config.py", "helper.py", "stray.py"]
  graph = import_graph(str(tmp_path), ["pkg"])
  chains = import_chains(graph, "pkg.dense", "pkg.sparse")
  assert chains == [["pkg.dense.base", "pkg.helper", "pkg.sparse.bm25"]]
  text = describe(graph, chains[0])
  assert text.startswith("pkg.dense.base -> pkg.helper -> pkg.sparse.bm25\n")
  assert os.path.join("pkg", "helper.py") + ":2: pkg.helper imports pkg.sparse.bm25" in text
  assert import_chains(graph, "pkg.config", "pkg.sparse") == [["pkg.config", "pkg.sparse"]]
  assert import_chains(graph, "pkg.sparse", "pkg.helper") == []
  assert import_chains(graph, "pkg.dense.clean", "pkg.sparse") == []
