# The two commands of README.md. Both create .venv/ and install the project with
# its dev extra when missing (or when pyproject.toml changed), then do their job.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.siftmq-installed
# the hot path compiled with mypyc (setup.py; the list lives in broker/_build.py)
BUILT := $(VENV)/.siftmq-compiled
# the JVM provider of format("siftmq"), package data (bridge/_jar.py)
JAR := bridge/jvm/siftmq-spark.jar
# the byte code of the installed dependencies (pip installs them without, below)
PYC := $(VENV)/.siftmq-bytecode
# the suite's own byte code (test modules as pytest rewrites them), written before its workers start
TESTPYC := $(VENV)/.siftmq-test-bytecode
HOST ?= 127.0.0.1
PORT ?= 1883
METRICS_PORT ?= 9464

.PHONY: run test test-setup checks lint typecheck unit setup build jar bytecode wheel system-packages node-clients cluster

setup: $(STAMP) $(PYC)

# installed without compiling (SIFTMQ_PURE=1): the compile step below runs in the venv, so an
# edit rebuilds only the extensions instead of reinstalling the project. Set-up time
# (docs/development.md): --no-build-isolation, since a pure editable install needs only
# setuptools (installed first), not the isolated environment of pyproject.toml's build
# requirements (mypy, numpy, ... installed a second time, ~6 s). --no-compile: pip would
# byte-compile the ~5,700 modules of the dependencies one by one before the build can start
# (~11-15 s of CPU); $(PYC) compiles them on both cores beside the mypyc build instead. They
# must be compiled before any test: without it, Spark's first Python workers compiled pyspark
# and pandas at start-up and missed Spark's connect-back timeout on a loaded machine
#
# A new venv is made without pip and gets the current pip and setuptools from $(PYTHON)'s own
# pip (`pip --python`, pip >= 22.3): ensurepip installed and byte-compiled the bundled pip
# first, only for it to be upgraded (7.1 -> 3.3 s of CPU, 19.4 -> 8.7 s at a load of 7, at the
# head of the set-up where nothing else runs). Without a pip for $(PYTHON), the usual way.
$(STAMP): pyproject.toml setup.py
	if test -x $(PY); then $(PY) -m pip install -q --disable-pip-version-check -U pip 'setuptools>=77'; \
	elif $(PYTHON) -m venv --without-pip $(VENV) && \
	  $(PYTHON) -m pip --python $(PY) install -q --disable-pip-version-check -U pip 'setuptools>=77'; then :; \
	else rm -rf $(VENV) && $(PYTHON) -m venv $(VENV) && \
	  $(PY) -m pip install -q --disable-pip-version-check -U pip 'setuptools>=77'; fi
	SIFTMQ_PURE=1 $(PY) -m pip install -q --disable-pip-version-check --no-build-isolation --no-compile -e '.[dev]'
	touch $(STAMP)

build: $(BUILT) $(JAR) $(PYC)

# the JVM provider of format("siftmq") (bridge/_jar.py): compiled when javac is there (~5-20 s),
# else a warning and no jar (the Python data source reads, and this step runs again next time)
jar: $(JAR)

# SIFTMQ_PURE=1: setup.py's mypycify (mypyc's whole type analysis of the hot path, ~20 s of
# CPU) ran for this command too, which builds no extension, beside the mypyc build of the
# same modules into the same cache. javac is short-lived: the JIT's C2 threads and the
# parallel collector cost more than they save (javac 4.3 -> 2.1 s of CPU), as for the suite's
# JVMs (tests/conftest.py). The step: 25.6 -> 2.7 s of CPU (docs/development.md, session 15)
$(JAR): bridge/_schema.py bridge/_jar.py $(shell find bridge/jvm/src -type f) | $(STAMP)
	SIFTMQ_PURE=1 JAVA_TOOL_OPTIONS="-XX:TieredStopAtLevel=1 -XX:+UseSerialGC" $(BESIDE) $(PY) setup.py -q build_jar

bytecode: $(PYC)

