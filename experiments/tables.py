"""Moved to ``experiments.synthetic.tables``; this old name keeps scripts and old installs working."""
from experiments import moved

run = moved.shim("experiments.tables", "experiments.synthetic.tables")
if __name__ == "__main__":
  run()
