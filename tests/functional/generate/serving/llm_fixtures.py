"""The real-exporter fixtures (tests/fixtures/llm/, made by tools/llm_fixtures/make_fixtures.py): each model
folder as Optimum or onnxruntime-genai's builder wrote it (`models/<name>/`), and what transformers did with
it (`expected/<name>.json`: each prompt's and chat's token ids, transformers' greedy output ids, why it
stopped and the decoded text).

For the suites that serve the folders as they are and hold the answers to the recorded ones: the prompt
cases here (test_generate_hf_fixtures.py), the chat cases (once the model's own chat template is served).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

import tokenizers

from conftest import ROOT

FIXTURES = ROOT / "tests" / "fixtures" / "llm"
MODELS = FIXTURES / "models"


@dataclass(frozen=True, slots=True)
class Case:
    """One recorded prompt or chat of a model. `output_ids` empty for one transformers refused to run (over
    the context, a chat its template refuses): then `error` says why."""

    model: str
    kind: str  # "prompt" or "chat"
    name: str
    record: dict[str, Any]

    @property
    def prompt_ids(self) -> list[int]:
        return list(self.record.get("prompt_ids") or [])

    @property
    def output_ids(self) -> list[int]:
        return list(self.record.get("output_ids") or [])

    @property
    def finish_reason(self) -> str | None:
        return self.record.get("finish_reason")

    @property
    def error(self) -> str | None:
        return self.record.get("error")

    @property
    def id(self) -> str:
        return f"{self.model}-{self.name}"


def model_names() -> list[str]:
    return sorted(p.name for p in MODELS.iterdir() if p.is_dir())


@functools.cache
def expected(model: str) -> dict[str, Any]:
    return json.loads((FIXTURES / "expected" / f"{model}.json").read_text(encoding="utf-8"))


def cases(kind: str) -> list[Case]:
    """Every model's recorded cases of `kind` ("prompt" or "chat"), in file order."""
    key = {"prompt": "prompts", "chat": "chats"}[kind]
    return [Case(model, kind, record["name"], record) for model in model_names()
            for record in expected(model).get(key, [])]


def max_new_tokens(model: str) -> int:
    return int(expected(model)["greedy"]["max_new_tokens"])


@functools.cache
def tokenizer(model: str) -> Any:
    return tokenizers.Tokenizer.from_file(str(MODELS / model / "tokenizer.json"))


def token_texts(model: str, ids: list[int]) -> list[str]:
    """Each token's text decoded alone by the folder's tokenizer.json, special tokens left out: what OpenAI's
    legacy completion `logprobs.tokens` shows for them (engine/generate/core/tokenizer.py `token_bytes`)."""
    tok = tokenizer(model)
    return [tok.decode([i], skip_special_tokens=True) for i in ids]
