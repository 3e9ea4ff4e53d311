"""Shared plumbing for the command-line binaries: one-line errors instead of tracebacks.

Every command line of the project (the ``realm-*`` binaries, the corpus pipelines and the
experiments' entry points) runs its ``main`` through :func:`run_main`: an expected error
(``realm_tf.errors.RealmError``, a bad flag or usage, a missing file) is printed as one line
``error: <message>`` on stderr and the exit status is 2. Anything else is a bug: its traceback
stays.
"""

import sys

from absl import app
from absl import flags

from realm_tf import errors

# Errors a user can cause with a bad path, file, config or flag: reported on one line, exit
# status 2.
USER_ERRORS = (errors.RealmError, FileNotFoundError, app.UsageError)


def _fail(error) -> None:
  print(f"error: {error}", file=sys.stderr)
  sys.exit(2)


def run_main(main, known_only: bool = False):
  """``absl.app.run(main)``, turning user errors into ``error: ...`` and exit status 2.

  Args:
    main: called with the arguments left after the flags are parsed (``argv[0]`` first).
    known_only: leave unknown flags in ``main``'s arguments instead of refusing them (e.g. for
      Beam pipeline options such as ``--runner``).
  """
  def parse(argv):
    try:
      return flags.FLAGS(argv, known_only=known_only)
    except flags.Error as e:
      _fail(e)

  def wrapped(argv):
    try:
      return main(argv)
    except USER_ERRORS as e:
      _fail(e)

  app.run(wrapped, flags_parser=parse)
