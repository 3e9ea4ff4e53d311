"""Moved to ``experiments.synthetic.demo``; this old name keeps scripts and old installs working."""
from experiments import moved

run = moved.shim("experiments.demo", "experiments.synthetic.demo")
if __name__ == "__main__":
  run()
