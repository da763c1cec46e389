"""The model families of the fixtures: architecture, generation_config.json, chat template, prompts and chats.

Read by make_fixtures.py. Every value here is written as the family's real checkpoints ship it (shape of
the config, EOS lists, sampling defaults, the chat format); only the sizes are tiny. The chat templates are
written for this project in each family's format.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import fixture_tokenizers as ft
from transformers import GPT2Config, LlamaConfig, PretrainedConfig, PreTrainedTokenizerFast, Qwen2Config

# Llama-3: BOS first, one header per turn, content trimmed, every turn closed by <|eot_id|>.
LLAMA3_TEMPLATE = """{{- bos_token }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}
    {{- message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}"""

# Qwen2.5 ChatML with tools: a default system turn when the conversation has none; with `tools`, the system
# turn lists them (tojson, one a line) inside <tools></tools> and tells the model to answer with
# <tool_call>{"name": ..., "arguments": ...}</tool_call>; an assistant turn's tool_calls are written as such
# blocks (arguments through tojson), and `tool` messages, consecutive ones together, inside one user turn as
# <tool_response> blocks.
QWEN2_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' }}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
    {%- for tool in tools %}
        {{- '\\n' + tool | tojson }}
    {%- endfor %}
    {{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments ' }}
    {{- 'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n' }}
    {{- '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0]['role'] != 'system' %}
    {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message['role'] == 'system' and loop.first and tools %}
    {%- elif message['role'] == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' and message['tool_calls'] %}
        {{- '<|im_start|>assistant' }}
        {%- if message['content'] %}
            {{- '\\n' + message['content'] }}
        {%- endif %}
        {%- for tool_call in message['tool_calls'] %}
            {%- if tool_call['function'] is defined %}
                {%- set tool_call = tool_call['function'] %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' + tool_call['name'] + '", "arguments": ' }}
            {{- tool_call['arguments'] | tojson + '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}"""

# Llama-2 / Mistral [INST]: the system prompt folded into the first user turn, roles must alternate.
INST_TEMPLATE = """{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set system_message = '' %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message != '' %}
            {%- set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}
        {%- else %}
            {%- set content = message['content'] %}
        {%- endif %}
        {{- bos_token + '[INST] ' + content | trim + ' [/INST]' }}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] | trim + ' ' + eos_token }}
    {%- endif %}
{%- endfor %}"""

SHORT_PROMPTS: dict[str, str] = {
    "short": "Hello world",
    "sentence": "The quick brown fox jumps over the lazy dog.",
    "in_corpus": "Licensed under the Apache License, Version 2.0",
    "spaces": "  leading and trailing spaces  ",
    "trailing_space": "What is the capital of France? ",
    "non_ascii": "Grüße aus Köln — 東京 🚀 naïve café.",
}

CHATS: dict[str, list[dict[str, str]]] = {
    "user_only": [{"role": "user", "content": "Hello, who are you?"}],
    "system": [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Name a colour."},
    ],
    "multi_turn": [
        {"role": "system", "content": "Answer the question in one short sentence."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris is the capital of France."},
        {"role": "user", "content": "  Tell me a story about a dragon.  "},
    ],
    "not_alternating": [
        {"role": "user", "content": "Hello world!"},
        {"role": "user", "content": "How are you today?"},
    ],
}


# The tools of the tool chats, as an OpenAI request sends them. The one argument is an enum of one value, so
# a call the server's grammar forces is this call whatever the random model prefers, and the conversation
# after it is the recorded one.
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris"]}},
            "required": ["city"],
        },
    },
}

# Chats rendered with tools=[WEATHER_TOOL] (families whose template renders tools): the tools offered, then
# the whole loop: the assistant's call (arguments a dict, as transformers documents) and the tool's answer.
TOOL_CHATS: dict[str, list[dict[str, Any]]] = {
    "tools_offered": [{"role": "user", "content": "What is the weather in Paris?"}],
    "tool_result": [
        {"role": "user", "content": "What is the weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_0", "content": '{"temperature": 21, "sky": "clear"}'},
    ],
}

