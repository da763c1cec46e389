"""A model's own Jinja chat template on the OpenAI API (/v1/chat/completions), through the `openai`
package: the prompt it renders is encoded without a second BOS, and vLLM's `add_generation_prompt`,
`continue_final_message`, `chat_template_kwargs` and (on a server that trusts them) a request's own
`chat_template` change that prompt as they say; a template's refusal is a 400 in its own words, and a model
without a template refuses chat but completes. Each answer is checked against the generation engine in this
process over the same folder, fed the token ids the rendered prompt must have."""

from __future__ import annotations

import shutil
from pathlib import Path

import openai
import pytest
import tokenizers
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from tokenizers.processors import TemplateProcessing

from conftest import EXAMPLES, RunningServer, openai_client, start_server
from engine.generate.core.request import SamplingParams
from engine.generate.serving.model_folder import load_engine
from hubserve_models import examples

BASE = "tiny_decoder"
MODEL = "tiny_decoder_templated"   # word tokenizer ("t0" … "t255", "<s>" 256, "</s>" 257), its own template
PLAIN = "tiny_decoder_plain"       # the byte tokenizer and no chat template at all
BOS, EOS, PROMPT_START = 256, 257, 1
# The words' template: BOS, each message's words then EOS, "t1" to start the answer; "t9" when the request's
# chat_template_kwargs set `extra`; a system turn refused in the template's own words.
TEMPLATE = ("{{ bos_token }}{% for m in messages %}"
            "{% if m['role'] == 'system' %}{{ raise_exception('this model takes no system turn') }}"
            "{% endif %}"
            " {{ m['content'] }} {{ eos_token }}{% endfor %}"
            "{% if extra is defined %} t9{% endif %}{% if add_generation_prompt %} t1{% endif %}")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("chat_template") / "repo"
    (root / BASE).mkdir(parents=True)
    shutil.copy(EXAMPLES / BASE / "config.pbtxt", root / BASE / "config.pbtxt")
    examples.build_repository(root, [BASE])
    for name in (MODEL, PLAIN):
        shutil.copytree(root / BASE, root / name)
        config = root / name / "config.pbtxt"
        config.write_text(config.read_text().replace(f'name: "{BASE}"', f'name: "{name}"'))
    shutil.rmtree(root / BASE)
    (root / PLAIN / "chat_template.jinja").unlink()
    folder = root / MODEL
    config = folder / "config.pbtxt"
    config.write_text(config.read_text().replace('string_value: "bytes"', 'string_value: "tokenizer.json"')
                      + 'parameters { key: "bos_token" value { string_value: "<s>" } }\n'
                      'parameters { key: "eos_token" value { string_value: "</s>" } }\n')
    (folder / "chat_template.jinja").write_text(TEMPLATE)
    vocab = {f"t{i}": i for i in range(256)} | {"<s>": BOS, "</s>": EOS}
    tok = tokenizers.Tokenizer(WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = WhitespaceSplit()
    tok.add_special_tokens([tokenizers.AddedToken(t, special=True) for t in ("<s>", "</s>")])
    tok.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[("<s>", BOS)])  # adds BOS
    tok.save(str(folder / "tokenizer.json"))
    return root


@pytest.fixture(scope="module")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory):
    running = start_server(repo, tmp_path_factory.mktemp("chat_template_log") / "server.log",
                           "--trust-request-chat-template")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai_client(server)


@pytest.fixture(scope="module")
def reference(repo: Path):
    engine = load_engine(repo / MODEL)

    def run(ids: list[int]) -> str:
        engine.add_request("ref", ids, SamplingParams(max_tokens=8, ignore_eos=True))
        return engine.run_to_completion()["ref"].output_text

    return run


def chat(client: openai.OpenAI, messages: list[dict[str, str]], **extra: object):
    return client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0,
                                          extra_body={"ignore_eos": True, **extra})


USER = [{"role": "user", "content": "t5 t6"}]


