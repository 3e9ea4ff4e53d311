"""realm_tf: REALM (Guu et al., 2020) in TensorFlow 2 / Keras.

Start with ``realm_tf.Embedder.load(model_dir)`` (retrieval) or
``realm_tf.OpenQA.load(model_dir, index_dir)`` (answers with evidence); the stages are
described in README.md.
"""

import os

# tf.keras is tf_keras (Keras 2) in every process that imports realm_tf before TensorFlow: the
# project is on tf_keras throughout, and TensorFlow then skips importing Keras 3 (~1.4 s of each
# process start). Without effect when TensorFlow was imported first; the user's setting wins.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


def __getattr__(name):
  # Both pull in TensorFlow (OpenQA also Model Garden's task machinery): imported on first use
  # only, so that light modules such as realm_tf.errors import without them.
  if name == "Embedder":
    from realm_tf.embedder_api import Embedder  # pylint: disable=g-import-not-at-top
    return Embedder
  if name == "OpenQA":
    from realm_tf.openqa.predict import OpenQA  # pylint: disable=g-import-not-at-top
    return OpenQA
  raise AttributeError(f"module 'realm_tf' has no attribute {name!r}")


__all__ = ["Embedder", "OpenQA"]
__version__ = "0.1.0"
