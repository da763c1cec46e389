"""Small real tokenizers, trained with `tokenizers` on a fixed corpus, saved as real model folders ship them.

Called by make_fixtures.py once per family. Each builder returns a transformers fast tokenizer whose
save_pretrained() writes tokenizer.json, tokenizer_config.json and special_tokens_map.json; the trained
vocabulary depends only on the corpus text and the vocabulary size, so a rerun writes the same files.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaTokenizerFast, PreTrainedTokenizerFast, Qwen2TokenizerFast

# The corpus: the repository's LICENSE (Apache-2.0 text, which does not change as the code does), plus a few
# fixed lines so that common English words of the test prompts get merges of their own. Non-ASCII text is left
# out on purpose: it then reaches the byte-level alphabet or the byte fallback, as rare scripts do in real
# tokenizers.
_EXTRA_LINES = (
    "The quick brown fox jumps over the lazy dog.",
    "Hello world! How are you today? I am fine, thank you.",
    "You are a helpful assistant. Answer the question in one short sentence.",
    "What is the capital of France? Paris is the capital of France.",
    "Tell me a story about a dragon who learned to read.",
    "Name a colour, a number and an animal.",
)


def corpus_lines(repo_root: Path) -> list[str]:
    """Return the training text, one line per entry, in a fixed order."""
    license_text = (repo_root / "LICENSE").read_text(encoding="utf-8")
    lines = [line.strip() for line in license_text.splitlines() if line.strip()]
    return lines + list(_EXTRA_LINES)


def _train_byte_level(lines: list[str], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer)
    return tok


def gpt2_tokenizer(lines: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """GPT-2: byte-level BPE, `<|endoftext|>` last in the vocabulary as BOS, EOS and UNK; nothing added."""
    tok = _train_byte_level(lines, vocab_size)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens(["<|endoftext|>"])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        model_max_length=128,
        clean_up_tokenization_spaces=False,
    )


LLAMA3_SPECIALS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
)


def llama3_tokenizer(lines: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Llama-3: byte-level BPE, specials after the vocabulary, the post-processor adds `<|begin_of_text|>`."""
    tok = _train_byte_level(lines, vocab_size)
    tok.add_special_tokens(list(LLAMA3_SPECIALS))
    bos = "<|begin_of_text|>"
    bos_id = tok.token_to_id(bos)
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1", special_tokens=[(bos, bos_id)]
            ),
        ]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=bos,
        eos_token="<|end_of_text|>",
        model_max_length=256,
        clean_up_tokenization_spaces=True,
    )


QWEN2_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def qwen2_tokenizer(lines: list[str], vocab_size: int) -> Qwen2TokenizerFast:
    """Qwen2: byte-level BPE with the ChatML specials after the vocabulary; no BOS, `<|im_end|>` as EOS."""
    tok = _train_byte_level(lines, vocab_size)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens(list(QWEN2_SPECIALS))
    return Qwen2TokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        model_max_length=1024,  # the model's context: the tool chats' prompts are over 500 tokens
        clean_up_tokenization_spaces=False,
    )


SPM_SPECIALS = ("<unk>", "<s>", "</s>")


def spm_tokenizer(lines: list[str], vocab_size: int) -> LlamaTokenizerFast:
    """Llama-2/Mistral: Metaspace "▁" pre-tokenizer, byte-fallback BPE, `<s>` added by the post-processor.

    The vocabulary is laid out as a converted SentencePiece model's is: `<unk>`, `<s>`, `</s>`, then the 256
    byte pieces `<0x00>`..`<0xFF>`, then the trained pieces; a character not in it is spelled in bytes.
    """
    metaspace = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    trained = Tokenizer(models.BPE(unk_token="<unk>"))
    trained.pre_tokenizer = metaspace
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(SPM_SPECIALS) - 256, limit_alphabet=100, show_progress=False
    )
    trained.train_from_iterator(lines, trainer)
    model_json = json.loads(trained.to_str())["model"]
    vocab: dict[str, int] = {name: i for i, name in enumerate(SPM_SPECIALS)}
    for byte in range(256):
        vocab[f"<0x{byte:02X}>"] = len(vocab)
    for piece, _ in sorted(model_json["vocab"].items(), key=lambda item: item[1]):
        if piece not in vocab:
            vocab[piece] = len(vocab)
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model_json["merges"]]
    tok = Tokenizer(
        models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True)
    )
    tok.pre_tokenizer = metaspace
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.add_special_tokens(list(SPM_SPECIALS))
    tok.post_processor = processors.TemplateProcessing(
        single="<s>:0 $A:0", pair="<s>:0 $A:0 <s>:1 $B:1", special_tokens=[("<s>", 1)]
    )
    return LlamaTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        add_bos_token=True,
        add_eos_token=False,
        legacy=False,
        model_max_length=256,
        clean_up_tokenization_spaces=False,
    )
