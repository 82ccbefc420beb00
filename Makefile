# The two commands of the README, and their building blocks.
#   make demo   install, then stream a generated collection through the embedded pipeline
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
	$(BIN)/rewardstream replay --inputs demo-output/rollouts_materialized_inputs.jsonl \
	    --rollouts demo-output/rollouts.jsonl --output-dir demo-output/streamed
	$(BIN)/ng_reward_profile +materialized_inputs_jsonl_fpath=demo-output/rollouts_materialized_inputs.jsonl \
	    +rollouts_jsonl_fpath=demo-output/rollouts.jsonl +quiet=true
	@for f in reward_profiling.jsonl agent_metrics.json repeat_level_metrics.json; do \
	    cmp demo-output/streamed/rollouts/rollouts_$$f demo-output/rollouts_$$f || exit 1; done
	@echo "demo: streamed profile in demo-output/streamed/rollouts/ equals ng_reward_profile's, byte for byte"

bench: install
	$(BIN)/python -m bench.profile_bench

clean:
	rm -rf $(VENV) demo-output bench/data bench/out
