"""The one front door of a prompt, for both generation APIs: a prompt (text or token ids) → its token ids,
within the model's context, and the completion's token budget that the context leaves.

Why one place: Triton's generate / ModelStreamInfer (engine/generate/triton/model.py) and the OpenAI API
(engine/openai/service.py, and its Batch API through it) apply the same rules to a prompt, in this order:
1. a text prompt longer than `MAX_PROMPT_CHARS_PER_TOKEN` × the context is refused before it is tokenized
   (no tokenizer in use packs more characters into a token on average, and the bound keeps a huge prompt
   from costing the loop its tokenization, at most about a millisecond; tokenizing runs on the loop);
2. token ids must be in the vocabulary; a prompt asked to be truncated keeps its last tokens (vLLM's
   `truncate_prompt_tokens`); a prompt must have at least one token;
3. the prompt's tokens plus the completion's `max_tokens` must fit the context (`budget`); with no
   `max_tokens` the completion gets what the context leaves, which must be at least one token.
Each API words a refusal in its own protocol's form (the field it names, its error type), so a refusal here
is a `PromptRefused` carrying the facts, and each API maps it once: triton/model.py `_refusal`,
openai/service.py `_refusal`.

The engine checks the same again (generate/core/engine.py `add_request`), on its own thread, as its own
invariant; a prompt that passed here never meets those errors.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

from ..core.engine import GenerationEngine
from ..core.tokenizer import Tokenizer

# A prompt longer than this many characters per token of context is refused before it is tokenized (1 above).
MAX_PROMPT_CHARS_PER_TOKEN = 32


class PromptProblem(enum.Enum):
    TOO_LONG_TO_TOKENIZE = "too_long_to_tokenize"  # `value`: its characters
    TOKEN_OUTSIDE_VOCABULARY = "token_outside_vocabulary"  # `value`: the first such token id
    EMPTY = "empty"  # no token after tokenizing
    NO_ROOM_FOR_COMPLETION = "no_room_for_completion"  # `value`: the prompt's tokens (no max_tokens given)
    OVER_CONTEXT = "over_context"  # `value`: the prompt's tokens, `max_tokens` as asked


class PromptRefused(Exception):
    """A prompt the model cannot take: what broke the rule, the model's context (`context_tokens`) and
    vocabulary size, and the number the rule is about (`value`; see PromptProblem)."""

    def __init__(self, problem: PromptProblem, context_tokens: int, vocab_size: int, value: int = 0,
                 max_tokens: int = 0) -> None:
        super().__init__(problem.value)
        self.problem = problem
        self.context_tokens = context_tokens
        self.vocab_size = vocab_size
        self.value = value
        self.max_tokens = max_tokens


class PromptDoor:
    """A model's tokenizer and context, as a prompt meets them. Made per request by the API that checks it
    (`of` its version's engine), on the loop; holds nothing else."""

    __slots__ = ("context_tokens", "tokenizer", "vocab_size")

    def __init__(self, tokenizer: Tokenizer, context_tokens: int) -> None:
        self.tokenizer = tokenizer
        self.context_tokens = context_tokens
        self.vocab_size = tokenizer.vocab_size

    @classmethod
    def of(cls, engine: GenerationEngine) -> PromptDoor:
        return cls(engine.tokenizer, engine.cache_config.max_model_len)

    def tokens(self, prompt: str | Sequence[int], add_special_tokens: bool = True,
               keep_last: int | None = None) -> list[int]:
        """The prompt's token ids (rules 1 and 2); PromptRefused for one the model cannot take.
        `add_special_tokens`: False encodes a text without the BOS the tokenizer adds; `keep_last`: only
        the prompt's last this many tokens (None: all)."""
        if isinstance(prompt, str):
            if len(prompt) > MAX_PROMPT_CHARS_PER_TOKEN * self.context_tokens:
                raise self._refused(PromptProblem.TOO_LONG_TO_TOKENIZE, len(prompt))
            ids = self.tokenizer.encode(prompt, add_special_tokens)
        else:
            ids = list(prompt)
            vocab = self.vocab_size
            bad = next((t for t in ids if not 0 <= t < vocab), None)
            if bad is not None:
                raise self._refused(PromptProblem.TOKEN_OUTSIDE_VOCABULARY, bad)
        if keep_last is not None:
            ids = ids[-keep_last:]
        if not ids:
            raise self._refused(PromptProblem.EMPTY)
        return ids

    def budget(self, prompt_tokens: int, max_tokens: int | None) -> int:
        """The completion's max_tokens (rule 3): as asked when it fits beside `prompt_tokens`, else what the
        context leaves when none was asked; PromptRefused when it does not fit, or leaves nothing."""
        if max_tokens is None:
            left = self.context_tokens - prompt_tokens
            if left < 1:
                raise self._refused(PromptProblem.NO_ROOM_FOR_COMPLETION, prompt_tokens)
            return left
        if prompt_tokens + max_tokens > self.context_tokens:
            raise self._refused(PromptProblem.OVER_CONTEXT, prompt_tokens, max_tokens)
        return max_tokens

    def _refused(self, problem: PromptProblem, value: int = 0, max_tokens: int = 0) -> PromptRefused:
        return PromptRefused(problem, self.context_tokens, self.vocab_size, value, max_tokens)
