"""engine/generate/serving/prompt.py: the generation APIs' one prompt front door, with the byte tokenizer
(one token per byte, BOS first). Pure, synchronous; each API's wording of a refusal is tested through its
server (test_generate_triton.py, test_openai_errors.py, test_generate_limits.py)."""

from __future__ import annotations

import pytest

from engine.generate.core.tokenizer import ByteTokenizer
from engine.generate.serving.prompt import (
    MAX_PROMPT_CHARS_PER_TOKEN,
    PromptDoor,
    PromptProblem,
    PromptRefused,
)

CONTEXT = 16


def door() -> PromptDoor:
    return PromptDoor(ByteTokenizer(), CONTEXT)


def refused(call) -> PromptRefused:
    with pytest.raises(PromptRefused) as info:
        call()
    assert info.value.context_tokens == CONTEXT and info.value.vocab_size == 258
    return info.value


def test_text_is_tokenized_and_token_ids_pass_as_given() -> None:
    assert door().tokens("hi") == [256, ord("h"), ord("i")]
    assert door().tokens((1, 2, 257)) == [1, 2, 257]


def test_text_past_the_bound_is_refused_before_tokenizing() -> None:
    limit = MAX_PROMPT_CHARS_PER_TOKEN * CONTEXT
    assert len(door().tokens("x" * limit)) == limit + 1  # at the bound: tokenized (the context comes later)
    e = refused(lambda: door().tokens("x" * (limit + 1)))
    assert e.problem is PromptProblem.TOO_LONG_TO_TOKENIZE and e.value == limit + 1


def test_token_ids_outside_the_vocabulary_name_the_first() -> None:
    e = refused(lambda: door().tokens([5, 258, -1]))
    assert e.problem is PromptProblem.TOKEN_OUTSIDE_VOCABULARY and e.value == 258


def test_an_empty_prompt_is_refused() -> None:
    assert refused(lambda: door().tokens([])).problem is PromptProblem.EMPTY


def test_the_budget_is_max_tokens_when_it_fits() -> None:
    assert door().budget(6, 10) == 10


def test_a_prompt_and_max_tokens_over_the_context_are_refused() -> None:
    e = refused(lambda: door().budget(6, 11))
    assert e.problem is PromptProblem.OVER_CONTEXT and (e.value, e.max_tokens) == (6, 11)


def test_without_max_tokens_the_completion_gets_what_the_context_leaves() -> None:
    assert door().budget(6, None) == 10
    e = refused(lambda: door().budget(CONTEXT, None))
    assert e.problem is PromptProblem.NO_ROOM_FOR_COMPLETION and e.value == CONTEXT
