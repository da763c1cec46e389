"""A model folder's `tokenizer.json` through `tokenizers` (engine/generate/core/tokenizer.py JsonTokenizer),
on a small word-level tokenizer written here with BOS and EOS as special tokens: vLLM's
`add_special_tokens` (the BOS its post-processor adds) and `skip_special_tokens` (special tokens written
in the text or left out), in `decode` and a token at a time as the engine shows text (detokenize.py); a
stop string that is a special token's text stops there (stopping.py); and on SentencePiece-style BPE
tokenizers trained here, the first generated word's leading space, decoded after the prompt's last tokens
as transformers' text of the answer (the whole decode minus the prompt's) has it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tokenizers
from tokenizers import decoders, normalizers, pre_tokenizers, trainers

from engine.generate.core.detokenize import OutputText, WindowDecoder
from engine.generate.core.request import FinishReason, Request, SamplingParams
from engine.generate.core.stopping import check_stop
from engine.generate.core.tokenizer import JsonTokenizer


def word_tokenizer(folder: Path) -> JsonTokenizer:
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from tokenizers.processors import TemplateProcessing

    tok = tokenizers.Tokenizer(WordLevel({"hello": 0, "world": 1, "<s>": 2, "</s>": 3}, unk_token="hello"))
    tok.pre_tokenizer = WhitespaceSplit()
    tok.add_special_tokens([tokenizers.AddedToken("<s>", special=True),
                            tokenizers.AddedToken("</s>", special=True)])
    tok.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 2)])
    tok.save(str(folder / "tokenizer.json"))
    return JsonTokenizer(folder / "tokenizer.json", "<s>", "</s>")


def test_add_special_tokens_false_leaves_out_the_bos(tmp_path: Path):
    tok = word_tokenizer(tmp_path)
    assert (tok.bos_token_id, tok.eos_token_id) == (2, 3)
    assert tok.encode("hello world") == [2, 0, 1]
    assert tok.encode("hello world", add_special_tokens=False) == [0, 1]


def test_skip_special_tokens_false_writes_them_in_the_text(tmp_path: Path):
    tok = word_tokenizer(tmp_path)
    ids = [0, 3, 1, 2]
    assert tok.decode(ids) == "hello world"
    assert tok.decode(ids, skip_special_tokens=False) == "hello </s> world <s>"
    for skip in (True, False):
        text = OutputText(tok.stream_decoder(skip), ())
        for token in ids:
            text.push(token)
        assert text.text() == tok.decode(ids, skip_special_tokens=skip)


def stop_run(tok: JsonTokenizer, ids: list[int],
             params: SamplingParams) -> tuple[FinishReason | None, str, int]:
    """check_stop after each of `ids`, the engine's way (the text made as engine.add_request makes it):
    (the reason it finished, its text, the tokens it took)."""
    special = {i: s for s in params.stop if (i := tok.special_token_id(s)) is not None}
    request = Request("r", [2], params, np.random.default_rng(0),
                      text=OutputText(tok.stream_decoder(params.skip_special_tokens), params.stop, special))
    for token in ids:
        request.output_token_ids.append(token)
        reason = check_stop(request, tok, 512)
        if reason is not None:
            return reason, request.output_text, len(request.output_token_ids)
    return None, request.text.text() if request.text else "", len(ids)


@pytest.mark.parametrize("skip", [True, False])
def test_a_stop_string_that_is_a_special_token_stops_there(tmp_path: Path, skip: bool):
    tok = word_tokenizer(tmp_path)
    assert (tok.special_token_id("</s>"), tok.special_token_id("hello")) == (3, None)
    ids = [0, 1, 3, 0, 1]  # "hello world </s> hello world"
    params = SamplingParams(max_tokens=10, stop=("</s>",), ignore_eos=True, skip_special_tokens=skip)
    assert stop_run(tok, ids, params) == (FinishReason.STOP, "hello world", 3)
    kept = SamplingParams(max_tokens=10, stop=("</s>",), ignore_eos=True, skip_special_tokens=skip,
                          include_stop_str_in_output=True)
    # the token's text as the decode writes it, or the stop string where it writes none
    want = "hello world</s>" if skip else "hello world </s>"
    assert stop_run(tok, ids, kept) == (FinishReason.STOP, want, 3)
    # a stop string that is no special token's text is still looked for in the text only
    assert stop_run(tok, ids, SamplingParams(max_tokens=10, stop=("<s>x",), ignore_eos=True))[0] is None


CORPUS = ["the cat will up keep the house", "keep it up", "the house of the cat", "up and up we keep going"]


def sentencepiece_bpe(folder: Path, style: str) -> JsonTokenizer:
    """A BPE tokenizer trained here whose words carry SentencePiece's "▁": `metaspace` (a Metaspace
    pre-tokenizer and decoder), or `llama` (Llama and Mistral's tokenizer.json: a normalizer prepending "▁",
    a decoder replacing it and stripping the text's first space, and byte-fallback tokens "<0x00>" …)."""
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>", byte_fallback=style == "llama"))
    if style == "metaspace":
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    else:
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    tok.train_from_iterator(CORPUS * 5, trainers.BpeTrainer(vocab_size=120,
                                                            special_tokens=["<unk>", "<s>", "</s>"]))
    if style == "llama":  # the byte tokens in the model's vocabulary, as a SentencePiece export has them (not
        # added tokens, which `tokenizers` 0.23 decodes as their names, past the ByteFallback decoder)
        doc = json.loads(tok.to_str())
        vocab = doc["model"]["vocab"]
        vocab.update({f"<0x{b:02X}>": len(vocab) + b for b in range(256)})
        tok = tokenizers.Tokenizer.from_str(json.dumps(doc))
    tok.save(str(folder / "tokenizer.json"))
    return JsonTokenizer(folder / "tokenizer.json", "<s>", "</s>")


@pytest.mark.parametrize("style", ["metaspace", "llama"])
def test_the_first_generated_word_keeps_its_leading_space(tmp_path: Path, style: str):
    tok = sentencepiece_bpe(tmp_path, style)
    prompt = tok.encode("the cat will", add_special_tokens=False)
    answer = tok.encode("up keep the house", add_special_tokens=False)
    assert tok.decode(answer) == "up keep the house"  # alone, the first word's space is dropped
    whole = tok.decode(prompt + answer)
    expected = whole[len(tok.decode(prompt)):]  # transformers' text of the answer, and vLLM's
    assert expected == " up keep the house"
    for tail in (prompt, prompt[-WindowDecoder.PROMPT_CONTEXT:], prompt[-1:]):
        text = OutputText(tok.stream_decoder(True, tail), ())
        for token in answer:
            text.push(token)
        assert text.text() == expected


def test_a_run_of_byte_tokens_is_decoded_as_one_as_the_whole_decode_does(tmp_path: Path):
    """`tokenizers` writes a run of byte-fallback tokens that is not UTF-8 as one U+FFFD per byte, ASCII
    bytes included: "<0x65>" alone is "e", but "<0x65><0x83><0xDA>" is "���". The run stays pending until a
    token of another kind ends it, and nothing pending is shown."""
    tok = sentencepiece_bpe(tmp_path, "llama")
    prompt = tok.encode("the cat will", add_special_tokens=False)
    vocab = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json")).get_vocab()
    run = [vocab[t] for t in ("<0x65>", "<0x83>", "<0xDA>")]
    up, keep = (tok.encode(word, add_special_tokens=False) for word in ("up", "keep"))
    answer = [*up, *run, *keep]
    expected = tok.decode(prompt + answer)[len(tok.decode(prompt)):]
    assert expected == " up��� keep" and tok.decode(run[:1]) == "e"
    text = OutputText(tok.stream_decoder(True, prompt), ())
    shown = ""
    for token in answer:
        text.push(token)
        shown += text.release(False, "")[0]
        assert expected.startswith(shown)
    assert text.text() == expected
