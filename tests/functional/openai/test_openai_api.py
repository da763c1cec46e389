"""The OpenAI-compatible API (/v1) against a real server serving the tiny_decoder example, with the official
`openai` package as the client, unmodified: completions, chat, streaming, usage, stop, penalties, n and
seed; greedy answers equal the generation engine's own greedy run in this process over the same model
folder. Errors, request ids and disconnects are checked over raw HTTP (test_openai_errors.py has the bad
inputs)."""

from __future__ import annotations

import shutil
import socket
import time
import urllib.request
from pathlib import Path

import openai
import pytest

from conftest import EXAMPLES, RunningServer, openai_client, start_server, wait_until
from engine.generate.core.request import SamplingParams
from engine.generate.serving.model_folder import load_engine
from hubserve_models import examples

MODEL = "tiny_decoder"
# the example's chat template (chat_template.jinja, perf/hubserve_models/tiny_decoder.py) adds no stop strings
CHAT_STOPS: tuple[str, ...] = ()


def build_repository(root: Path) -> Path:
    for name in ("simple", MODEL):
        (root / name).mkdir(parents=True)
        shutil.copy(EXAMPLES / name / "config.pbtxt", root / name / "config.pbtxt")
    examples.build_repository(root, ["simple", MODEL])
    return root


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_repository(tmp_path_factory.mktemp("openai") / "repo")


@pytest.fixture(scope="module")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory):
    running = start_server(repo, tmp_path_factory.mktemp("openai_log") / "server.log")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai_client(server)


@pytest.fixture(scope="module")
def reference(repo: Path):
    """The engine in this process, over the same folder: what greedy decoding must give."""
    engine = load_engine(repo / MODEL)

    def run(prompt: str | list[int], max_tokens: int, stop: tuple[str, ...] = (), **penalties: float,
            ) -> tuple[str, int, int]:
        engine.add_request("ref", prompt, SamplingParams(max_tokens=max_tokens, stop=stop, **penalties))
        out = engine.run_to_completion()["ref"]
        prompt_tokens = len(engine.tokenizer.encode(prompt)) if isinstance(prompt, str) else len(prompt)
        return out.output_text, len(out.output_token_ids), prompt_tokens

    return run


def chat_prompt(user: str, system: str | None = None) -> list[int]:
    """The example's template, written out, as the byte tokenizer encodes it for chat: without the BOS
    (vLLM's add_special_tokens default for chat; this template writes none)."""
    head = f"<|system|>\n{system}\n" if system is not None else ""
    return list(f"{head}<|user|>\n{user}\n<|assistant|>\n".encode())


def test_models_lists_the_generative_models_only(client: openai.OpenAI):
    listed = client.models.list()
    assert [m.id for m in listed.data] == [MODEL]  # "simple" serves, but does not generate
    assert listed.data[0].object == "model" and listed.data[0].owned_by == "hubserve"
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("simple")
    assert err.value.code == "model_not_found"


def test_completion_greedy_equals_the_engine(client: openai.OpenAI, reference):
    out = client.completions.create(model=MODEL, prompt="Hello, world", max_tokens=24, temperature=0)
    text, tokens, prompt_tokens = reference("Hello, world", 24)
    assert out.object == "text_completion" and out.model == MODEL and out.id.startswith("cmpl-")
    assert out.choices[0].text == text
    assert out.choices[0].finish_reason == "length"
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (prompt_tokens, tokens) == \
        (prompt_tokens, 24)
    assert out.usage.total_tokens == prompt_tokens + 24


def test_chat_greedy_equals_the_engine(client: openai.OpenAI, reference):
    out = client.chat.completions.create(
        model=MODEL, messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        max_completion_tokens=20, temperature=0)
    text, tokens, prompt_tokens = reference(chat_prompt("Hi", "Be brief."), 20, CHAT_STOPS)
    assert out.object == "chat.completion" and out.id.startswith("chatcmpl-")
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == text
    assert out.choices[0].finish_reason == "length"
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (prompt_tokens, tokens)


def test_streaming_chat_gives_the_same_text_in_chunks(client: openai.OpenAI, reference):
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Write a poem"}], max_tokens=30, temperature=0,
        stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text, tokens, prompt_tokens = reference(chat_prompt("Write a poem"), 30, CHAT_STOPS)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    content = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert "".join(content) == text
    assert len([piece for piece in content if piece]) > 2  # streamed, not one piece at the end
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (prompt_tokens, tokens)
    assert all(c.usage is None for c in chunks[:-1])


def test_streaming_completion_and_stop_string(client: openai.OpenAI, reference):
    full, _, _ = reference("The answer is", 40)
    stop = full[10:13]  # a piece of what greedy decoding writes: the text must end before it
    want = full[:full.find(stop)]
    out = client.completions.create(model=MODEL, prompt="The answer is", max_tokens=40, temperature=0,
                                    stop=[stop])
    assert out.choices[0].text == want and out.choices[0].finish_reason == "stop"
    pieces = list(client.completions.create(model=MODEL, prompt="The answer is", max_tokens=40,
                                            temperature=0, stop=stop, stream=True))
    assert "".join(p.choices[0].text for p in pieces) == want
    assert pieces[-1].choices[0].finish_reason == "stop"


