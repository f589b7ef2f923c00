# The two commands a newcomer runs: `make demo` and `make test`. Both create .venv and install
# everything into it. PyTorch is installed first and pinned, so no CUDA build is pulled in on a
# CPU machine; override TORCH for another build (e.g. TORCH="torch --index-url ...").
# `make test` (CI) runs every test; `make test-fast` is the inner loop (under a minute on 2 cores): the tests not
# marked slow (slow: starts a process, imports a reference library such as transformers, or measured over 0.1 s
# of CPU time: tests/slow_by_cpu.txt, made by tools/cpu_times.py).
VENV   ?= .venv
PYTHON ?= python3
TORCH  ?= torch==2.13.0
BIN    := $(VENV)/bin
# One pytest worker per core, at most 4 (each worker holds torch and the reference libraries); PARALLEL= runs
# the suite in one process.
PARALLEL ?= -n auto --maxprocesses 4
# The tests write bytecode caches (__pycache__, ignored by git) even where the environment turns them off
# (PYTHONDONTWRITEBYTECODE, as some sandboxes and containers set): without them every pytest worker rewrites
# and compiles all ~230 test modules again (10 s of CPU each on 2 cores) and every process a test starts
# compiles tformer's modules again.
TEST_ENV := PYTHONDONTWRITEBYTECODE=

.PHONY: demo test test-fast lint install install-test clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.torch: $(BIN)/python
	$(BIN)/pip install -q $(TORCH)
	touch $@

# The package is installed editable, so code changes need no reinstall: pip runs again (about 10 s) only when
# pyproject.toml (dependencies, entry points) is newer than the last install.
install: $(VENV)/.installed

$(VENV)/.installed: $(VENV)/.torch pyproject.toml
	$(BIN)/pip install -q -e ".[plot]"
	touch $@

install-test: $(VENV)/.installed-test

$(VENV)/.installed-test: $(VENV)/.torch pyproject.toml
	$(BIN)/pip install -q -e ".[test]"
	touch $@

demo: install
	$(BIN)/tformer demo

test: install-test
	$(BIN)/ruff check tformer tests benchmarks tools examples
	$(TEST_ENV) $(BIN)/python -m pytest -q $(PARALLEL) --durations=25

test-fast: install-test
	$(BIN)/ruff check tformer tests benchmarks tools examples
	$(TEST_ENV) $(BIN)/python -m pytest -q -p no:cacheprovider -m "not slow" $(PARALLEL)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
