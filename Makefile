# vit-plasticity: set up, run the demo world, test.
# Needs only Python 3.10+ and pip; no conda, no GPU, no internet beyond the package registries.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
export PATH := $(abspath $(BIN)):$(PATH)
export MPLBACKEND := Agg
export PYDEVD_DISABLE_FILE_VALIDATION := 1

.PHONY: help venv lab demo test format notebooks sync demo-weights clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

venv: $(STAMP)  ## create .venv with the package, notebook and test extras (idempotent)

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@# uv (installed by pip) installs and byte-compiles on every core: about 1 min on 2 cores against 2-3 min for pip
	@# (docs/benchmarks.md). It reads no pip configuration: where it cannot install (an index of your own, no route to
	@# PyPI), pip does it, then compileall byte-compiles on every core, passing over, as pip does, the few files
	@# written for other Pythons (torch's tests of Python 3.12 syntax)
	$(BIN)/python -m pip install --quiet uv && $(BIN)/uv pip install --python $(BIN)/python --quiet --compile-bytecode \
		-c constraints.txt -e ".[notebook,test]" \
	|| { $(BIN)/python -m pip install --quiet --no-compile -c constraints.txt -e ".[notebook,test]" \
		&& { $(BIN)/python -m compileall -qq -j 0 $(VENV)/lib || true; }; }
	@touch $(STAMP)

lab: venv  ## open the notebooks in JupyterLab (the project's environment is the python3 kernel; .ipynb or .py twin)
	env -u MPLBACKEND $(BIN)/jupyter lab --ServerApp.root_dir=notebooks --allow-root

demo: venv  ## execute every notebook on the demo world; HTML reports under reports/
	$(BIN)/python -m paperlib report demo

test: venv  ## ruff (lint and format check), unit tests, the demo runs (one pool), then nbval over the committed notebooks
	$(BIN)/ruff check paperlib tests benchmarks
	$(BIN)/ruff format --check paperlib tests benchmarks
	$(BIN)/python -m pytest -n auto --maxprocesses 4 tests
	$(BIN)/python -m paperlib demo runs
	$(BIN)/python -m pytest --nbval-lax --nbval-current-env -p no:cacheprovider -n auto --maxprocesses 4 --dist loadfile notebooks

format: venv  ## format and lint-fix the package and the tests (ruff, line length 120)
	$(BIN)/ruff format paperlib tests benchmarks
	$(BIN)/ruff check --fix paperlib tests benchmarks

sync: venv  ## pair notebooks with their jupytext scripts (edit either, then sync)
	$(BIN)/jupytext --sync notebooks/[0-9][0-9]_*.ipynb

notebooks: sync  ## re-execute the committed notebooks in place (demo outputs)
	$(BIN)/python -m paperlib report inplace notebooks/[0-9][0-9]_*.ipynb

demo-weights: venv  ## pretrain the demo ViT again, compared with paperlib/assets/demo_vit.safetensors (other weights replace it only with demo pretrain --overwrite)
	$(BIN)/python -m paperlib demo pretrain

clean:  ## remove generated outputs (reports/, results/), keep .venv
	rm -rf reports results .pytest_cache
