# The two commands of README.md. Both create .venv/ and install the project with
# its dev extra when missing (or when pyproject.toml changed), then do their job.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.siftmq-installed
HOST ?= 127.0.0.1
PORT ?= 1883

.PHONY: run test lint typecheck unit setup chromium

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -U pip
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/siftmq serve --host $(HOST) --port $(PORT)

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

unit: $(STAMP) chromium
	$(PY) -m pytest

test: lint typecheck unit
