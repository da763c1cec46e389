"""The example pipelines' ONNX models (model_repository/image_pipeline and text_pipeline, both ensembles):
fixed weights computed here, so each pipeline answers what it says (a red image is "red", "a great movie" is
"positive") and the files are reproducible byte for byte. examples.py lists and writes them; their Python
steps (model.py: image_preprocess, text_tokenizer, text_postprocess) and word lists (vocab.txt, labels.txt)
are committed beside their configs, and tests/unit/perf/test_examples.py checks that those agree with the
constants here.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .onnx_build import finish, tensor

# The image pipeline (model_repository/image_pipeline, an ensemble): raw UINT8 pixels -> image_preprocess
# (Python: scale and normalize, (x / 255 - IMAGE_MEAN) / IMAGE_STD per channel; its model.py holds the same
# constants) -> image_classifier (below: the nearest of ten colours to the image's mean colour) -> the
# classification extension with the ensemble's labels.txt, in this order.
IMAGE_SIDE = 64
COLOURS = {"black": (0, 0, 0), "white": (255, 255, 255), "red": (255, 0, 0), "green": (0, 255, 0),
           "blue": (0, 0, 255), "yellow": (255, 255, 0), "cyan": (0, 255, 255), "magenta": (255, 0, 255),
           "gray": (128, 128, 128), "orange": (255, 165, 0)}
IMAGE_MEAN = np.array([0.485, 0.456, 0.406], np.float32)  # the usual ImageNet normalization
IMAGE_STD = np.array([0.229, 0.224, 0.225], np.float32)


def image_classifier_model() -> onnx.ModelProto:
    """FP32 PIXELS [batch, 3, 64, 64] -> PROBABILITIES [batch, 10]: a softmax over minus the squared distance
    of the mean colour to each of COLOURS (normalized as the pixels are), so a red image is "red"."""
    prototypes = ((np.array(list(COLOURS.values()), np.float32) / 255 - IMAGE_MEAN) / IMAGE_STD)  # [10, 3]
    weight = (8 * prototypes.T).astype(np.float32)  # -|m - p|^2 = 2 m.p - |p|^2 - |m|^2, sharpened 4x
    bias = (-4 * (prototypes ** 2).sum(axis=1)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("GlobalAveragePool", ["PIXELS"], ["pooled"], name="pool"),
            helper.make_node("Flatten", ["pooled"], ["mean_colour"], name="flatten", axis=1),
            helper.make_node("Gemm", ["mean_colour", "weight", "bias"], ["logits"], name="score"),
            helper.make_node("Softmax", ["logits"], ["PROBABILITIES"], name="softmax", axis=1),
        ],
        "image_classifier",
        [tensor("PIXELS", TensorProto.FLOAT, (-1, 3, IMAGE_SIDE, IMAGE_SIDE))],
        [tensor("PROBABILITIES", TensorProto.FLOAT, (-1, len(COLOURS)))],
        initializer=[numpy_helper.from_array(weight, "weight"), numpy_helper.from_array(bias, "bias")],
    )
    return finish(graph)


# The text pipeline (model_repository/text_pipeline, an ensemble): BYTES text -> text_tokenizer (Python:
# words to the line numbers of its vocab.txt, which holds TEXT_VOCAB) -> text_classifier (below) ->
# text_postprocess (Python: the best of TEXT_LABELS and its score).
TEXT_LENGTH = 16  # tokens per text, padded with 0
TEXT_LABELS = ("negative", "neutral", "positive")
_POSITIVE = ("good", "great", "excellent", "love", "loved", "wonderful", "happy", "best", "fast", "amazing",
             "enjoyed", "like", "nice", "perfect")
_NEGATIVE = ("bad", "terrible", "awful", "hate", "hated", "poor", "sad", "worst", "slow", "broken", "boring",
             "dislike", "ugly", "wrong")
_NEUTRAL = ("the", "a", "an", "is", "it", "was", "this", "that", "and", "or", "of", "to", "in", "on",
            "movie", "film", "server", "model", "food", "service", "day", "i", "you", "we", "very", "really")
TEXT_VOCAB = ("[pad]", "[unk]", *_POSITIVE, *_NEGATIVE, *_NEUTRAL)  # line i of vocab.txt is token id i
TEXT_SEED = 14


def text_classifier_weights() -> tuple[np.ndarray, np.ndarray]:
    """The classifier's embedding [len(TEXT_VOCAB), 3] and bias [3]: each word's row is its polarity (+-1.5
    towards positive or negative, 0 for the others) plus noise from `default_rng(TEXT_SEED)` (sd 0.05); the
    padding row is zero, and the bias leans neutral, so a text without opinion words is "neutral"."""
    rng = np.random.default_rng(TEXT_SEED)
    embedding = rng.normal(0.0, 0.05, (len(TEXT_VOCAB), len(TEXT_LABELS))).astype(np.float32)
    polarity = {w: (1.5, 0.0, -1.5) for w in _NEGATIVE} | {w: (-1.5, 0.0, 1.5) for w in _POSITIVE}
    for i, word in enumerate(TEXT_VOCAB):
        embedding[i] += np.array(polarity.get(word, (0.0, 0.0, 0.0)), np.float32)
    embedding[0] = 0.0
    return embedding, np.array([0.0, 0.5, 0.0], np.float32)


def text_classifier_model() -> onnx.ModelProto:
    """INT64 TOKENS [batch, 16] -> FP32 SCORES [batch, 3]: softmax(sum of the tokens' embedding rows + bias),
    a bag-of-words sentiment classifier over negative, neutral, positive."""
    embedding, bias = text_classifier_weights()
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["embedding", "TOKENS"], ["rows"], name="embed", axis=0),
            helper.make_node("ReduceSum", ["rows", "token_axis"], ["summed"], name="bag", keepdims=0),
            helper.make_node("Add", ["summed", "bias"], ["logits"], name="bias"),
            helper.make_node("Softmax", ["logits"], ["SCORES"], name="softmax", axis=1),
        ],
        "text_classifier",
        [tensor("TOKENS", TensorProto.INT64, (-1, TEXT_LENGTH))],
        [tensor("SCORES", TensorProto.FLOAT, (-1, len(TEXT_LABELS)))],
        initializer=[numpy_helper.from_array(embedding, "embedding"), numpy_helper.from_array(bias, "bias"),
                     numpy_helper.from_array(np.array([1], np.int64), "token_axis")],
    )
    return finish(graph)
