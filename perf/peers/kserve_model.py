"""KServe python model server running ONNX Runtime, for the side-by-side benchmark.

One `kserve.Model` per model folder of `.peers/kserve_repo` (written by `repos.py`), all served by one
`kserve.ModelServer` speaking the v2 protocol over HTTP (FastAPI/uvicorn, binary tensor extension) and gRPC:

    .peers/kserve/bin/python perf/peers/kserve_model.py --repository .peers/kserve_repo \\
        --models simple,mlp,image --http_port 8080 --grpc_port 8081 --enable_latency_logging false \\
        --configure_logging false

Written the way KServe's custom-model docs do it: a synchronous `predict` that KServe calls on its event loop,
one request at a time (KServe's python server has no server-side batcher). Session options are hubserve's CPU
defaults: one intra-op and one inter-op thread, spinning off.

Two additions for the benchmark, neither on the inference path: KServe 0.21 listens on 0.0.0.0 / [::] with no
option to change it, so both listeners are rebound to 127.0.0.1; and Triton's model-configuration endpoint,
which perf_analyzer needs before it starts, is added (see `triton_config_shim.py`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer, model_server
from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc
from kserve.protocol.rest.server import RESTServer
from triton_config_shim import REST_PATH, ModelConfigs

LOOPBACK = "127.0.0.1"


def session_options() -> ort.SessionOptions:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
    opts.log_severity_level = 3
    return opts


class OnnxModel(Model):
    def __init__(self, folder: Path) -> None:
        self.spec: dict[str, Any] = json.loads((folder / "spec.json").read_text())
        super().__init__(self.spec["name"])
        self.onnx_path = folder / "model.onnx"
        self.output_names = [o["name"] for o in self.spec["outputs"]]
        self.output_types = {o["name"]: o["datatype"] for o in self.spec["outputs"]}
        self.load()

    def load(self) -> bool:
        self.session = ort.InferenceSession(str(self.onnx_path), session_options(),
                                            providers=["CPUExecutionProvider"])
        self.ready = True
        return self.ready

    def get_input_types(self) -> list[dict]:
        return self.spec["inputs"]

    def get_output_types(self) -> list[dict]:
        return self.spec["outputs"]

    def predict(self, payload: InferRequest, headers: dict[str, str] | None = None) -> InferResponse:
        feed = {tensor.name: tensor.as_numpy() for tensor in payload.inputs}
        results: list[np.ndarray] = self.session.run(self.output_names, feed)
        outputs = [
            InferOutput(name, list(array.shape), self.output_types[name], data=array)
            for name, array in zip(self.output_names, results, strict=True)
        ]
        # gRPC answers with raw_output_contents whenever the data is an array; over REST each requested
        # output's `binary_data` decides. (Passing use_binary_outputs=True as well trips a KServe 0.21 bug in
        # to_grpc: `if ... infer_output.data` on an array raises "truth value of an array is ambiguous".)
        return InferResponse(payload.id, self.name, outputs, requested_outputs=payload.request_outputs)


class LoopbackRESTServer(RESTServer):
    """KServe's REST server, listening on 127.0.0.1 instead of its hard-coded 0.0.0.0."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.config.host = LOOPBACK


def add_benchmark_endpoints(configs: ModelConfigs) -> None:
    """Before ModelServer starts: Triton's config endpoint on both protocols, and loopback-only listeners."""
    model_server.app.add_route(REST_PATH, configs.rest_endpoint, methods=["GET"])
    model_server.RESTServer = LoopbackRESTServer
    add_servicer = configs.wrap_add_servicer(
        grpc_predict_v2_pb2_grpc.add_GRPCInferenceServiceServicer_to_server)

    def add_servicer_on_loopback(servicer: Any, server: Any) -> None:
        add_servicer(servicer, server)
        add_port = server.add_insecure_port
        server.add_insecure_port = lambda address: add_port(address.replace("[::]", LOOPBACK, 1))

    grpc_predict_v2_pb2_grpc.add_GRPCInferenceServiceServicer_to_server = add_servicer_on_loopback


def main() -> None:
    parser = argparse.ArgumentParser(parents=[model_server.parser], conflict_handler="resolve")
    parser.add_argument("--repository", type=Path, required=True)
    parser.add_argument("--models", required=True, help="comma-separated model folders of --repository")
    args, _ = parser.parse_known_args()
    names = [n for n in args.models.split(",") if n]
    add_benchmark_endpoints(ModelConfigs.from_repository(args.repository, names))
    ModelServer().start([OnnxModel(args.repository / name) for name in names])


if __name__ == "__main__":
    main()
