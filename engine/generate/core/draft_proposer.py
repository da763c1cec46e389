"""Speculative decoding's draft-model proposer: a small decoder's greedy tokens (vLLM's `draft_model`).

The scheduler asks it, per decoding request and step, for up to k tokens after the request's tokens so far
(proposer.py's `Proposer`). It keeps, per request, the draft's own keys and values as dense tensors (the
Optimum form: `present` = past + new) and the tokens they cover. At each call the kept state is cut back to
the common prefix of those tokens and the request's (the proposals the target rejected, and the draft's
last proposal, which it never fed, fall away), the tokens the draft has not seen are run in one call, and
then k - 1 more single-token runs give its greedy tokens. The target verifies them (verify.py) as a point
mass, which a greedy draft is, so sampled requests keep the target's distribution.

One request at a time: the draft runs rows of one, which is what single-stream latency, the case
speculation is for, asks of it; batching the draft's rows across requests is the next step where many
requests speculate at once. Its keys and values live outside the engine's KV blocks and are freed when the
request finishes (`release`); a preempted request keeps its draft state (its tokens do not change).
Called on the engine's thread; made by the model folder's loader (serving/model_folder.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort

from ...errors import invalid
from .decoder_model import DecoderModel


@dataclass(slots=True)
class _DraftState:
    """One request's draft keys and values ([1, heads, len(tokens), head_dim] per KV tensor)."""

    tokens: list[int] = field(default_factory=list)
    pasts: list[np.ndarray] = field(default_factory=list)


class DraftModelProposer:
    """A draft decoder (dense form, no LoRA inputs) with the target's vocabulary."""

    def __init__(self, model: Path | bytes, options: ort.SessionOptions, num_speculative_tokens: int,
                 vocab: int, where: str = "draft model",
                 providers: Sequence[str] = ("CPUExecutionProvider",)) -> None:
        if num_speculative_tokens < 1:
            raise invalid(f"{where}: num_speculative_tokens must be positive")
        self.model = DecoderModel(model, options, providers, where, shared_kv=False)
        if self.model.lora is not None:
            raise invalid(f"{where}: a draft model takes no LoRA adapters")
        if self.model.vocab and vocab and self.model.vocab != vocab:
            raise invalid(f"{where}: its vocabulary has {self.model.vocab} tokens, the model's {vocab}; a "
                          "draft model must share the model's tokenizer")
        self.k = num_speculative_tokens
        self._states: dict[str, _DraftState] = {}
        # a run's inputs, kept between runs: each run is a fraction of a millisecond, and building them
        # afresh (the mask's ones, the positions, the dict) was 0.05 of the 0.2 ms per step spent around ONNX
        self._feed: dict[str, np.ndarray] = {}
        self._past_names = [name for name, _ in self.model.kv_names]
        self._one_id = np.zeros((1, 1), np.int64)
        self._ids = np.zeros((1, 0), np.int64)
        self._ones = np.ones((1, 0), np.int64)
        self._positions = np.zeros((1, 0), np.int64)

    @property
    def requests_held(self) -> int:
        """Requests whose draft state is kept (those running, or preempted, that were proposed for)."""
        return len(self._states)

    def release(self, request_id: str) -> None:
        self._states.pop(request_id, None)

    def propose(self, request_id: str, token_ids: Sequence[int], limit: int) -> list[int]:
        limit = min(limit, self.k)
        if limit < 1:
            return []
        state = self._states.get(request_id)
        if state is None:
            state = self._states[request_id] = _DraftState()
        kept = _common_prefix(state.tokens, token_ids, len(token_ids) - 1)  # feed at least one token
        if kept < len(state.tokens):  # roll back: what the target did not keep
            del state.tokens[kept:]
            state.pasts = [np.ascontiguousarray(p[:, :, :kept]) for p in state.pasts]
        new = token_ids[kept:]
        proposals = self._runs(state, new, limit)
        state.tokens.extend(new)  # the state takes what was fed: `new` and all proposals but the last
        state.tokens.extend(proposals[:-1])
        return proposals

    def _runs(self, state: _DraftState, new: Sequence[int], limit: int) -> list[int]:
        """The draft's `limit` greedy tokens after the state's tokens and `new`; `state.pasts` becomes the
        last run's presents. One loop with its names bound once, where a method per run was: the Python
        between runs (a call, attribute look-ups, the feed's refresh) runs on caches the session has just
        evicted, so each line costs microseconds; this shape measured ~10-20 us less per proposal step."""
        model = self.model
        start = len(state.tokens)
        end = start + len(new)
        if not state.pasts:
            empty = (1, model.heads, 0, model.head_dim)
            state.pasts = [np.zeros(empty, model.kv_dtype) for _ in model.kv_names]
        if end + limit > self._ones.shape[1]:  # the ids, the mask's ones and the positions: views of arrays
            width = 2 * (end + limit)          # grown as needed
            self._ids = np.zeros((1, width), np.int64)
            self._ones = np.ones((1, width), np.int64)
            self._positions = np.arange(width, dtype=np.int64)[None]
        feed, run, output_names = self._feed, model.session.run, model.output_names
        past_names, ones, positions, one_id = self._past_names, self._ones, self._positions, self._one_id
        has_mask, has_positions = model.has_mask, model.has_positions
        ids = self._ids[:, :len(new)]
        ids[0] = new
        feed["input_ids"] = ids
        pasts = state.pasts
        proposals: list[int] = []
        while True:
            if has_mask:
                feed["attention_mask"] = ones[:, :end]
            if has_positions:
                feed["position_ids"] = positions[:, start:end]
            for name, past in zip(past_names, pasts, strict=True):
                feed[name] = past
            logits, *pasts = run(output_names, feed)
            token = int(logits[0, -1].argmax())
            proposals.append(token)
            if len(proposals) == limit:
                state.pasts = pasts
                return proposals
            one_id[0, 0] = token  # the k - 1 runs after the first: one token, written into a kept array
            feed["input_ids"] = one_id
            start, end = end, end + 1


def _common_prefix(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    """How many leading tokens `a` and `b` share, at most `limit`."""
    n = min(len(a), len(b), limit)
    # the tokens differ, if at all, in the last step's proposals: compare all before them in one C-level
    # slice comparison (lists), and only the rest token by token; a Python loop over the whole context
    # cost ~10 us a step at 200 tokens
    checked = max(0, n - 16)
    start = checked if a[:checked] == b[:checked] else 0
    for i in range(start, n):
        if a[i] != b[i]:
            return i
    return n
