"""Reading a Hugging Face folder's files into a generative config's parameters (hf_folder.py), and what a
folder adds to each request (request_defaults.py): pure reads of small JSON files in a temporary folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine.errors import EngineError
from engine.generate.core.request import SamplingParams
from engine.generate.core.tokenizer import ByteTokenizer
from engine.generate.serving.hf_folder import GENAI, OPTIMUM, declare_export, find_export
from engine.generate.serving.request_defaults import RequestDefaults
from engine.proto import model_config_pb2 as pb

LLAMA_CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "max_position_embeddings": 8192,
                "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
                "bos_token_id": 128000, "eos_token_id": 128001}


def write(folder: Path, files: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, doc in files.items():
        (folder / name).write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return folder


def declared(folder: Path, config: str = "") -> dict[str, str]:
    msg = pb.ModelConfig()
    if config:
        from google.protobuf import text_format
        text_format.Parse(config, msg)
    assert declare_export(msg, folder) is not None
    assert msg.backend == "onnxruntime" or msg.platform
    return {k: v.string_value for k, v in msg.parameters.items()}


GPT2 = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}


def test_an_optimum_export_is_found_at_the_top_level_or_in_1(tmp_path: Path):
    top = write(tmp_path / "top", {"model.onnx": "", "config.json": GPT2})
    found = find_export(top)
    assert found is not None and (found.form, found.files, found.top_level) == (OPTIMUM, top, True)
    nested = write(tmp_path / "nested" / "1", {"model.onnx": "", "config.json": GPT2})
    found = find_export(nested.parent)
    assert found is not None and (found.files, found.top_level) == (nested, False)
    assert find_export(write(tmp_path / "no_model", {"config.json": GPT2})) is None
    assert find_export(write(tmp_path / "no_config", {"model.onnx": ""})) is None


def test_only_a_model_that_generates_text_is_an_export(tmp_path: Path):
    bert = {"model_type": "bert", "architectures": ["BertForSequenceClassification"]}
    assert find_export(write(tmp_path / "classifier", {"model.onnx": "", "config.json": bert})) is None
    other = {"model.onnx": "", "config.json": {"a": 1}}
    assert find_export(write(tmp_path / "not_transformers", other)) is None
    # no architectures, but the generation_config.json every generating model saves
    assert find_export(write(tmp_path / "generates", {"model.onnx": "", "config.json": {"model_type": "x"},
                                                      "generation_config.json": {}})) is not None


def test_a_genai_export_names_its_model_file(tmp_path: Path):
    folder = write(tmp_path / "g", {"genai_config.json": {"model": {"decoder": {"filename": "decoder.onnx"}}},
                                    "decoder.onnx": ""})
    found = find_export(folder)
    assert found is not None and found.form == GENAI
    msg = pb.ModelConfig()
    declare_export(msg, folder)
    assert msg.default_model_filename == "decoder.onnx"
    assert find_export(write(tmp_path / "missing", {"genai_config.json": {}})) is None  # no model.onnx


def test_a_llama_folder_gives_context_gqa_layout_eos_list_and_sampling_defaults(tmp_path: Path):
    folder = write(tmp_path / "llama", {
        "model.onnx": "", "config.json": LLAMA_CONFIG, "tokenizer.json": "{}",
        "generation_config.json": {"bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
                                   "do_sample": True, "temperature": 0.6, "top_p": 0.9},
        "tokenizer_config.json": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
                                  "add_bos_token": True, "chat_template": "{{ messages }}"}})
    params = declared(folder)
    assert params["max_model_len"] == "8192" and params["source.max_model_len"] == \
        "config.json max_position_embeddings"
    assert (params["kv_num_heads"], params["kv_head_dim"]) == ("8", "128")
    assert params["source.kv_head_dim"] == "config.json hidden_size / num_attention_heads"
    assert params["eos_token_ids"] == "128001,128008,128009" and params["bos_token_id"] == "128000"
    assert (params["bos_token"], params["eos_token"]) == ("<|begin_of_text|>", "<|eot_id|>")
    assert (params["default_temperature"], params["default_top_p"]) == ("0.6", "0.9")
    assert "default_top_k" not in params and "chat_template" not in params
    assert params["tokenizer"] == "tokenizer.json" and params["model_type"] == "llama"


def test_the_least_context_key_wins_and_the_eos_falls_back_to_config_json(tmp_path: Path):
    folder = write(tmp_path / "f", {"model.onnx": "", "config.json": {
        **GPT2, "n_positions": 1024, "max_position_embeddings": 2048, "eos_token_id": 50256, "head_dim": 64,
        "num_attention_heads": 12}})
    params = declared(folder)
    assert (params["max_model_len"], params["source.max_model_len"]) == ("1024", "config.json n_positions")
    assert (params["eos_token_ids"], params["source.eos_token_ids"]) == ("50256", "config.json eos_token_id")
    assert params["kv_head_dim"] == "64" and params["kv_num_heads"] == "12"
    assert "tokenizer" not in params  # no tokenizer.json: the byte tokenizer, as any config's default


def test_the_config_overrides_and_says_what_the_folder_had(tmp_path: Path):
    folder = write(tmp_path / "f", {"model.onnx": "", "config.json": LLAMA_CONFIG})
    params = declared(folder, 'parameters { key: "max_model_len" value { string_value: "4096" } }')
    assert params["max_model_len"] == "4096"
    assert params["source.max_model_len"] == "config (folder: 8192 from config.json max_position_embeddings)"


def test_a_config_for_another_backend_is_left_alone(tmp_path: Path):
    folder = write(tmp_path / "f", {"model.onnx": "", "config.json": LLAMA_CONFIG})
    msg = pb.ModelConfig(backend="python")
    assert declare_export(msg, folder) is None and not msg.parameters


def test_a_file_that_is_not_json_is_refused_by_name(tmp_path: Path):
    folder = write(tmp_path / "broken", {"model.onnx": "", "config.json": "{"})  # read to recognise it
    with pytest.raises(EngineError, match="broken/config.json: cannot be read as JSON"):
        declare_export(pb.ModelConfig(), folder)


def test_the_genai_config_gives_head_size_share_buffer_and_context(tmp_path: Path):
    folder = write(tmp_path / "g", {"model.onnx": "", "genai_config.json": {
        "model": {"context_length": 4096, "eos_token_id": [2, 32000], "bos_token_id": 1,
                  "decoder": {"head_size": 96, "num_key_value_heads": 32, "num_attention_heads": 32}},
        "search": {"past_present_share_buffer": True, "temperature": 0.6, "top_k": 50, "top_p": 1.0}}})
    params = declared(folder)
    # no generation_config.json: search's sampling values, but transformers' defaults the builder writes out
    assert params["default_temperature"] == "0.6" and "default_top_k" not in params
    assert "default_top_p" not in params
    assert (params["max_model_len"], params["kv_head_dim"], params["kv_num_heads"]) == ("4096", "96", "32")
    assert params["past_present_share_buffer"] == "true" and params["eos_token_ids"] == "2,32000"
    assert params["source.eos_token_ids"] == "genai_config.json model.eos_token_id"


def test_request_defaults_add_the_other_eos_ids_unless_ignore_eos():
    defaults = RequestDefaults.of({"eos_token_ids": "257,40,41"}, ByteTokenizer(), "model 'm'")
    assert defaults.extra_eos_ids == {40, 41}  # the tokenizer's own EOS (257) stops already
    assert defaults.apply(SamplingParams(stop_token_ids=frozenset({7}))).stop_token_ids == {7, 40, 41}
    assert defaults.apply(SamplingParams(ignore_eos=True)).stop_token_ids == frozenset()


def test_sampling_defaults_fill_only_the_fields_left_out():
    defaults = RequestDefaults.of({"default_temperature": "0.6", "default_top_k": "-1",
                                   "default_repetition_penalty": "1.05"}, ByteTokenizer(), "model 'm'")
    params = defaults.apply(SamplingParams(temperature=1.0, top_k=5), {"temperature", "repetition_penalty"})
    assert (params.temperature, params.top_k, params.repetition_penalty) == (0.6, 5, 1.05)
    assert defaults.apply(SamplingParams(), {"top_k"}).top_k == 0  # -1: every token


@pytest.mark.parametrize("params, message", [
    ({"default_temperature": "hot"}, "default_temperature must be a number"),
    ({"default_top_k": "2.5"}, "default_top_k must be an integer"),
    ({"default_top_p": "0"}, "top_p must be in"),
    ({"eos_token_ids": "1,x"}, "eos_token_ids must be token ids"),
])
def test_a_default_that_cannot_be_used_is_refused_at_load(params: dict[str, str], message: str):
    with pytest.raises(EngineError, match=message):
        RequestDefaults.of(params, ByteTokenizer(), "model 'm'")
