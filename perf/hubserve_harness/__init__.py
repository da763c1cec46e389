"""The test and benchmark harness: a real server on free loopback ports (`start_server`, `RunningServer`,
`free_port`), the repository the tests serve (`build_test_repository`), and NVIDIA's perf_analyzer
(`hubserve_harness.perf_analyzer`). tests/conftest.py and perf/*.py import it; `pip install -e .` installs
it, and pytest finds this checkout's copy through `pythonpath` in pyproject.toml.

    checkout.py       ROOT, EXAMPLES, and the environment a subprocess needs to run this checkout's code
    server.py         start_server → RunningServer (ports, log, /metrics, stop)
    repository.py     build_test_repository, build_pipeline_repository (the ensemble benchmarks')
    perf_analyzer.py  run_perf_analyzer → PerfResult (exit status, output, throughput, CSV rows)
    proxy.py          RoundRobinProxy: replicas behind one port, round robin or sticky on a header
"""

from .checkout import EXAMPLES, ROOT, checkout_env
from .repository import build_pipeline_repository, build_test_repository
from .server import RunningServer, fd_links, free_port, free_ports, start_server

__all__ = ["EXAMPLES", "ROOT", "RunningServer", "build_pipeline_repository", "build_test_repository",
           "checkout_env", "fd_links", "free_port", "free_ports", "start_server"]
