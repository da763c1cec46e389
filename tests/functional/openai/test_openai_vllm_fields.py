"""vLLM's request fields on the OpenAI API (/v1), sent as vLLM's users send them: through the `openai`
package's `extra_body`. Each is shown to change the answer as the generation engine in this process does
over the same model folder (tiny_decoder, byte tokenizer: one token per ASCII character, BOS 256 first), or
to be refused by name with OpenAI's 400, as are the fields not served (guided decoding, the chat template's
inputs) and unknown ones."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import openai
import pytest
import tokenizers

from conftest import EXAMPLES, RunningServer, openai_client, start_server
from engine.generate.core.request import SamplingParams
from engine.generate.serving.model_folder import load_engine
from hubserve_models import examples

MODEL = "tiny_decoder"
JSON_MODEL = "tiny_decoder_words"
WORD_PROMPT = [256, 72, 105, 33]
PROMPT = "The answer is"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("vllm_fields") / "repo"
    (root / MODEL).mkdir(parents=True)
    shutil.copy(EXAMPLES / MODEL / "config.pbtxt", root / MODEL / "config.pbtxt")
    examples.build_repository(root, [MODEL])
    add_word_tokenizer_model(root)
    return root


def add_word_tokenizer_model(root: Path) -> None:
    """JSON_MODEL: tiny_decoder's graph with a tokenizer.json of one word per id ("t0" … "t255", "<s>",
    "</s>"), in which the first token greedy decoding writes after WORD_PROMPT is the end-of-sequence token
    (and special, as EOS tokens are): a greedy answer ends at once unless `ignore_eos` or `min_tokens` say
    otherwise, and has a special token to show or leave out."""
    import tokenizers
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    shutil.copytree(root / MODEL, root / JSON_MODEL)
    config = root / JSON_MODEL / "config.pbtxt"
    text = config.read_text().replace(f'name: "{MODEL}"', f'name: "{JSON_MODEL}"')
    text = text.replace('string_value: "bytes"', 'string_value: "tokenizer.json"')
    engine = load_engine(root / MODEL)
    engine.add_request("first", WORD_PROMPT, SamplingParams(max_tokens=1))
    first = engine.run_to_completion()["first"].output_token_ids[0]
    text += ('parameters { key: "bos_token" value { string_value: "<s>" } }\n'
             f'parameters {{ key: "eos_token" value {{ string_value: "t{first}" }} }}\n')
    config.write_text(text)
    vocab = {f"t{i}": i for i in range(256)} | {"<s>": 256, "</s>": 257}
    tok = tokenizers.Tokenizer(WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = WhitespaceSplit()
    tok.add_special_tokens([tokenizers.AddedToken(word, special=True)
                            for word, i in vocab.items() if i in (first, 256, 257)])
    tok.save(str(root / JSON_MODEL / "tokenizer.json"))


@pytest.fixture(scope="module")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory):
    running = start_server(repo, tmp_path_factory.mktemp("vllm_fields_log") / "server.log")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai_client(server)


@pytest.fixture(scope="module")
def reference(repo: Path):
    """The engine in this process over the same folder: (text, tokens generated) of a greedy run."""
    engine = load_engine(repo / MODEL)

    def run(prompt: str | list[int], max_tokens: int, **params: Any) -> tuple[str, int]:
        engine.add_request("ref", prompt, SamplingParams(max_tokens=max_tokens, **params))
        out = engine.run_to_completion()["ref"]
        return out.output_text, len(out.output_token_ids)

    return run


def complete(client: openai.OpenAI, prompt: str | list[int] = PROMPT, max_tokens: int = 40,
             **fields: Any) -> Any:
    return client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                     extra_body=fields)


def test_min_p_one_keeps_only_the_most_likely_token(client: openai.OpenAI, reference):
    greedy, _ = reference(PROMPT, 24)
    hot = {"model": MODEL, "prompt": PROMPT, "max_tokens": 24, "temperature": 2.0, "seed": 5}
    assert client.completions.create(**hot).choices[0].text != greedy  # so min_p's effect shows
    assert client.completions.create(**hot, extra_body={"min_p": 1.0}).choices[0].text == greedy


def test_min_tokens_passes_stops_until_that_many_tokens(client: openai.OpenAI, reference):
    full, _ = reference(PROMPT, 40, ignore_eos=True)
    stop = full[2]  # greedy decoding writes it third: without min_tokens the text ends before it
    early, _ = reference(PROMPT, 40, stop=(stop,))
    late, count = reference(PROMPT, 40, stop=(stop,), min_tokens=10)
    assert len(early) <= 2 and len(late) >= 10 and late != early
    out = complete(client, stop=[stop], min_tokens=10)
    assert out.choices[0].text == late and out.usage.completion_tokens == count
    assert complete(client, stop=[stop]).choices[0].text == early


def test_include_stop_str_in_output_keeps_the_stop_string(client: openai.OpenAI, reference):
    full, _ = reference(PROMPT, 40, ignore_eos=True)
    stop = full[10:13]
    want = full[:full.find(stop) + len(stop)]
    out = complete(client, stop=[stop], include_stop_str_in_output=True)
    assert out.choices[0].text == want and out.choices[0].finish_reason == "stop"
    pieces = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0,
                                            stop=stop, stream=True,
                                            extra_body={"include_stop_str_in_output": True}))
    assert "".join(p.choices[0].text for p in pieces) == want


def test_add_special_tokens_false_leaves_out_the_bos(client: openai.OpenAI, reference):
    raw = list(PROMPT.encode())
    with_bos = complete(client, max_tokens=16)
    without = complete(client, max_tokens=16, add_special_tokens=False)
    assert (with_bos.usage.prompt_tokens, without.usage.prompt_tokens) == (len(raw) + 1, len(raw))
    assert without.choices[0].text == reference(raw, 16)[0]
    assert with_bos.choices[0].text == reference([256, *raw], 16)[0]


def test_truncate_prompt_tokens_keeps_the_prompts_last_tokens(client: openai.OpenAI, reference):
    prompt = "A long preamble that will be cut. The answer is"
    out = complete(client, prompt, 16, truncate_prompt_tokens=6)
    assert out.usage.prompt_tokens == 6
    assert out.choices[0].text == reference(list(prompt.encode()[-6:]), 16)[0]
    assert out.choices[0].text != reference(prompt, 16)[0]
    whole = complete(client, prompt, 16, truncate_prompt_tokens=-1)  # the context's worth: all of it
    assert whole.usage.prompt_tokens == len(prompt) + 1


@pytest.mark.parametrize(("fields", "param"), [
    ({"min_p": 1.5}, "min_p"),
    ({"min_tokens": 41}, "min_tokens"),
    ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
    ({"include_stop_str_in_output": "yes"}, "include_stop_str_in_output"),
])
def test_out_of_range_values_are_refused_by_name(client: openai.OpenAI, fields: dict, param: str):
    with pytest.raises(openai.BadRequestError) as refused:
        complete(client, **fields)
    assert refused.value.status_code == 400 and refused.value.param == param
    assert refused.value.type == "invalid_request_error"


@pytest.mark.parametrize(("fields", "code"), [
    ({"guided_json": {"type": "object"}}, "unsupported_parameter"),
    ({"guided_choice": ["yes", "no"]}, "unsupported_parameter"),
    ({"chat_template": "{{ messages }}"}, "unsupported_parameter"),  # without --trust-request-chat-template
    ({"spaces_between_special_tokens": False}, "unsupported_parameter"),
    ({"a_newer_field": 1}, "unknown_parameter"),
])
def test_fields_not_served_are_refused_not_ignored(client: openai.OpenAI, fields: dict, code: str):
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=4,
                                       extra_body=fields)
    [field] = fields
    assert refused.value.status_code == 400 and refused.value.param == field and refused.value.code == code
    defaults = {"add_generation_prompt": True, "spaces_between_special_tokens": True,
                "chat_template_kwargs": {}}
    ok = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                        max_tokens=4, user="u", extra_body=defaults)
    assert ok.choices[0].finish_reason is not None


def test_skip_special_tokens_false_writes_them_in_the_text(client: openai.OpenAI, repo: Path):
    engine = load_engine(repo / JSON_MODEL)
    prompt = WORD_PROMPT
    engine.add_request("ref", prompt, SamplingParams(max_tokens=16, ignore_eos=True))
    ids = list(engine.run_to_completion()["ref"].output_token_ids)
    tok = tokenizers.Tokenizer.from_file(str(repo / JSON_MODEL / "tokenizer.json"))
    # the answer's text as transformers and vLLM give it: decoded after the prompt (a word's separating space
    # kept), minus the prompt's text
    shown, skipped = (tok.decode(prompt + ids, skip_special_tokens=skip)[
        len(tok.decode(prompt, skip_special_tokens=skip)):] for skip in (False, True))
    assert shown != skipped  # the answer has special tokens: the field's effect shows
    for skip, want in ((False, shown), (True, skipped)):
        out = client.completions.create(model=JSON_MODEL, prompt=prompt, max_tokens=16, temperature=0,
                                        extra_body={"ignore_eos": True, "skip_special_tokens": skip})
        assert out.choices[0].text == want


def test_ignore_eos_and_min_tokens_go_past_the_end_of_sequence_token(client: openai.OpenAI, repo: Path):
    ask = {"model": JSON_MODEL, "prompt": WORD_PROMPT, "max_tokens": 16, "temperature": 0}
    ends = client.completions.create(**ask)
    assert (ends.usage.completion_tokens, ends.choices[0].finish_reason) == (1, "stop")
    runs = client.completions.create(**ask, extra_body={"ignore_eos": True})
    assert (runs.usage.completion_tokens, runs.choices[0].finish_reason) == (16, "length")
    held = client.completions.create(**ask, extra_body={"min_tokens": 5})
    assert held.usage.completion_tokens > 5  # EOS could not be drawn before 5 tokens
    engine = load_engine(repo / JSON_MODEL)
    engine.add_request("ref", WORD_PROMPT, SamplingParams(max_tokens=16, min_tokens=5))
    want = engine.run_to_completion()["ref"]
    assert (held.choices[0].text, held.usage.completion_tokens) == (want.output_text,
                                                                     len(want.output_token_ids))


def test_the_end_of_sequence_tokens_text_shows_only_when_asked(client: openai.OpenAI, repo: Path):
    """vLLM's: the token that stopped a request is not in its text unless `include_stop_str_in_output`;
    EOS being special, `skip_special_tokens` false is needed to see it."""
    ask = {"model": JSON_MODEL, "prompt": WORD_PROMPT, "max_tokens": 16, "temperature": 0}
    eos = f"t{load_engine(repo / JSON_MODEL).tokenizer.eos_token_id}"
    shown = {"skip_special_tokens": False}
    assert client.completions.create(**ask, extra_body=shown).choices[0].text == ""
    out = client.completions.create(**ask, extra_body={**shown, "include_stop_str_in_output": True})
    assert out.choices[0].text == f" {eos}" and out.choices[0].finish_reason == "stop"  # after the prompt


def test_a_stop_string_that_is_a_special_tokens_text_stops_there(client: openai.OpenAI, repo: Path):
    """Llama-3's "<|eot_id|>" as a stop string: special, so its text is not in the text that stop strings
    were matched on; it stops at that token all the same (here the EOS token, with `ignore_eos`)."""
    ask = {"model": JSON_MODEL, "prompt": WORD_PROMPT, "max_tokens": 16, "temperature": 0}
    eos = f"t{load_engine(repo / JSON_MODEL).tokenizer.eos_token_id}"
    runs = client.completions.create(**ask, extra_body={"ignore_eos": True})
    assert runs.usage is not None and runs.usage.completion_tokens == 16  # without the stop string
    out = client.completions.create(**ask, stop=[eos], extra_body={"ignore_eos": True})
    assert (out.choices[0].text, out.choices[0].finish_reason) == ("", "stop")
    assert out.usage is not None and out.usage.completion_tokens == 1
    kept = client.completions.create(**ask, stop=[eos], extra_body={"ignore_eos": True,
                                                                    "include_stop_str_in_output": True})
    assert kept.choices[0].text == eos
