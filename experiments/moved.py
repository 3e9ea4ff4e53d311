"""The old entry points of modules that moved (``experiments/README.md``): each old name is a
tiny module that says where its program went, on stderr, then runs the new module's ``run``
with the same arguments, so that scripts, old installs and old clones' chains keep working."""

import importlib
import sys


def shim(old: str, new: str):
  """The old module ``old``'s ``run``: a note on stderr, then ``new``'s ``run()``."""
  def run():
    print(f"{old} moved to {new}: running python -m {new}", file=sys.stderr)
    return importlib.import_module(new).run()
  return run
