# The two commands of the README: `make serve` and `make test`.
VENV     ?= .venv
PY       := $(VENV)/bin/python
# The weights folder: WEIGHTS=... or VELOCITY_WEIGHTS=... (empty: the demo checkpoint,
# which scripts/serve.sh builds on first use).
WEIGHTS  ?= $(VELOCITY_WEIGHTS)
DEMO     := checkpoints/demo-tiny
PYTEST_ARGS ?=

.PHONY: setup serve test demo clean

setup:
	@bash scripts/setup.sh

# A demo checkpoint (seeded random weights: noise, not speech).
demo: setup
	@$(PY) -m velocity.release $(DEMO) 2>/dev/null || { rm -rf $(DEMO); \
		$(PY) scripts/make_demo_checkpoint.py --size tiny --out $(DEMO); }

serve: setup
	@bash scripts/serve.sh $(if $(WEIGHTS),--weights $(WEIGHTS))

test: setup
	@$(PY) -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) checkpoints .pytest_cache
