# Two commands matter: `make demo` and `make test`. Both set up what they need, once.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
JARS   := $(VENV)/.jars
PYTEST_ARGS ?=

.PHONY: setup jars test test-quick demo lint clean

setup: $(STAMP) $(JARS)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# Delta's jars are fetched once into a local cache (see replicator/jars.py); tests never download.
$(JARS): $(STAMP)
	$(PY) -m replicator.jars fetch
	touch $(JARS)

jars: $(JARS)

test: setup
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-quick: setup
	$(PY) -m pytest -q -m "not spark and not slow" $(PYTEST_ARGS)

demo: setup
	$(VENV)/bin/replicator demo

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
