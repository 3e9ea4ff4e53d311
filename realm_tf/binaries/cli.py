"""Shared plumbing for the command-line binaries: one-line errors instead of tracebacks.

Every command line of the project (the ``realm-*`` binaries, the corpus pipelines and the
experiments' entry points) runs its ``main`` through :func:`run_main`: an expected error
(``realm_tf.errors.RealmError``, a bad flag or usage, a missing file) is printed as one line
``error: <message>`` on stderr and the exit status is 2. Anything else is a bug: its traceback
stays. A ``main`` that returns ends the process at once (:func:`exit_now`).
"""

import os
import sys

from absl import app
from absl import flags
from absl import logging

from realm_tf import errors

# Errors a user can cause with a bad path, file, config or flag: reported on one line, exit
# status 2.
USER_ERRORS = (errors.RealmError, FileNotFoundError, app.UsageError)


def _fail(error) -> None:
  print(f"error: {error}", file=sys.stderr)
  sys.exit(2)


def exit_now(code: int = 0) -> None:
  """Flushes the process's output and ends it without the interpreter's teardown.

  That teardown destroys TensorFlow's iterators over ``tf.data.Dataset.from_generator``
  holding the GIL, while their input thread needs the GIL to leave the generator: a trainer
  that had saved its last checkpoint and printed its result sat there 15 to 100 s more (one
  such process holds up a whole stage; experiments/NOTES.md section 21). By then everything
  is on disk: checkpoints are written synchronously, and orbit flushes its summary writers
  after every write.
  """
  logging.flush()
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)  # pylint: disable=protected-access


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
      result = main(argv)
    except USER_ERRORS as e:
      _fail(e)
    if result is not None and not isinstance(result, int):
      print(result, file=sys.stderr)   # sys.exit's convention for a message
      result = 1
    exit_now(result or 0)

  app.run(wrapped, flags_parser=parse)