# the dependencies' own test suites (pandas/tests, ...: 1,600 of the ~6,000 modules) are never
# imported: left out (22 -> 14.5 s of CPU); whatever is imported uncompiled is compiled then.
# Nor are (a fresh-clone run of the suite read 11 of their 1,098 modules' byte code): mypy's
# and mypyc's pure-Python twins of their compiled modules, fontTools, rich, typer, cffi, and
# pyspark's pandas API, ML, examples and Spark Connect client (the rest of pyspark, which
# Spark's Python workers import, stays compiled): 12.0-12.5 -> 9.2-9.7 s of CPU
PYC_SKIP := /tests?/|/site-packages/(fontTools|mypy|mypyc|rich|typer|cffi)/|/pyspark/(pandas|ml|mllib|examples|sql/connect)/
$(PYC): $(STAMP)
	$(BESIDE) $(PY) -m compileall -q -j0 -x '$(PYC_SKIP)' "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null
	touch $(PYC)

# mypyc's incremental cache (build/mypyc-cache) can crash code generation after a merge that
# moved classes between modules ("ValueError: value is not in list" in emit_undefined_attr_check,
# mypy 1.x, seen twice in session 14): the build then runs once more from an empty cache
$(BUILT): $(STAMP) setup.py $(shell find broker topics -name "*.py" -o -name "*.c")
	$(PY) setup.py -q build_ext --inplace || { echo "mypyc failed: again from an empty cache"; \
	  rm -rf build/mypyc-cache; $(PY) setup.py -q build_ext --inplace; }
	# build_ext copies an unchanged per-module shim with its old time; the group library
	# beside it is new, so the stale-module check (broker/_build.py) must see them as built
	find broker topics -name "*.so" -exec touch {} +
	touch $(BUILT)

# The wheel of `pip install siftmq` with the compiled hot path (docs/operations.md,
# "Installing"), built with the standard front end. --no-isolation: the dev venv already holds
# the build requirements (build checks them), so nothing is fetched and mypyc's C files in
# build/ are reused (it rewrites only those whose code changed): a rebuild after an edit
# compiles only what changed. tests/packaging/ installs this wheel into a fresh venv.
WHEEL := dist/.siftmq-wheel

wheel: $(WHEEL)

$(WHEEL): $(BUILT) $(JAR) pyproject.toml setup.py $(shell find broker topics content composite bridge cluster uplink -name "*.py")
	mkdir -p dist && rm -f dist/siftmq-*.whl
	$(PY) -m build --wheel --no-isolation --outdir dist . >dist/build.log 2>&1 || { cat dist/build.log; exit 1; }
	touch $(WHEEL)

run: $(BUILT) $(PYC)
	$(VENV)/bin/siftmq serve --host $(HOST) --port $(PORT) --metrics-listen $(HOST):$(METRICS_PORT)

# a 3-node cluster on this machine (docs/cluster.md): MQTT on 1883-1885
cluster: $(BUILT) $(PYC)
	scripts/cluster.sh

lint: $(STAMP)
	$(BESIDE) $(PY) -m ruff check .
	$(BESIDE) $(PY) -m ruff format --check .

typecheck: $(STAMP)
	$(BESIDE) $(PY) -m mypy

# Debian packages that some tests drive (each such test skips with its reason when its program
# is missing), as command:package. Installed in ONE apt-get call when any is missing and we may
# (root with apt-get): two apt-get runs side by side would fight over dpkg's lock.
#   chromium, chromedriver: the analytics report and the dashboard in a real browser
#   mosquitto: the edge broker of the bridge interoperability test (issue 21)
#   mosquitto_sub, paho_c_sub: the interoperability matrix (tests/interop, issue 28)
#   ip, nft: the nemesis (network namespaces, a bridge, drop rules; tests/nemesis, issue 30)
DEBS := chromium:chromium chromedriver:chromium-driver mosquitto:mosquitto \
	mosquitto_sub:mosquitto-clients paho_c_sub:paho.mqtt.c-examples ip:iproute2 nft:nftables

system-packages:
	@missing=; for pair in $(DEBS); do cmd=$${pair%%:*}; \
	  command -v $$cmd >/dev/null 2>&1 || test -x /usr/sbin/$$cmd || missing="$$missing $${pair#*:}"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing) >/dev/null \
	      || echo "could not install$$missing: the tests that need them will be skipped"; \
	  else echo "not installed:$$missing: the tests that need them will be skipped"; fi; fi

