"""Seldon MLServer custom runtime running ONNX Runtime, and its launcher, for the side-by-side benchmark.

The repository `.peers/mlserver_repo` (written by `repos.py`) is an ordinary MLServer repository:
`settings.json` (debug off, one inference worker process) and one folder per model with `model-settings.json`
naming `mlserver_runtime.OnnxRuntimeModel`, adaptive batching on (`max_batch_size`, `max_batch_time` from
hubserve's config). Start it with the launcher below, which does what `mlserver start <repo>` does plus two
things for the benchmark, neither on the inference path: the listeners' host and ports come from the command
line (127.0.0.1 only), and Triton's model-configuration endpoint, which perf_analyzer needs before it starts,
is added to the REST app and the gRPC server (see `triton_config_shim.py`):

    .peers/mlserver/bin/python perf/peers/mlserver_runtime.py --repository .peers/mlserver_repo \\
        --http-port 8080 --grpc-port 8081 --metrics-port 8082

MLServer imports this module again in its inference worker (a spawned process that inherits `sys.path`), so
importing it has no side effects. Session options are hubserve's CPU defaults: one intra-op and one inter-op
thread, spinning off. MLServer's adaptive batcher merges the queued requests into one InferenceRequest before
`predict` and splits the response afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse
from mlserver.utils import get_model_uri


class OnnxRuntimeModel(MLModel):
    async def load(self) -> bool:
        """Called by MLServer once per model in each inference worker."""
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
        opts.log_severity_level = 3
        uri = await get_model_uri(self._settings, wellknown_filenames=["model.onnx"])
        self._session = ort.InferenceSession(uri, opts, providers=["CPUExecutionProvider"])
        self._output_names = [o.name for o in self._session.get_outputs()]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        feed = {tensor.name: NumpyCodec.decode_input(tensor) for tensor in payload.inputs}
        results: list[np.ndarray] = self._session.run(self._output_names, feed)
        outputs = [NumpyCodec.encode_output(name, array)
                   for name, array in zip(self._output_names, results, strict=True)]
        for output in outputs:
            # Triton's HTTP client (perf_analyzer) reads an output that carries `parameters` as binary and
            # fails without `binary_data_size`; MLServer's JSON outputs are plain data.
            output.parameters = None
        return InferenceResponse(model_name=self.name, id=payload.id, outputs=outputs)


def _add_benchmark_endpoints(repository: Path, models: list[Any]) -> None:
    """Before MLServer builds its servers: Triton's config endpoint on REST and gRPC."""
    import mlserver.grpc.server as grpc_server
    import mlserver.rest.server as rest_server
    from triton_config_shim import REST_PATH, ModelConfigs

    configs = ModelConfigs.from_repository(repository, [m.name for m in models])
    create_app = rest_server.create_app

    def create_app_with_config_endpoint(*args: Any, **kwargs: Any) -> Any:
        app = create_app(*args, **kwargs)
        app.add_route(REST_PATH, configs.rest_endpoint, methods=["GET"])
        return app

    rest_server.create_app = create_app_with_config_endpoint
    grpc_server.add_GRPCInferenceServiceServicer_to_server = configs.wrap_add_servicer(
        grpc_server.add_GRPCInferenceServiceServicer_to_server
    )


async def _serve(args: argparse.Namespace) -> None:
    from mlserver import MLServer
    from mlserver.cli.serve import load_settings

    settings, models = await load_settings(str(args.repository))
    settings.host = "127.0.0.1"
    settings.http_port, settings.grpc_port = args.http_port, args.grpc_port
    settings.metrics_port = args.metrics_port
    # MLServer's defaults put these under the working directory; keep them inside the (ignored) repository.
    settings.metrics_dir = str(args.repository.resolve() / ".metrics")
    settings.environments_dir = str(args.repository.resolve() / ".envs")
    _add_benchmark_endpoints(args.repository, models)
    await MLServer(settings).start(models)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repository", type=Path, required=True)
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--metrics-port", type=int, required=True)
    asyncio.run(_serve(parser.parse_args()))


if __name__ == "__main__":
    main()