def test_penalties_change_the_answer_as_the_engine_does(client: openai.OpenAI, reference):
    penalties = {"presence_penalty": 0.5, "frequency_penalty": 1.5}
    plain, _, _ = reference("ab ab ab ab", 32)
    text, _, _ = reference("ab ab ab ab", 32, repetition_penalty=1.3, **penalties)
    assert text != plain  # so the comparisons below can tell penalties served from penalties dropped
    out = client.completions.create(model=MODEL, prompt="ab ab ab ab", max_tokens=32, temperature=0,
                                    extra_body={"repetition_penalty": 1.3}, **penalties)
    assert out.choices[0].text == text
    pieces = list(client.completions.create(model=MODEL, prompt="ab ab ab ab", max_tokens=32, temperature=0,
                                            extra_body={"repetition_penalty": 1.3}, stream=True,
                                            **penalties))
    assert "".join(p.choices[0].text for p in pieces) == text


def test_chat_logprobs_whole_and_streamed(client: openai.OpenAI, reference):
    messages = [{"role": "user", "content": "Count"}]
    out = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0,
                                         logprobs=True, top_logprobs=3)
    choice = out.choices[0]
    text, _, _ = reference(chat_prompt("Count"), 16, CHAT_STOPS)
    assert choice.message.content == text
    content = choice.logprobs.content
    assert len(content) == out.usage.completion_tokens
    for entry in content:  # greedy: the token is the most likely of its top three, in order
        assert entry.logprob <= 0 and [t.logprob for t in entry.top_logprobs] == \
            sorted((t.logprob for t in entry.top_logprobs), reverse=True)
        assert len(entry.top_logprobs) == 3 and entry.top_logprobs[0].token == entry.token
        assert entry.top_logprobs[0].logprob == entry.logprob
    if choice.finish_reason == "length":  # no stop string cut the text: the tokens' bytes are the text
        assert b"".join(bytes(e.bytes) for e in content).decode("utf-8", "replace") == text
    chunks = [c.choices[0] for c in client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=16, temperature=0, logprobs=True, top_logprobs=3,
        stream=True) if c.choices and c.choices[0].logprobs]
    streamed = [e for c in chunks for e in c.logprobs.content]
    assert [(e.token, e.logprob, [t.token for t in e.top_logprobs]) for e in streamed] == \
        [(e.token, e.logprob, [t.token for t in e.top_logprobs]) for e in content]
    if choice.finish_reason == "length":  # each chunk carries the tokens whose text it shows (the chat
        for c in chunks:                  # template's stop strings hold the last characters back)
            shown = b"".join(bytes(e.bytes) for e in c.logprobs.content).decode("utf-8", "replace")
            assert shown == (c.delta.content or "")
    plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0)
    assert plain.choices[0].logprobs is None


def test_completion_logprobs_in_the_legacy_shape(client: openai.OpenAI):
    out = client.completions.create(model=MODEL, prompt="ab", max_tokens=10, temperature=0, logprobs=2,
                                    extra_body={"ignore_eos": True})
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 10
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(10)]
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert top[token] == logprob and max(top.values()) == logprob and 1 <= len(top) <= 3
    pieces = list(client.completions.create(model=MODEL, prompt="ab", max_tokens=10, temperature=0,
                                            logprobs=2, stream=True, extra_body={"ignore_eos": True}))
    chunks = [p.choices[0].logprobs for p in pieces if p.choices and p.choices[0].logprobs]
    assert [t for c in chunks for t in c.tokens] == lp.tokens
    assert [o for c in chunks for o in c.text_offset] == lp.text_offset  # offsets run on across chunks


def test_n_choices_with_a_seed_are_reproducible(client: openai.OpenAI):
    def ask() -> list[str]:
        out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Go"}],
                                             max_tokens=12, temperature=1.0, top_p=0.9, seed=1234, n=3,
                                             extra_body={"ignore_eos": True})
        assert [c.index for c in out.choices] == [0, 1, 2]
        assert out.usage.completion_tokens == 36
        return [c.message.content or "" for c in out.choices]

    first = ask()
    assert ask() == first
    assert len(set(first)) > 1  # each choice has its own draw


def test_request_id_is_the_answers_id_header_and_in_the_log(client: openai.OpenAI, server: RunningServer):
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3,
        extra_headers={"X-Request-ID": "trace-42.a"})
    assert raw.headers["x-request-id"] == "trace-42.a"
    assert raw.parse().id == "trace-42.a"
    deadline = time.monotonic() + 10
    while "request trace-42.a: finished" not in server.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "request trace-42.a: finished (length)" in server.log()
    made = client.chat.completions.with_raw_response.create(model=MODEL, max_tokens=2,
                                                            messages=[{"role": "user", "content": "hi"}])
    assert made.headers["x-request-id"] == made.parse().id


def _metric(server: RunningServer, name: str) -> float:
    return server.metric(name, MODEL)


