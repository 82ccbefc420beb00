# The two commands of the README, and their building blocks.
#   make demo   install, then profile a generated collection end to end
#   make test   install (Python and Debian packages, Kafka jars via Maven), lint, type-check, all tests
PY      ?= python3
VENV    ?= .venv
BIN      = $(VENV)/bin
STAMP    = $(VENV)/.installed

.PHONY: install system-deps kafka-jars lint test unit demo bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

system-deps:
	bash .ci/system-deps

kafka-jars: install system-deps
	$(BIN)/rewardstream kafka fetch

lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy

unit: install
	$(BIN)/pytest -q -m "not kafka"

test: kafka-jars lint
	$(BIN)/pytest -q

demo: install
	$(BIN)/python bench/generate.py --tasks 500 --repeats 4 --out demo-output/rollouts
	$(BIN)/ng_reward_profile +materialized_inputs_jsonl_fpath=demo-output/rollouts_materialized_inputs.jsonl \
	    +rollouts_jsonl_fpath=demo-output/rollouts.jsonl
	@echo "demo: profile files are in demo-output/ (streaming collection via Kafka: coming in issues 4-5)"

bench: install
	$(BIN)/python -m bench.profile_bench

clean:
	rm -rf $(VENV) demo-output bench/data bench/out
