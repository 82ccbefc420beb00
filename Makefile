# The two commands of the README, and their building blocks.
#   make demo   install, start the bundled gym servers, collect and profile live (rewardstream demo)
#   make test   install (Python and Debian packages, Kafka jars via Maven, the nemo-gym 0.7.0
#               reference on Python 3.13), lint, type-check, all tests
PY      ?= python3
VENV    ?= .venv
BIN      = $(VENV)/bin
STAMP    = $(VENV)/.installed

.PHONY: install system-deps kafka-jars nemo-reference lint test unit demo bench clean deploy-secrets

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

system-deps:
	VENV=$(VENV) bash .ci/system-deps

kafka-jars: install system-deps
	$(BIN)/rewardstream kafka fetch

# the real nemo-gym 0.7.0 the interop tests compare with (.ci/nemo-reference)
NEMO_PY = .nemo-gym/venv/bin/python
nemo-reference:
	bash .ci/nemo-reference

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

unit: install
	$(BIN)/pytest -q -m "not kafka"

# .venv/tools first on PATH: the Prometheus binaries .ci/system-deps takes out of Debian's package;
# --durations: the slowest tests named in every CI log, against .ci/run's 30-minute budget.
# -n 3 --dist loadfile: three pytest-xdist workers, a file each at a time (a module's fixtures
# stay in one worker; every worker starts its own fixture broker). Most tests wait on brokers,
# servers and child processes, so three share two cores well (docs/development.md, "Test run")
TEST_WORKERS ?= 3
test: kafka-jars nemo-reference lint
	PATH=$(CURDIR)/$(VENV)/tools:$$PATH \
	NEMO_GYM_PYTHON=$$([ -x $(NEMO_PY) ] && echo $(CURDIR)/$(NEMO_PY)) \
	$(BIN)/pytest -q --durations=40 -n $(TEST_WORKERS) --dist loadfile

demo: install
	$(BIN)/rewardstream demo --output-dir demo-output
	rm -rf demo-output/check && mkdir -p demo-output/check
	cp demo-output/rollouts.jsonl demo-output/rollouts_materialized_inputs.jsonl demo-output/check/
	$(BIN)/ng_reward_profile +materialized_inputs_jsonl_fpath=demo-output/check/rollouts_materialized_inputs.jsonl \
	    +rollouts_jsonl_fpath=demo-output/check/rollouts.jsonl +quiet=true
	@for f in reward_profiling.jsonl agent_metrics.json repeat_level_metrics.json; do \
	    cmp demo-output/rollouts_$$f demo-output/check/rollouts_$$f || exit 1; done
	@echo "demo: the live profile in demo-output/ equals ng_reward_profile's, byte for byte"

# docker-compose.yml's HTTP token, CA and processor certificate (deploy/secrets/, not committed)
deploy-secrets:
	bash deploy/make-secrets.sh

bench: install
	$(BIN)/python -m bench.profile_bench

clean:
	rm -rf $(VENV) .nemo-gym demo-output bench/data bench/out
