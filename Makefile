# Two commands matter: `make demo` and `make test`. Both set up what they need, once.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: setup jars rabbitmq test test-quick demo bench bench-layouts soak lint clean

setup: $(STAMP) jars rabbitmq

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# Delta's jars are fetched once into a local cache (see replicator/runtime/jars.py); tests never download.
# Always checked (a no-op taking a fraction of a second when present), so a cleared cache refills.
jars: $(STAMP)
	$(PY) -m replicator.runtime.jars fetch >/dev/null

# The Drizzle source's tests and demo start a RabbitMQ node of their own (replicator/drizzle/
# broker.py) from Debian's rabbitmq-server, installed here once. Without root, or sudo that needs
# no password, this only says the command; the tests that need the broker skip until then.
RABBITMQ_INSTALL := apt-get -qq update && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	--no-install-recommends rabbitmq-server
rabbitmq:
	@if command -v rabbitmq-server >/dev/null 2>&1 || test -x /usr/lib/rabbitmq/bin/rabbitmq-server; then \
		:; \
	elif ! command -v apt-get >/dev/null 2>&1; then \
		echo "rabbitmq-server is not installed (its tests will skip): install RabbitMQ 3.10+" >&2; \
	elif [ "$$(id -u)" = 0 ]; then \
		$(RABBITMQ_INSTALL); \
	elif sudo -n true 2>/dev/null; then \
		sudo sh -c '$(RABBITMQ_INSTALL)'; \
	else \
		echo "rabbitmq-server is not installed (its tests will skip): sudo apt-get install -y rabbitmq-server" >&2; \
	fi

# Two workers, each file kept on one (its module fixtures and Spark session are built once),
# handed out in conftest's order, longest first (tests/conftest.py says why).
test: setup
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder -m "not soak" --durations=25 $(PYTEST_ARGS)

test-quick: setup
	$(PY) -m pytest -q -m "not spark and not slow and not soak" $(PYTEST_ARGS)

demo: setup
	$(VENV)/bin/replicator demo

# Benchmarks are not tests: `make bench` measures (PRESET=quick|smoke for shorter runs), then
# times one against two sharded replicators on a standalone cluster (the `quick` data set under
# the default preset: a million documents would take the sharded loads most of an hour).
PRESET ?= default
SHARD_PRESET ?= $(if $(filter default,$(PRESET)),quick,$(PRESET))
bench: setup
	$(PY) jobs/bench.py --preset $(PRESET)
	$(PY) jobs/bench.py --two-shards --preset $(SHARD_PRESET)

# The table-layout comparison behind the README's layout decision (about 40 minutes on 2 cores).
bench-layouts: setup
	$(PY) -m replicator.bench.layouts --docs 200000 --work-dir bench-output/layouts-work \
		--output bench-output/layouts.json

# The long fault run: 200 SIGKILLs of a replicator under load, and a 100k-frame codec fuzz.
soak: setup
	$(PY) -m pytest -q -m soak $(PYTEST_ARGS)
	$(PY) jobs/soak.py --kills 200 --fuzz 100000

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
