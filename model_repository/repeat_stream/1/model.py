"""repeat_stream: streams IN back one element per response (see ../config.pbtxt).

The model holds its own resources bounded: a fixed pool of WORKERS threads, started in initialize, streams
the requests, and execute() only hands each request to them through a queue of at most MAX_WAITING
requests and returns None, as decoupled models do. So the instance takes the next request at once while
earlier answers are still being sent, WORKERS requests stream at the same time, and when the queue is full
execute() waits for room: the model pushes back on the server instead of starting a thread per request.
Each request ends with the final flag, or stops early when the client has gone.
"""

import queue
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

MAX_DELAY_MS = 10_000  # a pause longer than this is refused: the client would wait minutes for nothing
WORKERS = 4  # requests streamed at the same time
MAX_WAITING = 64  # requests handed over and not yet started; execute() waits past it
_POLL_S = 0.5  # how often an idle worker looks whether the model is being finalized


class TritonPythonModel:
    def initialize(self, args):
        self._waiting = queue.Queue(maxsize=MAX_WAITING)
        self._stopping = threading.Event()
        self._workers = [threading.Thread(target=self._work, name=f"repeat_stream.{i}", daemon=True)
                         for i in range(WORKERS)]
        for worker in self._workers:
            worker.start()

    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().copy()
            delay = pb_utils.get_input_tensor_by_name(request, "DELAY_MS")
            delay_ms = int(delay.as_numpy().reshape(-1)[0]) if delay is not None else 0
            sender = request.get_response_sender()
            if delay_ms > MAX_DELAY_MS:
                error = pb_utils.TritonError(f"DELAY_MS must be at most {MAX_DELAY_MS}, got {delay_ms}",
                                             pb_utils.TritonError.INVALID_ARG)
                sender.send(pb_utils.InferenceResponse(error=error),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            self._waiting.put((request, sender, values, delay_ms / 1000))  # waits while MAX_WAITING wait
        return None

    def _work(self):
        while not self._stopping.is_set():
            try:
                job = self._waiting.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            self._stream(*job)

    def _stream(self, request, sender, values, delay_s):
        for index, value in enumerate(values):
            if delay_s:
                time.sleep(delay_s)
            if request.is_cancelled() or self._stopping.is_set():
                break
            sender.send(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", np.array([value], dtype=np.int32)),
                pb_utils.Tensor("IDX", np.array([index], dtype=np.uint32)),
            ]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        self._stopping.set()
        for worker in self._workers:
            worker.join(timeout=5)
