"""engine/embed/folder.py: what an embedding model's folder says, read from real files in
sentence-transformers' layout, and the refusals naming the file or field at fault."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models

from conftest import config_from_pbtxt
from engine.embed.folder import is_embedding, load_folder
from engine.embed.pooling import Pooling
from engine.errors import EngineError, ErrorCode

CONFIG = """
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] },
        { name: "attention_mask" data_type: TYPE_INT64 dims: [ -1 ] } ]
output [ { name: "last_hidden_state" data_type: TYPE_FP32 dims: [ -1, 8 ] } ]
dynamic_batching { }
parameters { key: "embedding" value { string_value: "true" } }
"""


def folder(tmp_path: Path, **files: object) -> Path:
    Tokenizer(models.WordLevel({"[PAD]": 0, "[UNK]": 1, "hi": 2}, unk_token="[UNK]")).save(
        str(tmp_path / "tokenizer.json"))
    for name, doc in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc))
    return tmp_path


def test_defaults_without_sentence_transformers_files(tmp_path: Path):
    config = config_from_pbtxt(CONFIG, "e")
    assert is_embedding(config)
    got = load_folder(config, folder(tmp_path))
    assert (got.pooling, got.normalize, got.max_tokens, got.hidden_size) == (Pooling.MEAN, False, 512, 8)
    assert not got.type_ids and got.pad_id == 0 and got.max_batch_size == 4
    assert got.allows(8) and not got.allows(4)


def test_modules_pooling_context_and_matryoshka(tmp_path: Path):
    modules = [{"type": "sentence_transformers.models.Pooling", "path": "1_Pool"},
               {"type": "sentence_transformers.models.Normalize", "path": "2_Normalize"}]
    got = load_folder(config_from_pbtxt(CONFIG, "e"), folder(
        tmp_path, **{"modules.json": modules,
                                         "1_Pool/config.json": {"pooling_mode_lasttoken": True},
                                         "sentence_bert_config.json": {"max_seq_length": 128},
                                         "config.json": {"matryoshka_dimensions": [2, 4]}}))
    assert (got.pooling, got.normalize, got.max_tokens) == (Pooling.LAST, True, 128)
    assert got.allows(2) and got.allows(4) and got.allows(8) and not got.allows(3)


def test_config_parameters_win(tmp_path: Path):
    text = CONFIG + """parameters { key: "max_tokens" value { string_value: "16" } }
parameters { key: "matryoshka_dimensions" value { string_value: "any" } }"""
    files = {"config.json": {"is_matryoshka": False}}
    got = load_folder(config_from_pbtxt(text, "e"), folder(tmp_path, **files))
    assert got.max_tokens == 16 and got.allows(3) and not got.allows(9)


@pytest.mark.parametrize("files, words", [
    ({"1_Pooling/config.json": {"pooling_mode_max_tokens": True}}, "pooling_mode_max_tokens"),
    ({"1_Pooling/config.json": {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": True}},
     "exactly one"),
    ({"config.json": {"matryoshka_dimensions": [16]}}, "matryoshka_dimensions"),
])
def test_refusals_name_what_is_wrong(tmp_path: Path, files: dict, words: str):
    with pytest.raises(EngineError) as e:
        load_folder(config_from_pbtxt(CONFIG, "e"), folder(tmp_path, **files))
    assert e.value.code is ErrorCode.INVALID_ARG and words in e.value.message


def test_a_config_without_the_graphs_names_is_refused(tmp_path: Path):
    with pytest.raises(EngineError) as e:
        load_folder(config_from_pbtxt(CONFIG.replace("attention_mask", "mask"), "e"), folder(tmp_path))
    assert "attention_mask" in e.value.message
