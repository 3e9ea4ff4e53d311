"""Moved (experiments/README.md); this old name keeps old scripts and installs working."""
from experiments import moved

run = moved.shim("experiments.gold_reader", "experiments.real_text.gold_reader")
if __name__ == "__main__":
  run()
