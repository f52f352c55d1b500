# Two commands do everything on a fresh Linux machine with python3 and a C compiler:
#   make demo   set up .venv and run the demo
#   make test   set up .venv (with the test extras) and run the test suite
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export SAFELOADER_REQUIRE_NATIVE ?= 1

.PHONY: demo test bench setup clean

$(VENV)/.installed: pyproject.toml setup.py constraints.txt $(wildcard csrc/*.c csrc/*.h)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test,bench]'
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(PY) -m safeloader demo

test: setup
	$(PY) -m ruff check safeloader tests benchmarks
	$(PY) -m pytest

bench: setup
	$(PY) -m benchmarks --quick

clean:
	rm -rf $(VENV) build *.egg-info safeloader/_native*.so
