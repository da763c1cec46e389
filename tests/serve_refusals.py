"""`hubserve serve` refusing its flags at start, many flag sets in one child process.

Each flag set goes through the command's own entry point (engine.__main__.main), so the checks are the ones a
user meets, and must return 2 before anything serves; one process for all of them because a start is ~1 s of
imports before its check (several seconds under load) and the checks take milliseconds. A set that does not
refuse would start serving: the child's timeout ends it and the test fails.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from hubserve_harness import ROOT

_CHILD = """
import contextlib, io, json, sys, traceback
from engine.__main__ import main
results = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code
        except BaseException:
            rc = None
            traceback.print_exc(file=err)
    results.append([rc, err.getvalue()])
print(json.dumps(results))
"""


def serve_refusals(repository: Path, *runs: list[str] | tuple[str, ...]) -> list[str]:
    """What `hubserve serve --model-repository REPOSITORY` printed on stderr for each of `runs`' flags, each
    checked to have returned 2 without a traceback."""
    common = ["serve", "--model-repository", str(repository), "--host", "127.0.0.1", "--http-port", "0",
              "--grpc-port", "0", "--metrics-port", "0"]
    argvs = json.dumps([common + list(flags) for flags in runs])
    child = subprocess.run([sys.executable, "-c", _CHILD, argvs], cwd=ROOT, capture_output=True, text=True,
                           timeout=60 + 10 * len(runs))
    assert child.returncode == 0, child.stdout + child.stderr
    printed = []
    for flags, (rc, stderr) in zip(runs, json.loads(child.stdout), strict=True):
        assert rc == 2, (flags, rc, stderr)
        assert "Traceback" not in stderr, stderr
        printed.append(stderr)
    return printed
