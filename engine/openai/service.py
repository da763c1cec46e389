"""The OpenAI API's requests, transport aside: a checked request (protocol.py) → the prompt (chat template,
tokenizer) → its limits → the engine (a `Generation`) → the answer (responses.py).

Called on the loop by the HTTP routes (frontend/openai/routes.py). The prompt goes through the generation
APIs' one front door (engine/generate/serving/prompt.py: tokenizing, bounded, on the loop; the context's
limits), refusals in OpenAI's words; every model step runs on its engine's thread
(engine/generate/serving/driver.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import Callable
from pathlib import PurePosixPath
from typing import Any

from ..access.api_keys import ApiKey
from ..errors import EngineError, ErrorCode
from ..generate.core.grammar import GrammarSpec
from ..generate.core.lora import adapter_names
from ..generate.core.request import Priority, SamplingParams
from ..generate.serving.accounting import RequestAccount
from ..generate.serving.chat_template import ChatOptions, ChatTemplate, render_chat
from ..generate.serving.jinja_template import JinjaTemplate, RenderedTooLong, TemplateRenderError
from ..generate.serving.model_folder import adapters_folder
from ..generate.serving.prompt import MAX_PROMPT_CHARS_PER_TOKEN, PromptDoor, PromptProblem, PromptRefused
from ..generate.serving.registry import GenerationRegistry, GenerativeVersion, check_adapter
from ..model import Model
from ..types import InferenceRequest
from . import responses
from .embedding_service import EmbeddingService
from .errors import OpenAIError, bad_request, from_engine, model_not_found
from .generation import Generation
from .protocol import ApiRequest
from .token_quotas import TokenQuotas, charge_waiting
from .tokenize import DetokenizeRequest, TokenizeRequest, tokenize_answer
from .tools import PARSERS
from .tools.calls import ToolCallParser
from .tools.forced import NamedCallParser, RequiredCallsParser
from .tools.request import ToolChoice
from .tools.strict import check_combination, strict_calls


class OpenAIService:
    """One per server, in the process that holds the repository and the engines."""

    def __init__(self, registry: GenerationRegistry, keys: tuple[ApiKey, ...] = (),
                 trust_request_chat_template: bool = False, embeddings: EmbeddingService | None = None
                 ) -> None:
        """`embeddings`: the embedding models' service (None: /v1/embeddings serves none, and /v1/models
        lists the generative models alone)."""
        self.registry = registry
        self.embeddings = embeddings
        # a request's own `chat_template` is user-supplied template code (sandboxed, yet code): served only
        # when the operator says so (--trust-request-chat-template), as vLLM's flag of that name
        self.trust_request_chat_template = trust_request_chat_template
        self.quotas = TokenQuotas(keys)
        self._created: dict[str, int] = {}

    # ------------------------------------------------------------------ models

    def list_models(self) -> dict[str, Any]:
        """Every generative model that serves, each followed by the LoRA adapters its folder declares, as
        `base:adapter` (what a request's `model` names to run with one); then the embedding models."""
        data = []
        for model in self.registry.models():
            data.append(self._object(model, None))
            data.extend(self._object(model, adapter) for adapter in _declared_adapters(model))
        if self.embeddings is not None:
            data.extend(self.embeddings.model_object(model) for model in self.embeddings.models())
        return {"object": "list", "data": data}

    def retrieve_model(self, name: str) -> dict[str, Any]:
        if self.embeddings is not None:
            embedder = next((m for m in self.embeddings.models() if m.name == name), None)
            if embedder is not None:
                return self.embeddings.model_object(embedder)
        base, colon, adapter = name.partition(":")
        try:
            model = self.registry.model(base)
        except EngineError as e:
            raise _model_error(name, e) from None
        if not colon:
            return self._object(model, None)
        if adapter not in _declared_adapters(model):
            raise model_not_found(name, f"model '{base}' has no LoRA adapter '{adapter}'")
        return self._object(model, adapter)

    def _object(self, model: Model, adapter: str | None) -> dict[str, Any]:
        version = self.registry.loaded(model)
        context = None if version is None else version.driver.engine.cache_config.max_model_len
        if adapter is None:
            return responses.model_object(model.name, self._created_at(model.name), model.name,
                                          max_model_len=context)
        name = f"{model.name}:{adapter}"
        return responses.model_object(name, self._created_at(name), _adapter_root(model, adapter), model.name,
                                      context)

    def _created_at(self, name: str) -> int:
        return self._created.setdefault(name, int(time.time()))

    def engines_alive(self) -> bool:
        """Every served generative version's engine thread runs (vLLM's /health)."""
        return all(driver.alive for driver in self.registry.drivers())

    # ------------------------------------------------------------------ generation

    async def start(self, api: ApiRequest, request_id: str, owner: str = "",
                    priority: Priority = Priority.INTERACTIVE) -> Generation:
        """The request's generation, submitted. OpenAIError for what the client must change (or a model not
        ready, or the key's tokens_per_minute spent: 429); the engine's events then flow into the returned
        Generation. `owner`: whose tokens_per_minute it draws from, the owner id of the request's key
        (HttpRequest.owner) or of the key that owns a Batch API job; "" for none. `priority`: BATCH for such
        offline jobs (batch/runner.py), which the scheduler serves last, and which wait for their key's
        minute (QuotaWait, nothing submitted) rather than be refused while it is spent.
        The request counts in its model version's Triton statistics from here (its queue time lasts
        until the hand-off to the engine: engine/generate/serving/accounting.py)."""
        received_ns = time.perf_counter_ns()
        version, adapter = await self._version(api.model)
        parser = _tool_parser(api, version)
        door = PromptDoor.of(version.driver.engine)
        prompts = self._prompts(api, door, version)
        params = self._params(api, door, version, max(len(p) for p in prompts), priority)
        if api.structured is not None:
            await self._compile(api.structured, version)
        strict = await self._strict_calls(api, version)
        if strict is not None:
            params = dataclasses.replace(params, structured=strict)
        if adapter:
            params = dataclasses.replace(params, lora=adapter)
        cost = sum(len(p) for p in prompts) + params.max_tokens * api.n * len(prompts)
        reservation = self.quotas.charge(owner, cost) if priority is not Priority.BATCH \
            else charge_waiting(self.quotas, owner, cost)
        model = version.model
        request = InferenceRequest(model.name, model.version_str, [], id=request_id)  # for its access line
        account = RequestAccount(model.stats, model.name, model.version_str, request, received_ns)
        gen = Generation(version.driver, request_id, prompts, api.n, params, account)
        gen.tool_parser, gen.parallel_tool_calls = parser, api.tools.parallel
        try:
            gen.start()
        except EngineError as e:
            if reservation is not None:
                reservation.settle(0)
            raise from_engine(e) from None
        if reservation is not None:  # settled with what it used, once every choice finished
            gen.done.add_done_callback(
                lambda _: reservation.settle(gen.prompt_tokens + gen.completion_tokens))
        return gen

    async def _version(self, name: str) -> tuple[GenerativeVersion, str]:
        """The version a request's `model` names, and the LoRA adapter it names (`base:adapter`; "" for
        none); OpenAIError for a model that does not exist, does not generate or is not ready."""
        base, _, adapter = name.partition(":")
        try:
            version = await self.registry.version(base)
            if adapter:
                check_adapter(version, adapter)
        except EngineError as e:
            raise _model_error(name, e) from None
        return version, adapter

    # ------------------------------------------------------------------ vLLM's /tokenize, /detokenize

    async def tokenize(self, request: TokenizeRequest) -> dict[str, Any]:
        """The prompt's token ids as a generation request with the same fields would have them: the same
        chat template and the same front door (`_prompts`), so what /tokenize counts is what the engine
        gets."""
        api = request.api
        version, _ = await self._version(api.model)
        door = PromptDoor.of(version.driver.engine)
        ids = self._prompts(api, door, version)[0]
        strs = [door.tokenizer.token_str(t) for t in ids] if request.return_token_strs else None
        return tokenize_answer(ids, door.context_tokens, strs)

    async def detokenize(self, request: DetokenizeRequest) -> dict[str, Any]:
        """The text of token ids, special tokens written as the tokenizer writes them (vLLM's)."""
        version, _ = await self._version(request.model)
        tokenizer = version.driver.engine.tokenizer
        outside = next((t for t in request.tokens if t >= tokenizer.vocab_size), None)
        if outside is not None:
            raise bad_request(f"Token id {outside} in 'tokens' is outside the model's vocabulary "
                              f"(0 - {tokenizer.vocab_size - 1}).", "tokens", "invalid_value")
        return {"prompt": tokenizer.decode(request.tokens, skip_special_tokens=False)}

    def answer(self, gen: Generation, api: ApiRequest, created: int) -> dict[str, Any]:
        """The JSON answer of a finished generation (it did not stream)."""
        if gen.error is not None:
            raise from_engine(gen.error)
        return responses.completion(gen, api.chat, api.model, created)

    def _prompts(self, api: ApiRequest, door: PromptDoor, version: GenerativeVersion) -> list[list[int]]:
        """Each prompt's token ids, through the generation APIs' front door (generate/serving/prompt.py).
        A chat is rendered by its template first; `add_special_tokens` defaults to false for chat (vLLM's
        default: the template writes the BOS), true for completions."""
        texts: tuple[str | tuple[int, ...], ...] = \
            (self._render(api, version, door.context_tokens),) if api.chat else api.prompts
        keep = door.context_tokens if api.truncate_prompt_tokens == -1 else api.truncate_prompt_tokens
        try:
            return [door.tokens(prompt, api.add_special_tokens, keep) for prompt in texts]
        except PromptRefused as e:
            raise _refusal(e, api) from None

    def _params(self, api: ApiRequest, door: PromptDoor, version: GenerativeVersion, prompt_tokens: int,
                priority: Priority) -> SamplingParams:
        try:
            max_tokens = door.budget(prompt_tokens, api.max_tokens)
        except PromptRefused as e:
            raise _refusal(e, api) from None
        template = version.chat.template
        stop = api.stop + (template.stop if api.chat and template is not None and api.chat_template is None
                           else ())
        try:
            params = SamplingParams(max_tokens=max_tokens, temperature=api.temperature, top_p=api.top_p,
                                    top_k=api.top_k, min_p=api.min_p,
                                    seed=None if api.seed is None else api.seed % 2**64,
                                    stop=tuple(dict.fromkeys(stop)),
                                    stop_token_ids=frozenset(api.stop_token_ids), ignore_eos=api.ignore_eos,
                                    min_tokens=api.min_tokens,
                                    include_stop_str_in_output=api.include_stop_str_in_output,
                                    skip_special_tokens=api.skip_special_tokens,
                                    presence_penalty=api.presence_penalty,
                                    frequency_penalty=api.frequency_penalty,
                                    repetition_penalty=api.repetition_penalty, logprobs=api.logprobs,
                                    priority=priority, structured=api.structured)
            return version.defaults.apply(params, api.unset)  # the folder's EOS ids and sampling defaults
        except EngineError as e:
            raise from_engine(e) from None

    @staticmethod
    async def _compile(spec: GrammarSpec, version: GenerativeVersion) -> None:
        """Compile a request's structured output spec (and keep it in the engine's cache) before it is
        submitted, off the event loop (a large grammar, or llguidance's set-up of a large vocabulary on a
        model's first structured request, takes up to a second): a 400 naming its field when it does not
        compile, so no request runs without the constraint it asked for."""
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, version.driver.engine.grammars.check, spec)
        except EngineError as e:
            raise bad_request(f"Invalid {e.message}", spec.param, "invalid_value") from None

    async def _strict_calls(self, api: ApiRequest, version: GenerativeVersion) -> GrammarSpec | None:
        """The grammar that enforces the strict tools under tool_choice auto (tools/strict.py), compiled:
        each strict function's schema first, so one that does not compile is a 400 naming its tool; None
        without a strict tool (nothing is compiled nor paid)."""
        if not api.tools.parses:
            return None
        parser = version.chat.tool_call_parser
        check_combination(api.tools, parser, api.structured)
        if api.structured is not None:  # a JSON answer, which holds no Hermes call (check_combination)
            return None
        strict = strict_calls(api.tools, parser, version.driver.engine.tokenizer)
        if strict is None:
            return None
        for schema in strict.schemas:
            await self._compile(schema, version)
        await self._compile(strict.grammar, version)
        return strict.grammar

    def _render(self, api: ApiRequest, version: GenerativeVersion, context_tokens: int) -> str:
        """The chat's prompt text, by the request's own template (when trusted) or the folder's: a 400
        when the model has none, or the template refuses the chat or fails on it (its own words); a
        rendered text past the prompt's character bound is a context error, found while it is written."""
        template: ChatTemplate | None = version.chat.template
        if api.chat_template is not None:
            if not self.trust_request_chat_template:
                raise bad_request("'chat_template' is not accepted by this server: it serves each model's "
                                  "own chat template (its operator may allow request templates with "
                                  "--trust-request-chat-template); leave it out.", "chat_template",
                                  "unsupported_parameter")
            try:
                template = JinjaTemplate(api.chat_template, version.chat.special_tokens, "request")
            except TemplateRenderError as e:
                raise bad_request(f"Invalid 'chat_template': {e}", "chat_template", "invalid_value") from None
        if template is None:
            raise bad_request(f"model {api.model} has no chat template; use /v1/completions or add "
                              "chat_template.jinja", "messages", "chat_template_missing")
        options = ChatOptions(api.add_generation_prompt, api.continue_final_message,
                              api.chat_template_kwargs or {}, list(api.tools.tools) or None,
                              api.message_fields)
        limit = MAX_PROMPT_CHARS_PER_TOKEN * context_tokens
        try:
            return render_chat(template, api.messages, options, limit)
        except TemplateRenderError as e:
            raise bad_request(f"The chat template refused the messages: {e}", "messages",
                              "chat_template_error") from None
        except RenderedTooLong:
            raise _context_error(context_tokens, f"a chat of more than {limit} characters once rendered",
                                 "messages") from None