@dataclass(frozen=True, slots=True)
class Family:
    """One fixture model: how its tokenizer and model are built and what its folder says about generation."""

    name: str
    make_tokenizer: Callable[[list[str], int], PreTrainedTokenizerFast]
    tokenizer_vocab: int
    make_config: Callable[[PreTrainedTokenizerFast], PretrainedConfig]
    generation_config: Callable[[PreTrainedTokenizerFast], dict[str, Any]]
    context_length: int
    chat_template: str | None
    max_new_tokens: int = 20
    # The exporters save the template as chat_template.jinja (transformers >= 4.5x); many checkpoints carry it
    # in tokenizer_config.json instead. True: the folder is given that older form after the export.
    template_in_tokenizer_config: bool = False
    # True: the template renders tools; TOOL_CHATS are recorded too.
    renders_tools: bool = False
    seeds: tuple[int, ...] = field(default=tuple(range(40)))


def _ids(tok: PreTrainedTokenizerFast, *names: str) -> list[int]:
    return [int(tok.convert_tokens_to_ids(n)) for n in names]


def _gpt2_config(tok: PreTrainedTokenizerFast) -> PretrainedConfig:
    (eos,) = _ids(tok, "<|endoftext|>")
    return GPT2Config(
        vocab_size=len(tok),
        n_positions=128,
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_inner=128,
        initializer_range=0.5,
        bos_token_id=eos,
        eos_token_id=eos,
    )


def _llama3_config(tok: PreTrainedTokenizerFast) -> PretrainedConfig:
    bos, end_of_text = _ids(tok, "<|begin_of_text|>", "<|end_of_text|>")
    # As Meta-Llama-3-8B-Instruct first shipped: config.json and the tokenizer name <|end_of_text|> only;
    # <|eot_id|>, which ends an assistant turn, is in generation_config.json's list alone.
    return LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rope_theta=500000.0,
        initializer_range=0.5,
        tie_word_embeddings=False,
        bos_token_id=bos,
        eos_token_id=end_of_text,
    )


def _spm_config(tok: PreTrainedTokenizerFast) -> PretrainedConfig:
    return LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
        initializer_range=0.5,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )


def _qwen2_config(tok: PreTrainedTokenizerFast) -> PretrainedConfig:
    endoftext, im_end = _ids(tok, "<|endoftext|>", "<|im_end|>")
    return Qwen2Config(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,  # room for the tools' system turn and a tool turn
        max_window_layers=2,
        initializer_range=0.5,
        tie_word_embeddings=True,
        bos_token_id=endoftext,
        eos_token_id=im_end,
    )


def _gpt2_generation(tok: PreTrainedTokenizerFast) -> dict[str, Any]:
    (eos,) = _ids(tok, "<|endoftext|>")
    return {"bos_token_id": eos, "eos_token_id": eos}


def _llama3_generation(tok: PreTrainedTokenizerFast) -> dict[str, Any]:
    bos, end_of_text, eot = _ids(tok, "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>")
    return {
        "bos_token_id": bos,
        "do_sample": True,
        "eos_token_id": [end_of_text, eot],
        "temperature": 0.6,
        "top_p": 0.9,
    }


def _spm_generation(tok: PreTrainedTokenizerFast) -> dict[str, Any]:
    return {"bos_token_id": 1, "eos_token_id": 2}


def _qwen2_generation(tok: PreTrainedTokenizerFast) -> dict[str, Any]:
    endoftext, im_end = _ids(tok, "<|endoftext|>", "<|im_end|>")
    return {
        "bos_token_id": endoftext,
        "pad_token_id": endoftext,
        "do_sample": True,
        "eos_token_id": [im_end, endoftext],
        "repetition_penalty": 1.05,
        "temperature": 0.7,
        "top_p": 0.8,
        "top_k": 20,
    }


FAMILIES: tuple[Family, ...] = (
    Family("gpt2", ft.gpt2_tokenizer, 800, _gpt2_config, _gpt2_generation, 128, None, max_new_tokens=16),
    Family("llama", ft.llama3_tokenizer, 800, _llama3_config, _llama3_generation, 256, LLAMA3_TEMPLATE),
    Family("llama_spm", ft.spm_tokenizer, 800, _spm_config, _spm_generation, 256, INST_TEMPLATE),
    Family(
        "qwen2",
        ft.qwen2_tokenizer,
        800,
        _qwen2_config,
        _qwen2_generation,
        1024,
        QWEN2_TEMPLATE,
        template_in_tokenizer_config=True,
        renders_tools=True,
    ),
)
