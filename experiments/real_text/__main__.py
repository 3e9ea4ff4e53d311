"""``python -m experiments.real_text``, the old command: the driver is ``real_text.main``."""
from experiments import moved

moved.shim("experiments.real_text", "experiments.real_text.main")()
