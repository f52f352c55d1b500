# Commands that do everything on a fresh Linux machine with python3 and a C compiler:
#   make demo          set up .venv and run the demo
#   make test          set up .venv (pinned stack: constraints.txt), then ruff, mypy, the docs
#                      site (warnings are errors) and the test suite
#   make test-latest   set up .venv-latest on Python 3.13 with the newest releases of every
#                      dependency from the registry (torch, zarr, zarrs, numpy, h5py, lightning...)
#                      and run the same suite
# Set-up needs only the public package index (no pip configuration of ours).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export SAFELOADER_REQUIRE_NATIVE ?= 1
# The tests mostly wait on child processes (workers, a hang being confirmed): run 6 at a time
# even on 2 cores (the suite alone: 4:40 against 5:18 with 4; CI, running two suites side by
# side, runs each with 4). TEST_WORKERS=0 runs them in one process.
TEST_WORKERS ?= 6
PYTEST_PARALLEL := -n $(TEST_WORKERS) --dist worksteal

.PHONY: demo test test-latest check-pins check-packaging bench bench-imports docs setup setup-latest clean

# The newest stack: Python 3.13 (pyenv's, or PYTHON_LATEST=/path/to/python3.13), nothing pinned.
PYTHON_LATEST ?= $(shell scripts/find-python313)
VENV_LATEST := .venv-latest
PY_LATEST := $(VENV_LATEST)/bin/python

# INSTALL: both venvs are filled by uv (itself installed from the package index by the venv's
# pip), for disk space and time. torch's default build is about 3.6 GB of wheels and 5 GB
# unpacked: pip keeps every downloaded wheel until the end of the install, and a copy in its
# cache (10.6 GB at the peak without the cache, about 14 GB with it: CI once ran out of disk),
# where uv unpacks each wheel once into its cache and hard-links it into the venv (7.3 GB at the
# peak). The pinned set-up takes 38 s instead of pip's 87 s, with the same versions. The cache
# lives inside the venv (hard links need the same file system) and is removed after the install.
# uv reads no configuration (--no-config) and no pip settings; like pip it looks in a wheel
# folder named by PIP_FIND_LINKS, if set. --compile-bytecode: see COMPILE below.
# $(call uv_install,VENV,EXTRA ARGUMENTS)
# Not --quiet: uv prints what it resolved, downloads and installed (the first set-up from the
# public index is 7 GB and a minute or more: it must not look hung).
define uv_install
	@echo "Setting up $(1): torch and the other dependencies from the package index. The first time, from the"
	@echo "public index: 3.4 GB to download and 7 GB on disk (torch's default build with its CUDA packages),"
	@echo "from about a minute (fast connection, idle machine) to 15 minutes (slow or busy). Later runs reuse $(1)."
	$(1)/bin/python -m pip install --quiet uv
	UV_CACHE_DIR=$(1)/uv-cache UV_LINK_MODE=hardlink $(1)/bin/python -m uv pip install --no-config \
	    --compile-bytecode --python $(1)/bin/python $(foreach d,$(PIP_FIND_LINKS),--find-links $(d)) \
	    $(2) -e '.[test,bench,docs]'
	rm -rf $(1)/uv-cache
endef

# COMPILE: where PYTHONDONTWRITEBYTECODE is set (as on CI) Python writes no .pyc, so every test child
# would compile every module it imports again: the installed packages are compiled at install,
# and `make test` compiles this checkout's own (about 0.1 s per child).
$(VENV)/.installed: pyproject.toml setup.py constraints.txt $(wildcard csrc/*.c csrc/*.h)
	$(PYTHON) -m venv $(VENV)
	$(call uv_install,$(VENV),-c constraints.txt)
	touch $@

setup: $(VENV)/.installed

$(VENV_LATEST)/.installed: pyproject.toml setup.py $(wildcard csrc/*.c csrc/*.h)
	@test -n "$(PYTHON_LATEST)" || { echo "make test-latest: no Python 3.13 found (set PYTHON_LATEST)"; exit 1; }
	rm -rf $(VENV_LATEST)
	$(PYTHON_LATEST) -m venv $(VENV_LATEST)
	$(call uv_install,$(VENV_LATEST),)
	$(PY_LATEST) -m pip list 2>/dev/null | grep -iE '^(torch|torchdata|numpy|zarr|zarrs|numcodecs|h5py|lightning|threadpoolctl) '
	touch $@

setup-latest: $(VENV_LATEST)/.installed

demo: setup
	$(PY) -m safeloader demo

test: setup
	$(PY) -m ruff check safeloader tests benchmarks
	$(PY) -m mypy
	$(VENV)/bin/lint-imports --no-cache  # the layers of docs/design.md (pyproject: tool.importlinter)
	$(PY) -m mkdocs build --strict --quiet --site-dir build/site
	$(PY) -m compileall -q safeloader tests benchmarks  # see COMPILE above
	$(PY) -m pytest $(PYTEST_PARALLEL)

# The newest stack checks safeloader itself; the torch_baseline tests (torch's own loader
# failing on the same code, mostly waiting out a hang's deadline) and the tooling tests (the
# benchmark harness and the demo, each a few fresh interpreters) run in `make test`.
test-latest: setup-latest
	$(PY_LATEST) -m ruff check safeloader tests benchmarks
	$(VENV_LATEST)/bin/lint-imports --no-cache
	$(PY_LATEST) -m mkdocs build --strict --quiet --site-dir build/site-latest
	$(PY_LATEST) -m compileall -q safeloader tests benchmarks
	$(PY_LATEST) -m pytest $(PYTEST_PARALLEL) -m "not torch_baseline and not tooling"

# The pins resolve on the public package index alone: catches a pin that only a local wheel
# folder or pip configuration could satisfy. uv's resolver (no configuration, no cache) reads
# metadata only; `pip install --dry-run` downloads every wheel it picks (3.3 GB of torch's CUDA
# packages) before it reports. uv comes from the package index into build/check-pins.
check-pins:
	$(PYTHON) -m venv build/check-pins
	env -u PIP_FIND_LINKS PIP_CONFIG_FILE=/dev/null PIP_CONSTRAINT= build/check-pins/bin/python -m pip install \
	    --quiet --no-cache-dir uv
	printf '%s\n' '.[test,bench,docs]' $(BENCH_IMPORTS) | build/check-pins/bin/python -m uv pip compile \
	    --quiet --no-config --no-cache --python $(PYTHON) -c constraints.txt -o /dev/null -

# sdist + wheel installed in a fresh venv with and without a C compiler, then a smoke test.
check-packaging: setup
	PY=$(PY) scripts/check-packaging

docs: setup
	$(PY) -m mkdocs build --strict --site-dir build/site
	@echo "docs site: build/site/index.html"

bench: setup
	$(PY) -m benchmarks --quick

# More native packages for bench_first_start's largest import set (about 300 extension modules),
# kept out of .venv so that the tests never see them: installed beside it, pinned, without their
# dependencies (numpy and threadpoolctl are .venv's); the benchmark's children put the folder last
# on sys.path.
BENCH_IMPORTS := scipy scikit-learn joblib cloudpickle narwhals opencv-python-headless
BENCH_IMPORTS_DIR := build/bench-imports
bench-imports: setup
	$(PY) -m pip install --quiet --no-deps --upgrade --target $(BENCH_IMPORTS_DIR) -c constraints.txt $(BENCH_IMPORTS)

clean:
	rm -rf $(VENV) $(VENV_LATEST) build site *.egg-info safeloader/_native*.so
