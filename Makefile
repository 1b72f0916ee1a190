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

.PHONY: run test lint typecheck unit setup build wheel chromium mosquitto cluster

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

# The wheel of `pip install siftmq` with the compiled hot path (docs/operations.md,
# "Installing"), built with the standard front end. --no-isolation: the dev venv already holds
# the build requirements (build checks them), so nothing is fetched and mypyc's C files in
# build/ are reused (it rewrites only those whose code changed): a rebuild after an edit
# compiles only what changed. tests/packaging/ installs this wheel into a fresh venv.
WHEEL := dist/.siftmq-wheel

wheel: $(WHEEL)

$(WHEEL): $(BUILT) pyproject.toml setup.py $(shell find broker topics content composite bridge cluster -name "*.py")
	mkdir -p dist && rm -f dist/siftmq-*.whl
	$(PY) -m build --wheel --no-isolation --outdir dist . >dist/build.log 2>&1 || { cat dist/build.log; exit 1; }
	touch $(WHEEL)

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

# one worker per core, a test file's tests on one worker (module fixtures, ports 0 anyway), the
# files using the Spark session on one worker (tests/conftest.py)
unit: $(BUILT) $(WHEEL) chromium mosquitto
	$(PY) -m pytest -n auto --dist loadfile

# The set-up steps run side by side (mypy, ruff and the system packages while mypyc compiles;
# the wheel after the in-place build, whose C files it reuses), then the tests on both cores.
test:
	@$(MAKE) --no-print-directory -j3 -Otarget lint typecheck wheel chromium mosquitto
	@$(MAKE) --no-print-directory unit
