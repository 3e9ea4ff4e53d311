"""Moved (experiments/README.md); this old name keeps old scripts and installs working."""
from experiments import moved

run = moved.shim("experiments.real_text_merge", "experiments.real_text.merge")
if __name__ == "__main__":
  run()
