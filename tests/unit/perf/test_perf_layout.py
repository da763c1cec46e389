"""The load tester (perf/hubserve_perf/) is a client beside the server, not a part of it: importing it loads
no stage of the server's request path, and the server never imports it. Each check runs a fresh interpreter
in the repository root with this checkout's packages first, and reads what it imported from `sys.modules`.
"""

from __future__ import annotations

import subprocess
import sys

from hubserve_harness import ROOT, checkout_env

# What the load tester may take from the server package: the wire, never a stage. The sans-I/O HTTP/2 core
# (frames, HPACK, stream states, windows, the core with its sending and ending halves, its limits and
# policies, with their packages' __init__), the generated protobuf messages, the datatype table
# (engine.types, with engine.errors, which it raises), and the bounded memo HPACK decoding keeps its blocks in
# (engine.bounded_cache), the bound on a frame read in place (engine.frontend.in_place, the core's like the
# HTTP reader's); and engine.native, which `import engine` runs (the compiled hot path's finder).
H2_CORE = {f"engine.frontend.h2.{m}" for m in ("frames", "headers", "states", "windows", "streams", "guard",
                                               "outbound", "control", "lifecycle", "core")}
SHARED = {"engine", "engine.native", "engine.errors", "engine.types", "engine.proto", "engine.frontend",
          "engine.frontend.h2", "engine.frontend.in_place", "engine.bounded_cache", *H2_CORE}


def imported_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running `code`."""
    probe = f"{code}\nimport sys\nprint('\\n'.join(sys.modules))"
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=checkout_env(), capture_output=True,
                            text=True, timeout=60, stdin=subprocess.DEVNULL, check=False)
    assert result.returncode == 0, result.stderr
    return set(result.stdout.split())


def server_modules(modules: set[str]) -> list[str]:
    """The server's modules among `modules`. A module mypyc compiled with `separate=True` keeps its code in
    a library of its own, `<module>__mypyc`, which its shim imports: that is the module itself."""
    names = {m.removesuffix("__mypyc") for m in modules}
    return sorted(m for m in names if m.split(".")[0] == "engine" and m not in SHARED
                  and not m.startswith("engine.proto."))


def test_the_load_tester_loads_no_server_stage() -> None:
    # Every module of the package but the HTTP/2 client (the next test) and __main__, which would run the CLI.
    modules = imported_after(
        "import importlib, pkgutil, hubserve_perf\n"
        "for m in pkgutil.iter_modules(hubserve_perf.__path__):\n"
        "    if m.name not in ('grpc_h2', '__main__'):\n"
        "        importlib.import_module('hubserve_perf.' + m.name)")
    assert "hubserve_perf.session" in modules and "hubserve_perf.tune" in modules
    assert server_modules(modules) == []


def test_the_http2_client_loads_only_the_http2_core() -> None:
    modules = imported_after("import hubserve_perf.grpc_h2")
    assert modules >= H2_CORE
    assert server_modules(modules) == []
    # The core is the wire only: no asyncio adapter (connection.py), gRPC (grpc/call.py, grpc/rpcs.py) or
    # listener.
    assert not {"engine.frontend.h2.connection", "engine.frontend.grpc.call", "engine.frontend.grpc.rpcs",
                "engine.frontend.grpc.server"} & modules


def test_the_server_never_imports_the_load_tester() -> None:
    modules = imported_after("import engine.__main__, engine.server\nengine.__main__.build_parser()")
    assert "engine.server" in modules
    assert sorted(m for m in modules if m.startswith(("hubserve_perf", "hubserve_harness"))) == []


def test_hubserve_perf_is_handed_to_the_load_tester() -> None:
    result = subprocess.run([sys.executable, "-m", "engine", "perf", "tune-window", "--help"], cwd=ROOT,
                            env=checkout_env(), capture_output=True, text=True, timeout=60,
                            stdin=subprocess.DEVNULL, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: hubserve perf tune-window")
