"""A served generative model's KV cache sized from a memory budget, and its engine placed by its instance
group (engine/generate/serving/kv_budget.py, device.py), on a real server started with
`--kv-cache-memory-bytes 4MiB`: the flag sizes a folder without its own setting, the parameter sizes one
that has it, `kv_num_blocks` still wins; each version's blocks, tokens and bytes are in the load log, its
config endpoint's parameters and the metrics; a budget too small for one sequence, and a group that wants a
GPU this machine does not have, fail the load UNAVAILABLE with the reason, the GPU one in the same words
as an ordinary ONNX model's. Explicit model control: the repository API loads each folder.

The folders are tiny_decoder's files (2 layers, 4 heads of 16, fp32: 1 KiB per token, 16 KiB per block of
16) with one setting changed each."""

from __future__ import annotations

import shutil
import urllib.request
from pathlib import Path

import pytest

from conftest import EXAMPLES, RunningServer, openai_client, start_server
from test_generate_load import call, copy_decoder, index
from test_openai_api import MODEL, build_repository

BLOCKS_LINE = 'parameters { key: "kv_num_blocks" value { string_value: "1024" } }'
CPU_GROUP = "instance_group [ { count: 1 kind: KIND_CPU } ]"
GPU_GROUP = "instance_group [ { count: 1 kind: KIND_GPU } ]"
BY_FLAG, BY_PARAMETER, TOO_SMALL, ON_GPU, SIMPLE_ON_GPU = \
    "by_flag", "by_parameter", "too_small", "decoder_on_gpu", "simple_on_gpu"


def edit(folder: Path, old: str, new: str) -> None:
    config = folder / "config.pbtxt"
    text = config.read_text()
    assert old in text
    config.write_text(text.replace(old, new))


def budget_line(size: str) -> str:
    return f'parameters {{ key: "kv_cache_memory_bytes" value {{ string_value: "{size}" }} }}'


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("kv_sizing")
    repo = build_repository(root / "repo")
    edit(copy_decoder(repo, BY_FLAG), BLOCKS_LINE, "")
    edit(copy_decoder(repo, BY_PARAMETER), BLOCKS_LINE, budget_line("1MiB"))
    edit(copy_decoder(repo, TOO_SMALL), BLOCKS_LINE, budget_line("64KiB"))
    edit(copy_decoder(repo, ON_GPU), CPU_GROUP, GPU_GROUP)
    shutil.copytree(repo / "simple", repo / SIMPLE_ON_GPU)
    simple = (EXAMPLES / "simple" / "config.pbtxt").read_text()
    assert "kind: KIND_CPU" in simple
    simple = simple.replace('name: "simple"', f'name: "{SIMPLE_ON_GPU}"')
    (repo / SIMPLE_ON_GPU / "config.pbtxt").write_text(simple.replace("kind: KIND_CPU", "kind: KIND_GPU"))
    running = start_server(repo, root / "server.log", "--model-control-mode", "explicit",
                           "--load-model", MODEL, "--kv-cache-memory-bytes", "4MiB",
                           env={"CUDA_VISIBLE_DEVICES": ""})
    yield running
    running.stop()


def shown_parameters(server: RunningServer, name: str) -> dict[str, str]:
    status, config = call(server, "GET", f"/v2/models/{name}/config")
    assert status == 200, config
    return {k: v["string_value"] for k, v in config["parameters"].items()}


def metrics_page(server: RunningServer) -> str:
    return urllib.request.urlopen(server.metrics_url, timeout=30).read().decode()


def metric(server: RunningServer, family: str, name: str) -> float:
    text = metrics_page(server)
    for line in text.splitlines():
        if line.startswith(f'{family}{{model="{name}",version="1"}} '):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {family} for {name} in:\n{text}")


