"""Errors of the retrieval side, each with a one-line message a user can act on.

The binaries print ``error: <message>`` and exit with status 2 on any of these. The corpus
errors are the data contract's own (``realm_tf.data.manifests``), so a caller catching either
``CorpusFormatError`` catches both.
"""

from realm_tf import errors as realm_errors
from realm_tf import model_dir as model_dir_lib
from realm_tf.data import manifests

# Base class: an index, a corpus or an embedding file that does not fit. Every such file is data
# on disk, so the retrieval side's base class is the data contract's: the corpus errors below
# are RetrievalErrors and DataErrors at once.
RetrievalError = manifests.DataError

# A blocks directory, or one shard of it, with no blocks.
EmptyCorpusError = manifests.EmptyCorpusError

# A blocks directory or an embedding shard that does not follow the format.
CorpusFormatError = manifests.CorpusFormatError


class DimensionMismatchError(RetrievalError):
  """An index or a query whose embedding width differs from what the caller expects."""


class FingerprintMismatchError(RetrievalError):
  """An index built over a different corpus than the one the caller uses."""


class IndexFormatError(RetrievalError):
  """An index directory that is incomplete or was written by something else."""


class UnsafeIndexError(IndexFormatError):
  """An index directory holding a file realm_tf refuses to open (a pickle, which would run the
  code of whoever wrote it): never retried, the index must be rebuilt."""


class BlockTowerMismatchError(RetrievalError):
  """An index whose blocks were embedded by another block tower than the one the model was
  fine-tuned against."""


class CheckpointNotFoundError(RetrievalError, model_dir_lib.ModelDirError):
  """A model directory or checkpoint that does not exist."""


class CheckpointVanishedError(RetrievalError):
  """A checkpoint that was deleted (by the trainer's retention policy) while we read it."""


class IndexNotReadyError(realm_errors.RealmError, TimeoutError):
  """No index was published in ``index_dir`` within the waiting time."""


class IndexUpdateError(RetrievalError):
  """An update an index cannot take: another block tower than its own, a uid or title that
  names no live block, a document with no text."""
