"""Moved to ``experiments.real_text.merge``; this old name keeps scripts and old installs working."""
from experiments import moved

run = moved.shim("experiments.real_text_merge", "experiments.real_text.merge")
if __name__ == "__main__":
  run()
