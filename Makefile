# The two commands of the README: `make serve` and `make test`.
VENV     ?= .venv
PY       := $(VENV)/bin/python
# The weights folder: WEIGHTS=... or VELOCITY_WEIGHTS=... (empty: the demo checkpoint,
# which scripts/serve.sh builds on first use).
WEIGHTS  ?= $(VELOCITY_WEIGHTS)
PYTEST_ARGS ?=

.PHONY: setup serve test test-fast clean

setup:
	@bash scripts/setup.sh

serve: setup
	@bash scripts/serve.sh $(if $(WEIGHTS),--weights $(WEIGHTS))

# The server tests and the others as two pytests at once (scripts/test.sh says how).
test:
	@bash scripts/setup.sh --test-tools
	@PY=$(PY) bash scripts/test.sh $(PYTEST_ARGS)

# The inner loop: every test that starts no server and runs no real pretrained model (about
# a minute). CI runs `make test`.
test-fast:
	@bash scripts/setup.sh --test-tools
	@$(PY) -m pytest -m "not server and not slow" $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) checkpoints .pytest_cache
