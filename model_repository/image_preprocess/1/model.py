"""image_preprocess: step 1 of the image_pipeline ensemble, a Triton Python model.

IMAGE (UINT8 [batch, 3, H, W], channels first: red, green, blue) -> PIXELS (FP32, the same shape): each
channel (x / 255 - mean) / std, with ImageNet's usual mean and std. perf/hubserve_models/pipelines.py holds
the same constants (IMAGE_MEAN, IMAGE_STD) for the classifier after this step; test_ensemble.py checks
that this step's output equals that formula.
"""

import numpy as np
import triton_python_backend_utils as pb_utils

MEAN = np.array([0.485, 0.456, 0.406], np.float32).reshape(3, 1, 1)
STD = np.array([0.229, 0.224, 0.225], np.float32).reshape(3, 1, 1)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            image = pb_utils.get_input_tensor_by_name(request, "IMAGE").as_numpy()
            pixels = (image.astype(np.float32) / np.float32(255) - MEAN) / STD  # broadcast over the batch
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("PIXELS", pixels)]))
        return responses
