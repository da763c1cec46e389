"""text_tokenizer: step 1 of the text_pipeline ensemble, a Triton Python model.

TEXT (BYTES [batch, 1], UTF-8) -> TOKENS (INT64 [batch, 16]): the text lower-cased and split into words
(letters and apostrophes), each word's line number in vocab.txt (beside config.pbtxt; line 0 is the padding
token, line 1 the unknown-word token), truncated or padded with 0 to the output's length.
"""

import json
import os
import re

import numpy as np
import triton_python_backend_utils as pb_utils

WORD = re.compile(r"[a-z']+")


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.length = pb_utils.get_output_config_by_name(config, "TOKENS")["dims"][0]
        with open(os.path.join(args["model_repository"], "vocab.txt"), encoding="utf-8") as f:
            words = [line.strip() for line in f]
        self.ids = {word: i for i, word in enumerate(words)}
        self.unknown = self.ids["[unk]"]

    def tokens(self, text):
        ids = [self.ids.get(w, self.unknown) for w in WORD.findall(text.lower())][:self.length]
        return ids + [0] * (self.length - len(ids))

    def execute(self, requests):
        responses = []
        for request in requests:
            texts = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            try:
                rows = [self.tokens(t.decode("utf-8")) for t in texts.reshape(-1)]
            except UnicodeDecodeError as e:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    f"TEXT must be UTF-8: {e}", pb_utils.TritonError.INVALID_ARG)))
                continue
            tokens = np.array(rows, dtype=np.int64).reshape(len(texts), self.length)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("TOKENS", tokens)]))
        return responses