def _tool_parser(api: ApiRequest, version: GenerativeVersion) -> Callable[[], ToolCallParser] | None:
    """How the request's answers are read for tool calls: for tool_choice auto the model folder's parser (a
    400 when it has none: an answer would be returned as text however it wrote calls); for required or a
    named function, the reader of the constrained form (tools/forced.py)."""
    if not api.tools.parses:
        return None
    if api.tools.named:  # the answer is constrained to the call (tools/forced.py)
        return functools.partial(NamedCallParser, api.tools.choice)
    if api.tools.choice == ToolChoice.REQUIRED:
        return RequiredCallsParser
    name = version.chat.tool_call_parser
    if not name:
        raise bad_request(f"model {api.model} does not say how it writes tool calls: its chat template shows "
                          "no known format and its config sets no 'tool_call_parser' parameter (hermes, "
                          "llama3_json); send tool_choice 'none' or leave 'tools' out.", "tools",
                          "unsupported_parameter")
    return PARSERS[name]


def _declared_adapters(model: Model) -> list[str]:
    """The adapters the model's folder holds (generate/core/lora.py `adapter_names`: a scan, nothing
    loaded)."""
    return adapter_names(adapters_folder(model.config, model.model_dir))


def _adapter_root(model: Model, adapter: str) -> str | None:
    """An adapter's folder inside the repository (`base/adapters/name`); None when `lora_adapters` points
    outside the model's folder: a server path is never shown."""
    folder = PurePosixPath(model.config.parameters.get("lora_adapters", "adapters")) / adapter
    if folder.is_absolute() or ".." in folder.parts:
        return None
    return f"{model.name}/{folder}"


