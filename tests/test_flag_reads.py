"""Only a driver's ``main`` reads flags (README, "Configs, directories, layout"), in every module
of ``experiments`` (its subfolders ``pipeline/``, ``synthetic/``, ``real_text/``, ``dev/`` and
``benchmarks/`` included); ``experiments/pipeline/stages.py`` reads none, every flag read is
defined in the module or in a module it imports (a flags module such as
``experiments/pipeline/recipe_flags.py``), and no module of ``realm_tf`` outside
``realm_tf/binaries/`` touches flags at all.

Read from the source (the AST). **A read of flags** is any use of absl's ``FLAGS`` (the name
``FLAGS`` or the attribute ``flags.FLAGS``): ``FLAGS.name``, ``FLAGS["name"]``,
``FLAGS.set_default(...)``, ``FLAGS(argv)``, ``name in FLAGS``, or ``FLAGS`` handed on as a value;
the one exception is the module-level binding ``FLAGS = flags.FLAGS``. **A handler** is a
function named ``main``, a function a module registers with absl as its program (passed by name
to a call of a function named ``run``, ``run_main`` or ``run_subcommand(s)``, as ``app.run`` and
``cli.run_main``), or a binary's subcommand (a value of its module-level ``SUBCOMMANDS`` dict,
as ``realm-index``'s). The rule holds for ``realm_tf/binaries/`` and ``data_prep`` too, but for
``binaries/cli.py``, the frame that parses ``argv`` into the flags.
Reads are allowed only inside a handler's body (functions nested in it included); a helper gets
the parsed values as an argument (``recipe_flags.recipe(FLAGS)`` from ``main``, a ``values``
parameter, or a dataclass built in ``main``).

For the definitions: ``flags.DEFINE_*("name", ...)`` defines ``name``, and a flag per field of a
dataclass (``for field in dataclasses.fields(Cls): define(field.name, ...)``, and the matching
``FLAGS[f.name] for f in dataclasses.fields(Cls)``) counts as each of ``Cls``'s fields.
"""

import ast
import dataclasses
import importlib
import os
from typing import Dict, List, Set, Tuple

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# FlagValues' own methods, not flags.
METHODS = {"is_parsed", "mark_as_parsed", "set_default", "unparse_flags", "flag_values_dict",
           "find_module_defining_flag", "get_flag_value", "flags_by_module_dict",
           "append_flag_values", "remove_flag_values", "read_flags_from_files", "__call__"}


def _modules():
  """Every module of ``experiments`` and its subfolders (``__init__`` and ``__main__`` aside)."""
  out = {}
  for folder, subdirs, files in os.walk(os.path.join(ROOT, "experiments")):
    subdirs[:] = sorted(d for d in subdirs if not d.startswith((".", "__")))
    package = os.path.relpath(folder, ROOT).replace(os.sep, ".")
    for name in sorted(files):
      if name.endswith(".py") and name not in ("__init__.py", "__main__.py"):
        out[f"{package}.{name[:-3]}"] = os.path.join(folder, name)
  return out


def _fields(module: str, node: ast.AST) -> Set[str]:
  """The field names of each ``dataclasses.fields(Cls)`` under ``node`` (``Cls`` a name in
  ``module`` or ``alias.Cls`` of a module it imports)."""
  names = set()
  for call in ast.walk(node):
    if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
        and call.func.attr == "fields" and call.args):
      obj = importlib.import_module(module)
      target = call.args[0]
      path = []
      while isinstance(target, ast.Attribute):
        path.insert(0, target.attr)
        target = target.value
      for part in [target.id] + path:
        obj = getattr(obj, part)
      names |= {f.name for f in dataclasses.fields(obj)}
  return names


