# ampe — make demo | make test | make lint | make bench | make ops
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean venv ops

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The small CPU build of torch first, so the `trial` extra does not pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[trial,dev]'
	touch $(STAMP)

venv: $(STAMP)

# DeepSpeed's CPU comm op, built once up front (one line says so; 1-4 minutes on a busy 2-core machine) in ampe's
# folder for this environment, under ampe's build lock; clears a build lock a killed build left (docs/trials.md).
# Nothing is built when the op is there already (a check of a few seconds). `make test` stops if it cannot be built
# (every trial test would fail); `make demo` only plans, so it says why and goes on.
PREBUILD := DS_ACCELERATOR=cpu $(BIN)/python -m ampe.runtime.prebuild

ops: $(STAMP)
	$(PREBUILD)

demo: $(STAMP)
	-$(PREBUILD)
	$(BIN)/ampe search --cluster cluster_specs/amp-het-cluster.yaml --model gpt2-amp \
		--profile ampe/data/amp_layer_profiles.csv --global-batch 32 --top-k 10 --out demo-plan.json
	@echo "ampe is installed in $(VENV): 'source $(VENV)/bin/activate' puts it on your PATH"

# two xdist workers, each test file kept on one (its module fixtures built once): on the 2-core machine the suite's
# trials wait on their ranks often enough that two files at a time take about two thirds of the serial time
test: $(STAMP) ops
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --durations=25 tests; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 0; fi; exit $$rc

# ruff (rule set in pyproject.toml), mypy on ampe/, and the import contracts (docs/layout.md)
lint: $(STAMP)
	$(BIN)/ruff check ampe tests benchmarks
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: $(STAMP)
	for b in benchmarks/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
