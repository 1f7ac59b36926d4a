# Two commands on a fresh machine:  make run  (serve the built-in demo model)  ·  make test
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed

.PHONY: install run generate test wheel-check clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# NOTE: the CPU build of torch, pinned before anything can ask for an open range (which
	# would pull a CUDA build of several GB).
	$(PIP) install -q torch==2.13.0 numpy
	# every extra: the tests' (which hold scale, otel and cuda's packages) and the benchmarks' plots
	$(PIP) install -q -e '.[test,bench]'
	touch $(STAMP)

install: $(STAMP)

run: install
	$(VENV)/bin/modelcall serve

generate: install
	$(VENV)/bin/modelcall generate --prompt "def fibonacci(n):" --max-tokens 48

# PYTEST_ARGS: extra pytest arguments; CI passes the coverage ones (.ci/run), `make test` runs without.
test: install
	OMP_NUM_THREADS=1 $(VENV)/bin/pytest -q -p no:cacheprovider $(PYTEST_ARGS)

wheel-check: install
	bash .ci/wheel_check.sh

clean:
	rm -rf $(VENV) build dist *.egg-info
