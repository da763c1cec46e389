"""The committed LLM fixtures (tests/fixtures/llm, built by tools/llm_fixtures/make_fixtures.py) agree with
themselves, without torch or transformers: every model folder has the files its exporter writes, each
expected/<name>.json is well formed and names its folder's EOS list, the recorded prompt ids are what the
committed tokenizer.json encodes, the recorded texts are what it decodes, the chat prompts are what the
committed template renders (Qwen2's tool chats with their tools), and onnxruntime on each Optimum export
greedily gives the recorded tokens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import tokenizers

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "llm"
TOKENIZER_FILES = {"tokenizer.json", "tokenizer_config.json"}
OPTIMUM_FILES = {"model.onnx", "config.json", "generation_config.json"} | TOKENIZER_FILES
GENAI_FILES = {"model.onnx", "genai_config.json"} | TOKENIZER_FILES
NAMES = sorted(p.stem for p in (FIXTURES / "expected").glob("*.json"))


def expected(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / "expected" / f"{name}.json").read_text(encoding="utf-8"))


def folder(name: str) -> Path:
    return FIXTURES / "models" / name


def generated(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in data["prompts"] + data["chats"] + data.get("tool_chats", []) if "output_ids" in c]


def chat_template(name: str) -> str | None:
    """The template as transformers finds it: chat_template.jinja, else tokenizer_config.json's."""
    jinja_file = folder(name) / "chat_template.jinja"
    config = json.loads((folder(name) / "tokenizer_config.json").read_text(encoding="utf-8"))
    if jinja_file.exists():
        assert "chat_template" not in config, f"{name}: a template in both places"
        return jinja_file.read_text(encoding="utf-8")
    return config.get("chat_template")


def test_the_families_are_all_there():
    assert NAMES == ["gpt2", "llama", "llama_genai", "llama_spm", "qwen2"]
    assert sorted(p.name for p in (FIXTURES / "models").iterdir()) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_each_folder_has_what_its_exporter_writes_and_no_external_data(name: str):
    files = {p.name for p in folder(name).iterdir()}
    assert (GENAI_FILES if name.endswith("_genai") else OPTIMUM_FILES) <= files
    assert not [f for f in files if f.endswith(".data")]
    assert sum(p.stat().st_size for p in folder(name).iterdir()) < 1_200_000


@pytest.mark.parametrize("name", NAMES)
def test_expected_is_well_formed_and_names_the_folders_eos_list(name: str):
    data = expected(name)
    greedy = data["greedy"]
    eos = greedy["eos_token_id"]
    if name.endswith("_genai"):
        genai = json.loads((folder(name) / "genai_config.json").read_text(encoding="utf-8"))
        assert genai["model"]["eos_token_id"] == eos
        assert data["onnxruntime_genai"]["all_match"] is True
    else:
        generation = json.loads((folder(name) / "generation_config.json").read_text(encoding="utf-8"))
        assert eos == (generation["eos_token_id"] if isinstance(generation["eos_token_id"], list)
                       else [generation["eos_token_id"]])
        assert greedy["repetition_penalty"] == generation.get("repetition_penalty", 1.0)
        assert data["onnxruntime_matches_torch"] is True
    assert data["min_top2_gap"] > 1e-3
    for case in generated(data):
        ids = case["output_ids"]
        assert 0 < len(ids) <= greedy["max_new_tokens"]
        if case["finish_reason"] == "stop":
            assert ids[-1] == case["stop_token_id"] and ids[-1] in eos
        else:
            assert case["finish_reason"] == "length" and len(ids) == greedy["max_new_tokens"]
            assert not set(ids) & set(eos)
        assert len(case["prompt_ids"]) + len(ids) <= data["context_length"]
    over = [c for c in data["prompts"] if c["name"] == "over_context"]
    assert len(over) == 1 and "output_ids" not in over[0]
    assert len(over[0]["prompt_ids"]) > data["context_length"]


@pytest.mark.parametrize("name", NAMES)
def test_prompt_ids_and_texts_are_what_the_committed_tokenizer_gives(name: str):
    data = expected(name)
    tok = tokenizers.Tokenizer.from_file(str(folder(name) / "tokenizer.json"))
    for case in data["prompts"]:
        assert tok.encode(case["prompt"]).ids == case["prompt_ids"], case["name"]
    for case in data["chats"] + data.get("tool_chats", []):
        if "prompt_ids" in case:  # the template writes the special tokens: encoded without adding more
            ids = tok.encode(case["prompt_text"], add_special_tokens=False).ids
            assert ids == case["prompt_ids"], case["name"]
    for case in generated(data):
        assert tok.decode(case["output_ids"], skip_special_tokens=True) == case["text_alone"]
        if case["text"] is not None:
            prompt_text = tok.decode(case["prompt_ids"], skip_special_tokens=True)
            full = tok.decode(case["prompt_ids"] + case["output_ids"], skip_special_tokens=True)
            assert full == prompt_text + case["text"], case["name"]


