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

.PHONY: run test lint typecheck unit setup build chromium mosquitto cluster nemesis-tools

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

# iproute2 and nftables for the nemesis (issue 30: network namespaces, a bridge, drop rules);
# installed when missing and we may, otherwise tests/nemesis is skipped with its reason.
nemesis-tools:
	@{ command -v ip >/dev/null 2>&1 && command -v nft >/dev/null 2>&1; } || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 nftables) >/dev/null \
	      || echo "iproute2/nftables could not be installed: the nemesis test will be skipped"; \
	  else echo "ip or nft missing: the nemesis test will be skipped"; fi; }

# one worker per core, a test file's tests on one worker (module fixtures, ports 0 anyway), the
# files using the Spark session on one worker (tests/conftest.py)
unit: $(BUILT) chromium mosquitto nemesis-tools
	$(PY) -m pytest -n auto --dist loadfile

test: lint typecheck unit
