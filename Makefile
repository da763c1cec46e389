# Two commands do everything on a fresh machine:
#   make serve   install what serving needs, build the example models, serve model_repository/ (HTTP 8000,
#                gRPC 8001, metrics 8002; other flags with ARGS, e.g. make serve ARGS="--http-port 9000")
#   make test    install the test tools as well (tritonclient, grpcio-tools, the real perf_analyzer, ruff, mypy,
#                ...), build models, run every test, then make lint (ruff and mypy at the versions pinned in
#                pyproject.toml's test extra)

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=
# Two steps, so `make serve` never waits for the test tools: the server's dependencies and onnx (the example
# models' builder), then the test extra on top.
SERVE_STAMP := $(VENV)/.installed-serve
TEST_STAMP := $(VENV)/.installed-test

.PHONY: install install-test models serve test lint perf-analyzer protos clean

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

install: $(SERVE_STAMP)

install-test: $(TEST_STAMP)

models: install
	$(PY) -m hubserve_models.examples model_repository

serve: models
	$(VENV)/bin/hubserve serve --model-repository model_repository $(ARGS)

perf-analyzer: install
	PYTHON=$(PY) bash tools/install_perf_analyzer.sh

# The whole suite runs as the default layout is chosen here (one process below 4 cores: engine/workers/); the
# protocol, completion, parity, perf_analyzer, sequence, ensemble, decoupled, shared-memory, access, canary and
# OpenAI suites run again with --workers 2, so both layouts stay tested whichever the machine picks.
WORKER_SUITES = tests/test_http_api.py tests/test_grpc_api.py tests/test_completion.py tests/test_parity.py \
	tests/test_perf_analyzer.py tests/test_sequence_batcher.py tests/test_ensemble.py tests/test_classification.py \
	tests/test_python_sequence.py tests/test_sequence_clients.py tests/test_decoupled.py tests/test_client_shm.py \
	tests/test_access_server.py tests/test_canary.py tests/test_openai_api.py tests/test_openai_errors.py \
	tests/test_observability.py tests/test_abuse.py tests/test_faults.py tests/test_generate_triton.py \
	tests/test_openai_quota.py tests/test_generate_adapters.py tests/test_generate_statistics.py tests/test_generate_access.py \
	tests/test_generate_limits.py tests/test_openai_batch_access.py tests/test_client_shm_owners.py \
	tests/test_stream_backpressure.py tests/test_health_watch.py

test: install-test models perf-analyzer
	$(PY) -m pytest -q tests
	HUBSERVE_TEST_WORKERS=2 $(PY) -m pytest -q $(WORKER_SUITES)
	$(MAKE) --no-print-directory lint

lint: install-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy engine perf

protos: install-test
	$(PY) protos/generate.py

clean:
	rm -rf $(VENV) .tools .pytest_cache
