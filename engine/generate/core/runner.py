"""Runs a step's chunks through an ONNX decoder that takes and returns its KV cache as dense tensors.

The model (Hugging Face Optimum's `decoder_with_past` form, like perf/hubserve_models/tiny_decoder.py) wants
each call's past as `past_key_values.{i}.key/value` [batch, heads, past_len, head_dim] and gives back
`present.*` with the new tokens appended. The engine keeps keys and values in fixed-size blocks instead, so
that sequences grow, share prefixes and leave without moving each other's memory. This runner maps one onto
the other:

- **Shared-KV models** (`shared_kv`, shared_group.py) instead read and write one buffer per KV tensor in
  place (ONNX Runtime's GroupQueryAttention), contexts left-aligned and each row attending over its own
  length: no padding and no Concat copy; the rest below (storage, prefill gathers, groups) is the same.
- **Storage.** One array [2 * layers, heads, num_blocks * block_size + 1, head_dim] (keys and values of
  every layer): token `t` of a sequence is slot `table[t // block_size] * block_size + t % block_size`. The
  extra last slot stays zero: it is what padding reads.
- **Gather (blocks → dense past).** For a group of B rows, the past is [B, heads, P, head_dim] with P the
  longest context in the group; each row's context is right-aligned (left padding) and its padding masked
  out by `attention_mask` (0). One `np.take` of [2 * layers, B, heads, P] rows of head_dim values reads
  every past tensor of the call at once, already in the contiguous layout ONNX Runtime reads.
- **Run.** The new tokens sit in slots P … P+S-1 (right-padded to the group's longest chunk S); the model's
  causal mask is by slot, so every real query sees exactly its own context and earlier new tokens.
- **Scatter (present → blocks).** Only the new tokens' rows of `present` are written back into their blocks;
  the block tables stay the truth for admission, preemption and prefix sharing. A prefill's tokens are
  written at once; a decode's wait in the decode group's tensors until they fill a block or the row leaves
  (decode_group.py, shared_group.py).
- **Groups.** Dense tensors pad every row to the longest: a 256-token prefill chunk batched with decodes
  would make every decode compute 256 positions. So the decodes (one token each) run as one batch, and the
  prefill chunks in batches of similar length (`prefill_groups`), each batch one session run.
- **The decode group's past is kept** (decode_group.py): a decode run's `present` is the next decode run's
  `past` for the same rows, so while the decoding requests stay the same the runner gathers nothing and
  feeds ONNX Runtime its own output back; when they change, the continuing rows are copied over (trimmed to
  the new longest context) and only the joining rows are gathered from blocks.

Per step this costs, besides the model: for a steady decode group, a block's worth of keys and values written
per row every block_size steps (the model's own Concat copies the past into `present`, which is kept); on a
membership change, one copy of the continuing rows plus a gather of the joining ones; for prefill chunks, a
gather of their cached context (usually none) and a write of their tokens. `RunnerStats` counts the time,
and perf/bench_generate.py prints it. Called on the engine's thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from ...errors import invalid
from .decode_group import DecodeGroup
from .lora import LoraShape, lora_feed
from .scheduler import ScheduledChunk
from .shared_group import SharedDecodeGroup

_KV_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


@dataclass(slots=True)
class RunnerStats:
    """Where a runner's time went, in nanoseconds, since it was made (or `reset`)."""

    steps: int = 0
    runs: int = 0             # session runs (a step runs one per group)
    tokens: int = 0           # new tokens computed
    past_slots: int = 0       # context slots gathered into dense past tensors, padding included
    padded_slots: int = 0     # of those, padding
    gather_ns: int = 0        # blocks → dense past, and the other inputs
    run_ns: int = 0           # ONNX Runtime
    decode_run_ns: int = 0    # of which, decode runs
    scatter_ns: int = 0       # present → blocks, and picking the logits
    decode_rows: int = 0      # decode rows run
    gathered_rows: int = 0    # of those, with their past gathered from blocks (not kept from the last step)
    free_rows: int = 0        # rows run masked out: a decode group's free rows (decode_group.py)
    rebuilds: int = 0         # decode runs whose group's tensors were rebuilt (not kept or filled in place)

    def reset(self) -> None:
        for name in self.__slots__:  # type: ignore[attr-defined]
            setattr(self, name, 0)