def test_the_rendered_prompt_is_encoded_with_one_bos(client: openai.OpenAI, reference):
    ids = [BOS, 5, 6, EOS, PROMPT_START]
    out = chat(client, USER)
    assert out.usage.prompt_tokens == len(ids) and out.choices[0].message.content == reference(ids)
    twice = chat(client, USER, add_special_tokens=True)  # asked: the tokenizer's BOS before the template's
    assert twice.usage.prompt_tokens == len(ids) + 1
    assert twice.choices[0].message.content == reference([BOS, *ids])


def test_add_generation_prompt_false_leaves_the_answers_start_out(client: openai.OpenAI, reference):
    ids = [BOS, 5, 6, EOS]
    out = chat(client, USER, add_generation_prompt=False)
    assert out.usage.prompt_tokens == len(ids) and out.choices[0].message.content == reference(ids)


def test_continue_final_message_leaves_the_last_message_open(client: openai.OpenAI, reference):
    messages = [*USER, {"role": "assistant", "content": "t7 t8"}]
    ids = [BOS, 5, 6, EOS, 7, 8]  # cut after the final message's text: no EOS, no t1
    out = chat(client, messages, add_generation_prompt=False, continue_final_message=True)
    assert out.usage.prompt_tokens == len(ids) and out.choices[0].message.content == reference(ids)
    with pytest.raises(openai.BadRequestError) as refused:
        chat(client, messages, continue_final_message=True)  # add_generation_prompt is true by default
    assert refused.value.param == "continue_final_message"
    assert "Cannot set both `continue_final_message` and `add_generation_prompt`" in refused.value.message


def test_chat_template_kwargs_reach_the_template(client: openai.OpenAI, reference):
    ids = [BOS, 5, 6, EOS, 9, PROMPT_START]
    out = chat(client, USER, chat_template_kwargs={"extra": True})
    assert out.usage.prompt_tokens == len(ids) and out.choices[0].message.content == reference(ids)


def test_a_request_template_is_served_when_the_server_trusts_it(client: openai.OpenAI, reference):
    own = "{{ bos_token }} t3{% for m in messages %} {{ m['content'] }}{% endfor %}"
    ids = [BOS, 3, 5, 6]
    out = chat(client, USER, chat_template=own)
    assert out.usage.prompt_tokens == len(ids) and out.choices[0].message.content == reference(ids)
    with pytest.raises(openai.BadRequestError) as refused:
        chat(client, USER, chat_template="{% if %}")
    assert refused.value.param == "chat_template" and "does not parse" in refused.value.message


@pytest.mark.parametrize(("messages", "extra", "words"), [
    ([{"role": "system", "content": "t1"}, *USER], {}, "this model takes no system turn"),
    (USER, {"chat_template": "{{ messages.pop() }}"}, "unsafe"),  # the sandbox: messages are not changed
    (USER, {"chat_template": "{{ nothing.here }}"}, "'nothing' is undefined"),
])
def test_a_template_error_is_a_400_in_its_own_words(client: openai.OpenAI, messages, extra, words: str):
    with pytest.raises(openai.BadRequestError) as refused:
        chat(client, messages, **extra)
    error = refused.value.body
    assert refused.value.status_code == 400 and refused.value.code == "chat_template_error"
    assert isinstance(error, dict) and words in error["message"] and error["param"] == "messages"


def test_a_rendered_chat_past_the_prompts_bound_is_stopped_while_it_is_written(client: openai.OpenAI):
    endless = "{% for i in range(100000) %}{{ ' t5 t6 t7 t8 t9' }}{% endfor %}"  # 1.5 M characters
    with pytest.raises(openai.BadRequestError) as refused:
        chat(client, USER, chat_template=endless)
    assert refused.value.code == "context_length_exceeded" and refused.value.param == "messages"
    assert "more than 16384 characters once rendered" in refused.value.message  # 32 per token of 512


def test_a_model_without_a_template_refuses_chat_but_completes(client: openai.OpenAI):
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=PLAIN, messages=USER, max_tokens=4)
    error = refused.value.body
    assert isinstance(error, dict) and error["message"] == (
        f"model {PLAIN} has no chat template; use /v1/completions or add chat_template.jinja")
    assert refused.value.param == "messages" and refused.value.code == "chat_template_missing"
    out = client.completions.create(model=PLAIN, prompt="Hello", max_tokens=4, temperature=0)
    assert out.usage.completion_tokens == 4
