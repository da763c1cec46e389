"""When a request is done: after each token it generates, in this order (OpenAI's finish reasons).

1. the model's end-of-sequence token (unless `ignore_eos`) or one of the request's stop tokens → "stop",
   the text without that token's (with it under `include_stop_str_in_output`, as vLLM does);
2. a stop string in the decoded text → "stop", the text cut before it (after it with
   `include_stop_str_in_output`; the tokens stay as generated); a stop string that is a special token's
   text (Llama-3's "<|eot_id|>") stops at that token whether or not its text is written
   (`skip_special_tokens`), the text before it (with `include_stop_str_in_output`: and the token's text,
   or the stop string where skip_special_tokens wrote none);
3. `max_tokens` generated, or the model's context full → "length".

A structured request (grammar.py) also stops ("stop") on the token that completes its grammar, where
nothing may follow; its text keeps that token's. EOS or a stop token, which its grammar allows only where
the text may end, stops it as in 1. A grammar that failed (a per-step limit of llguidance's) ends its
request first of all, with "error" (the token drawn meanwhile is not shown): never a "stop" with a text
its grammar did not finish.

Called by the engine once for each token a request generates, in order: it adds the token to the request's
text (detokenize.py `OutputText`), so each call costs work bounded by the longest stop string, not the
output's length. Until more than `min_tokens` tokens are generated neither 1 nor 2 stops the request (vLLM's
min_tokens; the sampler keeps it from drawing a stop token meanwhile). The rest is pure apart from setting
the request's `output_text` once it finishes.
"""

from __future__ import annotations

from .request import FinishReason, Request
from .tokenizer import Tokenizer


def check_stop(request: Request, tokenizer: Tokenizer, max_model_len: int) -> FinishReason | None:
    params, last, text = request.params, request.output_token_ids[-1], request.text
    assert text is not None, "the engine makes a request's text when it adds the request"
    before = len(text)
    text.push(last)
    reason: FinishReason | None = None
    if request.grammar is not None and request.grammar.error is not None:  # failed: ends alone, with it
        request.output_text = text.text()[:before]
        return FinishReason.ERROR
    if request.grammar is not None and request.grammar.complete:  # matched in full: nothing may follow
        stopped = last == tokenizer.eos_token_id or last in params.stop_token_ids
        request.output_text = text.text()[:before] if stopped and not params.include_stop_str_in_output \
            else text.text()
        return FinishReason.STOP
    if params.min_tokens and len(request.output_token_ids) <= params.min_tokens:
        pass  # the sampler held the stop tokens; a stop string counts only past min_tokens, as in vLLM
    elif (last == tokenizer.eos_token_id and not params.ignore_eos) or last in params.stop_token_ids:
        request.output_text = text.text() if params.include_stop_str_in_output else text.text()[:before]
        return FinishReason.STOP
    elif (special := text.special_stop(last)) is not None:
        # kept under include_stop_str_in_output: its text as written, or the stop string where it wrote none
        whole = text.text()
        request.output_text = whole[:before] if not params.include_stop_str_in_output else \
            whole if len(whole) > before else whole + special
        return FinishReason.STOP
    elif (found := text.find_stop()) is not None:
        request.output_text = text.text()[:found[1] if params.include_stop_str_in_output else found[0]]
        return FinishReason.STOP
    if reason is None and (len(request.output_token_ids) >= params.max_tokens
                           or request.num_tokens >= max_model_len):
        reason = FinishReason.LENGTH
    if reason is not None:
        request.output_text = text.text()
    return reason
