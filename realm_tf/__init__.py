"""realm_tf: REALM (Guu et al., 2020) in TensorFlow 2 / Keras.

Start with ``realm_tf.Embedder.load(model_dir)`` (retrieval) or
``realm_tf.OpenQA.load(model_dir, index_dir)`` (answers with evidence); the stages are
described in README.md.
"""

from realm_tf.embedder_api import Embedder


def __getattr__(name):
  # OpenQA pulls in Model Garden's task machinery: imported on first use only.
  if name == "OpenQA":
    from realm_tf.openqa.predict import OpenQA  # pylint: disable=g-import-not-at-top
    return OpenQA
  raise AttributeError(f"module 'realm_tf' has no attribute {name!r}")


__all__ = ["Embedder", "OpenQA"]
__version__ = "0.1.0"
