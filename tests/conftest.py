"""Shared fixtures: a real hubserve process on free loopback ports, serving a repository built for the test
session from the example configs plus test-only models.

The harness itself (start_server, RunningServer, build_test_repository, free_port) lives in
perf/hubserve_harness/, which benchmarks use too; it is re-exported here, so `from conftest import
start_server` keeps working in test files. `config_from_pbtxt` builds a frozen config in-process, for the
tests of modules that read one; `run_repository` runs a test against a ModelRepository in-process.

`http` and `grpc` (one client of each for a module) and `client` (each test run once per protocol, with
the client's module as `client.module`) talk to whichever `server` fixture the test module has: its own,
or the session's below.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

import engine.kinds  # noqa: F401  (the in-process repositories serve every kind, as the server does)
from engine import native
from engine.config import steps as cfg
from engine.config.model_config import ModelConfig
from engine.instances.rate_limiter import RateLimiter
from engine.proto import model_config_pb2 as pb
from engine.repository.lifecycle import ModelRepository
from hubserve_harness import (
    EXAMPLES,
    ROOT,
    RunningServer,
    build_test_repository,
    fd_links,
    free_port,
    free_ports,
    start_server,
)
from hubserve_models import examples

if TYPE_CHECKING:
    import openai

T = TypeVar("T")


def _add_test_folders_to_path() -> None:
    """Put every folder of tests/unit and tests/functional on sys.path, once, before any test module loads.

    Test modules import each other's builders by module name (`from test_openai_api import build_repository`,
    this file's `reference_session`) across the folders that mirror engine/; pytest's default import mode puts
    only the importing module's own folder on the path. Test module names stay unique across folders, as that
    mode needs anyway. A subprocess a test starts gets the path it passes itself."""
    here = Path(__file__).resolve().parent
    for folder in sorted({str(p.parent) for p in here.glob("*/**/test_*.py")}):
        if folder not in sys.path:
            sys.path.append(folder)


_add_test_folders_to_path()

__all__ = ["EXAMPLES", "ROOT", "RunningServer", "assert_serves_simple", "build_test_repository",
           "config_from_pbtxt", "fd_links", "free_port", "free_ports",
           "openai_client", "run_repository", "start_example_server", "start_server", "wait_until"]


def config_from_pbtxt(text: str, name: str = "m") -> ModelConfig:
    """`text` (a config.pbtxt) through the loading steps a model without a model file takes: parse,
    auto-complete, validate."""
    msg = pb.ModelConfig()
    cfg.parse_pbtxt(text, msg)
    cfg.autocomplete(msg, None, name)
    return cfg.validate(msg, f"model '{name}'")


def run_repository(test: Callable[[ModelRepository], Awaitable[None]], root: Path) -> None:
    """`test` against a ModelRepository over `root`, in-process on a fresh loop, bounded at 30 s; the
    repository is closed whatever the test does."""
    async def go() -> None:
        repo = ModelRepository(root, RateLimiter())
        try:
            await asyncio.wait_for(test(repo), 30)
        finally:
            await repo.close()

    asyncio.run(go())


@pytest.fixture(scope="session")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_test_repository(tmp_path_factory.mktemp("repository"))


@pytest.fixture(scope="session")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory):
    """One server for the read-mostly functional tests. Non-strict readiness: 'broken' never loads."""
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    srv = start_server(repository, log_path, "--no-strict-readiness", "--model-control-mode", "none")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def http(server):
    with httpclient.InferenceServerClient(server.http_url, network_timeout=60.0) as c:
        yield c


@pytest.fixture(scope="module")
def grpc(server):
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        yield c


@pytest.fixture(scope="module")
def reference_session():
    """The dense example decoder in ONNX Runtime: the session test_generate_engine.reference_greedy steps,
    the generation tests' oracle (one per test module, as each module's own copy was)."""
    import onnxruntime as ort

    from test_generate_engine import MODEL, options
    return ort.InferenceSession(MODEL, options(), providers=["CPUExecutionProvider"])


@pytest.fixture(params=[httpclient, grpcclient], ids=["http", "grpc"])
def client(request: pytest.FixtureRequest, server):
    module = request.param
    c = module.InferenceServerClient(server.http_url if module is httpclient else server.grpc_url)
    c.module = module
    yield c
    c.close()


def assert_simple_over_grpc(server: RunningServer, client_timeout: float = 30.0) -> None:
    """A correct inference of the example `simple` over gRPC on a fresh connection: what the abuse, fault
    and limit suites ask of the server after each case."""
    import numpy as np

    x = np.arange(16, dtype=np.int32).reshape(1, 16)
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        inputs = []
        for name in ("INPUT0", "INPUT1"):
            tensor = grpcclient.InferInput(name, [1, 16], "INT32")
            tensor.set_data_from_numpy(x)
            inputs.append(tensor)
        result = c.infer("simple", inputs, client_timeout=client_timeout)
    assert result.as_numpy("OUTPUT0").tolist() == (x + x).tolist()


def wait_until(condition: Callable[[], T], what: str, timeout_s: float = 30.0) -> T:
    """Poll `condition` until it returns something true, and return that; AssertionError naming `what` after
    `timeout_s`. For state the server updates after the answer the client already has (statistics recorded
    once a model's execute returns, a log line, a span at a collector)."""
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s}s: {what}")
        time.sleep(0.02)
    return value


def assert_serves_simple(server: RunningServer, authorization: str | None = None) -> None:
    """`simple` answers right over both protocols, sending `authorization` (a key's `Bearer ...`) when given:
    what a test checks after a hostile case, that the server keeps serving everyone else."""
    x = np.arange(16, dtype=np.int32).reshape(1, 16)
    for module, url, header in ((httpclient, server.http_url, "Authorization"),
                                (grpcclient, server.grpc_url, "authorization")):  # gRPC metadata: lower-case
        with module.InferenceServerClient(url) as client:
            inputs = [module.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
            for tensor in inputs:
                tensor.set_data_from_numpy(x)
            headers = {header: authorization} if authorization else None
            result = client.infer("simple", inputs, headers=headers)
            assert result.as_numpy("OUTPUT0").tolist() == (x + x).tolist()


def openai_client(server: RunningServer, timeout_s: float = 60.0) -> openai.OpenAI:
    """The official `openai` client on the server's /v1, as the OpenAI suites use it (no retries, so a
    refusal is seen as it came)."""
    import openai  # only the OpenAI suites need it

    return openai.OpenAI(base_url=f"http://{server.http_url}/v1", api_key="unused", max_retries=0,
                         timeout=timeout_s)


def start_example_server(tmp_path_factory: pytest.TempPathFactory, label: str, model: str) -> RunningServer:
    """A server on a repository holding one example model: its committed config, its model built here."""
    root = tmp_path_factory.mktemp(label) / "repo"
    (root / model).mkdir(parents=True)
    shutil.copy(EXAMPLES / model / "config.pbtxt", root / model / "config.pbtxt")
    examples.build_repository(root, [model])
    return start_server(root, tmp_path_factory.mktemp(f"{label}_log") / "server.log")


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """One line per suite that counts its cases (tests/case_counts.py), e.g. "fuzz: 1200 cases tried", so
    CI's log says how much each suite tried, with or without `-s`; and which engine the run tested, the
    compiled build or pure Python (engine/native.py), as the servers it started decided too."""
    from case_counts import COUNTS

    for suite, n in sorted(COUNTS.items()):
        terminalreporter.write_line(f"{suite}: {n} cases tried")
    terminalreporter.write_line(native.status().line())
