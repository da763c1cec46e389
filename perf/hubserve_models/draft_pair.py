"""A target decoder and a draft that agrees with it by construction, for speculative decoding's benchmark.

Two models of independent random weights agree on almost no greedy token, so a draft model can only be
measured at 0 % acceptance with them; a trained pair (a distilled or same-family small model) agrees most of
the time. This builds such a pair from one set of random weights instead: the draft is the target's
embedding, first `draft_layers` layers, final norm and head; the target adds its remaining layers with
their output projections (attention's `wo`/`bo`, the MLP's `w2`/`b2`) scaled by `residual_scale`, so they
add only a small correction to the residual stream. Where the draft's top two logits are far apart (the
head spreads them to a std of about 4: tiny_decoder.py) the correction does not flip the argmax, so the
greedy tokens agree most of the time, and less the larger `residual_scale` is; perf/bench_spec.py reports
the acceptance it measures. The target costs what a model of its shape costs (every layer still runs); the
draft what its fewer layers cost.

Built with the onnx helper API from a seeded RNG, like the other example models: no downloads.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx

from .tiny_decoder import TinyDecoderShape, decoder_from_weights, decoder_weights

OUTPUT_PROJECTIONS = ("wo", "bo", "w2", "b2")  # what a layer adds to the residual stream goes through these


def agreeing_pair(target: TinyDecoderShape, draft_layers: int = 1, draft_ffn: int = 0,
                  residual_scale: float = 0.1, seed: int = 17) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """(target, draft): the draft is the target's first `draft_layers` layers under the same embedding, norm
    and head, with the first `draft_ffn` of their MLP units (0: all); the target's later layers, and its
    other MLP units in the draft's layers, write `residual_scale` × what they would (the module doc)."""
    if not 1 <= draft_layers < target.layers:
        raise ValueError(f"draft_layers must be 1 … {target.layers - 1} for a {target.layers}-layer target")
    ffn = draft_ffn or target.ffn
    if not 1 <= ffn <= target.ffn:
        raise ValueError(f"draft_ffn must be 1 … {target.ffn}")
    weights = decoder_weights(target, seed)
    scale = np.float32(residual_scale)
    for i in range(draft_layers, target.layers):
        for name in OUTPUT_PROJECTIONS:
            weights[f"l{i}.{name}"] = weights[f"l{i}.{name}"] * scale
    for i in range(draft_layers):  # the MLP units the draft leaves out add little to the target's
        weights[f"l{i}.w2"][ffn:] *= scale
    later = tuple(f"l{i}." for i in range(draft_layers, target.layers))
    draft_weights = {name: w for name, w in weights.items() if not name.startswith(later)}
    for i in range(draft_layers):
        draft_weights[f"l{i}.w1"] = np.ascontiguousarray(weights[f"l{i}.w1"][:, :ffn])
        draft_weights[f"l{i}.b1"] = weights[f"l{i}.b1"][:ffn].copy()
        draft_weights[f"l{i}.w2"] = weights[f"l{i}.w2"][:ffn].copy()
    draft = dataclasses.replace(target, layers=draft_layers, ffn=ffn, shared_kv=False)  # the draft runs dense
    return decoder_from_weights(target, weights), decoder_from_weights(draft, draft_weights)
