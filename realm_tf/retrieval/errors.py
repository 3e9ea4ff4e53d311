"""Errors of the retrieval side, each with a one-line message a user can act on.

The binaries print ``error: <message>`` and exit with status 2 on any of these.
"""

from realm_tf import model_dir as model_dir_lib


class RetrievalError(ValueError):
  """Base class: an index, a corpus or an embedding file that does not fit."""


class DimensionMismatchError(RetrievalError):
  """An index or a query whose embedding width differs from what the caller expects."""


class FingerprintMismatchError(RetrievalError):
  """An index built over a different corpus than the one the caller uses."""


class EmptyCorpusError(RetrievalError):
  """A blocks directory, or one shard of it, with no blocks."""


class CorpusFormatError(RetrievalError):
  """A blocks directory or an embedding shard that does not follow the format."""


class IndexFormatError(RetrievalError):
  """An index directory that is incomplete or was written by something else."""


class CheckpointNotFoundError(RetrievalError, model_dir_lib.ModelDirError):
  """A model directory or checkpoint that does not exist."""


class CheckpointVanishedError(RetrievalError):
  """A checkpoint that was deleted (by the trainer's retention policy) while we read it."""


class IndexNotReadyError(TimeoutError):
  """No index was published in ``index_dir`` within the waiting time."""
