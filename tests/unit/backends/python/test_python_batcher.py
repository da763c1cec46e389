"""batcher.py's `RequestBatcher` through a real `PythonModel` whose instance runs in the server process
(`in_process: "true"`: no instance process to start, so the test is cheap): what its batches leave behind in
the queue policy that early dispatch reads."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

from engine.backends.python.model import PythonModel
from engine.config import steps as cfg
from engine.instances.rate_limiter import RateLimiter
from engine.types import DataType, InferenceRequest, Tensor

ADD_ONE = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() + 1)]) for r in requests]
'''

CONFIG = '''backend: "python"
max_batch_size: 8
input { name: "IN" data_type: TYPE_INT32 dims: [ 4 ] }
output { name: "OUT" data_type: TYPE_INT32 dims: [ 4 ] }
dynamic_batching { max_queue_delay_microseconds: 100 }
parameters { key: "in_process" value: { string_value: "true" } }
'''


def test_answered_requests_leave_nothing_in_flight_for_early_dispatch(tmp_path: Path) -> None:
    """Early dispatch sends a lone client's request at once when every request in flight is queued (the
    population rule, engine/scheduling/batching/join_forecast.py); the policy counts a batch's requests as
    executing until the batcher says they finished. The Python batcher once never said so: the count grew
    with every request, and most of a lone client's batches waited out the window."""
    version_dir = tmp_path / "add_one" / "1"
    version_dir.mkdir(parents=True)
    (version_dir / "model.py").write_text(ADD_ONE)
    msg = cfg.pb.ModelConfig()
    cfg.parse_pbtxt(CONFIG, msg)
    cfg.autocomplete(msg, None, "add_one")
    config = cfg.validate(msg, "add_one/config.pbtxt")

    async def run() -> tuple[list[int], int]:
        model = PythonModel(config, 1, version_dir / "model.py", (), RateLimiter(), None)
        await model.start()
        try:
            firsts = []
            for i in range(5):  # one client, one request at a time
                data = np.full((1, 4), i, np.int32)
                request = InferenceRequest("add_one", "", [Tensor("IN", DataType.INT32, data.shape, data)])
                response = await asyncio.wait_for(model.submit(request), 10)
                firsts.append(int(response.outputs[0].data[0, 0]))
            return firsts, model.batcher.policy.in_flight
        finally:
            await model.stop()

    firsts, in_flight = asyncio.run(run())
    assert firsts == [1, 2, 3, 4, 5]
    assert in_flight == 0
