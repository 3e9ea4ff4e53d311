"""Shared plumbing for the command-line binaries: one-line errors instead of tracebacks."""

import sys

from absl import app

from realm_tf import checkpoint_convert
from realm_tf import configs
from realm_tf import model_dir
from realm_tf import tokenization

# Errors a user can cause with a bad path, file or flag: reported on one line, exit status 2.
USER_ERRORS = (configs.ConfigError, checkpoint_convert.ConversionError,
               model_dir.ModelDirError, tokenization.VocabError, FileNotFoundError)


def run_main(main, extra_errors=()):
  """``absl.app.run(main)``, turning user errors into ``error: ...`` and exit status 2."""
  def wrapped(argv):
    try:
      return main(argv)
    except USER_ERRORS + tuple(extra_errors) as e:
      print(f"error: {e}", file=sys.stderr)
      sys.exit(2)
  app.run(wrapped)
