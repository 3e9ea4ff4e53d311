"""Experiments, benchmarks and the demo of realm_tf."""

import realm_tf  # noqa: F401  # Sets TF_USE_LEGACY_KERAS before TensorFlow loads.
