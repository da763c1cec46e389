"""Triton Python-backend model that runs a `model.onnx` with ONNX Runtime, for the side-by-side benchmark.

Copied as `<repo>/<model>/1/model.py` by `perf/peers/repos.py`, next to the same `model.onnx` hubserve
serves. Triton's own frontends, dynamic batcher and statistics do the serving; this file only runs the batch
Triton hands it. It is loaded by Triton's Python backend stub (Debian's libpython3.11, numpy 1.x), never
imported by hubserve.

The Python backend hands `execute` the requests of one batch separately, so the inputs are concatenated along
dim 0 here, run once, and split back per request (as hubserve's instance does). Session options are hubserve's
CPU defaults: one intra-op and one inter-op thread, spinning off.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# The stub runs its embedded interpreter isolated (PYTHONPATH is ignored; sys.prefix is /usr), so the peer
# venv's site-packages, written next to this file by the repository generator, goes first on sys.path.
sys.path.insert(0, (Path(__file__).resolve().parent / "site-packages.txt").read_text().strip())

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        """Called once per instance by the stub, on the stub's thread."""
        config = json.loads(args["model_config"])
        model_file = Path(args["model_repository"]) / args["model_version"] / "model.onnx"
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
        opts.log_severity_level = 3
        self.session = ort.InferenceSession(str(model_file), opts, providers=["CPUExecutionProvider"])
        # A sequence model is also fed its control inputs and implicit state inputs by Triton's sequence
        # batcher, and must answer its state outputs (Triton keeps them for the sequence's next request).
        sequence = config.get("sequence_batching") or {}
        self.input_names = [i["name"] for i in config["input"]] + \
            [c["name"] for c in sequence.get("control_input", [])] + \
            [s["input_name"] for s in sequence.get("state", [])]
        self.output_names = [o["name"] for o in config["output"]] + \
            [s["output_name"] for s in sequence.get("state", [])]

    def execute(self, requests: list) -> list:
        """One call per batch Triton formed; returns one response per request, in order."""
        per_request = [
            [pb_utils.get_input_tensor_by_name(r, name).as_numpy() for name in self.input_names]
            for r in requests
        ]
        if len(per_request) == 1:
            feed = dict(zip(self.input_names, per_request[0], strict=True))
        else:
            feed = {
                name: np.concatenate([arrays[i] for arrays in per_request])
                for i, name in enumerate(self.input_names)
            }
        results = self.session.run(self.output_names, feed)
        responses = []
        start = 0
        for arrays in per_request:
            end = start + arrays[0].shape[0]
            tensors = [pb_utils.Tensor(name, out[start:end])
                       for name, out in zip(self.output_names, results, strict=True)]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
            start = end
        return responses

    def finalize(self) -> None:
        del self.session
