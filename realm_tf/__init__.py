"""realm_tf: REALM (Guu et al., 2020) in TensorFlow 2 / Keras.

Start with ``realm_tf.Embedder.load(model_dir)``; the stages are described in README.md.
"""

from realm_tf.embedder_api import Embedder

__all__ = ["Embedder"]
__version__ = "0.1.0"
