"""The base class of the project's expected errors.

An expected error is one a user can cause and fix: a bad path, file, flag, config or corpus.
Each says what is wrong and how to fix it, in one line. Every command line (``realm-*``, the
``data_prep`` pipelines, the ``experiments`` entry points) reports a :class:`RealmError` as
``error: <message>`` with exit status 2 (``realm_tf.binaries.cli``); anything else is a bug and
keeps its traceback.

The subclasses live beside the code that raises them (``configs.ConfigError``,
``model_dir.ModelDirError``, ``data.manifests.DataError`` and its retrieval and corpus
subclasses, ...). Most also derive from the built-in exception they refine (``ValueError``,
``FileNotFoundError``, ``TimeoutError``), so callers that catch those keep working.
"""


class RealmError(Exception):
  """An expected error: its message tells the user what to fix."""
