"""Python models the Python-backend tests write into their temporary repositories, and helpers to write them.

Each model is a Triton Python model (`<name>/1/model.py` with `class TritonPythonModel`, and a config.pbtxt),
written the way Triton users write them, so the tests exercise what such models do.
"""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

from hubserve_harness import EXAMPLES


def write_model(repo: Path, name: str, source: str, config: str, version: int = 1) -> Path:
    folder = repo / name
    (folder / str(version)).mkdir(parents=True, exist_ok=True)
    (folder / str(version) / "model.py").write_text(textwrap.dedent(source))
    (folder / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n' + textwrap.dedent(config))
    return folder


def add_simple(repo: Path) -> None:
    """The ONNX example `simple` (INT32 [-1,16] INPUT0 + INPUT1 → OUTPUT0 sum, OUTPUT1 difference)."""
    from hubserve_models import examples

    (repo / "simple").mkdir(parents=True, exist_ok=True)
    for cfg in (EXAMPLES / "simple").glob("config.*"):
        shutil.copy(cfg, repo / "simple" / cfg.name)
    examples.build_repository(repo, ["simple"])


def io(inputs: list[tuple[str, str, str]], outputs: list[tuple[str, str, str]], extra: str = "") -> str:
    """A config body: (name, TYPE_*, dims text) per tensor, then `extra`."""
    def block(kind: str, items: list[tuple[str, str, str]]) -> str:
        return "".join(f'{kind} [ {{ name: "{n}" data_type: {t} dims: [ {d} ] }} ]\n' for n, t, d in items)

    return block("input", inputs) + block("output", outputs) + extra


# Reports what it was given: initialize's args, and per request its parameters, requested outputs, id,
# correlation id, flags and input; doubles IN into DOUBLE, echoes TEXT (BYTES) upper-cased.
PROBE = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.args = args
        self.config = json.loads(args["model_config"])
        pb_utils.Logger.log_info("probe initialized: " + args["model_instance_name"])

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            text = pb_utils.get_input_tensor_by_name(request, "TEXT")
            info = {
                "args": self.args,
                "types": sorted({type(v).__name__ for v in self.args.values()}),
                "parameters": request.parameters(),
                "requested": request.requested_output_names(),
                "id": request.request_id(),
                "correlation_id": request.correlation_id(),
                "flags": request.flags(),
                "batch": len(requests),
                "text_type": type(text.as_numpy().reshape(-1)[0]).__name__ if text is not None else "",
                "out_config": pb_utils.get_output_config_by_name(self.config, "DOUBLE")["data_type"],
                "dtype": str(pb_utils.triton_string_to_numpy("TYPE_FP32")),
                "dlpack": float(np.from_dlpack(pb_utils.Tensor.from_dlpack("x", pb_utils.Tensor("IN", x)
                                                                        .to_dlpack()).as_numpy()).sum()),
            }
            outputs = [pb_utils.Tensor("INFO", np.array([json.dumps(info).encode()], dtype=np.object_)),
                       pb_utils.Tensor("DOUBLE", (x * 2).astype(np.float32))]
            if text is not None:
                upper = [t.upper() for t in text.as_numpy().reshape(-1)]
                outputs.append(pb_utils.Tensor("UPPER", np.array(upper, dtype=object)))
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
'''
PROBE_CONFIG = io([("IN", "TYPE_FP32", "-1")],
                  [("INFO", "TYPE_STRING", "1"), ("DOUBLE", "TYPE_FP32", "-1"),
                   ("UPPER", "TYPE_STRING", "-1")],
                  'input [ { name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] optional: true } ]\n')

# MODE (INT32 [1]) per request: 0 ok, 1 TritonError INVALID_ARG, 2 TritonError (default code), 3 missing
# output, 4 wrong datatype, 5 wrong shape, 6 raise (fails the batch), 7 one response too few, 8 not a
# response. OUT (FP32 [2]) = [batch size, MODE].
BEHAVE = '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy().reshape(-1)[0])
            rows = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy().shape[0]
            good = np.tile(np.array([[len(requests), mode]], dtype=np.float32), (rows, 1))
            if mode == 1:
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("mode one is refused", pb_utils.TritonError.INVALID_ARG)))
            elif mode == 2:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("plain failure")))
            elif mode == 3:
                responses.append(pb_utils.InferenceResponse([]))
            elif mode == 4:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", good.astype(np.int32))]))
            elif mode == 5:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.zeros((rows, 3),
                                                                                         np.float32))]))
            elif mode == 6:
                raise ValueError("execute gave up")
            elif mode == 8:
                responses.append(None)
            else:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", good)]))
        if any(int(pb_utils.get_input_tensor_by_name(r, "MODE").as_numpy().reshape(-1)[0]) == 7
               for r in requests):
            responses.pop()
        return responses
'''
# The window holds a burst of requests in one batch (test_one_bad_request_in_a_batch_fails_alone): without
# early dispatch, which would send a lone client's request at once (Triton waits out the window too).
BEHAVE_CONFIG = io([("MODE", "TYPE_INT32", "1")], [("OUT", "TYPE_FP32", "2")],
                   "max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 300000 }\n"
                   'parameters { key: "early_dispatch" value { string_value: "false" } }\n')

ASYNC = '''
import asyncio
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    async def execute(self, requests):
        await asyncio.sleep(0.01)
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() + 1)]) for r in requests]
'''
ONE_IN_ONE_OUT = io([("IN", "TYPE_FP32", "-1")], [("OUT", "TYPE_FP32", "-1")])

# Echoes IN as OUT, and the request's parameters as its response's (InferenceResponse(parameters=...)).
PARAMETER_ECHO = '''
import json
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(
            [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())],
            parameters=json.loads(r.parameters())) for r in requests]
'''

# Answers its process id and how many elements IN (FP32, any length) had: INT64 [2].
COUNTER = '''
import os
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array(
            [os.getpid(), pb_utils.get_input_tensor_by_name(r, "IN").as_numpy().size], np.int64))])
            for r in requests]
'''
COUNTER_CONFIG = io([("IN", "TYPE_FP32", "-1")], [("OUT", "TYPE_INT64", "2")])

# Sleeps SECONDS (FP32 [1]) seconds, then echoes it; or crashes the process when it is negative.
SLEEPER = '''
import os
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            seconds = float(pb_utils.get_input_tensor_by_name(r, "IN").as_numpy().reshape(-1)[0])
            if seconds < 0:
                os._exit(3)
            time.sleep(seconds)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([os.getpid()],
                                                                                   np.float32))]))
        return out
'''
SLEEPER_CONFIG = io([("IN", "TYPE_FP32", "1")], [("OUT", "TYPE_FP32", "1")])

# DLPack as model authors use it (Triton's python_backend README): IN (FP32 [-1]) doubled through
# from_dlpack / to_dlpack; INFO reports whether memory was shared and what was kept. A negative first element
# hands from_dlpack a tensor that says it lives on CUDA device 0 (DLPack device type 2), as a torch CUDA
# tensor would: refused with the reason on a server with no GPU path, not a crash.
DLPACK = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class OnCuda:
    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, **kwargs):
        raise AssertionError("read before its device was checked")

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if x.size and x.reshape(-1)[0] < 0:
                pb_utils.Tensor.from_dlpack("OUT", OnCuda())
            doubled = (x * 2).astype(np.float32)
            out = pb_utils.Tensor.from_dlpack("OUT", doubled)
            again = pb_utils.Tensor.from_dlpack("again", out.to_dlpack())
            info = {"shared": bool(np.shares_memory(out.as_numpy(), doubled)),
                    "round_trip_shared": bool(np.shares_memory(again.as_numpy(), doubled)),
                    "through_numpy": np.from_dlpack(out).tolist(),
                    "dtype": out.datatype(), "shape": out.shape(), "is_cpu": out.is_cpu(),
                    "int16": pb_utils.Tensor.from_dlpack("i", np.arange(6, dtype=np.int16).reshape(2, 3))
                    .shape()}
            responses.append(pb_utils.InferenceResponse(
                [out, pb_utils.Tensor("INFO", np.array([json.dumps(info).encode()], dtype=np.object_))]))
        return responses
