"""The model-kind seam (engine/repository/kinds.py, engine/kinds.py): the core imports no plug-in kind, the
plug-ins register themselves when engine/kinds.py imports them, the registry names each config's kind, and
the backend table (engine/backends/__init__.py) says which backends need their kind and their model file.
Loading and serving each kind is tested with the real server in test_repository.py, test_ensemble*.py,
test_python_*.py, test_generate_triton.py and test_openai_embeddings*.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, config_from_pbtxt, run_repository
from engine.model import ModelState
from engine.repository.kinds import kind_of, kinds
from engine.repository.lifecycle import ModelRepository

# The core: every module of these is imported, in a fresh interpreter, and none may bring in a plug-in.
CORE_MODULES = ["engine.model"]
CORE_PACKAGES = ["engine.repository", "engine.observability", "engine.scheduling.batching",
                 "engine.scheduling.sequence"]
PLUGINS = ("engine.generate", "engine.backends.python", "engine.scheduling.ensemble", "engine.embed")

_IMPORT_CORE = """
import importlib, json, pkgutil, sys
names = list(sys.argv[1].split(","))
for package in sys.argv[2].split(","):
    names.append(package)
    names += [m.name for m in pkgutil.walk_packages(importlib.import_module(package).__path__, package + ".")]
for name in names:
    importlib.import_module(name)
print(json.dumps({"imported": names, "loaded": sorted(sys.modules)}))
"""


def test_the_core_imports_no_plugin_kind() -> None:
    argv = [sys.executable, "-c", _IMPORT_CORE, ",".join(CORE_MODULES), ",".join(CORE_PACKAGES)]
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120, check=True).stdout
    result = json.loads(out)
    assert "engine.repository.lifecycle" in result["imported"]
    assert "engine.observability.metrics" in result["imported"]
    plugins = [m for m in result["loaded"] if m.startswith(PLUGINS)]
    assert plugins == [], f"the core imported plug-in modules: {plugins}"


def test_plugins_register_themselves_in_the_order_they_are_asked() -> None:
    import engine.kinds  # noqa: F401  (conftest imported it already; the point is what it registers)

    assert [kind.name for kind in kinds()] == ["ensemble", "generative", "python", "embedding", "instances"]


def test_each_config_gets_one_kind() -> None:
    io = 'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }] ' \
         'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }]'
    def kind(text: str) -> str:
        return kind_of(config_from_pbtxt(text), Path("unused")).name

    assert kind(f'backend: "identity" max_batch_size: 8 {io}') == "instances"
    assert kind(f'backend: "onnxruntime" {io}') == "instances"
    assert kind(f'backend: "python" max_batch_size: 8 {io}') == "python"
    embedding = 'parameters { key: "embedding" value { string_value: "true" } }'
    assert kind(f'backend: "onnxruntime" max_batch_size: 8 {io} {embedding}') == "embedding"


_BARE_REPOSITORY = """
import asyncio, json, sys
from pathlib import Path
from engine.instances.rate_limiter import RateLimiter
from engine.repository.lifecycle import ModelRepository

async def main():
    repo = ModelRepository(Path(sys.argv[1]), RateLimiter())
    try:
        await repo.load_all()
        print(json.dumps([[e.name, e.version, e.state.value, e.reason] for e in repo.index()]))
    finally:
        await repo.close()

asyncio.run(main())
"""


def test_without_the_python_kind_a_python_model_never_runs(tmp_path: Path) -> None:
    """A repository made in an interpreter that did not import engine/kinds.py has no Python kind: the core's
    instance kind refuses a Python model rather than run its code under none of that kind's rules."""
    marker = tmp_path / "initialized"
    model = tmp_path / "repo" / "py"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(
        'backend: "python" max_batch_size: 0 '
        'input [{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }] '
        'output [{ name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }]')
    (model / "1" / "model.py").write_text(
        "import pathlib\n\n"
        "class TritonPythonModel:\n"
        f"    def initialize(self, args):\n        pathlib.Path({str(marker)!r}).write_text('ran')\n\n"
        "    def execute(self, requests):\n        return []\n")
    argv = [sys.executable, "-c", _BARE_REPOSITORY, str(tmp_path / "repo")]
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120, check=True).stdout
    [(name, _, state, reason)] = json.loads(out.splitlines()[-1])
    assert (name, state) == ("py", "UNAVAILABLE")
    assert "backend 'python' is served by the python kind, which this server has not registered" in reason
    assert not marker.exists()


def test_the_backend_table_says_which_versions_need_their_model_file(tmp_path: Path) -> None:
    io = 'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }] ' \
         'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }]'
    for name, backend in (("onnx", "onnxruntime"), ("ident", "identity")):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "config.pbtxt").write_text(f'backend: "{backend}" {io}')

    async def check(repo: ModelRepository) -> None:
        await repo.load_all()
        rows = {row.name: row for row in repo.index()}
        assert rows["ident"].state is ModelState.READY
        assert rows["onnx"].state is ModelState.UNAVAILABLE
        assert "model 'onnx' version 1: missing model file onnx/1/model.onnx" in rows["onnx"].reason

    run_repository(check, tmp_path)
