"""The data_prep command lines: absl flags, Beam options passed through, one-line errors.

Each module with a command line defines its flags in its own ``define_flags()``, which only
:func:`run` calls, when the module runs as a program (``python -m data_prep.<module>``).
Importing several modules into one process (``data_prep.pipeline``, the tests, the demo) thus
never defines a flag twice. The flag groups that several command lines share are defined here.

Flags a pipeline does not know are its Beam pipeline options (``--runner=DataflowRunner
--project=...``), passed to Beam untouched. An expected error (a missing input, a bad flag, a
malformed input file) is one line ``error: ...`` on stderr and exit status 2.
"""

import logging

from absl import app
from absl import flags

from realm_tf.binaries import cli
from realm_tf.data import features


def define_vocab_flags() -> None:
  """``--vocab_file`` (required) and ``--[no]lower_case``."""
  flags.DEFINE_string("vocab_file", None, "WordPiece vocabulary file.")
  flags.DEFINE_bool("lower_case", True,
                    "Lower-case before WordPiece (an uncased BERT vocab; --nolower_case: cased).")
  flags.mark_flag_as_required("vocab_file")


def define_split_flags() -> None:
  """``--eval_fraction`` (checked to lie in [0, 1)) and ``--seed``."""
  flags.DEFINE_float("eval_fraction", 0.02,
                     "Fraction of the blocks (by a hash of their uid) whose examples go to eval.")
  flags.register_validator("eval_fraction", lambda v: 0.0 <= v < 1.0,
                           message="--eval_fraction must be in [0, 1)")
  flags.DEFINE_integer("seed", 0, "Seed of the random choices (the same seed, the same output).")


def define_num_shards() -> None:
  flags.DEFINE_integer("num_shards", 0, "Output shards (0: from the number of records).")


def define_example_flags() -> None:
  """The flags of both example pipelines (pre-training and ICT): ``--query_seq_length``, the
  split flags and ``--num_shards``."""
  flags.DEFINE_integer("query_seq_length", features.QUERY_SEQ_LENGTH, "Wordpieces per query.")
  define_split_flags()
  define_num_shards()


class _NoTracebackFor(logging.Filter):
  """Drops the traceback from a log record of one of ``errors`` (its message stays)."""

  def __init__(self, errors):
    super().__init__()
    self._errors = tuple(errors)

  def filter(self, record):
    if record.exc_info and isinstance(record.exc_info[1], self._errors):
      record.exc_info, record.exc_text = None, None
    return True


def run(main, define_flags, beam: bool = True) -> None:
  """Defines the module's flags, parses the command line and runs ``main(argv)``.

  Args:
    main: takes the arguments left after the flags (``argv[0]`` first); for a Beam pipeline,
      ``argv[1:]`` are its pipeline options.
    define_flags: defines the module's flags.
    beam: leave unknown flags to Beam; without, they are errors and so are positional
      arguments.
  """

  def checked(argv):
    if not beam and len(argv) > 1:
      raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    logging.getLogger().setLevel(logging.INFO)
    return main(argv)

  define_flags()
  # A step that raises logs the exception with its traceback before Beam re-raises it here;
  # for an expected error (a malformed input file) the one-line report is enough.
  logging.getLogger("apache_beam.runners.common").addFilter(
      _NoTracebackFor(cli.USER_ERRORS))
  cli.run_main(checked, known_only=beam)
