"""A Python model's static `auto_complete_config`, run in a short-lived process of its own.

As in Triton, the interpreter that runs it is gone afterwards (nothing it made reaches `initialize`), and the
model's code never runs inside the server for it. `complete()` (the repository's config step, on a worker
thread) hands the config, as Triton's JSON, to `python -m engine.backends.python.autocomplete MODEL_FILE`
on stdin and reads the completed config back from stdout; the model's error, if any, comes back as its
message and last lines. Skipped when the model file never mentions `auto_complete_config`.

When the function turned dynamic batching on and named no preferred batch size, `[max_batch_size]` is added,
as Triton's auto-complete does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ... import child_pythonpath
from ...errors import invalid

TIMEOUT_S = 120.0


def complete(msg: Any, model_file: Path, model_dir: Path, name: str, interpreter: str) -> None:
    """Run the model's `auto_complete_config` on `msg` (a model_config_pb2.ModelConfig), in place."""
    from google.protobuf import json_format

    from ...config.json_form import message_to_json

    try:
        source = model_file.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return  # the version's load reports the missing or unreadable file
    if "auto_complete_config" not in source:
        return
    config = message_to_json(msg)
    config["name"] = config.get("name") or name
    had_batching = msg.HasField("dynamic_batching")
    path = child_pythonpath(os.environ.get("PYTHONPATH"))
    shown = f"{name}/"
    try:
        done = subprocess.run([interpreter, "-m", "engine.backends.python.autocomplete", str(model_file),
                               str(model_dir), shown], input=json.dumps(config).encode(), capture_output=True,
                              timeout=TIMEOUT_S, cwd=str(model_dir), env={**os.environ, "PYTHONPATH": path},
                              check=False)
    except subprocess.TimeoutExpired:
        raise invalid(f"model '{name}': auto_complete_config did not return within {TIMEOUT_S:g} s") from None
    if done.returncode != 0:
        text = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise invalid(f"model '{name}': auto_complete_config failed: " + "\n".join(text[-8:]))
    completed = json.loads(done.stdout)
    batching = completed.get("dynamic_batching")
    if isinstance(batching, dict) and not had_batching and not batching.get("preferred_batch_size") \
            and completed.get("max_batch_size", 0) > 0:
        batching["preferred_batch_size"] = [completed["max_batch_size"]]
    msg.Clear()
    try:
        json_format.ParseDict(completed, msg)
    except json_format.ParseError as e:
        raise invalid(f"model '{name}': auto_complete_config returned a config that does not parse: {e}"
                      ) from None


def main(argv: list[str]) -> int:
    """The short-lived process: config JSON in on stdin, completed config JSON out on stdout."""
    from . import pb_utils
    from .runner import ModelError, describe_exception, load_model_class

    model_file, model_dir, shown = Path(argv[0]), Path(argv[1]), argv[2]
    config = json.loads(sys.stdin.read())
    out, sys.stdout = sys.stdout, sys.stderr  # what the model prints must not mix with the answer
    try:
        cls = load_model_class(model_file, model_dir, shown)
        function = getattr(cls, "auto_complete_config", None)
        given = pb_utils.ModelConfig(config)
        result = given if function is None else function(given)
    except ModelError as e:
        print(str(e), file=sys.stderr)
        return 1
    except Exception as e:
        print(describe_exception(e, model_dir, shown), file=sys.stderr)
        return 1
    if not isinstance(result, pb_utils.ModelConfig):
        print(f"auto_complete_config returned {type(result).__name__}, not the pb_utils.ModelConfig it was "
              "given", file=sys.stderr)
        return 1
    out.write(json.dumps(result.as_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
