# The two commands of README.md. Both create .venv/ and install the project with
# its dev extra when missing (or when pyproject.toml changed), then do their job.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.siftmq-installed
HOST ?= 127.0.0.1
PORT ?= 1883

.PHONY: run test lint typecheck unit setup

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

unit: $(STAMP)
	$(PY) -m pytest

test: lint typecheck unit
