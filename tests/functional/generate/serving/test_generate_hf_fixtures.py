"""The real exporters' folders (tests/fixtures/llm/models: Optimum exports of GPT-2, Llama with GQA, a
SentencePiece Llama and Qwen2 with GQA, and onnxruntime-genai's export of the Llama) served as they are, the
committed folder itself as the model repository, with no config.pbtxt: every recorded prompt through the
`openai` package answers as transformers' greedy `generate()` did (llm_fixtures.py).

Token for token as far as the API shows tokens: the prompt's token count (usage) equals the recorded prompt
ids', the answer's token count and finish reason equal the recorded output's, each generated token's text
(completions' `logprobs.tokens`) equals that id's text in the folder's tokenizer.json, and the whole text
equals transformers' decode. Alone, all of a model's prompts at once (batched in its engine), and streamed.
A request is greedy by `temperature: 0` and otherwise as the folder says: Qwen2's generation_config.json
repetition_penalty 1.05 applies, as it did in transformers. The prompt over GPT-2's 128 positions is a 400.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
from typing import Any

import openai
import pytest
from llm_fixtures import MODELS, Case, cases, expected, max_new_tokens, model_names, token_texts

from conftest import RunningServer, openai_client, start_server

GENERATED = [c for c in cases("prompt") if c.output_ids]
OVER_CONTEXT = [c for c in cases("prompt") if not c.output_ids]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    running = start_server(MODELS, tmp_path_factory.mktemp("hf_fixtures") / "server.log",
                           "--model-control-mode", "none")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai_client(server)


def complete(client: openai.OpenAI, case: Case, **fields: Any) -> Any:
    return client.completions.create(model=case.model, prompt=case.record["prompt"], temperature=0,
                                     max_tokens=max_new_tokens(case.model), **fields)


def check_text(case: Case, text: str) -> None:
    if case.record.get("text") is None:  # not recorded: transformers' decode is not one text
        return
    assert text == case.record["text"]


def test_every_fixture_folder_serves(client: openai.OpenAI):
    assert {m.id for m in client.models.list().data} == set(model_names())


@pytest.mark.parametrize("case", GENERATED, ids=lambda c: c.id)
def test_a_prompt_answers_as_transformers_did(client: openai.OpenAI, case: Case):
    out = complete(client, case, logprobs=0)
    choice = out.choices[0]
    assert out.usage.prompt_tokens == len(case.prompt_ids)
    assert out.usage.completion_tokens == len(case.output_ids)
    assert choice.finish_reason == case.finish_reason
    assert choice.logprobs.tokens == token_texts(case.model, case.output_ids)
    check_text(case, choice.text)


@pytest.mark.parametrize("model", model_names())
def test_a_models_prompts_at_once_answer_as_they_do_alone(client: openai.OpenAI, model: str):
    mine = [c for c in GENERATED if c.model == model]
    with concurrent.futures.ThreadPoolExecutor(len(mine)) as pool:
        answers = list(pool.map(lambda c: complete(client, c), mine))
    for case, out in zip(mine, answers, strict=True):
        assert out.usage.completion_tokens == len(case.output_ids), case.id
        assert out.choices[0].finish_reason == case.finish_reason, case.id
        if case.record.get("text") is not None:
            assert out.choices[0].text == case.record["text"], case.id


@pytest.mark.parametrize("case", GENERATED, ids=lambda c: c.id)
def test_a_streamed_prompt_answers_the_same(client: openai.OpenAI, case: Case):
    pieces, usage, reason = [], None, None
    for chunk in complete(client, case, stream=True, stream_options={"include_usage": True}):
        for choice in chunk.choices:
            pieces.append(choice.text)
            reason = choice.finish_reason or reason
        usage = chunk.usage or usage
    assert usage is not None and usage.completion_tokens == len(case.output_ids)
    assert usage.prompt_tokens == len(case.prompt_ids) and reason == case.finish_reason
    check_text(case, "".join(pieces))


@pytest.mark.parametrize("case", OVER_CONTEXT, ids=lambda c: c.id)
def test_a_prompt_over_the_context_is_a_400(client: openai.OpenAI, case: Case):
    context = expected(case.model)["context_length"]
    assert len(case.prompt_ids) > context
    with pytest.raises(openai.BadRequestError) as err:
        complete(client, case)
    assert err.value.code == "context_length_exceeded" and str(context) in err.value.message


@pytest.mark.parametrize("model", model_names())
def test_the_config_shows_the_folders_context_and_every_eos_id(server: RunningServer, model: str):
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    conn.request("GET", f"/v2/models/{model}/config")
    resp = conn.getresponse()
    params = {k: v["string_value"] for k, v in json.loads(resp.read())["parameters"].items()}
    conn.close()
    record = expected(model)
    assert params["max_model_len"] == str(record["context_length"])
    assert params["eos_token_ids"].split(",") == [str(i) for i in record["greedy"]["eos_token_id"]]
    assert params["generation"] == "decoder_with_past" and params["tokenizer"] == "tokenizer.json"