# MQTT.js for the interoperability matrix, from npm into tests/interop/node_modules (its
# package-lock.json) when node is there; otherwise its tests are skipped with their reason.
node-clients:
	@test -d tests/interop/node_modules/mqtt || { \
	  if command -v npm >/dev/null 2>&1; then \
	    (cd tests/interop && $(BESIDE) npm ci --no-audit --no-fund --silent) >/dev/null \
	      || echo "MQTT.js could not be installed: its interop tests will be skipped"; \
	  else echo "npm not installed: the MQTT.js interop tests will be skipped"; fi; }

# four workers on the two cores: the tests spend most of their time waiting for subprocesses,
# JVMs and failure detectors (a run used 165 s of CPU in 240 s on two cores with two workers;
# three workers: 192 s, same tests, same machine; 2026-11-27, 1,102 tests: three workers 182 s,
# four 164 s, in place, one after the other); a test file's tests on one worker (module
# fixtures, ports 0 anyway), the files using the Spark session on one worker (tests/conftest.py)
#
# Byte code: the suite starts hundreds of Python processes (its workers, brokers and cluster
# nodes as subprocesses, CLIs, Spark's Python workers); with PYTHONDONTWRITEBYTECODE set (as in
# this machine's environment) each compiled every module of ours it imported, and each worker
# rewrote and compiled all 120 test modules (~3 s of CPU of its ~5 s collection). The suite
# writes its byte code (gitignored __pycache__/), and $(TESTPYC) collects the suite once
# beforehand, so that the four workers read the test modules' byte code instead of each
# rewriting them at the same time. That collection runs beside the mypyc build (BESIDE), not
# after it: it runs no test, so it needs no compiled module (tests/conftest.py checks for a
# stale build only in a run of tests), and it took ~7-9 s of the set-up's critical path after
# the build (docs/development.md, "Suite time (session 17)")
unit: export PYTHONDONTWRITEBYTECODE :=
unit: $(BUILT) $(PYC) $(TESTPYC) $(WHEEL) system-packages node-clients
	$(PY) -m pytest -n 4 --dist loadfile

$(TESTPYC): $(STAMP) $(PYC) $(shell find tests -name "*.py" -not -path "*/node_modules/*")
	PYTHONDONTWRITEBYTECODE= $(BESIDE) $(PY) -m pytest -p no:xdist -p no:cacheprovider --collect-only -q \
	  >$(VENV)/collect.log 2>&1 && touch $@ || echo "collecting the tests failed (the test run reports it)"

# The set-up steps run side by side (the dependencies' byte code, then the suite's, and the
# system packages while mypyc compiles; the wheel after the in-place build, whose C files it
# reuses), then the tests on both cores.
#
# The steps beside the mypyc build (byte code, the jar, MQTT.js) run niced (BESIDE): the
# build is the set-up's critical path (pip, then mypyc's analysis on one core, then gcc, the
# two broker/core libraries on the two cores at the end), and the steps beside it
# fill the core it leaves idle instead of taking a share of its core (docs/development.md,
# "Suite time (session 16)")
#
# mypy and ruff (`checks`) run beside the tests, niced, not before them: the tests need neither,
# and the suite leaves part of the two cores idle (its workers wait for brokers, cluster nodes
# and JVMs, most at its end), which the two fill instead of lengthening the set-up
# (docs/development.md, "Suite time (session 19)"). Their output is in $(CHECKS), printed after
# the tests, or at once when one of them fails (make then fails once the tests are done)
BESIDE ?=
CHECKS := $(VENV)/checks.log
test: test-setup
	@$(MAKE) --no-print-directory -j2 BESIDE="nice -n 10" unit checks
	@cat $(CHECKS)

test-setup:
	@$(MAKE) --no-print-directory -j3 -Otarget BESIDE="nice -n 10" wheel bytecode $(TESTPYC) system-packages node-clients

checks: $(STAMP)
	@$(MAKE) --no-print-directory -k typecheck lint >$(CHECKS) 2>&1 || { cat $(CHECKS); exit 1; }
