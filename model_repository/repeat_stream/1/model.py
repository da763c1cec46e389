"""repeat_stream: streams IN back one element per response (see ../config.pbtxt).

execute() only starts a thread per request and returns None, as decoupled models do, so the instance takes
the next request at once while earlier answers are still being sent; each thread ends its request with the
final flag, or stops early when the client has gone.
"""

import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

MAX_DELAY_MS = 10_000  # a pause longer than this is refused: the client would wait minutes for nothing


class TritonPythonModel:
    def initialize(self, args):
        self._threads = set()
        self._lock = threading.Lock()

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
            thread = threading.Thread(target=self._stream, args=(request, sender, values, delay_ms / 1000),
                                      daemon=True)
            with self._lock:
                self._threads.add(thread)
            thread.start()
        return None

    def _stream(self, request, sender, values, delay_s):
        try:
            for index, value in enumerate(values):
                if delay_s:
                    time.sleep(delay_s)
                if request.is_cancelled():
                    break
                sender.send(pb_utils.InferenceResponse([
                    pb_utils.Tensor("OUT", np.array([value], dtype=np.int32)),
                    pb_utils.Tensor("IDX", np.array([index], dtype=np.uint32)),
                ]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())

    def finalize(self):
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout=5)
