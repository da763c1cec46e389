"""What transformers generates for each prompt and chat, and the checks that the exported models agree.

Called by make_fixtures.py: `cases()` lists the prompts and chats of a family, `torch_greedy()` runs
transformers' greedy generate() on them (the recorded truth), `onnx_greedy()` and `genai_greedy()` run the
exported folders and return their tokens for the comparison.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fixture_families as ff
import numpy as np
import torch
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerFast

MIN_TOP2_GAP = 1e-2  # the least top-1/top-2 logit gap accepted at any recorded greedy step


@dataclass(slots=True)
class Case:
    """One prompt or chat; `prompt_ids` is None where the chat template refuses the conversation."""

    kind: str  # "prompt", "chat" or "tool_chat"
    name: str
    prompt_ids: list[int] | None
    record: dict[str, Any]
    generate: bool = True


def _corpus_prefix(tok: PreTrainedTokenizerFast, words: list[str], limit: int, over: bool) -> str:
    """The longest run of corpus words encoding to at most `limit` tokens (over: the shortest above it)."""
    text = ""
    for word in words:
        candidate = f"{text} {word}" if text else word
        n = len(tok(candidate)["input_ids"])
        if over and n > limit:
            return candidate
        if not over and n > limit:
            return text
        text = candidate
    raise ValueError("corpus too short for the long prompt")


def cases(family: ff.Family, tok: PreTrainedTokenizerFast, corpus: list[str]) -> list[Case]:
    """The prompts (short ones, a long one under the context, one over it) and, with a template, the chats."""
    words = " ".join(corpus).split()
    prompts = dict(ff.SHORT_PROMPTS)
    prompts["long"] = _corpus_prefix(
        tok, words, family.context_length - family.max_new_tokens - 4, over=False
    )
    out: list[Case] = []
    for name, text in prompts.items():
        ids = [int(i) for i in tok(text)["input_ids"]]
        out.append(Case("prompt", name, ids, {"name": name, "prompt": text, "prompt_ids": ids}))
    over_text = _corpus_prefix(tok, words, family.context_length + 8, over=True)
    over_ids = [int(i) for i in tok(over_text)["input_ids"]]
    error = f"prompt of {len(over_ids)} tokens exceeds the context length {family.context_length}"
    out.append(
        Case(
            "prompt",
            "over_context",
            over_ids,
            {
                "name": "over_context",
                "prompt": over_text,
                "prompt_ids": over_ids,
                "error": error,
            },
            generate=False,
        )
    )
    if family.chat_template is None:
        return out
    for name, messages in ff.CHATS.items():
        record: dict[str, Any] = {"name": name, "messages": messages}
        try:
            text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except Exception as exc:  # the template's raise_exception: recorded, the server must refuse it too
            record["error"] = str(exc)
            out.append(Case("chat", name, None, record, generate=False))
            continue
        ids = [int(i) for i in tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)]
        record["prompt_text"] = text
        record["prompt_ids"] = ids
        out.append(Case("chat", name, ids, record))
    if family.renders_tools:
        out += _tool_chats(tok)
    return out


def _tool_chats(tok: PreTrainedTokenizerFast) -> list[Case]:
    """TOOL_CHATS rendered by apply_chat_template(tools=...): transformers' text and ids for each."""
    tools = [ff.WEATHER_TOOL]
    out: list[Case] = []
    for name, messages in ff.TOOL_CHATS.items():
        text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
        ids = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True)
        record: dict[str, Any] = {"name": name, "tools": tools, "messages": messages, "prompt_text": text,
                                  "prompt_ids": [int(i) for i in ids]}
        out.append(Case("tool_chat", name, record["prompt_ids"], record))
    return out


def greedy_config(family: ff.Family, generation: dict[str, Any]) -> GenerationConfig:
    """The folder's generation_config with sampling off: what a temperature-0 request must reproduce."""
    config = GenerationConfig(**generation)
    config.do_sample = False
    config.temperature = None
    config.top_p = None
    config.top_k = None
    config.max_new_tokens = family.max_new_tokens
    if config.pad_token_id is None:
        eos = config.eos_token_id
        config.pad_token_id = eos[0] if isinstance(eos, list) else eos
    return config