def scan(module: str, path: str):
  """``(defined, read, imported)``: the flag names ``module`` defines and reads, and the
  modules of ``experiments`` it imports."""
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read(), path)
  defined, read, imported = set(), set(), set()
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("experiments"):
      imported |= {f"{node.module}.{a.name}" for a in node.names} | {node.module}
    elif isinstance(node, ast.Import):
      imported |= {a.name for a in node.names if a.name.startswith("experiments")}
    elif isinstance(node, ast.Call):
      func = node.func
      name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
      literal = node.args and isinstance(node.args[0], ast.Constant)
      if name.startswith("DEFINE_") and literal:
        defined.add(node.args[0].value)
      if name == "set_default" and literal:
        read.add(node.args[0].value)
    elif isinstance(node, ast.Attribute) and getattr(node.value, "id", "") == "FLAGS":
      if node.attr not in METHODS:
        read.add(node.attr)
    elif isinstance(node, ast.Subscript) and getattr(node.value, "id", "") == "FLAGS":
      if isinstance(node.slice, ast.Constant):
        read.add(node.slice.value)
  # Flags of a dataclass's fields: defined in a loop or function that defines flags, read in a
  # comprehension that reads FLAGS[...].
  for node in ast.walk(tree):
    if isinstance(node, (ast.For, ast.FunctionDef)):
      source = ast.dump(node)
      if "DEFINE_" in source and "attr='fields'" in source and isinstance(node, ast.For):
        defined |= _fields(module, node)
    if isinstance(node, (ast.DictComp, ast.ListComp, ast.GeneratorExp, ast.SetComp)):
      if "id='FLAGS'" in ast.dump(node):
        read |= _fields(module, node)
  return defined, read, imported


MODULES = _modules()


def test_stages_read_no_flag():
  for module in ("experiments.pipeline.stages", "experiments.real_text.text_stages",
                 "experiments.synthetic.table_seed", "experiments.pipeline.common"):
    source = open(MODULES[module], encoding="utf-8").read()
    assert "FLAGS" not in source and "absl import flags" not in source, module


@pytest.mark.parametrize("module", sorted(MODULES))
def test_every_flag_read_is_defined_here_or_in_an_imported_module(module):
  scans: Dict[str, tuple] = {}

  def get(name):
    if name not in scans:
      scans[name] = scan(name, MODULES[name])
    return scans[name]

  defined, read, imported = get(module)
  for other in imported:
    if other in MODULES:
      defined = defined | get(other)[0]
  assert read <= defined, (f"{module} reads flags it neither defines nor imports from a flags "
                           f"module: {sorted(read - defined)}")


def test_the_scan_sees_a_flag_read_that_is_defined_nowhere(tmp_path, monkeypatch):
  """The check can fail: a module reading a flag of a module it does not import is caught, and
  a dataclass's flags count as its fields."""
  (tmp_path / "planted_flags.py").write_text(
      "import dataclasses\nfrom absl import flags\nFLAGS = flags.FLAGS\n"
      "@dataclasses.dataclass\nclass S:\n  alpha: int = 1\n"
      "def define():\n  for f in dataclasses.fields(S):\n    flags.DEFINE_integer(f.name, 1, '')\n"
      "def main():\n  return S(**{f.name: FLAGS[f.name].value for f in dataclasses.fields(S)}), "
      "FLAGS.beta\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  defined, read, _ = scan("planted_flags", str(tmp_path / "planted_flags.py"))
  assert defined == {"alpha"} and read == {"alpha", "beta"}


HANDLER_REGISTRARS = {"run", "run_main", "run_subcommand", "run_subcommands"}


def _is_flags(node: ast.AST) -> bool:
  """``FLAGS`` or ``<anything>.FLAGS`` (``flags.FLAGS``), read."""
  return ((isinstance(node, ast.Name) and node.id == "FLAGS" and isinstance(node.ctx, ast.Load))
          or (isinstance(node, ast.Attribute) and node.attr == "FLAGS"
              and isinstance(node.ctx, ast.Load)))


def handlers(tree: ast.Module) -> Set[str]:
  """The handlers' names: ``main``, every function passed by name to a registrar, and the values
  of a module-level ``SUBCOMMANDS = {"name": function, ...}`` (a binary's subcommands)."""
  names = {"main"}
  for node in ast.walk(tree):
    if isinstance(node, ast.Call):
      func = node.func
      called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
      if called in HANDLER_REGISTRARS:
        names |= {a.id for a in node.args if isinstance(a, ast.Name)}
  for node in tree.body:
    if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
        and [getattr(t, "id", "") for t in node.targets] == ["SUBCOMMANDS"]):
      names |= {v.id for v in node.value.values if isinstance(v, ast.Name)}
  return names


