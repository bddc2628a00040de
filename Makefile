# The two commands of the README:
#   make smoke   the main job on this host (cpu-smoke profile, tiny model, end to end)
#   make test    the test suite (what CI runs)
SHELL := /bin/bash
VENV := .venv/bin

.PHONY: env smoke test lint
env:
	@scripts/setup-env.sh

smoke: env
	@scripts/smoke.sh

test: env
	$(VENV)/ruff check .
	$(VENV)/python -m pytest -q $(PYTEST_ARGS)

lint: env
	$(VENV)/ruff check .
