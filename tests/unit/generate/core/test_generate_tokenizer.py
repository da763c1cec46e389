"""A model folder's `tokenizer.json` through `tokenizers` (engine/generate/core/tokenizer.py JsonTokenizer),
on a small word-level tokenizer written here with BOS and EOS as special tokens: vLLM's
`add_special_tokens` (the BOS its post-processor adds) and `skip_special_tokens` (special tokens written
in the text or left out), in `decode` and a token at a time as the engine shows text (detokenize.py)."""

from __future__ import annotations

from pathlib import Path

import tokenizers

from engine.generate.core.detokenize import OutputText
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