def flag_reads_outside_handlers(path: str) -> List[Tuple[int, str]]:
  """``(line, where)`` of each read of flags outside a handler (module docstring)."""
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read(), path)
  allowed = handlers(tree)
  found = []

  def visit(node: ast.AST, where: str, inside: bool) -> None:
    for child in ast.iter_child_nodes(node):
      if (isinstance(node, ast.Module) and isinstance(child, ast.Assign)
          and [getattr(t, "id", "") for t in child.targets] == ["FLAGS"]
          and _is_flags(child.value) and isinstance(child.value, ast.Attribute)):
        continue   # FLAGS = flags.FLAGS
      if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
        name = f"{where}.{child.name}" if where else child.name
        visit(child, name, inside or (not where and child.name in allowed))
        continue
      if isinstance(child, ast.ClassDef):
        visit(child, f"{where}.{child.name}" if where else child.name, inside)
        continue
      if _is_flags(child) and not inside:
        found.append((child.lineno, where or "<module>"))
      visit(child, where, inside)

  visit(tree, "", False)
  return sorted(set(found))


def _command_line_modules():
  """The modules with command lines beside ``experiments``': ``realm_tf/binaries/`` (but
  ``cli.py``, the frame that parses ``argv`` into the flags for every handler) and ``data_prep``."""
  out = {}
  for package in ("realm_tf/binaries", "data_prep"):
    for name in sorted(os.listdir(os.path.join(ROOT, package))):
      if name.endswith(".py") and name not in ("__init__.py", "__main__.py", "cli.py"):
        out[f"{package.replace('/', '.')}.{name[:-3]}"] = os.path.join(ROOT, package, name)
  return out


HANDLED = {**MODULES, **_command_line_modules()}


@pytest.mark.parametrize("module", sorted(HANDLED))
def test_only_a_handler_reads_flags(module):
  reads = flag_reads_outside_handlers(HANDLED[module])
  assert not reads, (f"{module} reads flags outside main (or a registered handler): "
                     + ", ".join(f"line {line} in {where}" for line, where in reads)
                     + "; pass the parsed values down from main instead")


def test_the_handler_check_sees_a_read_outside_main(tmp_path):
  """The check can fail: reads at module level, in a helper, in a method and through
  ``flags.FLAGS`` are caught; the binding ``FLAGS = flags.FLAGS``, reads in ``main`` (and in
  a function nested in it) and in a function registered with ``app.run`` are not."""
  planted = tmp_path / "planted_reads.py"
  planted.write_text(
      "from absl import app\nfrom absl import flags\nFLAGS = flags.FLAGS\n"
      "FLAGS.set_default('a', 1)\n"                                   # 4: module level
      "def helper():\n  return FLAGS.b\n"                              # 6: a helper
      "class C:\n  def method(self):\n    return flags.FLAGS['c']\n"  # 9: a method
      "def passes_on(f):\n  return f(FLAGS)\n"                         # 11: handed on
      "def main(argv):\n  def nested():\n    return FLAGS.d\n"
      "  return helper(), nested(), FLAGS.e\n"
      "def other(argv):\n  return FLAGS.f\n"
      "def sub():\n  return FLAGS.g\n"
      "SUBCOMMANDS = {'sub': sub}\n"
      "if __name__ == '__main__':\n  app.run(other)\n")
  assert flag_reads_outside_handlers(str(planted)) == [
      (4, "<module>"), (6, "helper"), (9, "C.method"), (11, "passes_on")]
  # A function named in a SUBCOMMANDS dict only inside a function is no subcommand.
  planted.write_text("from absl import flags\nFLAGS = flags.FLAGS\n"
                     "def sub():\n  return FLAGS.g\n"
                     "def helper():\n  SUBCOMMANDS = {'sub': sub}\n  return SUBCOMMANDS\n")
  assert flag_reads_outside_handlers(str(planted)) == [(4, "sub")]


def reads_flags(path: str) -> bool:
  """Whether the module at ``path`` touches absl's ``FLAGS`` (``FLAGS`` or ``flags.FLAGS``)."""
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read(), path)
  return any((isinstance(node, ast.Name) and node.id == "FLAGS")
             or (isinstance(node, ast.Attribute) and node.attr == "FLAGS")
             for node in ast.walk(tree))


def test_the_library_reads_no_flag(tmp_path):
  """Flags belong to the command lines: no module of realm_tf outside realm_tf/binaries/ reads
  them (a planted read is seen)."""
  library = os.path.join(ROOT, "realm_tf")
  readers = []
  for folder, _, files in os.walk(library):
    if os.path.relpath(folder, library).split(os.sep)[0] == "binaries":
      continue
    readers += [os.path.join(folder, f) for f in files
                if f.endswith(".py") and reads_flags(os.path.join(folder, f))]
  assert not readers, readers
  planted = tmp_path / "planted.py"
  planted.write_text("from absl import flags\ndef f():\n  return flags.FLAGS.x\n")
  assert reads_flags(str(planted))
