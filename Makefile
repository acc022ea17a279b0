# Two commands for a fresh machine; each does all of its own set-up.
#   make test   - venv + installs, then the CPU test suite (compiles every kernel for sm_90a/sm_100a
#                 with triton 3.6.0, and again with triton 3.9.0 in a second venv); GPU tests run
#                 too when a CUDA GPU is present (`pytest -m gpu`).
#   make bench  - venv + install, then the survey (`gluon-survey`) on this machine's GPU.
# A python3 that already has torch and triton (e.g. a GPU box) is reused through
# --system-site-packages; otherwise TORCH_SPEC is installed (the CPU build where the local index
# has one; note that an unpinned `torch` from PyPI pulls several GB of CUDA packages).
PYTHON ?= python3
TORCH_SPEC ?= torch==2.13.0
TRITON_SPEC ?= triton==3.6.0
TRITON_NEW ?= triton==3.9.0
VENV ?= .venv
VENV_NEW ?= .venv-triton39
PYTEST_ARGS ?=

HAVE_STACK := $(shell $(PYTHON) -c "import torch, triton" >/dev/null 2>&1 && echo yes)

.PHONY: test test-cpu test-triton-new bench lint readme clean

$(VENV)/.ready: pyproject.toml
	$(PYTHON) -m venv $(if $(HAVE_STACK),--system-site-packages,) $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(if $(HAVE_STACK),,$(VENV)/bin/python -m pip install -q "$(TORCH_SPEC)" "$(TRITON_SPEC)")
	$(VENV)/bin/python -m pip install -q -e ".[dev]"
	touch $@

$(VENV_NEW)/.ready: pyproject.toml
	$(PYTHON) -m venv $(VENV_NEW)
	$(VENV_NEW)/bin/python -m pip install -q --upgrade pip
	$(VENV_NEW)/bin/python -m pip install -q "$(TORCH_SPEC)" "$(TRITON_NEW)"
	$(VENV_NEW)/bin/python -m pip install -q -e ".[dev]"
	touch $@

test: test-cpu test-triton-new

test-cpu: $(VENV)/.ready
	$(VENV)/bin/ruff check src tests
	$(VENV)/bin/python -m pytest -q $(PYTEST_ARGS)

# Every kernel must also compile with the newest triton on PyPI (renamed Gluon calls live in compat.py).
test-triton-new: $(VENV_NEW)/.ready
	$(VENV_NEW)/bin/python -m pytest -q -m compile $(PYTEST_ARGS)

bench: $(VENV)/.ready
	$(VENV)/bin/gluon-survey $(MODES) --dtype fp16,bf16 $(BENCH_ARGS)

# The README's result tables, from the committed results files (tests/test_readme.py checks them).
readme: $(VENV)/.ready
	$(VENV)/bin/python scripts/update_readme.py

lint: $(VENV)/.ready
	$(VENV)/bin/ruff check src tests

clean:
	rm -rf $(VENV) $(VENV_NEW) build *.egg-info src/*.egg-info
