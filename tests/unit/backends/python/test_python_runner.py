"""engine/backends/python/runner.py's import of a model: `import triton_python_backend_utils` gives every
model the one pb_utils module, also when several in-process models are imported at once on their own
threads (as instances load), with nothing of that name on the path. It runs in a fresh child process, so
the first import of that name is the one under test."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import ROOT

MODEL = textwrap.dedent('''
    import time
    time.sleep(0.05)  # the threads' imports overlap
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        api = pb_utils
''')

CHILD = textwrap.dedent('''
    import importlib.util, sys, threading
    from pathlib import Path
    from engine.backends.python import pb_utils
    from engine.backends.python.runner import load_model_class

    assert importlib.util.find_spec("triton_python_backend_utils") is None
    files = [Path(p) for p in sys.argv[1:]]
    got = {}
    start = threading.Barrier(len(files))

    def load(f):
        start.wait()
        got[f] = load_model_class(f, f.parent, f.parent.name + "/").api

    threads = [threading.Thread(target=load, args=(f,)) for f in files]
    for t in threads: t.start()
    for t in threads: t.join()
    assert len(got) == len(files), got
    for f, api in got.items():
        assert api is pb_utils, (f, api)
        assert callable(api.get_input_tensor_by_name)
    print("ok", len(got))
''')


def test_models_imported_at_once_on_their_own_threads_all_get_pb_utils(tmp_path: Path) -> None:
    files = []
    for i in range(8):
        folder = tmp_path / f"m{i}" / "1"
        folder.mkdir(parents=True)
        (folder / "model.py").write_text(MODEL)
        files.append(str(folder / "model.py"))
    child = subprocess.run([sys.executable, "-c", CHILD, *files], cwd=ROOT, capture_output=True, text=True,
                           timeout=60, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert child.returncode == 0, child.stderr[-3000:]
    assert child.stdout.split() == ["ok", "8"]
