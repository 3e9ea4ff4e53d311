"""Moved (experiments/README.md); this old name keeps old scripts and installs working."""
from experiments import moved

run = moved.shim("experiments.tables", "experiments.synthetic.tables")
if __name__ == "__main__":
  run()
