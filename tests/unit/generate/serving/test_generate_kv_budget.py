"""The KV cache's block count from a memory budget (engine/generate/serving/kv_budget.py): sizes as the flag
and the parameter take them, the order of the settings, the default's share and caps, the refusal of a
budget that cannot hold one sequence, and what the machine says it has left. Pure: the shapes are numbers,
the available memory is passed in (or read from files written here); and one real build of the example
folder without a setting, and the fixture exports' shapes read from their graphs."""

from __future__ import annotations

from pathlib import Path

import onnxruntime as ort
import pytest
from hf_exports import optimum_folder

from conftest import EXAMPLES, ROOT, config_from_pbtxt
from engine.errors import EngineError, ErrorCode
from engine.generate.core.decoder_model import DecoderModel
from engine.generate.serving.kv_budget import (
    DEFAULT_CAP_BYTES,
    GiB,
    KVShape,
    SizedBy,
    available_memory_bytes,
    parse_bytes,
    show_parameters,
    size_for_model,
    size_kv_cache,
)
from engine.generate.serving.model_folder import load_engine
from hubserve_models import examples

TINY = KVShape(layers=2, kv_heads=4, head_dim=16, dtype_bytes=4)  # the example tiny_decoder, fp32
LLAMA3_8B_FP32 = KVShape(layers=32, kv_heads=8, head_dim=128, dtype_bytes=4)  # GQA: 8 KV heads of 128
LLAMA3_8B_FP16 = KVShape(layers=32, kv_heads=8, head_dim=128, dtype_bytes=2)