'''
DLPACK_CONFIG = io([("IN", "TYPE_FP32", "-1")], [("OUT", "TYPE_FP32", "-1"), ("INFO", "TYPE_STRING", "1")])

FAILS_INIT = '''
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("no weights in " + args["model_repository"])

    def execute(self, requests):
        return []
'''
FAILS_IMPORT = '''
import a_module_nobody_installed

class TritonPythonModel:
    def execute(self, requests):
        return []
'''

AUTO = '''
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [3]})
        config.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [3]})
        config.set_max_batch_size(4)
        config.set_dynamic_batching()
        print("printed during auto-complete must not break it")
        return config

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() * 3)]) for r in requests]
'''

# IN (FP32 [1]) per request: >= 0 sleeps that long, -1 exits the process, -2 stops it (SIGSTOP: hung);
# OUT is the instance's pid. Each start is recorded in starts.txt beside the config; a restart (every start
# after the first) takes RESTART_DELAY_S, so a test sees the model not ready while it restarts.
FRAGILE = '''
import os
import signal
import time
import numpy as np
import triton_python_backend_utils as pb_utils

RESTART_DELAY_S = 1.5

class TritonPythonModel:
    def initialize(self, args):
        starts = os.path.join(args["model_repository"], "starts.txt")
        earlier = os.path.exists(starts)
        with open(starts, "a") as f:
            f.write(f"{os.getpid()}\\n")
        if earlier:
            time.sleep(RESTART_DELAY_S)

    def execute(self, requests):
        out = []
        for r in requests:
            value = float(pb_utils.get_input_tensor_by_name(r, "IN").as_numpy().reshape(-1)[0])
            if value == -1:
                os._exit(3)
            if value == -2:
                os.kill(os.getpid(), signal.SIGSTOP)
            time.sleep(max(value, 0))
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([os.getpid()],
                                                                                   np.float32))]))
        return out
