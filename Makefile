# The two commands of README.md. Both create .venv/ and install the project with
# its dev extra when missing (or when pyproject.toml changed), then do their job.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.siftmq-installed
# the hot path compiled with mypyc (setup.py; the list lives in broker/_build.py)
BUILT := $(VENV)/.siftmq-compiled
HOST ?= 127.0.0.1
PORT ?= 1883
METRICS_PORT ?= 9464

.PHONY: run test lint typecheck unit setup build chromium mosquitto cluster interop-clients

setup: $(STAMP)

# installed without compiling (SIFTMQ_PURE=1): the compile step below runs in the venv, so an
# edit rebuilds only the extensions instead of reinstalling the project
$(STAMP): pyproject.toml setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -U pip
	SIFTMQ_PURE=1 $(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

build: $(BUILT)

$(BUILT): $(STAMP) setup.py $(shell find broker topics -name "*.py")
	$(PY) setup.py -q build_ext --inplace
	touch $(BUILT)

run: $(BUILT)
	$(VENV)/bin/siftmq serve --host $(HOST) --port $(PORT) --metrics-listen $(HOST):$(METRICS_PORT)

# a 3-node cluster on this machine (docs/cluster.md): MQTT on 1883-1885
cluster: $(BUILT)
	scripts/cluster.sh

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

typecheck: $(STAMP)
	$(PY) -m mypy

# Headless Chromium renders the analytics report in one test; installed from Debian when
# missing and we may (root with apt-get), otherwise that one test is skipped with its reason.
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null \
	      || echo "chromium could not be installed: the report-rendering test will be skipped"; \
	  else echo "chromium not installed: the report-rendering test will be skipped"; fi; }

# Debian's mosquitto is the edge broker of the bridge interoperability test (issue 21); installed
# when missing and we may, otherwise that test is skipped with its reason.
mosquitto:
	@command -v mosquitto >/dev/null 2>&1 || test -x /usr/sbin/mosquitto || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mosquitto) >/dev/null \
	      || echo "mosquitto could not be installed: the bridge test will be skipped"; \
	  else echo "mosquitto not installed: the bridge test will be skipped"; fi; }

# The clients of the interoperability matrix (tests/interop, issue 28): Debian's mosquitto-clients
# and Paho C examples when missing and we may; MQTT.js from npm into tests/interop/node_modules
# (package-lock.json) when node is there. A client that is missing is skipped with its reason.
interop-clients:
	@{ command -v mosquitto_sub >/dev/null 2>&1 && command -v paho_c_sub >/dev/null 2>&1; } || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mosquitto-clients paho.mqtt.c-examples) >/dev/null \
	      || echo "mosquitto-clients / paho.mqtt.c-examples could not be installed: their interop tests will be skipped"; \
	  else echo "mosquitto-clients / paho.mqtt.c-examples not installed: their interop tests will be skipped"; fi; }
	@test -d tests/interop/node_modules/mqtt || { \
	  if command -v npm >/dev/null 2>&1; then \
	    (cd tests/interop && npm ci --no-audit --no-fund --silent) >/dev/null \
	      || echo "MQTT.js could not be installed: its interop tests will be skipped"; \
	  else echo "npm not installed: the MQTT.js interop tests will be skipped"; fi; }

# one worker per core, a test file's tests on one worker (module fixtures, ports 0 anyway), the
# files using the Spark session on one worker (tests/conftest.py)
unit: $(BUILT) chromium mosquitto interop-clients
	$(PY) -m pytest -n auto --dist loadfile

test: lint typecheck unit
