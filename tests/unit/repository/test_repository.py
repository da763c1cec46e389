"""ModelRepository in-process, with identity-backend models in a tmp folder: which versions a reload rebuilds,
what a failed reload keeps, what loading API files leaves behind, and that unloaded versions are freed."""

from __future__ import annotations

import gc
import tempfile
from pathlib import Path

import pytest

from conftest import run_repository
from engine.errors import EngineError, ErrorCode
from engine.model import Model, ModelState
from engine.repository.lifecycle import ModelRepository
from engine.repository.overrides import PREFIX

CONFIG = ('backend: "identity"\nmax_batch_size: 4\nversion_policy: { all { } }\n'
          'input { name: "INPUT0" data_type: TYPE_INT32 dims: [ 2 ] }\n'
          'output { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 2 ] }\n')
FAILING_WARMUP = ('parameters { key: "fail_on_value" value: { string_value: "0" } }\n'
                  'model_warmup { name: "zeros" inputs { key: "INPUT0" value: '
                  '{ data_type: TYPE_INT32 dims: [ 2 ] zero_data: true } } }\n')


def make_model(root: Path, name: str, versions: tuple[int, ...], config: str = CONFIG) -> Path:
    folder = root / name
    for v in versions:
        (folder / str(v)).mkdir(parents=True, exist_ok=True)
        (folder / str(v) / "model.txt").write_text(f"version {v}")
    (folder / "config.pbtxt").write_text(config)
    return folder


def serving(repo: ModelRepository, name: str) -> dict[int, object]:
    return {m.version: m for m in repo.loaded_models() if m.name == name}


def test_a_reload_rebuilds_only_what_changed(tmp_path: Path):
    folder = make_model(tmp_path, "m", (1, 2))

    async def test(repo: ModelRepository) -> None:
        await repo.load("m")
        first = serving(repo, "m")
        assert sorted(first) == [1, 2]
        (folder / "3").mkdir()
        (folder / "3" / "model.txt").write_text("version 3")
        await repo.load("m")  # an explicit load of a loaded model picks up the new version folder
        second = serving(repo, "m")
        assert sorted(second) == [1, 2, 3]
        assert second[1] is first[1] and second[2] is first[2]  # unchanged: kept, not rebuilt
        (folder / "2" / "model.txt").write_text("version 2, retrained")
        await repo.load("m")
        third = serving(repo, "m")
        assert third[1] is first[1] and third[2] is not first[2] and third[3] is second[3]
        assert first[2].state is ModelState.UNLOADING  # retired once the new one was ready
        (folder / "config.pbtxt").write_text(CONFIG.replace("max_batch_size: 4", "max_batch_size: 2"))
        await repo.load("m")  # a changed config rebuilds every version
        assert not set(map(id, serving(repo, "m").values())) & set(map(id, third.values()))
        assert all(m.config.max_batch_size == 2 for m in serving(repo, "m").values())

    run_repository(test, tmp_path)


def test_a_removed_version_is_retired(tmp_path: Path):
    folder = make_model(tmp_path, "m", (1, 2))

    async def test(repo: ModelRepository) -> None:
        await repo.load("m")
        old = serving(repo, "m")[2]
        for path in (folder / "2").iterdir():
            path.unlink()
        (folder / "2").rmdir()
        await repo.load("m")
        assert sorted(serving(repo, "m")) == [1] and old.state is ModelState.UNLOADING
        # Listed as Triton lists it:
        assert [(e.version, e.state, e.reason) for e in repo.index()] == \
            [("1", ModelState.READY, ""), ("2", ModelState.UNAVAILABLE, "unloaded")]

    run_repository(test, tmp_path)


def test_a_failed_reload_keeps_every_version_that_served(tmp_path: Path):
    folder = make_model(tmp_path, "m", (1,), CONFIG.replace("version_policy: { all { } }", ""))

    async def test(repo: ModelRepository) -> None:
        await repo.load("m")
        v1 = repo.get("m")
        (folder / "2").mkdir()
        (folder / "2" / "model.txt").write_text("version 2")
        (folder / "config.pbtxt").write_text(folder.joinpath("config.pbtxt").read_text() + FAILING_WARMUP)
        await repo.load("m")  # version 2 (latest) fails its warm-up; version 1 must keep serving
        assert repo.get("m") is v1 and v1.state is ModelState.READY
        rows = {e.version: e for e in repo.index()}
        assert rows["1"].state is ModelState.READY
        assert rows["2"].state is ModelState.UNAVAILABLE
        assert rows["2"].reason == "warm-up 'zeros' failed: identity backend: input contains 0"
        with pytest.raises(EngineError) as e:
            repo.get("m", "2")
        assert e.value.code is ErrorCode.UNAVAILABLE and "warm-up 'zeros' failed" in e.value.message

    run_repository(test, tmp_path)


def test_files_from_the_api_are_loaded_and_not_left_behind(tmp_path: Path):
    before = {p.name for p in Path(tempfile.gettempdir()).glob(f"{PREFIX}*")}
    config = {"backend": "identity", "max_batch_size": 4,
              "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [2]}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [2]}]}

    async def test(repo: ModelRepository) -> None:
        await repo.load("sent", config, {"1/model.txt": b"x", "2/model.txt": b"y"})
        assert sorted(serving(repo, "sent")) == [2]  # default policy: the latest version
        assert "sent" in {e.name for e in repo.index()}  # known, though the repository has no such folder
        with pytest.raises(EngineError, match="needs the 'config' parameter"):
            await repo.load("sent", None, {"1/model.txt": b"x"})
        with pytest.raises(EngineError, match="inside the model folder"):
            await repo.load("sent", config, {"../1/model.txt": b"x"})
        await repo.unload("sent")
        assert "sent" not in {e.name for e in repo.index()}

    run_repository(test, tmp_path)
    assert {p.name for p in Path(tempfile.gettempdir()).glob(f"{PREFIX}*")} == before


def test_unloaded_and_replaced_versions_are_freed(tmp_path: Path):
    folder = make_model(tmp_path, "m", (1,))

    def alive() -> list[Model]:
        # Not weak references: compiled with mypyc, a model class cannot be weakly referenced (model.py).
        return [o for o in gc.get_objects() if isinstance(o, Model) and o.name == "m"]

    async def test(repo: ModelRepository) -> None:
        await repo.load("m")
        replaced = repo.get("m")
        (folder / "1" / "model.txt").write_text("changed")
        await repo.load("m")
        assert {id(m) for m in alive()} == {id(replaced), id(repo.get("m"))}  # what the check below sees
        del replaced
        await repo.unload("m")
        gc.collect()
        left = alive()
        assert not left, gc.get_referrers(*left)

    run_repository(test, tmp_path)