'''
FRAGILE_CONFIG = io([("IN", "TYPE_FP32", "1")], [("OUT", "TYPE_FP32", "1")])

ENV_REPORT = '''
import sys
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        prefix = np.array([sys.prefix.encode()], dtype=object)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", prefix)]) for r in requests]
'''
ENV_CONFIG = io([("IN", "TYPE_FP32", "1")], [("OUT", "TYPE_STRING", "1")])

# BLS. Request parameters: `chain` ("a,b"): call the first model with the rest of the chain, or answer
# INPUT0 + INPUT1 / INPUT0 - INPUT1 itself when the chain is empty; `bls_timeout_us`; `sleep_s` (sleep first).
# A failed BLS call becomes this request's error, prefixed "BLS: ".
CALLER = '''
import json
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            params = json.loads(request.parameters())
            time.sleep(float(params.get("sleep_s", 0)))
            in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            chain = [m for m in params.get("chain", "").split(",") if m]
            if not chain:
                a, b = in0.as_numpy(), in1.as_numpy()
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", a + b),
                                                             pb_utils.Tensor("OUTPUT1", a - b)]))
                continue
            bls = pb_utils.InferenceRequest(
                model_name=chain[0], inputs=[in0, in1], requested_output_names=["OUTPUT0", "OUTPUT1"],
                timeout=int(params.get("bls_timeout_us", 0)), parameters={"chain": ",".join(chain[1:])})
            response = bls.exec()
            if response.has_error():
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("BLS: " + response.error().message())))
            else:
                responses.append(pb_utils.InferenceResponse(response.output_tensors()))
        return responses
'''
# async execute: OUTPUT0 from the first model of `chain`, OUTPUT1 from `simple`, both requests in flight
# at once.
ASYNC_CALLER = '''
import asyncio
import json
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            target = json.loads(request.parameters())["chain"]
            inputs = [pb_utils.get_input_tensor_by_name(request, n) for n in ("INPUT0", "INPUT1")]
            calls = [pb_utils.InferenceRequest(model_name=m, inputs=inputs,
                                               requested_output_names=["OUTPUT0", "OUTPUT1"]).async_exec()
                     for m in (target, "simple")]
            first, second = await asyncio.gather(*calls)
            if first.has_error() or second.has_error():
                error = (first if first.has_error() else second).error()
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            responses.append(pb_utils.InferenceResponse([
                pb_utils.get_output_tensor_by_name(first, "OUTPUT0"),
                pb_utils.get_output_tensor_by_name(second, "OUTPUT1")]))
        return responses
'''
# A decoupled CALLER without a chain: OUTPUT0 (sum) and OUTPUT1 (difference) in one response sent with the
# final flag. For tests/test_python_bls.py (a BLS call to a decoupled model).
DECOUPLED_ADDER = '''
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            outputs = [pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]
            request.get_response_sender().send(
                pb_utils.InferenceResponse(outputs),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''
CALLER_CONFIG = io([("INPUT0", "TYPE_INT32", "1, 16"), ("INPUT1", "TYPE_INT32", "1, 16")],
                   [("OUTPUT0", "TYPE_INT32", "1, 16"), ("OUTPUT1", "TYPE_INT32", "1, 16")])


# A decoupled model for test_decoupled.py and test_streaming.py: MODE (INT32 [1]) picks what it
# does; OUT (BYTES [1]) reports. One instance, so "the next request ran"
# proves the instance was free.
DECOUPLED_MISUSE = '''
import time
import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL

def text(s):
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([s.encode()], dtype=object))])

class TritonPythonModel:
    def initialize(self, args):
        self.note = "nothing yet"

    def execute(self, requests):
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
            sender = request.get_response_sender()
            if mode == 1:  # a decoupled execute must return None
                return [text("returned")]
            if mode == 2:  # flags 0 with no response
                try:
                    sender.send(None, 0)
                except pb_utils.TritonModelException as e:
                    sender.send(text(str(e)), FINAL)
            elif mode == 3:  # send after the final flag: remembered for mode 4
                sender.send(text("last"), FINAL)
                try:
                    sender.send(text("after"))
                except pb_utils.TritonModelException as e:
                    self.note = str(e)
            elif mode == 4:
                sender.send(text(self.note), FINAL)
            elif mode == 5:  # an error between two responses
                sender.send(text("one"))
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("bad piece")))
                sender.send(text("two"))
                sender.send(flags=FINAL)
            elif mode == 6:  # execute raises after one response
                sender.send(text("before"))
                raise ValueError("broke after one")
            elif mode == 7:  # holds the instance until the client leaves
                sender.send(text("waiting"))
                deadline = time.monotonic() + 30
                while not request.is_cancelled() and time.monotonic() < deadline:
                    time.sleep(0.01)
                self.note = f"cancelled={request.is_cancelled()} sender={sender.is_cancelled()}"
                sender.send(flags=FINAL)
            elif mode == 8:  # a non-decoupled call pattern: the sender's final with a response
                sender.send(text("only"), FINAL)
        return None
'''
DECOUPLED_MISUSE_CONFIG = '''max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
'''
