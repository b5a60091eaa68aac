# mfpde: two commands on a fresh machine.
#   make run    builds .venv if missing, then runs the main job (mfpde run on its embedded default)
#   make test   builds .venv if missing, then ruff, mypy, the docs, pytest, pytest under mpiexec -n 2 (the tests marked
#               ranks: what the rank count can change), and the container test
#   make docs   the documentation (Sphinx, warnings are errors) into out/docs/html
#   make test-coretypes   the round-off tests again under other CPUs' OpenBLAS kernels (CI runs it too)
SHELL := /bin/bash
VENV := .venv
BIN := $(VENV)/bin
# python3.12 on PATH, else the newest 3.12 that pyenv has.
PYTHON312 := $(shell if python3.12 -c 'pass' >/dev/null 2>&1; then echo python3.12; \
	elif command -v pyenv >/dev/null 2>&1 && v=$$(pyenv versions --bare 2>/dev/null | grep '^3\.12' | tail -n1) && [ -n "$$v" ]; \
	then echo "$$(pyenv root)/versions/$$v/bin/python3.12"; fi)
NP ?= 2

.PHONY: run test env clean lint typecheck docs demo-outputs test-serial test-mpi test-container test-coretypes bench

$(BIN)/mfpde: pyproject.toml
	@test -n "$(PYTHON312)" || { echo "error: python3.12 not found: neither 'python3.12' on PATH runs nor does pyenv have a 3.12 (install Python 3.12)" >&2; exit 2; }
	$(PYTHON312) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[test]"
	@touch $@

env: $(BIN)/mfpde

run: env
	$(BIN)/mfpde run --overwrite

lint: env
	$(BIN)/ruff check .

typecheck: env
	$(BIN)/mypy

# The serial pass in NP worker processes (pytest-xdist): the tests are independent processes' work, each rank-1.
test-serial: env
	$(BIN)/pytest -n $(NP) --dist worksteal -m "not container" --junitxml=out/junit-serial.xml

test-mpi: env
	$(BIN)/mpiexec -n $(NP) $(BIN)/python -m mpi4py -m pytest -m "ranks and not serial and not container" -p no:cacheprovider \
		--junitxml=out/junit-mpi.xml

test-container: env
	$(BIN)/pytest -m container --junitxml=out/junit-container.xml

docs: env
	$(BIN)/sphinx-build -W --keep-going -q -b html docs out/docs/html

# the demos' printed output and figures of their quick runs, stored for the docs (a few minutes)
demo-outputs: env
	$(BIN)/python docs/store_demo_outputs.py

test: lint typecheck docs test-serial test-mpi test-container

# The round-off tests (marker ``roundoff``: their assertions are bounds of tests/roundoff.py, what another CPU's
# rounding can change; tests/conftest.py marks them) under other CPUs' OpenBLAS kernels (OPENBLAS_CORETYPE):
# Prescott (SSE3) with one thread, Haswell (AVX2) with OpenBLAS's default threads (the suite itself runs one thread a
# process, as the commands do, unless MFPDE_BLAS_THREADS says otherwise). numpy 2.5's bundled OpenBLAS
# 0.3.34 overflows a stack buffer in dgemm when a core type is forced on an AMD Zen 4/5 host (OpenBLAS
# issues #6021 and #6026, fixed by PR #6027, not yet in numpy's wheel): the emulation preloads the fixed
# build of the scipy-openblas64 wheel, which exports numpy's symbols. A real Haswell never takes that path.
OPENBLAS_FIXED = $$($(BIN)/python -c "import scipy_openblas64 as s; print(s.get_lib_dir())")/libscipy_openblas64_.so
test-coretypes: env
	LD_PRELOAD=$(OPENBLAS_FIXED) OPENBLAS_CORETYPE=Prescott OMP_NUM_THREADS=1 \
		$(BIN)/pytest -n $(NP) --dist worksteal -m "roundoff and not container" -p no:cacheprovider -q --junitxml=out/junit-prescott.xml
	LD_PRELOAD=$(OPENBLAS_FIXED) OPENBLAS_CORETYPE=Haswell MFPDE_BLAS_THREADS=default \
		$(BIN)/pytest -n $(NP) --dist worksteal -m "roundoff and not container" -p no:cacheprovider -q --junitxml=out/junit-haswell.xml

bench: env
	$(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) out .pytest_cache .ruff_cache .mypy_cache
