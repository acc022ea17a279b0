# Two commands for a fresh machine; each does all of its own set-up.
#   make test   - venvs + installs, ruff, then the CPU test suite with triton 3.6.0 (compiles every
#                 kernel config for sm_90a/sm_100a and checks its SASS), then the compile tests
#                 with triton 3.9.0 in a second venv (one config per kernel design: API renames);
#                 GPU tests run too when a CUDA GPU is present (`pytest -m gpu`). Prints its time;
#                 a second run reuses the venvs. Tests run on PYTEST_JOBS pytest-xdist workers.
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
PYTEST_JOBS ?= auto
PIP_QUIET ?= -qq
# The compile tests the triton-3.9 pass runs: one config per kernel design (tests/kernel_reports.py).
NEW_MARKERS ?= compile and not exhaustive

HAVE_STACK := $(shell $(PYTHON) -c "import torch, triton" >/dev/null 2>&1 && echo yes)

.PHONY: test test-cpu test-triton-new bench lint readme clean

# pytest (quiet, on PYTEST_JOBS workers), where exit status 5 (no test collected, e.g.
# PYTEST_ARGS="-k ..." that matches none of a step's tests) is a pass that says so; every other
# non-zero status fails the step. $(1): the python (with any environment), $(2): pytest's options.
define pytest
	status=0; $(1) -m pytest -q -n $(PYTEST_JOBS) $(2) $(PYTEST_ARGS) || status=$$?; \
	if [ $$status -eq 5 ]; then echo "(no test selected in this step)"; status=0; fi; exit $$status
endef

$(VENV)/.ready: pyproject.toml
	$(PYTHON) -m venv $(if $(HAVE_STACK),--system-site-packages,) $(VENV)
	$(VENV)/bin/python -m pip install $(PIP_QUIET) --upgrade pip
	$(if $(HAVE_STACK),,$(VENV)/bin/python -m pip install $(PIP_QUIET) "$(TORCH_SPEC)" "$(TRITON_SPEC)")
	$(VENV)/bin/python -m pip install $(PIP_QUIET) -e ".[dev]"
	touch $@

$(VENV_NEW)/.ready: pyproject.toml
	$(PYTHON) -m venv $(VENV_NEW)
	$(VENV_NEW)/bin/python -m pip install $(PIP_QUIET) --upgrade pip
	$(VENV_NEW)/bin/python -m pip install $(PIP_QUIET) "$(TORCH_SPEC)" "$(TRITON_NEW)"
	$(VENV_NEW)/bin/python -m pip install $(PIP_QUIET) -e ".[dev]"
	touch $@

test:
	@start=$$(date +%s); status=0; \
	$(MAKE) --no-print-directory test-cpu test-triton-new || status=$$?; \
	echo "make test: $$(( $$(date +%s) - start )) s, $$([ $$status -eq 0 ] && echo passed || echo FAILED)"; \
	exit $$status

# The GPU tests, where torch sees a GPU, run after the rest and in one process (they share the GPU).
test-cpu: $(VENV)/.ready
	$(VENV)/bin/ruff check src tests
	@echo "pytest, triton 3.6.0: the suite"
	@$(call pytest,$(VENV)/bin/python,-m "not gpu")
	@if $(VENV)/bin/python -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then \
		echo "pytest, triton 3.6.0: the GPU tests"; $(call pytest,$(VENV)/bin/python,-n 0 -m gpu); fi

# Every kernel design must also compile with the newest triton on PyPI (renamed Gluon calls live in
# compat.py). TRITON_DEFAULT_FP_FUSION=1: the default triton 3.6 compiles with, which 3.9 warns
# will change in 3.10.
test-triton-new: $(VENV_NEW)/.ready
	@echo "pytest, triton 3.9.0: one config per kernel design compiles"
	@$(call pytest,TRITON_DEFAULT_FP_FUSION=1 $(VENV_NEW)/bin/python,-m "$(NEW_MARKERS)")

bench: $(VENV)/.ready
	$(VENV)/bin/gluon-survey $(MODES) --dtype fp16,bf16 $(BENCH_ARGS)

# The result tables of README.md and docs/results.md, from the committed results files (tests/test_readme.py checks them).
readme: $(VENV)/.ready
	$(VENV)/bin/python scripts/update_readme.py

lint: $(VENV)/.ready
	$(VENV)/bin/ruff check src tests

clean:
	rm -rf $(VENV) $(VENV_NEW) build *.egg-info src/*.egg-info
