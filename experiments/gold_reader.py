"""Moved to ``experiments.real_text.gold_reader``; this old name keeps scripts and old installs working."""
from experiments import moved

run = moved.shim("experiments.gold_reader", "experiments.real_text.gold_reader")
if __name__ == "__main__":
  run()
