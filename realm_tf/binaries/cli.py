"""Shared plumbing for the command-line binaries: one-line errors instead of tracebacks.

Every command line of the project (the ``realm-*`` binaries and the corpus pipelines) runs its
``main`` through :func:`run_main`: an expected error, a bad flag included, is printed as one line
``error: <message>`` on stderr and the exit status is 2.
"""

import sys

from absl import app
from absl import flags

from realm_tf import checkpoint_convert
from realm_tf import configs
from realm_tf import model_dir
from realm_tf import tokenization
from realm_tf.data import manifests

# Errors a user can cause with a bad path, file or flag: reported on one line, exit status 2.
USER_ERRORS = (configs.ConfigError, checkpoint_convert.ConversionError,
               model_dir.ModelDirError, tokenization.VocabError, manifests.DataError,
               FileNotFoundError, app.UsageError)


def _fail(error) -> None:
  print(f"error: {error}", file=sys.stderr)
  sys.exit(2)


def run_main(main, extra_errors=(), known_only: bool = False):
  """``absl.app.run(main)``, turning user errors into ``error: ...`` and exit status 2.

  Args:
    main: called with the arguments left after the flags are parsed (``argv[0]`` first).
    extra_errors: more exception classes to report on one line.
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
    except USER_ERRORS + tuple(extra_errors) as e:
      _fail(e)

  app.run(wrapped, flags_parser=parse)
