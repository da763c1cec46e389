"""A Hugging Face model folder served as it is (engine/generate/serving/hf_folder.py): no config.pbtxt, or one
that only overrides, in the repository's poll mode, answered through the `openai` package and Triton's
generate endpoint.

The folders (hf_exports.py) hold the example decoder's graph with a byte-level tokenizer.json whose ids are
the byte tokenizer's, so every greedy answer is checked token for token against the example tiny_decoder's
engine in this process, built from its own config.pbtxt (nothing read from the Hugging Face files):

    gpt2ish     Optimum's form at the folder's top level; config.json n_positions 128 (the graph takes 512);
                generation_config.json eos_token_id [257, STOP]: STOP is the fifth token greedy decoding
                writes after PROMPT
    sampling    the same, generation_config.json {repetition_penalty 1.3, top_k 1, temperature 0.7}
                (Qwen's kind of defaults; top_k 1 makes them greedy, so the answer is known)
    genai       onnxruntime-genai's form in 1/: the shared-buffer graph with a symbolic head size, which
                genai_config.json states
    overridden  gpt2ish's files with a config.pbtxt that says only max_model_len 64
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import shutil
from pathlib import Path
from typing import Any

import openai
import pytest
from hf_exports import CONTEXT, EOS, genai_folder, optimum_folder

from conftest import EXAMPLES, RunningServer, openai_client, start_server, wait_until
from engine.errors import EngineError
from engine.generate.core.request import SamplingParams
from engine.generate.serving.model_folder import load_engine
from hubserve_models import examples

PROMPT = "Hello"
PROMPTS = ["Hello", "The answer is", "A longer prompt, with punctuation; and more words."]
STOP_AT = 4  # STOP is the token greedy decoding writes at this index after PROMPT


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory):
    """The example tiny_decoder's engine (its config.pbtxt, the byte tokenizer): (token ids, text) of a
    run."""
    root = tmp_path_factory.mktemp("hf_reference")
    (root / "tiny_decoder").mkdir()
    shutil.copy(EXAMPLES / "tiny_decoder" / "config.pbtxt", root / "tiny_decoder" / "config.pbtxt")
    examples.build_repository(root, ["tiny_decoder"])
    engine = load_engine(root / "tiny_decoder")

    def run(prompt: str, max_tokens: int, **params: Any) -> tuple[list[int], str]:
        engine.add_request("ref", prompt, SamplingParams(max_tokens=max_tokens, **params))
        out = engine.run_to_completion()["ref"]
        return list(out.output_token_ids), out.output_text

    return run


@pytest.fixture(scope="module")
def stop_token(reference) -> int:
    ids, _ = reference(PROMPT, STOP_AT + 1, ignore_eos=True)
    assert ids[STOP_AT] not in ids[:STOP_AT] and ids[STOP_AT] != EOS  # so it stops there, not before
    return ids[STOP_AT]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, stop_token: int):
    root = tmp_path_factory.mktemp("hf_folder")
    repo = root / "repo"
    optimum_folder(repo / "gpt2ish", {"eos_token_id": [EOS, stop_token]})
    optimum_folder(repo / "sampling", {"repetition_penalty": 1.3, "top_k": 1, "temperature": 0.7})
    genai_folder(repo / "genai" / "1")
    optimum_folder(repo / "overridden")
    (repo / "overridden" / "config.pbtxt").write_text(
        'parameters { key: "max_model_len" value { string_value: "64" } }\n')
    running = start_server(repo, root / "server.log", "--model-control-mode", "poll",
                           "--repository-quiet-secs", "0.2", "--repository-poll-secs", "0.5")
    running.repo = repo  # type: ignore[attr-defined]
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai_client(server)


def model_config(server: RunningServer, name: str) -> dict[str, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    conn.request("GET", f"/v2/models/{name}/config")
    resp = conn.getresponse()
    body = json.loads(resp.read())
    conn.close()
    assert resp.status == 200, body
    return {k: v["string_value"] for k, v in body["parameters"].items()}


def greedy(client: openai.OpenAI, model: str, prompt: str, max_tokens: int, **extra: Any) -> Any:
    return client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                     extra_body=extra or None)


def streamed_text(client: openai.OpenAI, model: str, prompt: str, max_tokens: int) -> tuple[str, Any]:
    stream = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                       stream=True, stream_options={"include_usage": True})
    pieces, usage = [], None
    for chunk in stream:
        pieces.extend(c.text for c in chunk.choices)
        usage = chunk.usage or usage
    return "".join(pieces), usage


def test_folders_without_a_config_serve(client: openai.OpenAI):
    assert {m.id for m in client.models.list().data} >= {"gpt2ish", "sampling", "genai", "overridden"}


@pytest.mark.parametrize("model", ["gpt2ish", "genai"])
def test_greedy_answers_match_the_example_model_alone_batched_and_streamed(client: openai.OpenAI, reference,
                                                                          model: str):
    want = {p: reference(p, 24, ignore_eos=True) for p in PROMPTS}
    for prompt in PROMPTS:  # alone; prompt tokens: BOS (tokenizer.json's post-processor) + the UTF-8 bytes
        out = greedy(client, model, prompt, 24, ignore_eos=True)
        assert out.choices[0].text == want[prompt][1]
        assert out.usage.prompt_tokens == 1 + len(prompt.encode())
        assert out.usage.completion_tokens == len(want[prompt][0])
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS) * 2) as pool:  # batched in the engine
        texts = list(pool.map(lambda p: greedy(client, model, p, 24, ignore_eos=True).choices[0].text,
                              PROMPTS * 2))
    assert texts == [want[p][1] for p in PROMPTS * 2]
    text, usage = streamed_text(client, model, PROMPTS[1], 24)
    assert text == reference(PROMPTS[1], 24)[1] and usage.prompt_tokens == 1 + len(PROMPTS[1])


def test_every_end_of_sequence_id_of_generation_config_stops(client: openai.OpenAI, reference,
                                                             stop_token: int):
    ids, text = reference(PROMPT, 12, stop_token_ids=frozenset({stop_token}))
    assert len(ids) == STOP_AT + 1
    out = greedy(client, "gpt2ish", PROMPT, 12)
    assert out.choices[0].finish_reason == "stop" and out.choices[0].text == text
    assert out.usage.completion_tokens == STOP_AT + 1
    longer = greedy(client, "gpt2ish", PROMPT, 12, ignore_eos=True)  # every EOS id is ignored
    assert longer.choices[0].finish_reason == "length" and longer.usage.completion_tokens == 12
    # the example model's own folder (one EOS) does not stop there: the stop is the folder's
    assert greedy(client, "sampling", PROMPT, 12).usage.completion_tokens > STOP_AT + 1


def test_the_triton_generate_endpoint_stops_on_them_too(server: RunningServer, reference, stop_token: int):
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    body = {"text_input": PROMPT, "sampling_parameters": json.dumps({"max_tokens": 12}),
            "exclude_input_in_output": True}
    conn.request("POST", "/v2/models/gpt2ish/generate", body=json.dumps(body))
    resp = conn.getresponse()
    answer = json.loads(resp.read())
    conn.close()
    assert resp.status == 200, answer
    assert answer["text_output"] == reference(PROMPT, 12, stop_token_ids=frozenset({stop_token}))[1]


def test_sampling_defaults_apply_to_the_fields_a_request_leaves_out(client: openai.OpenAI, reference):
    penalized = reference(PROMPTS[2], 32, ignore_eos=True, repetition_penalty=1.3)[1]
    plain = reference(PROMPTS[2], 32, ignore_eos=True)[1]
    assert penalized != plain  # so the default's effect shows
    # no temperature, top_k or repetition_penalty sent: generation_config.json's (top_k 1: greedy)
    out = client.completions.create(model="sampling", prompt=PROMPTS[2], max_tokens=32,
                                     extra_body={"ignore_eos": True})
    assert out.choices[0].text == penalized
    sent = greedy(client, "sampling", PROMPTS[2], 32, ignore_eos=True, repetition_penalty=1.0)
    assert sent.choices[0].text == plain  # a field the request sets is its own


def test_a_request_over_the_folders_context_is_a_400(client: openai.OpenAI):
    prompt = "x" * (CONTEXT - 1 - 20)  # with BOS, 20 tokens short of config.json's n_positions
    assert greedy(client, "gpt2ish", prompt, 20, ignore_eos=True).usage.total_tokens == CONTEXT
    for max_tokens in (21, None):
        with pytest.raises(openai.BadRequestError) as err:
            client.completions.create(model="gpt2ish", prompt=prompt + "x" * 21, max_tokens=max_tokens,
                                      temperature=0)
        assert err.value.status_code == 400 and err.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as err:  # the config's max_model_len wins over the folder's
        greedy(client, "overridden", "x" * 60, 10)
    assert err.value.code == "context_length_exceeded"


def test_the_config_endpoint_shows_each_value_and_where_it_came_from(server: RunningServer, stop_token: int):
    params = model_config(server, "gpt2ish")
    assert params["max_model_len"] == str(CONTEXT)
    assert params["source.max_model_len"] == "config.json n_positions"
    assert params["eos_token_ids"] == f"{EOS},{stop_token}"
    assert params["source.eos_token_ids"] == "generation_config.json eos_token_id"
    assert (params["bos_token"], params["eos_token"]) == ("<s>", "</s>")
    assert params["tokenizer"] == "tokenizer.json"
    assert (params["kv_num_heads"], params["kv_head_dim"]) == ("4", "16")
    assert params["generation"] == "decoder_with_past" and params["hf_export_files"] == "."
    assert model_config(server, "sampling")["default_repetition_penalty"] == "1.3"
    genai = model_config(server, "genai")
    assert genai["past_present_share_buffer"] == "true" and genai["kv_head_dim"] == "16"
    assert genai["source.kv_head_dim"] == "genai_config.json model.decoder.head_size"
    assert genai["hf_export_files"] == "1"
    overridden = model_config(server, "overridden")
    assert overridden["max_model_len"] == "64"
    assert overridden["source.max_model_len"] == f"config (folder: {CONTEXT} from config.json n_positions)"


def test_the_load_logs_what_the_folder_gave(server: RunningServer):
    line = next(line for line in server.log().splitlines()
                if "model gpt2ish version 1: from its folder:" in line)
    assert "max_model_len 128 (config.json n_positions)" in line and "EOS 257, BOS 256" in line
    line = next(line for line in server.log().splitlines()
                if "model sampling version 1: from its folder:" in line)
    assert "request defaults: temperature 0.7; top_k 1; repetition_penalty 1.3" in line


def test_dropping_a_folder_serves_it_and_removing_it_unloads_it(server: RunningServer, client: openai.OpenAI,
                                                                 reference, tmp_path: Path):
    staged = optimum_folder(tmp_path / "dropped")
    shutil.move(str(staged), str(server.repo / "dropped"))  # type: ignore[attr-defined]
    wait_until(lambda: "dropped" in {m.id for m in client.models.list().data}, "the dropped folder serves")
    assert greedy(client, "dropped", PROMPT, 8, ignore_eos=True).choices[0].text == \
        reference(PROMPT, 8, ignore_eos=True)[1]
    # an edit of one of its files reloads version 1 with the new value
    generation = server.repo / "dropped" / "generation_config.json"  # type: ignore[attr-defined]
    generation.write_text(json.dumps({**json.loads(generation.read_text()), "temperature": 0.25}))
    wait_until(lambda: model_config(server, "dropped").get("default_temperature") == "0.25",
               "the edited folder reloads")
    shutil.rmtree(server.repo / "dropped")  # type: ignore[attr-defined]
    wait_until(lambda: "dropped" not in {m.id for m in client.models.list().data}, "the folder unloads")
    with pytest.raises(openai.NotFoundError):
        greedy(client, "dropped", PROMPT, 8)


def test_a_symbolic_head_size_needs_the_folder_to_state_it(tmp_path: Path):
    folder = genai_folder(tmp_path / "genai")
    config = json.loads((folder / "genai_config.json").read_text())
    del config["model"]["decoder"]["head_size"]
    (folder / "genai_config.json").write_text(json.dumps(config))
    with pytest.raises(EngineError, match="fixed heads and head_dim.*kv_head_dim"):
        load_engine(folder)


def test_a_fixed_kv_dim_must_agree_with_the_folders(tmp_path: Path):
    folder = optimum_folder(tmp_path / "gpt2ish")
    config = json.loads((folder / "config.json").read_text())
    config["n_embd"] = 32  # 4 heads of 8, where the graph's past has 16
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(EngineError, match="the graph's past has head_dim 16, but kv_head_dim says 8"):
        load_engine(folder)


def test_a_folders_context_longer_than_the_kv_cache_is_cut_to_it(tmp_path: Path):
    folder = optimum_folder(tmp_path / "long")
    blocks = 'parameters { key: "kv_num_blocks" value { string_value: "4" } }\n'
    (folder / "config.pbtxt").write_text(blocks)
    assert load_engine(folder).cache_config.max_model_len == 4 * 16  # not config.json's 128
    context = 'parameters { key: "max_model_len" value { string_value: "100" } }\n'
    (folder / "config.pbtxt").write_text(blocks + context)
    assert load_engine(folder).cache_config.max_model_len == 100  # the config's own: as it says
