"""Moved (experiments/README.md); this old name keeps old scripts and installs working."""
from experiments import moved

run = moved.shim("experiments.demo", "experiments.synthetic.demo")
if __name__ == "__main__":
  run()
