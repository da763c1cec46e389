"""The config variants of `perf/bench_peers.py` (perf/peers/variants.py) and the repository hubserve serves
there (`repos.write_hubserve_repo`): the examples' configs as committed, and beside them each model with
`max_batch_size: 64` and a 1000 µs window, everything else as in the example; the peers' repositories are
generated from it, so Triton and MLServer see the same change. The last test serves the written repository
with the real server and reads the configs back over HTTP."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import tritonclient.http as httpclient

from conftest import EXAMPLES, start_server
from hubserve_models import examples
from peers import repos, servers, variants

MODELS = ["simple", "mlp", "image"]  # pbtxt with a window, YAML, and `dynamic_batching { }` (no window)
BOTH = [variants.EXAMPLES, variants.TUNED]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example configs of MODELS as committed, with their model files built (never model_repository/
    itself: other checkouts' runs read it)."""
    root = tmp_path_factory.mktemp("examples")
    for name in MODELS:
        (root / name).mkdir()
        for config in (EXAMPLES / name).glob("config.*"):
            shutil.copy(config, root / name / config.name)
    examples.build_repository(root, MODELS)
    return root


@pytest.fixture(scope="module")
def written(source: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    dst = tmp_path_factory.mktemp("hubserve_repo")
    return dst, repos.write_hubserve_repo(source, MODELS, BOTH, dst)


def test_each_model_is_served_once_per_variant_the_example_under_its_own_name(written) -> None:
    dst, names = written
    assert names == ["simple", "simple_tuned", "mlp", "mlp_tuned", "image", "image_tuned"]
    assert sorted(p.name for p in dst.iterdir()) == sorted(names)


def test_the_examples_variant_is_the_committed_file_as_it_is(source: Path, written) -> None:
    dst, _ = written
    for name in MODELS:
        (config,) = (source / name).glob("config.*")
        assert (dst / name / config.name).read_bytes() == config.read_bytes()
        model_file = Path(name, "1", "model.onnx")
        assert (dst / model_file).read_bytes() == (source / model_file).read_bytes()


def test_tuned_sets_max_batch_size_64_and_a_1000_us_window_and_nothing_else(source: Path, written) -> None:
    dst, _ = written
    for name in MODELS:
        example = repos.served_model(source, name).config
        tuned = repos.served_model(dst, f"{name}_tuned").config
        assert (tuned.name, tuned.max_batch_size) == (f"{name}_tuned", 64)
        assert tuned.dynamic_batching is not None and tuned.dynamic_batching.max_queue_delay_us == 1000
        assert example.dynamic_batching is not None  # all three batch in the examples, at their own window
        assert tuned.dynamic_batching.preferred_batch_sizes == example.dynamic_batching.preferred_batch_sizes
        for field in ("backend", "inputs", "outputs", "parameters", "version_policy"):
            assert getattr(tuned, field) == getattr(example, field), field
        # instance groups are named after their model when the config names none
        assert [replace(g, name="") for g in tuned.instance_groups] == [
            replace(g, name="") for g in example.instance_groups]


def test_the_peers_get_the_tuned_batching_too(written) -> None:
    dst, _ = written
    tuned = repos.served_model(dst, "image_tuned")  # its example's window is 0
    triton = repos.peer_config(tuned, "python", batching=True)
    assert (triton.max_batch_size, triton.dynamic_batching.max_queue_delay_microseconds) == (64, 1000)
    assert repos.mlserver_batching(tuned) == (64, 0.001)


def test_rewriting_with_fewer_variants_drops_the_other_folders(source: Path, tmp_path: Path) -> None:
    repos.write_hubserve_repo(source, ["simple"], BOTH, tmp_path)
    assert repos.write_hubserve_repo(source, ["simple"], [variants.TUNED], tmp_path) == ["simple_tuned"]
    assert [p.name for p in tmp_path.iterdir()] == ["simple_tuned"]


def test_extra_server_arguments_go_after_the_benchmarks_own() -> None:
    kind = servers.HUBSERVE.with_args(["--workers", "2"])
    command = kind.command(servers.Ports(1, 2, 3), ["simple"])
    assert command[:-2] == servers.HUBSERVE.command(servers.Ports(1, 2, 3), ["simple"])
    assert command[-2:] == ["--workers", "2"]


def test_hubserve_serves_the_written_repository_with_each_variants_config(written, tmp_path: Path) -> None:
    dst, names = written
    server = start_server(dst, tmp_path / "server.log", "--model-control-mode", "none")
    try:
        with httpclient.InferenceServerClient(server.http_url, network_timeout=30.0) as client:
            for name in names:
                assert client.is_model_ready(name), name
            tuned = client.get_model_config("simple_tuned")
            example = client.get_model_config("simple")
    finally:
        server.stop()
    window = "max_queue_delay_microseconds"
    assert (tuned["max_batch_size"], tuned["dynamic_batching"][window]) == (64, 1000)
    assert (example["max_batch_size"], example["dynamic_batching"][window]) == (8, 100)