@pytest.mark.parametrize(("text", "count"), [
    ("536870912", 512 << 20), ("512MiB", 512 << 20), ("512mib", 512 << 20), ("512Mi", 512 << 20),
    ("2GB", 2 * 10**9), ("2G", 2 * 10**9), ("1.5GiB", 3 * GiB // 2), ("16 KiB", 16384), ("512B", 512),
])
def test_sizes_are_bytes_or_an_si_or_iec_unit(text: str, count: int):
    assert parse_bytes(text) == count


@pytest.mark.parametrize("text", ["", "lots", "-1", "0", "0MiB", "1e9", "2 GiBs", "GiB"])
def test_a_size_that_is_none_of_those_is_refused_with_the_forms_taken(text: str):
    with pytest.raises(ValueError, match="expected a size"):
        parse_bytes(text)


def test_bytes_per_block_follow_the_kv_shape():
    assert TINY.bytes_per_token == 2 * 2 * 4 * 16 * 4 == 1024
    assert LLAMA3_8B_FP32.bytes_per_block(16) == 32 * 2 * 8 * 128 * 4 * 16 == 4 << 20
    # what issue 29 measured: the old default of 1024 such blocks, whatever the machine had
    assert 1024 * LLAMA3_8B_FP32.bytes_per_block(16) == 4 * GiB  # 4.3 GB


def test_an_8b_shape_under_the_default_budget_gets_a_share_of_the_memory_not_4_gib_regardless():
    # issue 29's case, fp32 at 512-token contexts: a quarter of what is left, and never more than 2 GiB
    small = size_kv_cache(LLAMA3_8B_FP32, 16, 512, 32, available_bytes=6 * GiB)
    assert small.sized_by is SizedBy.DEFAULT and small.budget_bytes == 6 * GiB // 4
    assert small.num_blocks == 384 and small.tokens == 6144 and small.nbytes == 1536 << 20  # 1.5 GiB
    big = size_kv_cache(LLAMA3_8B_FP32, 16, 512, 32, available_bytes=64 * GiB)
    assert big.budget_bytes == DEFAULT_CAP_BYTES == 2 * GiB and big.num_blocks == 512  # was 1024, 4.3 GB
    assert big.tokens == 8192 and big.nbytes == 2 * GiB
    # a real Llama-3-8B export: fp16, 8192 positions: two whole contexts
    export = size_kv_cache(LLAMA3_8B_FP16, 16, 8192, 32, available_bytes=64 * GiB)
    assert export.num_blocks == 1024 and export.tokens == 2 * 8192 and export.nbytes == 2 * GiB
    # a machine with little left after the weights: one context still fits, or the load says why not
    assert size_kv_cache(LLAMA3_8B_FP16, 16, 8192, 32, available_bytes=6 * GiB).tokens == 12288
    with pytest.raises(EngineError, match="lower max_model_len to 4096 or less"):
        size_kv_cache(LLAMA3_8B_FP16, 16, 8192, 32, available_bytes=2 * GiB)


def test_the_default_stops_at_what_max_num_seqs_full_sequences_hold():
    sizing = size_kv_cache(TINY, 16, 512, 32, available_bytes=16 * GiB)
    assert sizing.num_blocks == 32 * 512 // 16 == 1024  # the old fixed default, 16 MiB
    assert sizing.nbytes == 16 << 20 and sizing.budget_bytes == DEFAULT_CAP_BYTES
    assert sizing.describe() == ("1024 KV blocks of 16 tokens (16384 tokens, 16 MiB; default budget 2.0 GiB, "
                                 "no more than max_num_seqs sequences of max_model_len fill)")
    assert size_kv_cache(TINY, 16, 128, 8, available_bytes=16 * GiB).num_blocks == 64


def test_a_machine_that_does_not_say_gets_a_quarter_of_the_cap():
    sizing = size_kv_cache(LLAMA3_8B_FP16, 16, 4096, 32, available_bytes=None)
    assert sizing.budget_bytes == DEFAULT_CAP_BYTES // 4 and sizing.num_blocks == 256


def test_kv_num_blocks_wins_then_the_parameter_then_the_flag():
    both = dict(parameter_bytes=1 << 20, flag_bytes=2 << 20, available_bytes=GiB)
    given = size_kv_cache(TINY, 16, 512, 32, num_blocks=7, **both)  # type: ignore[arg-type]
    assert (given.num_blocks, given.sized_by, given.budget_bytes) == (7, SizedBy.BLOCKS, 0)
    parameter = size_kv_cache(TINY, 16, 512, 32, **both)  # type: ignore[arg-type]
    assert (parameter.num_blocks, parameter.sized_by) == (64, SizedBy.PARAMETER)
    flag = size_kv_cache(TINY, 16, 512, 32, flag_bytes=2 << 20, available_bytes=GiB)
    assert (flag.num_blocks, flag.sized_by, flag.budget_bytes) == (128, SizedBy.FLAG, 2 << 20)


def test_an_explicit_budget_is_used_whole_past_what_the_sequences_fill():
    assert size_kv_cache(TINY, 16, 512, 2, parameter_bytes=64 << 20).num_blocks == 4096


@pytest.mark.parametrize(("kwargs", "source", "advice"), [
    ({"parameter_bytes": 64 << 10}, "kv_cache_memory_bytes)", "raise the parameter kv_cache_memory_bytes"),
    ({"flag_bytes": 64 << 10}, "--kv-cache-memory-bytes)",
      "raise --kv-cache-memory-bytes or give the model kv_cache_memory_bytes"),
    ({"available_bytes": 256 << 10}, "default)", "free memory, or give kv_cache_memory_bytes"),
])
def test_a_budget_too_small_for_one_sequence_fails_with_the_numbers(kwargs: dict, source: str, advice: str):
    with pytest.raises(EngineError) as caught:
        size_kv_cache(TINY, 16, 512, 32, where="model 'm'", **kwargs)
    assert caught.value.code is ErrorCode.UNAVAILABLE
    message = caught.value.message
    assert message.startswith("model 'm': its KV cache budget of 64 KiB (65536 bytes, "), message
    assert f"{source} holds 4 blocks of 16 tokens (64 tokens at 1024 bytes each), but one sequence of " \
           f"max_model_len 512 needs 32 blocks (512 KiB); {advice}, or lower max_model_len to 64 or less" \
           in message, message


def test_the_parameters_of_a_config_are_read_and_checked():
    params = {"kv_cache_memory_bytes": "1MiB"}
    sizing = size_for_model(TINY, params, 16, 512, 32, None, "model 'm'")
    assert (sizing.num_blocks, sizing.sized_by) == (64, SizedBy.PARAMETER)
    assert size_for_model(TINY, {**params, "kv_num_blocks": "9"}, 16, 512, 32, None, "m").num_blocks == 9
    for key, value, words in (("kv_cache_memory_bytes", "much", "parameter kv_cache_memory_bytes: expected"),
                              ("kv_num_blocks", "0", "parameter kv_num_blocks must be a positive integer")):
        with pytest.raises(EngineError) as caught:
            size_for_model(TINY, {key: value}, 16, 512, 32, None, "model 'm'")
        assert caught.value.code is ErrorCode.INVALID_ARG and f"model 'm': {words}" in caught.value.message


def test_the_effective_values_are_shown_beside_the_folders_parameters():
    generation = 'parameters { key: "generation" value { string_value: "decoder_with_past" } }\n'
    config = config_from_pbtxt('backend: "onnxruntime"\n' + generation +
                               'input [{ name: "x" data_type: TYPE_FP32 dims: [1] }]\n'
                               'output [{ name: "y" data_type: TYPE_FP32 dims: [1] }]')
    sizing = size_kv_cache(TINY, 16, 512, 32, flag_bytes=1 << 20)
    shown = show_parameters(config, sizing.parameters())
    printed = {k: v["string_value"] for k, v in shown.as_json()["parameters"].items()}
    assert printed == {"generation": "decoder_with_past", "kv_cache_blocks": "64", "kv_cache_tokens": "1024",
                       "kv_cache_bytes": str(1 << 20), "kv_cache_sized_by": "--kv-cache-memory-bytes"}
    assert dict(shown.parameters) == {"generation": "decoder_with_past"}  # what the engine reads: unchanged


def test_available_memory_is_memavailable_or_the_cgroups_room_whichever_is_less(tmp_path: Path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:    8000000 kB\n")
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    assert available_memory_bytes(meminfo, cgroup) == 8_000_000 * 1024  # no cgroup files: not limited
    (cgroup / "memory.max").write_text("max\n")
    (cgroup / "memory.current").write_text("1000\n")
    assert available_memory_bytes(meminfo, cgroup) == 8_000_000 * 1024
    (cgroup / "memory.max").write_text(f"{2 * GiB}\n")
    (cgroup / "memory.current").write_text(f"{GiB // 2}\n")
    assert available_memory_bytes(meminfo, cgroup) == 3 * GiB // 2


def test_a_folder_without_a_setting_is_sized_by_the_default_from_its_graphs_shape(tmp_path: Path):
    folder = tmp_path / "tiny_decoder"
    folder.mkdir()
    config = (EXAMPLES / "tiny_decoder" / "config.pbtxt").read_text()
    blocks_line = 'parameters { key: "kv_num_blocks" value { string_value: "1024" } }'
    assert blocks_line in config
    seqs = 'key: "max_num_seqs" value { string_value: "%s" }'
    (folder / "config.pbtxt").write_text(config.replace(blocks_line, "").replace(seqs % 32, seqs % 4))
    examples.build_repository(tmp_path, ["tiny_decoder"])
    engine = load_engine(folder)
    cache = engine.cache_config
    assert (cache.num_blocks, cache.sized_by) == (4 * 512 // 16, "default")  # 4 sequences of 512 tokens
    assert 0 < cache.budget_bytes <= DEFAULT_CAP_BYTES
    assert engine.runner.blocks.nbytes == 128 * 16 * TINY.bytes_per_token  # what the graph's shape costs


FIXTURES = ROOT / "tests" / "fixtures" / "llm" / "models"


@pytest.mark.parametrize(("name", "shape", "context", "blocks"), [
    ("gpt2", KVShape(2, 4, 16, 4), 128, 256),
    ("llama", KVShape(2, 2, 16, 4), 256, 512),  # GQA: 2 KV heads for 4 query heads
    ("llama_spm", KVShape(2, 4, 16, 4), 256, 512),
    ("qwen2", KVShape(2, 2, 16, 4), 1024, 2048),  # a context long enough for a tools prompt
    ("llama_genai", KVShape(2, 2, 16, 4), 256, 512),  # the builder's shared past and present
])
def test_the_real_exports_kv_shapes_are_read_from_their_graphs(name: str, shape: KVShape, context: int,
                                                              blocks: int):
    decoder = DecoderModel(FIXTURES / name / "model.onnx", ort.SessionOptions(), ["CPUExecutionProvider"],
                           f"model '{name}'", shared_kv=name.endswith("genai"))
    assert KVShape.of(decoder) == shape
    sizing = size_kv_cache(shape, 16, context, 32, available_bytes=16 * GiB)  # the default, docs' table
    assert (sizing.num_blocks, sizing.nbytes) == (blocks, blocks * 16 * shape.bytes_per_token)


def test_a_hugging_face_folders_own_context_is_cut_to_its_budget_but_a_configs_is_refused(tmp_path: Path):
    folder = optimum_folder(tmp_path / "gpt2ish")  # config.json's 128 positions, 1 KiB per token
    budget = 'parameters { key: "kv_cache_memory_bytes" value { string_value: "64KiB" } }\n'
    (folder / "config.pbtxt").write_text(budget)
    cache = load_engine(folder).cache_config
    assert (cache.num_blocks, cache.max_model_len, cache.sized_by) == (4, 64, "kv_cache_memory_bytes")
    context = 'parameters { key: "max_model_len" value { string_value: "100" } }\n'
    (folder / "config.pbtxt").write_text(budget + context)
    with pytest.raises(EngineError, match="one sequence of max_model_len 100 needs 7 blocks .*lower "
                                          "max_model_len to 64 or less"):
        load_engine(folder)
