# Each target makes its own virtual environment (.venv) on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test test-fast bench clean-venv

$(VENV)/.installed: pyproject.toml requirements-test.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-test.txt -e '.[test]'
	touch $@

demo: $(VENV)/.installed
	$(PY) examples/demo.py

# Six pytest workers on 2 cores: two kept the cores about half busy; six keep them busy from the
# first minute to the last (vmstat), mostly with the jobs' torch and Lightning imports, and eight
# were no faster. The jobs that start many processes at once size themselves by free memory. The
# shared gloo dumps are made once per run by whichever worker asks first (tests/analysis/conftest.py).
# Tests go out one at a time, longest first (tests/conftest.py, tests/durations.txt), so the run
# does not end on one long job; a module whose tests share a costly fixture is one xdist_group.
# Bytecode caches are written even where the environment says not to (PYTHONDONTWRITEBYTECODE):
# each of the suite's ~400 job processes and helpers would compile this package's modules again.
# tests/startup/sitecustomize.py makes the garbage collector run less often in every process of
# the run: ~0.6 of each rank's ~4.4 CPU-seconds of imports went to it.
test: $(VENV)/.installed
	PYTHONDONTWRITEBYTECODE= PYTHONPATH=$(CURDIR)/tests/startup$${PYTHONPATH:+:$$PYTHONPATH} $(PY) -m pytest -q -n 6 --dist loadgroup --no-loadscope-reorder tests

# Everything but the real multi-process jobs (tests marked `jobs` by tests/conftest.py).
test-fast: $(VENV)/.installed
	PYTHONDONTWRITEBYTECODE= PYTHONPATH=$(CURDIR)/tests/startup$${PYTHONPATH:+:$$PYTHONPATH} $(PY) -m pytest -q -n 2 -m "not jobs" tests

bench: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) bench/run_all.py

clean-venv:
	rm -rf $(VENV)