@pytest.mark.parametrize(("name", "blocks", "budget", "sized_by"), [
    (MODEL, 1024, "kv_num_blocks", "kv_num_blocks"),
    (BY_FLAG, 256, "--kv-cache-memory-bytes budget 4 MiB", "--kv-cache-memory-bytes"),
    (BY_PARAMETER, 64, "kv_cache_memory_bytes budget 1 MiB", "kv_cache_memory_bytes"),
])
def test_each_version_is_sized_by_its_setting_and_says_so_everywhere(server: RunningServer, name: str,
                                                                     blocks: int, budget: str, sized_by: str):
    if name != MODEL:
        assert call(server, "POST", f"/v2/repository/models/{name}/load", {})[0] == 200
    tokens, nbytes = blocks * 16, blocks * 16 * 1024
    shown = shown_parameters(server, name)
    effective = {"kv_cache_blocks": str(blocks), "kv_cache_tokens": str(tokens),
                 "kv_cache_bytes": str(nbytes), "kv_cache_sized_by": sized_by}
    assert {k: shown[k] for k in effective} == effective
    # the folder's own parameters beside them, as it gave them
    assert (shown.get("kv_num_blocks"), shown.get("kv_cache_memory_bytes")) == \
        {MODEL: ("1024", None), BY_FLAG: (None, None), BY_PARAMETER: (None, "1MiB")}[name]
    assert metric(server, "hubserve_generation_kv_cache_capacity_tokens", name) == tokens
    assert metric(server, "hubserve_generation_kv_cache_bytes", name) == nbytes
    assert metric(server, "hubserve_generation_kv_blocks_free", name) == blocks
    assert (f'vllm:cache_config_info{{block_size="16",num_gpu_blocks="{blocks}",kv_cache_memory_bytes='
            f'"{nbytes}",model_name="{name}",engine="1"}} 1.0') in metrics_page(server).splitlines()
    assert (f"model {name} version 1: generation engine ready, load check passed ({blocks} KV blocks of 16 "
            f"tokens ({tokens} tokens, {nbytes >> 20} MiB; {budget}); dense KV; context 512; "
            "CPUExecutionProvider; chat template: ") in server.log()
    answer = openai_client(server).completions.create(model=name, prompt="hi", max_tokens=3)
    assert answer.usage is not None and answer.usage.completion_tokens == 3


def test_a_budget_too_small_for_one_sequence_fails_the_load_with_the_numbers(server: RunningServer):
    status, doc = call(server, "POST", f"/v2/repository/models/{TOO_SMALL}/load", {})
    reason = (f"model '{TOO_SMALL}' version 1 cannot generate: model '{TOO_SMALL}': its KV cache budget of "
              "64 KiB (65536 bytes, kv_cache_memory_bytes) holds 4 blocks of 16 tokens (64 tokens at 1024 "
              "bytes each), but one sequence of max_model_len 512 needs 32 blocks (512 KiB); raise the "
              "parameter kv_cache_memory_bytes, or lower max_model_len to 64 or less")
    assert status == 400 and reason in doc["error"], doc
    row = index(server)[TOO_SMALL]
    assert row["state"] == "UNAVAILABLE" and reason in row["reason"], row
    assert f"model {TOO_SMALL} version 1 UNAVAILABLE: {reason}" in server.log()


def test_a_gpu_group_without_a_gpu_fails_as_an_onnx_models_does(server: RunningServer):
    reasons = {}
    for name in (ON_GPU, SIMPLE_ON_GPU):
        status, doc = call(server, "POST", f"/v2/repository/models/{name}/load", {})
        row = index(server)[name]
        assert status == 400 and row["state"] == "UNAVAILABLE", (doc, row)
        reasons[name] = row["reason"]
    words = "instance group '{0}_0' wants a GPU, but none is visible; use kind KIND_CPU"
    assert reasons[ON_GPU].endswith(f"model '{ON_GPU}': {words.format(ON_GPU)}"), reasons
    assert reasons[SIMPLE_ON_GPU].endswith(f"model '{SIMPLE_ON_GPU}': {words.format(SIMPLE_ON_GPU)}"), reasons
