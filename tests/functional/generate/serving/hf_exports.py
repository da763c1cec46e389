"""Hugging Face model folders in the two exporters' forms, built here without torch or downloads: the
example tiny decoder's graph (perf/hubserve_models/tiny_decoder.py) with the JSON files Optimum and
onnxruntime-genai's model builder write beside it, and a `tokenizer.json` written by the `tokenizers` package.

The tokenizer is byte-level BPE with no merges whose token id is the byte's value (GPT-2's byte → character
map), `<s>` 256 and `</s>` 257 special and BOS written first by its post-processor, as a Llama tokenizer.json
does: its ids are exactly the byte tokenizer's (engine/generate/core/tokenizer.py), so a folder's greedy
answers can be checked against the example model's engine in the test's own process (`reference_greedy`).

Until the real-exporter fixtures (tests/fixtures/llm/) are on main, these are the folders the HF suites serve.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import onnx
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, processors

from hubserve_models.tiny_decoder import TinyDecoderShape, tiny_decoder_model

BOS, EOS = 256, 257
CONTEXT = 128  # config.json n_positions of the Optimum folder (the graph itself takes 512 positions)


def byte_chars() -> dict[int, str]:
    """GPT-2's byte → printable character map, as byte-level BPE vocabularies spell bytes."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def write_tokenizer(folder: Path) -> None:
    """tokenizer.json: one token per byte (id = the byte), `<s>` and `</s>`, BOS added first."""
    vocab = {c: b for b, c in byte_chars().items()}
    tok = tokenizers.Tokenizer(models.BPE(vocab, [], fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([tokenizers.AddedToken("<s>", special=True),
                            tokenizers.AddedToken("</s>", special=True)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", BOS)])
    tok.save(str(folder / "tokenizer.json"))
    write_json(folder / "tokenizer_config.json", {
        "bos_token": "<s>", "eos_token": {"content": "</s>", "special": True}, "add_bos_token": True,
        "tokenizer_class": "PreTrainedTokenizerFast"})


def write_json(path: Path, doc: dict[str, Any]) -> None:
    path.write_text(json.dumps(doc, indent=2))


def optimum_folder(folder: Path, generation: dict[str, Any] | None = None) -> Path:
    """An Optimum text-generation-with-past export's files at `folder`'s top level (GPT-2's config.json)."""
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(tiny_decoder_model(), str(folder / "model.onnx"))
    shape = TinyDecoderShape()
    write_json(folder / "config.json", {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_positions": CONTEXT,
        "n_embd": shape.hidden, "n_head": shape.heads, "n_layer": shape.layers,
        "vocab_size": shape.vocab_size,
        "bos_token_id": BOS, "eos_token_id": EOS})
    write_json(folder / "generation_config.json",
               {"bos_token_id": BOS, "eos_token_id": EOS, **(generation or {})})
    write_tokenizer(folder)
    return folder


def genai_folder(folder: Path, context: int = 256) -> Path:
    """An onnxruntime-genai builder export's files at `folder`: the GroupQueryAttention form of the graph
    (past and present sharing one buffer) whose past leaves its head size symbolic, as the builder writes
    it, with genai_config.json saying the head size and the shared buffer."""
    folder.mkdir(parents=True, exist_ok=True)
    shape = TinyDecoderShape(shared_kv=True)
    model = tiny_decoder_model(shape)
    for value in [*model.graph.input, *model.graph.output]:
        if value.name.startswith(("past_key_values.", "present.")):
            dim = value.type.tensor_type.shape.dim[3]
            dim.ClearField("dim_value")
            dim.dim_param = "head_size"
    onnx.save(model, str(folder / "model.onnx"))
    write_json(folder / "genai_config.json", {
        "model": {"bos_token_id": BOS, "eos_token_id": [EOS], "pad_token_id": EOS, "context_length": context,
                  "type": "llama", "vocab_size": shape.vocab_size,
                  "decoder": {"filename": "model.onnx", "head_size": shape.head_dim,
                              "hidden_size": shape.hidden, "num_attention_heads": shape.heads,
                              "num_key_value_heads": shape.heads, "num_hidden_layers": shape.layers,
                              "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                                         "past_key_names": "past_key_values.%d.key",
                                         "past_value_names": "past_key_values.%d.value"},
                              "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                                          "present_value_names": "present.%d.value"}}},
        "search": {"do_sample": False, "max_length": context, "past_present_share_buffer": True,
                   "num_beams": 1, "top_k": 1, "top_p": 1.0, "temperature": 1.0}})
    write_tokenizer(folder)
    return folder
