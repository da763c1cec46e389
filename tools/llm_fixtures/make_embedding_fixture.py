"""Build the embedding fixture under tests/fixtures/embeddings: a tiny random-weight BertModel with a
WordPiece tokenizer made from the fixture corpus, exported by Optimum's `feature-extraction` task, with
sentence-transformers' pooling files beside it, and the vectors torch gives for a set of texts.

Run in the fixture venv, never the project's (see README.md beside this):
    /work/fixvenv/bin/python tools/llm_fixtures/make_embedding_fixture.py --out tests/fixtures/embeddings

Writes models/bert_embed/ (model.onnx, config.json with `matryoshka_dimensions` added, the tokenizer files,
modules.json, 1_Pooling/config.json with mean pooling, 2_Normalize/, sentence_bert_config.json) and
expected/bert_embed.json: for each text its token ids, the mean-pooled last_hidden_state before the
normalization (`pooled`) and after it (`embedding`), computed by hand from transformers' BertModel output as
sentence-transformers' Pooling and Normalize modules compute them (sentence-transformers itself is not
installed here). Exits 1 if onnxruntime on the export gives other hidden states than torch (past
ONNX_TOLERANCE).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import fixture_export as fx
import fixture_tokenizers as ft
import numpy as np
import onnxruntime
import optimum.version
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import BertConfig, BertModel, BertTokenizerFast

REPO_ROOT = Path(__file__).resolve().parents[2]
NAME = "bert_embed"
SEED = 0
HIDDEN = 64
MAX_SEQ_LENGTH = 64
MATRYOSHKA = [16, 32]
ONNX_TOLERANCE = 1e-4  # the most onnxruntime's last_hidden_state may differ from torch's
TEXTS = [
    "Hello world!",
    "The quick brown fox jumps over the lazy dog.",
    "What is the capital of France?",
    "Licensed under the Apache License, Version 2.0.",
    "a zebra quietly",
    "Tell me a story about a dragon who learned to read, and name a colour, a number and an animal.",
]


def tokenizer(lines: list[str]) -> BertTokenizerFast:
    """A WordPiece vocabulary made from `lines` without training (WordPiece's trainer picks among tied merges
    differently from run to run): the specials, every word of the corpus, and each of its characters alone
    and as a `##` continuation, so any other word of those characters splits into pieces."""
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    normalizer, splitter = normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()
    words = {w for line in lines for w, _ in splitter.pre_tokenize_str(normalizer.normalize_str(line))}
    chars = {c for w in words for c in w}
    learned = sorted(words | chars | {f"##{c}" for c in chars})
    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(specials + learned)}, unk_token="[UNK]"))
    tok.normalizer = normalizer
    tok.pre_tokenizer = splitter
    tok.decoder = decoders.WordPiece()
    cls, sep = specials.index("[CLS]"), specials.index("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return BertTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                             sep_token="[SEP]", mask_token="[MASK]", model_max_length=MAX_SEQ_LENGTH)


def sentence_transformers_files(folder: Path) -> None:
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules, indent=2) + "\n")
    (folder / "1_Pooling").mkdir()
    pooling = {"word_embedding_dimension": HIDDEN, "pooling_mode_cls_token": False,
               "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
               "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False,
               "pooling_mode_lasttoken": False, "include_prompt": True}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=2) + "\n")
    (folder / "2_Normalize").mkdir()
    (folder / "2_Normalize" / ".keep").write_text("")  # an empty module folder, kept by git
    (folder / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": MAX_SEQ_LENGTH, "do_lower_case": False}, indent=2) + "\n")
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    config["matryoshka_dimensions"] = MATRYOSHKA
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    out = parser.parse_args().out
    tok = tokenizer(ft.corpus_lines(REPO_ROOT))
    config = BertConfig(vocab_size=len(tok), hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=128, initializer_range=0.5)
    torch.manual_seed(SEED)
    model = BertModel(config, add_pooling_layer=False).eval()
    target = out / "models" / NAME
    shutil.rmtree(target, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "source"
        model.save_pretrained(source)
        tok.save_pretrained(source)
        from optimum.exporters.onnx import main_export

        main_export(model_name_or_path=str(source), output=str(target), task="feature-extraction",
                    device="cpu", do_validation=False)
    fx.fold_external_data(target / "model.onnx")
    sentence_transformers_files(target)

    session = onnxruntime.InferenceSession(str(target / "model.onnx"))
    names = {i.name for i in session.get_inputs()}
    records, worst = [], 0.0
    for text in TEXTS:
        enc = tok(text, return_tensors="pt")
        with torch.no_grad():
            hidden = model(**enc).last_hidden_state[0].double()
        mask = enc["attention_mask"][0].double()[:, None]
        pooled = (hidden * mask).sum(0) / mask.sum()
        embedding = pooled / pooled.norm()
        feeds = {k: v.numpy() for k, v in enc.items() if k in names}
        onnx_hidden = session.run(["last_hidden_state"], feeds)[0][0]
        worst = max(worst, float(np.abs(onnx_hidden - hidden.numpy()).max()))
        records.append({"text": text, "ids": enc["input_ids"][0].tolist(), "pooled": pooled.tolist(),
                        "embedding": embedding.tolist()})
    versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                "optimum": optimum.version.__version__, "onnxruntime": onnxruntime.__version__}
    expected = {"model": NAME, "seed": SEED, "hidden_size": HIDDEN, "max_seq_length": MAX_SEQ_LENGTH,
                "matryoshka_dimensions": MATRYOSHKA, "inputs": sorted(names), "pooling": "mean_tokens",
                "normalize": True, "versions": versions, "onnx_checked_to": ONNX_TOLERANCE, "texts": records}
    (out / "expected").mkdir(parents=True, exist_ok=True)
    (out / "expected" / f"{NAME}.json").write_text(json.dumps(expected, indent=1) + "\n")
    print(f"{NAME}: onnxruntime vs torch last_hidden_state max abs diff {worst:.2e}")
    return 0 if worst < ONNX_TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
