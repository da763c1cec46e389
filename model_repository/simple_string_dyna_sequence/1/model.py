"""simple_string_dyna_sequence: a sequence model with implicit state and a string correlation ID.

Each request is one row of a sequence batch (batch size 1). The server hands the model, as input tensors,
INPUT, the control inputs START, END, READY and CORRID (the correlation ID as BYTES), and ACC_IN, the
sequence's running sum (the ACC_OUT this model returned for the sequence's previous request, zeros on
START). The model returns ACC_OUT, the new sum, which the server keeps for the next request and never
answers, and OUTPUT: the sum, plus the correlation ID read as an integer on the sequence's END request (what
Triton's dyna_sequence test backend answers). A row that is not READY answers zeros.
"""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            tensors = {t.name(): t.as_numpy() for t in request.inputs()}
            value = tensors["INPUT"].astype(np.int32)
            if tensors["READY"][0, 0] == 0:
                zero = np.zeros_like(value)
                responses.append(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUTPUT", zero), pb_utils.Tensor("ACC_OUT", zero)]))
                continue
            total = value if tensors["START"][0, 0] else tensors["ACC_IN"] + value
            output = total.copy()
            if tensors["END"][0, 0]:
                output += int(tensors["CORRID"][0, 0])
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT", output.astype(np.int32)),
                 pb_utils.Tensor("ACC_OUT", total.astype(np.int32))]))
        return responses