@dataclass(frozen=True, slots=True)
class RunShape:
    """One session run as the runner made it: input_ids' [batch, seq], the mask's width, and each row's
    ones in the mask (its context plus new tokens, padding left out)."""

    ids: tuple[int, ...]
    width: int
    lengths: list[int]


@dataclass(slots=True)
class _DecodeBinding:
    """A shared-KV decode run at one height (rows): its buffers' views bound as past and present, and
    input_ids, position_ids and logits bound once to arrays kept here, which each schedule fills in place.
    Only the mask is bound per run (its width is the longest row's length), from `mask`'s memory. The Python
    right after an ONNX Runtime run finds its caches cold (each array made and bound there cost several
    times what it costs alone), so a decode run makes as few as it can."""

    binding: ort.IOBinding
    input_ids: np.ndarray   # [rows, 1]
    positions: np.ndarray   # [rows, 1]
    logits: np.ndarray      # [rows, 1, vocab]
    mask: np.ndarray        # [rows * max_len]: each run's [rows, width] mask is its first rows × width


class DecoderRunner:
    """One ONNX Runtime session plus the KV blocks' storage. `options`: the session options (one intra-op
    thread and no spinning, as engine/backends/onnxruntime.py sets them)."""

    def __init__(self, model: Path | bytes, num_blocks: int, block_size: int, options: ort.SessionOptions,
                 providers: Sequence[str] = ("CPUExecutionProvider",), where: str = "model",
                 shared_kv: bool = False, max_len: int = 512, max_rows: int = 32) -> None:
        source = str(model) if isinstance(model, Path) else model
        self.session = ort.InferenceSession(source, options, providers=list(providers))
        inputs = {a.name: a for a in self.session.get_inputs()}
        outputs = {a.name for a in self.session.get_outputs()}
        layers = 0
        while f"past_key_values.{layers}.key" in inputs:
            layers += 1
        if not layers or "input_ids" not in inputs or "logits" not in outputs:
            raise invalid(f"{where}: not a decoder with past: it needs inputs input_ids and "
                          "past_key_values.{i}.key/value, and outputs logits and present.{i}.key/value")
        first = inputs["past_key_values.0.key"]
        heads, head_dim = first.shape[1], first.shape[3]
        if not (isinstance(heads, int) and isinstance(head_dim, int)) or first.type not in _KV_DTYPES:
            raise invalid(f"{where}: past_key_values.0.key must be float or float16 [batch, heads, past, "
                          f"head_dim] with fixed heads and head_dim, got {first.type} {first.shape}")
        self.kv_names = [(f"past_key_values.{i}.{p}", f"present.{i}.{p}")
                         for i in range(layers) for p in ("key", "value")]
        missing = [n for pair in self.kv_names for n in pair if n not in inputs and n not in outputs]
        if missing:
            raise invalid(f"{where}: missing KV tensor {missing[0]}")
        self.layers, self.heads, self.head_dim = layers, heads, head_dim
        self.block_size = block_size
        self.zero_slot = num_blocks * block_size
        dtype = _KV_DTYPES[first.type]
        self.slots_per_head = self.zero_slot + 1
        self.cache = np.zeros((len(self.kv_names), heads, self.slots_per_head, head_dim), dtype)
        self._rows = self.cache.reshape(-1, head_dim)  # a view: one row per (tensor, head, slot)
        # the first row of each (tensor, head) in _rows, shaped to broadcast against [B, P] or [N]
        self._bases = (np.arange(len(self.kv_names) * heads) * self.slots_per_head).reshape(
            len(self.kv_names), heads)
        if "use_cache_branch" in inputs:
            raise invalid(f"{where}: a merged decoder (input use_cache_branch) is not supported; export "
                          "the model with past (Optimum's decoder_with_past, or one taking an empty past)")
        self.has_mask, self.has_positions = "attention_mask" in inputs, "position_ids" in inputs
        self.lora = _lora_shape(inputs, layers, where)  # None: the model takes no adapters (lora.py)
        self.output_names = ["logits", *(present for _, present in self.kv_names)]
        logits = next(o for o in self.session.get_outputs() if o.name == "logits")
        if shared_kv and (not isinstance(logits.shape[-1], int) or logits.type not in _KV_DTYPES):
            raise invalid(f"{where}: with past_present_share_buffer, logits must be float or float16 [batch, "
                          f"seq, vocab] with a fixed vocab, got {logits.type} {logits.shape}")
        self.vocab = logits.shape[-1] if isinstance(logits.shape[-1], int) else 0
        self._logits_dtype = _KV_DTYPES.get(logits.type, np.float32)
        self.stats = RunnerStats()
        self.decode_group = DecodeGroup(block_size, self._flush_rows)
        # a shared-KV model (shared_group.py): its decode buffers, and per run height (rows) a binding of
        # their views as both past and present, remade only if the buffers are (shared_group.grown)
        self.shared_kv = shared_kv
        self.shared_group = SharedDecodeGroup(
            (len(self.kv_names), heads, head_dim), dtype, max_len, max_rows, block_size, self._flush_rows,
        ) if shared_kv else None
        self._bindings: dict[int, _DecodeBinding] = {}
        self._bound = 0
        self._columns = np.arange(max_len)  # a mask's column indices, compared with each row's position
        # set to a list, each session run is recorded in it (RunShape), for perf/bench_generate.py's ceiling
        self.trace: list[RunShape] | None = None
        self._check_layout(where)

    def _check_layout(self, where: str) -> None:
        """Refuse a model whose attention does not take its past the way this runner will give it, before
        it answers anything wrongly: a shared-KV runner must be able to bind one buffer as past and present;
        a dense one right-aligns contexts behind masked padding, which a length-based attention (ONNX
        Runtime's GroupQueryAttention counts the mask's ones) would misread. Two or three one-token runs."""
        kv = self.cache.dtype
        rng = np.random.default_rng(0)
        rows: list[ScheduledChunk | None] = [None]
        ids, positions = np.zeros((1, 1), np.int64), np.ones((1, 1), np.int64)
        if self.shared_kv:
            buffers = [np.zeros((1, self.heads, 2, self.head_dim), kv) for _ in self.kv_names]
            try:
                self._run_bound(self._bind_kv(buffers), ids, np.ones((1, 2), np.int64), positions, rows)
            except Exception as e:
                raise invalid(f"{where}: with past_present_share_buffer true the model must write its "
                              f"present into its past buffer (GroupQueryAttention); it could not: "
                              f"{str(e).splitlines()[0][:300]}. Set it to false for a model that returns "
                              "past + new as present (Optimum's form)") from None
            return
        if not self.has_mask:
            return
        past = [rng.standard_normal((1, self.heads, 1, self.head_dim)).astype(kv) for _ in self.kv_names]
        padded = [np.concatenate([np.zeros_like(p), p], axis=2) for p in past]
        plain = self.session.run(["logits"], self._feed(ids, np.ones((1, 2), np.int64), positions, past,
                                                        rows))[0]
        behind = self.session.run(["logits"], self._feed(ids, np.array([[0, 1, 1]], np.int64), positions,
                                                         padded, rows))[0]
        if not np.allclose(plain, behind, rtol=1e-3, atol=1e-3):
            raise invalid(f"{where}: the model does not ignore past slots its attention_mask marks 0 (the "
                          "dense layout pads shorter contexts that way); a model with GroupQueryAttention "
                          "and a shared past/present buffer is served with past_present_share_buffer true")

    @property
    def kv_bytes_per_token(self) -> int:
        return int(self.cache[:, :, 0].nbytes)

    def execute(self, chunks: Sequence[ScheduledChunk]) -> np.ndarray:
        """Compute every chunk's tokens into its blocks; the last position's logits of each chunk with
        `sample`, one row each in chunk order ([n, vocab]; n may be 0: a step of prefill chunks only, such
        as the first chunk of a prompt longer than the token budget)."""
        self.stats.steps += 1
        decodes = [i for i, c in enumerate(chunks) if len(c.token_ids) == 1]
        decode = self._decode
        if len(decodes) == len(chunks) and all(c.sample for c in chunks):
            return decode(chunks)  # a step of decodes only (the usual one): its logits are the answer
        prefills = [i for i, c in enumerate(chunks) if len(c.token_ids) > 1]
        rows: dict[int, np.ndarray] = {}
        if decodes:
            rows.update(zip(decodes, decode([chunks[i] for i in decodes]), strict=True))
        else:  # nobody is decoding: let go of the kept tensors
            self.decode_group.clear()
            if self.shared_group is not None:
                self.shared_group.clear()
        groups = prefill_groups(chunks, prefills)
        if self.shared_kv:  # ONNX Runtime's GroupQueryAttention batches several new tokens only from slot 0
            groups = [part for g in groups for part in _fresh_together(chunks, g)]
        for group in groups:
            rows.update(zip(group, self._run([chunks[i] for i in group]), strict=True))
        wanted = [rows[i] for i, c in enumerate(chunks) if c.sample]
        return np.stack(wanted) if wanted else np.empty((0, self.vocab), self._logits_dtype)

    def _slots(self, table: Sequence[int], start: int, count: int) -> np.ndarray:
        positions = np.arange(start, start + count)
        return np.asarray(table, np.int64)[positions // self.block_size] * self.block_size \
            + positions % self.block_size

    def _gather(self, group: Sequence[ScheduledChunk], width: int) -> np.ndarray:
        """Every KV tensor's context for `group` from its blocks, `width` slots wide, the rest read from the
        zero slot: [tensors, B, heads, width, head_dim]. Each context is right-aligned for a dense model (its
        padding first, masked out) and left-aligned for a shared-KV one (slots 0 … start - 1)."""
        index = np.full((len(group), width), self.zero_slot, np.int64)
        for row, c in enumerate(group):
            if c.start:
                at = slice(0, c.start) if self.shared_kv else slice(width - c.start, width)
                index[row, at] = self._slots(c.block_table, 0, c.start)
        past_rows = self._bases[:, None, :, None] + index[None, :, None, :]  # [tensors, B, heads, width]
        return np.take(self._rows, past_rows, axis=0)

    def _run_bound(self, binding: ort.IOBinding, input_ids: np.ndarray, mask: np.ndarray,
                   positions: np.ndarray, rows: Sequence[ScheduledChunk | None]) -> np.ndarray:
        """One run of a shared-KV model whose KV buffers `binding` already holds (past and present bound to
        the same values); the other inputs bound here. Returns the logits [batch, seq, vocab]."""
        for name, value in self._feed(input_ids, mask, positions, (), rows).items():
            binding.bind_cpu_input(name, value)
        logits = np.empty((*input_ids.shape, self.vocab), self._logits_dtype)
        binding.bind_ortvalue_output("logits", ort.OrtValue.ortvalue_from_numpy(logits))
        self._record(input_ids, mask)
        self.session.run_with_iobinding(binding)
        return logits

    def _record(self, input_ids: np.ndarray, mask: np.ndarray) -> None:
        if self.trace is not None:
            self.trace.append(RunShape(input_ids.shape, mask.shape[1], mask.sum(axis=1).tolist()))

    def _bind_kv(self, buffers: Sequence[np.ndarray]) -> ort.IOBinding:
        """A binding whose past and present are the same buffers, so the model writes them in place."""
        binding = self.session.io_binding()
        for (past, present), buffer in zip(self.kv_names, buffers, strict=True):
            value = ort.OrtValue.ortvalue_from_numpy(buffer)
            binding.bind_ortvalue_input(past, value)
            binding.bind_ortvalue_output(present, value)
        return binding

    def _decode_binding(self, views: Sequence[np.ndarray]) -> _DecodeBinding:
        """A shared-KV decode binding for the rows of `views` (the group's buffers' first rows, each as
        wide as the context). The binding holds a reference to every array bound to it."""
        rows, width = len(views[0]), views[0].shape[2]
        ids, positions = np.zeros((rows, 1), np.int64), np.zeros((rows, 1), np.int64)
        logits = np.empty((rows, 1, self.vocab), self._logits_dtype)
        kept = _DecodeBinding(self._bind_kv(views), ids, positions, logits, np.zeros(rows * width, np.int64))
        kept.binding.bind_cpu_input("input_ids", kept.input_ids)
        if self.has_positions:
            kept.binding.bind_cpu_input("position_ids", kept.positions)
        kept.binding.bind_ortvalue_output("logits", ort.OrtValue.ortvalue_from_numpy(kept.logits))
        return kept

    def _adapter_inputs(self, rows: Sequence[ScheduledChunk | None]) -> dict[str, np.ndarray]:
        """The LoRA inputs for a run's rows: each row's adapter (None: a free row, or no adapter)."""
        assert self.lora is not None
        return lora_feed(self.lora, [None if c is None else c.request.adapter for c in rows])

    def _feed(self, input_ids: np.ndarray, mask: np.ndarray, positions: np.ndarray,
              pasts: Sequence[np.ndarray], rows: Sequence[ScheduledChunk | None]) -> dict[str, np.ndarray]:
        """A run's inputs by name; `pasts` empty when they are bound instead (a shared-KV run)."""
        feed: dict[str, np.ndarray] = {"input_ids": input_ids}
        if self.lora is not None:
            feed.update(self._adapter_inputs(rows))
        if self.has_mask:
            feed["attention_mask"] = mask
        if self.has_positions:
            feed["position_ids"] = positions
        if pasts:
            feed.update(zip((name for name, _ in self.kv_names), pasts, strict=True))
        return feed

    def _run(self, group: Sequence[ScheduledChunk]) -> np.ndarray:
        """Prefill chunks, batched, over their cached context gathered from their blocks; the last position's
        logits. Dense: each context right-aligned before the group's longest, the new tokens in slots P …
        P+S-1. Shared-KV: each context left-aligned in a buffer as wide as the longest context plus the
        widest chunk, bound as past and present, and every row's mask counting its start plus the full width,
        so a shorter chunk's padding tokens land after its real ones (never read: they are not written back,
        and the next token overwrites the first). Only the real new tokens are written to their blocks."""
        t0 = time.perf_counter_ns()
        batch, shared = len(group), self.shared_kv
        past = max(c.start for c in group)
        width = max(len(c.token_ids) for c in group)
        input_ids = np.zeros((batch, width), np.int64)
        position_ids = np.zeros((batch, width), np.int64)
        mask = np.zeros((batch, past + width), np.int64)
        for row, c in enumerate(group):
            count = len(c.token_ids)
            input_ids[row, :count] = c.token_ids
            position_ids[row, :count] = np.arange(c.start, c.start + count)
            if shared:
                mask[row, :c.start + width] = 1
            else:
                mask[row, past - c.start:past + count] = 1
        outs: Sequence[np.ndarray]
        if shared:
            outs = list(self._gather(group, past + width))
            t1 = time.perf_counter_ns()
            logits = self._run_bound(self._bind_kv(outs), input_ids, mask, position_ids, group)
            firsts = [c.start for c in group]  # the column of each row's first new token
        else:
            feed = self._feed(input_ids, mask, position_ids, list(self._gather(group, past)), group)
            t1 = time.perf_counter_ns()
            self._record(input_ids, mask)
            logits, *outs = self.session.run(self.output_names, feed)
            firsts = [past] * batch
        t2 = time.perf_counter_ns()
        counts = [len(c.token_ids) for c in group]
        rows = np.repeat(np.arange(batch), counts)
        cols = np.concatenate([np.arange(first, first + n) for first, n in zip(firsts, counts, strict=True)])
        slots = np.concatenate([self._slots(c.block_table, c.start, len(c.token_ids)) for c in group])
        for i, out in enumerate(outs):
            self._rows[self._bases[i][None, :] + slots[:, None]] = out[rows, :, cols, :]  # [N, heads, d]
        last = logits[np.arange(batch), np.asarray(counts) - 1]
        t3 = time.perf_counter_ns()
        context = sum(c.start for c in group)
        self._count(batch, len(rows), context if shared else batch * past, context, t0, t1, t2, t3)
        return last

    def _decode(self, group: Sequence[ScheduledChunk]) -> np.ndarray:
        """One decode step: a token for each of `group` over the decode group's kept past (decode_group.py,
        or shared_group.py's buffers); the logits in `group`'s order."""
        logits: list[np.ndarray] = []

        def keep(last: np.ndarray) -> list[int]:
            logits.append(last)
            return []  # nothing is fed back after the last step

        self._decode_steps(group, 1, keep)
        return logits[0].copy()  # a shared-KV run's logits are kept and bound: the next run overwrites them

    def execute_steps(self, chunks: Sequence[ScheduledChunk], steps: int,
                      pick: Callable[[np.ndarray], list[int]]) -> np.ndarray:
        """A multi-step decode (engine.py): `steps` decode runs over `chunks` (each one token that samples,
        with blocks for `steps` tokens), each run's logits [chunks, vocab] handed to `pick` (the engine's
        sampler) and the tokens it picks fed back as the next run's input, with no schedule in between.
        Returns the picked tokens, [chunks, steps]."""
        self.stats.steps += 1
        tokens = np.empty((len(chunks), steps), np.int64)
        step = 0

        def feed_back(last: np.ndarray) -> list[int]:
            nonlocal step
            picked = pick(last)
            tokens[:, step] = picked
            step += 1
            return picked

        self._decode_steps(chunks, steps, feed_back)
        return tokens

    def _decode_steps(self, group: Sequence[ScheduledChunk], steps: int,
                      pick: Callable[[np.ndarray], list[int]]) -> None:
        """`steps` decode runs, the rows placed once: after each run every live row is one longer and takes
        the token `pick` returns for its chunk (unused after the last). Built from plain lists once, then
        numpy in place per run: at tens of rows numpy's per-call cost and per-row Python are what add up.
        Dense: each run's `present` is the next run's past (right-aligned, one slot wider each run). Shared:
        the buffers are past and present both, each row's mask counting its own length, so nothing is
        padded and nothing copied. The blocks these runs filled are written after the last."""
        t0 = time.perf_counter_ns()
        shared = self.shared_group
        dense = self.decode_group
        before = dense.rebuilds if shared is None else shared.moves
        kept: _DecodeBinding | None = None
        pasts: list[np.ndarray] = []
        if shared is not None:
            order, gathered = shared.prepare(group, self._gather)
            if self._bound != shared.grown:
                self._bindings, self._bound = {}, shared.grown
            kept = self._bindings.get(len(order))
            if kept is None:
                kept = self._bindings[len(order)] = self._decode_binding(shared.views())
        else:
            order, pasts, gathered = dense.prepare(group, self._gather)
        # rows moved count as rebuilds: a shared group is never rebuilt whole
        regrouped = (dense.rebuilds if shared is None else shared.moves) - before
        batch = len(order)
        starts, token_ids, live, picked = _decode_rows(group, order)  # a free row: token 0 at slot 0
        rows = [group[i] if i >= 0 else None for i in order]
        if kept is not None:  # filled in place: the binding holds these arrays
            input_ids, positions = kept.input_ids, kept.positions
            input_ids[:, 0], positions[:, 0] = token_ids, starts
            if self.lora is not None:  # once for the schedule's runs
                for name, value in self._adapter_inputs(rows).items():
                    kept.binding.bind_cpu_input(name, value)
        else:
            positions = np.array(starts, np.int64)[:, None]
            input_ids = np.array(token_ids, np.int64).reshape(batch, 1)
        rows_of_chunks = _rows_of_chunks(batch, len(group), live, picked)
        fed_rows = slice(None) if rows_of_chunks is None else rows_of_chunks  # each chunk's row
        for step in range(steps):
            context = sum(starts) + step * len(live)
            if kept is not None:
                past_slots = context
                width = int(positions.max()) + 1
                mask = kept.mask[:batch * width].reshape(batch, width)  # row r: ones in 0 … its position
                np.less_equal(self._columns[:width], positions, out=mask, casting="unsafe")
                t1 = time.perf_counter_ns()
                if self.has_mask:
                    kept.binding.bind_cpu_input("attention_mask", mask)
                self._record(input_ids, mask)
                self.session.run_with_iobinding(kept.binding)
                logits = kept.logits
            else:
                width = pasts[0].shape[2]
                past_slots = batch * width
                mask = (np.arange(width + 1) >= width - positions).astype(np.int64)
                feed = self._feed(input_ids, mask, positions, pasts, rows)
                t1 = time.perf_counter_ns()
                self._record(input_ids, mask)
                logits, *pasts = self.session.run(self.output_names, feed)
            t2 = time.perf_counter_ns()
            last = _decode_logits(logits, rows_of_chunks)
            if step == steps - 1:  # writes the blocks these runs filled (the rest wait in the group)
                if shared is not None:
                    shared.advance(group, order, steps)
                else:
                    dense.advance(group, order, pasts, steps)
            fed = pick(last)
            if step < steps - 1:
                input_ids[fed_rows, 0] = fed
                positions[fed_rows] += 1
            t3 = time.perf_counter_ns()
            self._count_decode(batch, len(live), gathered, regrouped, t2 - t1)
            self._count(batch, len(live), past_slots, context, t0, t1, t2, t3)
            t0, gathered, regrouped = t3, 0, 0  # the rows were placed once, before the first run

    def _flush_rows(self, arrays: Sequence[np.ndarray], row: int, offset: int, table: Sequence[int],
                    first: int, end: int) -> None:
        """Write positions [first, end) of a decode group's `row` (position p at column offset + p of each
        KV tensor's array) into the blocks `table` names: one copy per tensor and block of [heads, slots,
        head_dim] (a block's slots are contiguous on both sides)."""
        bs = self.block_size
        position = first
        while position < end:
            count = min(end, (position // bs + 1) * bs) - position
            slot = table[position // bs] * bs + position % bs
            column = offset + position
            for t, array in enumerate(arrays):
                self.cache[t, :, slot:slot + count] = array[row, :, column:column + count]
            position += count

    def _count_decode(self, batch: int, live: int, gathered: int, regrouped: int, run_ns: int) -> None:
        s = self.stats
        s.decode_rows += live
        s.free_rows += batch - live
        s.gathered_rows += gathered
        s.rebuilds += regrouped
        s.decode_run_ns += run_ns

    def _count(self, batch: int, tokens: int, past_slots: int, context: int,
               t0: int, t1: int, t2: int, t3: int) -> None:
        s = self.stats
        s.runs += 1
        s.tokens += tokens
        s.past_slots += past_slots
        s.padded_slots += past_slots - context
        s.gather_ns += t1 - t0
        s.run_ns += t2 - t1
        s.scatter_ns += t3 - t2


def _lora_shape(inputs: dict, layers: int, where: str) -> LoraShape | None:
    """The adapter inputs' shape (`lora_a.{i}` [batch, hidden, r], `lora_b.{i}` [batch, r, hidden] for
    every layer), or None when the model has none."""
    if "lora_a.0" not in inputs:
        return None
    _, hidden, rank = inputs["lora_a.0"].shape
    for i in range(layers):
        a, b = inputs.get(f"lora_a.{i}"), inputs.get(f"lora_b.{i}")
        if a is None or b is None or list(a.shape[1:]) != [hidden, rank] \
                or list(b.shape[1:]) != [rank, hidden]:
            raise invalid(f"{where}: LoRA inputs need lora_a.{{i}} [batch, hidden, r] and lora_b.{{i}} "
                          f"[batch, r, hidden] with fixed hidden and r for each of the {layers} layers")
    if not (isinstance(hidden, int) and isinstance(rank, int)):
        raise invalid(f"{where}: lora_a.0 must have fixed hidden and rank dims, got "
                      f"{inputs['lora_a.0'].shape}")
    return LoraShape(layers, hidden, rank)


def _decode_rows(group: Sequence[ScheduledChunk], order: Sequence[int],
                 ) -> tuple[list[int], list[int], list[int], list[int]]:
    """A decode run's rows from a decode group's order (-1: a free row): each row's start and token (0 and
    0 for a free row), the live rows, and each live row's chunk. Plain lists, one pass: at tens of rows
    numpy's per-call cost is what adds up."""
    batch = len(order)
    starts, token_ids = [0] * batch, [0] * batch
    live: list[int] = []
    for row, index in enumerate(order):
        if index >= 0:
            chunk = group[index]
            starts[row], token_ids[row] = chunk.start, chunk.token_ids[0]
            live.append(row)
    return starts, token_ids, live, [order[row] for row in live]


def _rows_of_chunks(batch: int, chunks: int, live: list[int], picked: list[int]) -> np.ndarray | None:
    """Each chunk's row in a decode run, or None when row i is chunk i for every row (no free rows, in
    order): what `_decode_logits` takes, worked out once for the runs of a multi-step decode."""
    if len(live) == batch and picked == list(range(chunks)):
        return None
    rows = np.empty(chunks, np.int64)
    rows[picked] = live
    return rows


def _decode_logits(logits: np.ndarray, rows: np.ndarray | None) -> np.ndarray:
    """The decode run's logits [chunks, vocab] in chunk order (`rows`: `_rows_of_chunks`)."""
    return logits[:, 0] if rows is None else logits[rows, 0]


def _fresh_together(chunks: Sequence[ScheduledChunk], group: list[int]) -> list[list[int]]:
    """A prefill group as a shared-KV model can run it: the chunks starting at slot 0 together, each chunk
    with cached context alone (its CPU kernel takes a batch of several new tokens over a past only at batch
    size 1)."""
    fresh = [i for i in group if chunks[i].start == 0]
    return ([fresh] if fresh else []) + [[i] for i in group if chunks[i].start]


def prefill_groups(chunks: Sequence[ScheduledChunk], indices: Sequence[int],
                   max_waste: float = 1.5) -> list[list[int]]:
    """Prefill chunks batched by similar length: sorted by (length, start), a chunk joins the group before
    it while the group's padded work (rows × longest chunk × (longest start + longest chunk), what dense
    tensors compute) stays within `max_waste` × its real work; one session run per group."""
    groups: list[list[int]] = []
    real = 0
    for i in sorted(indices, key=lambda i: (len(chunks[i].token_ids), chunks[i].start)):
        n, start = len(chunks[i].token_ids), chunks[i].start
        if groups:
            group = groups[-1]
            width = max(n, *(len(chunks[j].token_ids) for j in group))
            past = max(start, *(chunks[j].start for j in group))
            if (len(group) + 1) * width * (past + width) <= max_waste * (real + n * (start + n)):
                group.append(i)
                real += n * (start + n)
                continue
        groups.append([i])
        real = n * (start + n)
    return groups
