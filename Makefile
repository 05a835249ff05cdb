# The two commands of the README: `make serve` and `make test`.
VENV     ?= .venv
PY       := $(VENV)/bin/python
WEIGHTS  ?=
DEMO     := checkpoints/demo-tiny
PYTEST_ARGS ?=

.PHONY: setup serve test demo clean

setup:
	@bash scripts/setup.sh

# A demo checkpoint (seeded random weights: noise, not speech) when no WEIGHTS are given.
demo: setup
	@if [ -z "$(WEIGHTS)" ] && [ -f scripts/make_demo_checkpoint.py ] && [ ! -d $(DEMO) ]; then \
		$(PY) scripts/make_demo_checkpoint.py --size tiny --out $(DEMO); fi

serve: demo
	@bash scripts/serve.sh $(if $(WEIGHTS),--weights $(WEIGHTS),--weights $(DEMO))

test: setup
	@$(PY) -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) checkpoints .pytest_cache