def test_the_sentencepiece_fixture_shows_the_leading_space_of_the_first_generated_word():
    shown = [c for c in generated(expected("llama_spm")) if c["text"] == " " + c["text_alone"]]
    assert shown, "no llama_spm case whose text, decoded alone, loses its leading space"


def test_eos_ids_only_generation_config_names_end_some_recorded_answers():
    llama = expected("llama")
    config_eos = json.loads((folder("llama") / "config.json").read_text(encoding="utf-8"))["eos_token_id"]
    stops = {c["stop_token_id"] for c in generated(llama) if c["finish_reason"] == "stop"}
    assert stops - {config_eos}, "no llama case ends on <|eot_id|>, the id only generation_config.json names"


def transformers_tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
                        separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """transformers' `tojson` filter (keys in their order, non-ASCII kept), not Jinja's own (sorted keys)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


@pytest.mark.parametrize("name", NAMES)
def test_chat_prompts_are_what_the_committed_template_renders(name: str):
    jinja2_sandbox = pytest.importorskip("jinja2.sandbox")
    template_text = chat_template(name)
    data = expected(name)
    if template_text is None:
        assert name == "gpt2" and data["chats"] == []
        return

    def raise_exception(message: str) -> None:
        raise ValueError(message)

    env = jinja2_sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    env.filters["tojson"] = transformers_tojson
    template = env.from_string(template_text)
    config = json.loads((folder(name) / "tokenizer_config.json").read_text(encoding="utf-8"))
    specials = {"bos_token": config.get("bos_token"), "eos_token": config.get("eos_token")}
    assert data["chats"]
    for case in data["chats"]:
        if "error" in case:
            with pytest.raises(ValueError, match="alternate"):
                template.render(messages=case["messages"], add_generation_prompt=True, **specials)
            continue
        rendered = template.render(messages=case["messages"], add_generation_prompt=True, **specials)
        assert rendered == case["prompt_text"], case["name"]
    for case in data.get("tool_chats", []):
        rendered = template.render(messages=case["messages"], tools=case["tools"], add_generation_prompt=True,
                                   **specials)
        assert rendered == case["prompt_text"], case["name"]


def test_the_qwen2_template_renders_tools_a_call_and_its_result():
    """The fixture with a tool-capable template (Qwen2.5's format), recorded with transformers' tools."""
    chats = {c["name"]: c for c in expected("qwen2")["tool_chats"]}
    assert set(chats) == {"tools_offered", "tool_result"}
    offered, result = chats["tools_offered"]["prompt_text"], chats["tool_result"]["prompt_text"]
    assert "<tools>\n" + json.dumps(chats["tools_offered"]["tools"][0]) + "\n</tools>" in offered
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in result
    assert "<|im_start|>user\n<tool_response>\n" in result


def greedy_onnx(model: Path, prompt_ids: list[int], steps: int, eos: list[int], penalty: float) -> list[int]:
    """Greedy decoding on an Optimum merged decoder with past: the whole prompt, then a token per step."""
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}
    past = {n: np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32) for n, i in inputs.items() if "past" in n}
    tokens, step_ids, out = list(prompt_ids), list(prompt_ids), []
    while len(out) < steps:
        feed = {
            "input_ids": np.array([step_ids], np.int64),
            "attention_mask": np.ones((1, len(tokens)), np.int64),
        }
        if "position_ids" in inputs:
            feed["position_ids"] = np.arange(len(tokens) - len(step_ids), len(tokens), dtype=np.int64)[None]
        names = [o.name for o in session.get_outputs()]
        result = dict(zip(names, session.run(names, {**feed, **past}), strict=True))
        logits = result["logits"][0, -1].copy()
        for seen in set(tokens):  # transformers' repetition penalty
            logits[seen] = logits[seen] * penalty if logits[seen] < 0 else logits[seen] / penalty
        token = int(np.argmax(logits))
        out.append(token)
        tokens.append(token)
        step_ids = [token]
        past = {n: result[n.replace("past_key_values", "present")] for n in past}
        if token in eos:
            break
    return out


@pytest.mark.parametrize("name", [n for n in NAMES if not n.endswith("_genai")])
def test_onnxruntime_on_each_optimum_export_gives_the_recorded_tokens(name: str):
    data = expected(name)
    greedy = data["greedy"]
    for case in generated(data):
        got = greedy_onnx(folder(name) / "model.onnx", case["prompt_ids"], greedy["max_new_tokens"],
                          greedy["eos_token_id"], greedy["repetition_penalty"])
        assert got == case["output_ids"], case["name"]