def eos_list(generation: dict[str, Any]) -> list[int]:
    eos = generation["eos_token_id"]
    return [int(e) for e in (eos if isinstance(eos, list) else [eos])]


def torch_greedy(
    model: PreTrainedModel,
    tok: PreTrainedTokenizerFast,
    family: ff.Family,
    generation: dict[str, Any],
    all_cases: list[Case],
) -> float:
    """Fill each case's record with generate()'s tokens and text; return the least top-1/top-2 gap seen."""
    config = greedy_config(family, generation)
    eos = eos_list(generation)
    least_gap = float("inf")
    for case in all_cases:
        if not case.generate or case.prompt_ids is None:
            continue
        input_ids = torch.tensor([case.prompt_ids])
        with torch.no_grad():
            result = model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                generation_config=config,
                return_dict_in_generate=True,
                output_scores=True,
            )
        output_ids = [int(i) for i in result.sequences[0][len(case.prompt_ids) :]]
        gaps = [float(top[0] - top[1]) for top in (s[0].topk(2).values for s in result.scores)]
        case_gap = min(gaps)
        least_gap = min(least_gap, case_gap)
        stopped = bool(output_ids) and output_ids[-1] in eos
        prompt_text = tok.decode(case.prompt_ids, skip_special_tokens=True)
        full_text = tok.decode(case.prompt_ids + output_ids, skip_special_tokens=True)
        case.record.update(
            {
                "output_ids": output_ids,
                "finish_reason": "stop" if stopped else "length",
                "stop_token_id": output_ids[-1] if stopped else None,
                "text": full_text[len(prompt_text) :] if full_text.startswith(prompt_text) else None,
                "text_alone": tok.decode(output_ids, skip_special_tokens=True),
                "min_top2_gap": float(f"{case_gap:.3g}"),
            }
        )
    return least_gap


def _repetition_penalty(logits: np.ndarray, seen: list[int], penalty: float) -> np.ndarray:
    """transformers' RepetitionPenaltyLogitsProcessor on one row."""
    if penalty == 1.0:
        return logits
    out = logits.copy()
    for token in set(seen):
        out[token] = out[token] * penalty if out[token] < 0 else out[token] / penalty
    return out


def onnx_greedy(
    model_path: Path, prompt_ids: list[int], max_new_tokens: int, eos: list[int], repetition_penalty: float
) -> list[int]:
    """Greedy decode with onnxruntime on an Optimum merged decoder (with past), one token per step."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    past: dict[str, np.ndarray] = {}
    for spec in session.get_inputs():
        if spec.name.startswith("past_key_values"):
            shape = [1, spec.shape[1], 0, spec.shape[3]]
            past[spec.name] = np.zeros(shape, dtype=np.float32)
    outputs = [o.name for o in session.get_outputs()]
    tokens = list(prompt_ids)
    step_ids = list(prompt_ids)
    generated: list[int] = []
    while len(generated) < max_new_tokens:
        start = len(tokens) - len(step_ids)
        feed: dict[str, np.ndarray] = {
            "input_ids": np.array([step_ids], dtype=np.int64),
            "attention_mask": np.ones((1, len(tokens)), dtype=np.int64),
        }
        if "position_ids" in names:
            feed["position_ids"] = np.arange(start, len(tokens), dtype=np.int64)[None, :]
        feed.update(past)
        result = dict(zip(outputs, session.run(outputs, feed), strict=True))
        logits = _repetition_penalty(result["logits"][0, -1], tokens, repetition_penalty)
        token = int(np.argmax(logits))
        generated.append(token)
        tokens.append(token)
        step_ids = [token]
        past = {name: result[name.replace("past_key_values", "present")] for name in past}
        if token in eos:
            break
    return generated


def genai_greedy(folder: Path, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Greedy decode with onnxruntime-genai's own Generator on a builder export."""
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(prompt_ids) + max_new_tokens, batch_size=1)
    generator = og.Generator(model, params)
    generator.append_tokens([prompt_ids])
    while not generator.is_done():
        generator.generate_next_token()
    return [int(t) for t in generator.get_sequence(0)][len(prompt_ids) :]