def _open_stream(server: RunningServer, max_tokens: int, stream: bool = True) -> socket.socket:
    body = (b'{"model": "%s", "prompt": "Once upon a time", "max_tokens": %d, "ignore_eos": true, '
            b'"stream": %s}' % (MODEL.encode(), max_tokens, b"true" if stream else b"false"))
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    return sock


def finished(server: RunningServer, reason: str) -> float:
    """hubserve_generation_requests_finished_total for `reason` (stop, length, abort, error); 0 before any."""
    with urllib.request.urlopen(server.metrics_url, timeout=10) as r:
        text = r.read().decode()
    for line in text.splitlines():
        if line.startswith("hubserve_generation_requests_finished_total{") and f'reason="{reason}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def server_aborts(server: RunningServer) -> float:
    return finished(server, "abort")


def leave_while_running(server: RunningServer, max_tokens: int, stream: bool = True, tries: int = 5) -> None:
    """Start a generation, leave once it holds blocks and runs, and see the server abort it. On a loaded
    machine the server can finish all `max_tokens` (~190 ms for 450) before the close reaches it, or
    before a scrape sees it running or holding blocks (finished "length"); such a try shows nothing either
    way and is made again, at most `tries` times. Fails if the request never finishes, or if no try was
    both seen holding blocks and aborted."""
    for _ in range(tries):
        before = finished(server, "abort") + finished(server, "length")
        aborted = finished(server, "abort")
        sock = _open_stream(server, max_tokens, stream=stream)
        if stream:
            got = b""
            while got.count(b"data: ") < 5:  # a few tokens in: the request holds blocks and is running
                piece = sock.recv(65536)
                assert piece, "the stream ended early"
                got += piece
            assert got.startswith(b"HTTP/1.1 200 OK\r\n") and b"Transfer-Encoding: chunked" in got
        else:
            wait_until(lambda n=before: _metric(server, "hubserve_generation_running_sequences") == 1
                       or finished(server, "length") + finished(server, "abort") > n, "never ran")
        held = _metric(server, "hubserve_generation_kv_blocks_used") > 0  # (0 once it ended: a void try)
        sock.close()
        # the finish is counted on the loop once the engine's step reports it, which can follow the gauges
        wait_until(lambda n=before + 1: finished(server, "abort") + finished(server, "length") == n,
                   "the request never finished")
        if held and finished(server, "abort") == aborted + 1:
            return
    raise AssertionError(f"none of {tries} tries was seen holding KV blocks and then aborted (were all "
                         f"{max_tokens} tokens generated before the scrape or the close each time?)")


def test_a_client_leaving_mid_stream_frees_its_kv_blocks(client: openai.OpenAI, server: RunningServer):
    client.completions.create(model=MODEL, prompt="warm", max_tokens=1)  # the engine exists, so its gauges do
    free_before = _metric(server, "hubserve_generation_kv_blocks_free")
    leave_while_running(server, 400)
    wait_until(lambda: _metric(server, "hubserve_generation_running_sequences") == 0, "still running")
    wait_until(lambda: _metric(server, "hubserve_generation_kv_blocks_free") == free_before,
               "blocks not freed")
    assert _metric(server, "hubserve_generation_kv_blocks_used") == 0


def test_a_client_leaving_before_a_whole_answer_aborts_it(client: openai.OpenAI, server: RunningServer):
    client.completions.create(model=MODEL, prompt="warm", max_tokens=1)  # the engine exists, so its gauges do
    leave_while_running(server, 450, stream=False)
    wait_until(lambda: _metric(server, "hubserve_generation_kv_blocks_used") == 0, "blocks not freed")


def test_metrics_have_the_latency_histograms(client: openai.OpenAI, server: RunningServer):
    client.completions.create(model=MODEL, prompt="metrics", max_tokens=5, temperature=0)
    with urllib.request.urlopen(server.metrics_url, timeout=10) as r:
        text = r.read().decode()
    for family in ("time_to_first_token", "inter_token_latency"):
        name = f"hubserve_generation_{family}_seconds"
        assert f"# TYPE {name} histogram" in text
        count = next(line for line in text.splitlines() if line.startswith(f"{name}_count{{"))
        assert float(count.rsplit(" ", 1)[1]) >= 1
        assert f'{name}_bucket{{model="{MODEL}",version="1",le="+Inf"}}' in text
    assert _metric(server, "hubserve_generation_tokens_total") >= 5
    assert 0.0 <= _metric(server, "hubserve_generation_prefix_cache_hit_rate") <= 1.0
    assert _metric(server, "hubserve_generation_preemptions_total") == 0
    assert _metric(server, "hubserve_generation_waiting_sequences") == 0


def test_streamed_choices_and_prompts_match_the_whole_answer(client: openai.OpenAI):
    ask = {"model": MODEL, "prompt": ["first prompt", "second"], "max_tokens": 10, "temperature": 0.9,
           "seed": 99, "n": 2}
    whole = client.completions.create(**ask)
    assert sorted(c.index for c in whole.choices) == [0, 1, 2, 3]
    assert whole.usage.completion_tokens == 40
    texts: dict[int, str] = {}
    for chunk in client.completions.create(**ask, stream=True):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
    assert texts == {c.index: c.text for c in whole.choices}
