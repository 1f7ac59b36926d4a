# Two commands on a fresh machine:  make run  (serve the default model, SmolLM2-135M-Instruct)  ·  make test
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed

.PHONY: install run generate test test-fast test-slow test-clients wheel-check clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# NOTE: the CPU build of torch, pinned before anything can ask for an open range (which
	# would pull a CUDA build of several GB).
	$(PIP) install -q --no-compile torch==2.13.0 numpy
	# every extra: the tests' (which hold scale, otel and cuda's packages) and the benchmarks' plots
	$(PIP) install -q --no-compile -e '.[test,bench]'
	# NOTE: pip byte-compiles what it installs on one core (~34k files, ~1 min); here once, on every core. Exit
	# status 1: a file in a newer Python's syntax (torch's testing/_internal/py312_intrinsics.py), which pip too
	# leaves uncompiled.
	$(PY) -m compileall -qq -j 0 "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
	  || [ $$? -eq 1 ]
	# the real GGUF models (the default model and the tests' second file), fetched once into the user cache
	$(VENV)/bin/modelcall fetch-model smollm2 gemma3-270m
	touch $(STAMP)

install: $(STAMP)

run: install
	$(VENV)/bin/modelcall serve

generate: install
	$(VENV)/bin/modelcall generate --prompt "def fibonacci(n):" --max-tokens 48

# `make test` runs three steps, each printing its 20 slowest tests and its wall time:
#   test-fast     all but the slow tier, on $(WORKERS) workers (pytest-xdist)
#   test-slow     the slow tier (`-m slow`: the real GGUF models, the Ray replicas, the SIGKILL load loop, the
#                 browser, the sanitizer and AVX2 builds), on $(SLOW_WORKERS) workers
#   test-clients  instructor and guidellm, whose pins conflict with the test extra's, in a virtualenv of their own
# PYTEST_ARGS: extra pytest arguments of the first two; CI passes the coverage ones (.ci/run), which the slow
# step appends to, so its report covers both.
# NOTE: two workers are safe: every test server binds port 0; the demo model and the compiled C kernels are
# built into the user cache under a lock and renamed into place (demo_model/cache.py, core/native.py); tests
# share no file outside their tmp_path. --dist loadfile keeps each module on one worker, so a module-scoped
# server is started once, as in one process. --no-loadscope-reorder: files go out in collection order, where
# tests/conftest.py puts the longest first (LONGEST_FILES), not by their number of tests (xdist's default), so no
# long file starts last while the other worker idles. The slow tier runs after the fast one on $(SLOW_WORKERS)
# workers, a file a worker too, and imports only the files that name its marker (conftest.py). NOTE:
# its waits held on one worker at a load average of 10-15 on 2 cores, but on two at 15-20 (other sessions' work
# beside it) the Ray cluster of test_scale_ray did not start within its 240 s: SLOW_WORKERS=1 is the way back.
WORKERS      ?= 2
SLOW_WORKERS ?= $(WORKERS)
PYTEST       := OMP_NUM_THREADS=1 $(VENV)/bin/pytest -q -p no:cacheprovider --durations=20
CLIENT_TESTS := tests/test_client_instructor.py tests/test_client_guidellm.py
COV_APPEND   := $(if $(findstring --cov,$(PYTEST_ARGS)),--cov-append)
# $(call timed,NAME): after a step's command, print its wall time and keep its exit status
timed = rc=$$?; echo "make test: $(1) took $$(( $$(date +%s) - t0 )) s wall"; exit $$rc

test: test-fast test-slow test-clients

test-fast: install
	@t0=$$(date +%s); $(PYTEST) -n $(WORKERS) --dist loadfile --no-loadscope-reorder -m "not slow" $(addprefix --ignore=,$(CLIENT_TESTS)) \
	  $(PYTEST_ARGS); $(call timed,fast tier on $(WORKERS) workers)

# exit status 5 (no test selected: PYTEST_ARGS named files without slow tests) is not a failure here
test-slow: install
	@t0=$$(date +%s); $(PYTEST) -n $(SLOW_WORKERS) --dist loadfile --no-loadscope-reorder -m slow $(PYTEST_ARGS) $(COV_APPEND) || [ $$? -eq 5 ]; \
	  $(call timed,slow tier on $(SLOW_WORKERS) workers)

# instructor 1.17 wants openai 3.3 / jiter<0.15 and guidellm 0.8 click 8.4 / multidict<7 (the NOTEs in their
# tests): a virtualenv of their own over the project's (.ci/clients_venv.sh says how, and its time).
CLIENTS_VENV  ?= .venv-clients
CLIENTS_STAMP := $(CLIENTS_VENV)/.installed

$(CLIENTS_STAMP): $(STAMP) .ci/clients_venv.sh
	bash .ci/clients_venv.sh $(CLIENTS_VENV)
	touch $(CLIENTS_STAMP)

test-clients: $(CLIENTS_STAMP)
	@t0=$$(date +%s); MODELCALL_REQUIRE_CLIENTS=1 OMP_NUM_THREADS=1 $(CLIENTS_VENV)/bin/python -m pytest -q -p no:cacheprovider \
	  --durations=5 $(CLIENT_TESTS); $(call timed,clients in $(CLIENTS_VENV))

wheel-check: install
	bash .ci/wheel_check.sh

clean:
	rm -rf $(VENV) $(CLIENTS_VENV) build dist *.egg-info
