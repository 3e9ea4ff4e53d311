# `make demo` and `make test` set everything up on a fresh machine: a virtual environment in
# .venv (override with VENV=...), the project installed from its own setup.py, then the job.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.realm_tf_installed

.PHONY: demo test test-all install clean

$(STAMP): setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip wheel setuptools
	$(PY) -m pip install -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/realm-demo --output_dir demo_out

test: $(STAMP)
	$(PY) -m pytest -q tests

test-all: $(STAMP)
	$(PY) -m pytest -q --runslow tests

clean:
	rm -rf $(VENV) demo_out *.egg-info