def _refusal(refused: PromptRefused, api: ApiRequest) -> OpenAIError:
    """A prompt refused (generate/serving/prompt.py) in OpenAI's words, naming `messages` or `prompt`."""
    param = "messages" if api.chat else "prompt"
    limit, problem, value = refused.context_tokens, refused.problem, refused.value
    if problem is PromptProblem.TOO_LONG_TO_TOKENIZE:
        return _context_error(limit, f"a prompt of {value} characters", param)
    if problem is PromptProblem.TOKEN_OUTSIDE_VOCABULARY:
        return bad_request(f"Token id {value} in 'prompt' is outside the model's vocabulary "
                           f"(0 - {refused.vocab_size - 1}).", "prompt", "invalid_value")
    if problem is PromptProblem.EMPTY:
        return bad_request(f"The {param} is empty after tokenizing: send at least one token.", param)
    if problem is PromptProblem.NO_ROOM_FOR_COMPLETION:
        return _context_error(limit, f"{value} tokens in the {param}, leaving none for the completion", param)
    return _context_error(limit, f"{value + refused.max_tokens} tokens ({value} in the {param}, "
                                 f"{refused.max_tokens} in the completion)", param)


def _context_error(limit: int, requested: str, param: str) -> OpenAIError:
    return bad_request(f"This model's maximum context length is {limit} tokens. However, you requested "
                       f"{requested}. Please reduce the length of the {param} or completion.", param,
                       "context_length_exceeded")


def _model_error(name: str, error: EngineError) -> OpenAIError:
    if error.code is ErrorCode.NOT_FOUND:  # unknown (the repository's words add nothing), or not generative
        return model_not_found(name, "" if error.message.startswith("Request for unknown model") else
                               error.message)
    return from_engine(error, "model")
