"""text_postprocess: step 3 of the text_pipeline ensemble, a Triton Python model.

SCORES (FP32 [batch, 3]) -> LABEL (BYTES [batch, 1]: the line of labels.txt, beside config.pbtxt, of the
highest score) and CONFIDENCE (FP32 [batch, 1]: that score).
"""

import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        with open(os.path.join(args["model_repository"], "labels.txt"), encoding="utf-8") as f:
            self.labels = np.array([line.strip().encode("utf-8") for line in f if line.strip()], dtype=object)

    def execute(self, requests):
        responses = []
        for request in requests:
            scores = pb_utils.get_input_tensor_by_name(request, "SCORES").as_numpy()
            best = scores.argmax(axis=1)
            label = self.labels[best].reshape(-1, 1)
            confidence = scores[np.arange(len(best)), best].astype(np.float32).reshape(-1, 1)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("LABEL", label),
                                                         pb_utils.Tensor("CONFIDENCE", confidence)]))
        return responses
