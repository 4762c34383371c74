# kernelrl: `make up` runs the main job, `make test` the test suite; both set up first.
SHELL := /bin/bash
VENV := .venv
KRL := $(VENV)/bin/kernelrl
PYTEST_ARGS ?=

.PHONY: setup up test test-long test-gpu bench clean

setup:
	@bash cluster/scripts/setup.sh

up: setup
	$(KRL) up $(UP_ARGS)

test: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/python -m pytest -m "not gpu and not long" --durations=25 $(PYTEST_ARGS)

# The long proofs (marker `long`: each has a shorter twin in `make test`; docs record their last runs).
test-long: setup
	$(VENV)/bin/python -m pytest -m "long and not gpu" --durations=25 $(PYTEST_ARGS)

# On a GPU machine: the CUDA backend's tests. GPU_TESTS lists the folders holding gpu-marked tests
# (the GPU image has no kafka-python, so folders whose modules import the bus are not collected there).
GPU_TESTS ?= tests/sandbox
test-gpu:
	python3 -m pytest -m gpu $(GPU_TESTS) $(PYTEST_ARGS)

bench: setup
	$(KRL) bench bus --json

clean:
	rm -rf $(VENV) .pytest_cache
