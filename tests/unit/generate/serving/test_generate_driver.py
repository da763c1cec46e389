"""EngineDriver (engine/generate/serving/driver.py): a real engine over the tiny decoder on its own thread,
driven from an event loop with no sockets. Streamed text adds up to the engine's own answer (stop strings and
incomplete UTF-8 held back, never taken back), an abort frees the request's blocks, errors reach the
request, and close ends the thread."""

from __future__ import annotations

import asyncio

import onnxruntime as ort
import pytest

from engine.errors import ErrorCode
from engine.generate.core.engine import CacheConfig, GenerationEngine
from engine.generate.core.request import SamplingParams
from engine.generate.core.runner import DecoderRunner
from engine.generate.core.scheduler import SchedulerConfig
from engine.generate.core.tokenizer import ByteTokenizer
from engine.generate.serving.driver import EngineDriver, TokenEvent, acceptance_line
from hubserve_models import examples
from hubserve_models.tiny_decoder import tiny_decoder_model


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("driver") / "model.onnx"
    path.write_bytes(examples.model_bytes(tiny_decoder_model()))
    return path


def make_engine(model_path, num_blocks: int = 64) -> GenerationEngine:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    return GenerationEngine(DecoderRunner(model_path, num_blocks, 16, opts), ByteTokenizer(),
                            CacheConfig(block_size=16, num_blocks=num_blocks, max_model_len=512),
                            SchedulerConfig())


def reference(model_path, prompt: list[int], params: SamplingParams) -> str:
    engine = make_engine(model_path)
    engine.add_request("ref", prompt, params)
    return engine.run_to_completion()["ref"].output_text


async def collect(driver: EngineDriver, request_id: str, prompt: list[int],
                  params: SamplingParams) -> list[TokenEvent]:
    events: list[TokenEvent] = []
    done = asyncio.get_running_loop().create_future()

    def on_event(event: TokenEvent) -> None:
        events.append(event)
        if event.finished and not done.done():
            done.set_result(None)

    driver.submit(request_id, prompt, params, on_event)
    await asyncio.wait_for(done, 60)
    return events


def test_streamed_text_adds_up_to_the_engines_answer(model_path):
    prompts = [[256, *b"abc"], [256, *b"hello there"], [256, *b"x" * 40]]
    plain = SamplingParams(max_tokens=40, ignore_eos=True)
    full = reference(model_path, prompts[0], plain)
    # ends before a piece of its own text
    stopping = SamplingParams(max_tokens=40, ignore_eos=True, stop=(full[12:16],))

    async def run() -> None:
        driver = EngineDriver(make_engine(model_path), "tiny", "1")
        results = await asyncio.gather(*(collect(driver, f"r{i}", p, plain) for i, p in enumerate(prompts)),
                                       collect(driver, "stopped", prompts[0], stopping))
        for prompt, events in zip(prompts, results[:3], strict=True):
            assert "".join(e.text for e in events) == reference(model_path, prompt, plain)
            assert sum(e.num_tokens for e in events) == 40
            assert events[-1].finished and events[-1].finish_reason == "length"
            assert all(not e.finished for e in events[:-1])
        stopped = results[3]
        assert "".join(e.text for e in stopped) == full[:full.find(full[12:16])]
        assert stopped[-1].finish_reason == "stop"
        assert driver.metrics.time_to_first_token.count == 4
        assert driver.metrics.generation_tokens == sum(e.num_tokens for r in results for e in r)
        assert driver.in_flight == 0
        await driver.close()

    asyncio.run(run())


def test_logprobs_come_with_the_text_they_belong_to(model_path):
    """A stop string holds the last characters back, and each token's logprobs with them: an event carries
    the logprobs of exactly the tokens whose text it hands out, and the last one the rest."""
    prompt = [256, *b"hello there"]
    plain = SamplingParams(max_tokens=40, ignore_eos=True)
    full = reference(model_path, prompt, plain)
    params = SamplingParams(max_tokens=40, ignore_eos=True, stop=("never in the text", full[30:33]),
                            logprobs=2)

    async def run() -> list[TokenEvent]:
        driver = EngineDriver(make_engine(model_path), "tiny", "1")
        events = await collect(driver, "r", prompt, params)
        await driver.close()
        return events

    events = asyncio.run(run())
    assert "".join(e.text for e in events) == full[:full.find(full[30:33])]
    assert sum(len(e.logprobs) for e in events) == sum(e.num_tokens for e in events)
    held = [e for e in events[:-1] if e.num_tokens and not e.logprobs]
    assert held, "the stop string held some text (and its logprobs) back"
    for e in events[:-1]:
        assert b"".join(lp.token for lp in e.logprobs).decode("utf-8", "replace") == e.text
        assert all(len(lp.top) == 2 for lp in e.logprobs)


def test_an_abort_frees_the_blocks_and_ends_the_events(model_path):
    async def run() -> None:
        driver = EngineDriver(make_engine(model_path), "tiny", "1")
        events: list[TokenEvent] = []
        first = asyncio.get_running_loop().create_future()

        def on_event(event: TokenEvent) -> None:
            events.append(event)
            if not first.done():
                first.set_result(None)

        driver.submit("long", [256, *b"go"], SamplingParams(max_tokens=500, ignore_eos=True), on_event)
        await asyncio.wait_for(first, 60)
        driver.abort("long")
        seen = len(events)
        for _ in range(2000):  # the thread frees the blocks before its next step
            if driver.stats.kv_blocks_used == 0 and driver.stats.running == 0:
                break
            await asyncio.sleep(0.005)
        assert driver.stats.kv_blocks_used == 0 and driver.stats.kv_blocks_free == 64
        await asyncio.sleep(0.05)
        assert len(events) == seen  # nothing after the abort
        assert driver.metrics.finished == {"abort": 1}
        await driver.close()

    asyncio.run(run())


def test_refusals_come_back_as_events_and_duplicates_at_once(model_path):
    async def run() -> None:
        driver = EngineDriver(make_engine(model_path), "tiny", "1")
        events = await collect(driver, "bad", [256, 9999], SamplingParams(max_tokens=4))
        assert len(events) == 1 and events[0].error is not None
        assert events[0].error.code is ErrorCode.INVALID_ARG
        driver.submit("dup", [256, 1], SamplingParams(max_tokens=300, ignore_eos=True), lambda e: None)
        with pytest.raises(Exception) as dup:
            driver.submit("dup", [256, 1], SamplingParams(max_tokens=4), lambda e: None)
        assert getattr(dup.value, "code", None) is ErrorCode.ALREADY_EXISTS
        driver.abort("dup")
        await driver.close()
        with pytest.raises(Exception) as closed:
            driver.submit("late", [256, 1], SamplingParams(max_tokens=4), lambda e: None)
        assert getattr(closed.value, "code", None) is ErrorCode.UNAVAILABLE

    asyncio.run(run())


def test_the_acceptance_line_gives_tokens_per_verification():
    """Speculative decoding's log line: the kept share, and the tokens each verification gave (vLLM's mean
    acceptance length: 30 kept over 20 verifications of 3 proposals each is 2.50 tokens a step)."""
    line = acceptance_line("m", proposed=60, kept=30, drafts=20, seconds=10.2)
    assert line == ("model 'm': speculative decoding kept 30 of 60 proposed tokens (50.0%), 2.50 tokens per "
                    "verification (mean acceptance length), in the last 10 s")
    assert "0 of 0 proposed tokens (0.0%), - tokens per verification" in acceptance_line("m", 0, 0, 0, 1.0)
