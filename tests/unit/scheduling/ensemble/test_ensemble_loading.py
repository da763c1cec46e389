"""engine/scheduling/ensemble/loading.py through ModelRepository in-process (as test_repository.py
does), with identity-backend models in a tmp folder: an ensemble's load loads its composing models,
`unload_dependents` unloads those no other ensemble uses, and ensembles that contain each other are refused,
never loaded forever. The repository API's answers over real clients: test_ensemble.py."""

from __future__ import annotations

from pathlib import Path

import ensemble_repository as er
from conftest import run_repository
from engine.repository.lifecycle import ModelRepository


def one_step(name: str, model: str) -> str:
    return er.ensemble(name, er.FP4, [("OUT", "TYPE_FP32", [4])],
                       [er.step(model, {"INPUT0": "IN"} if model.startswith("m") else {"IN": "IN"},
                                {"OUTPUT0": "OUT"} if model.startswith("m") else {"OUT": "OUT"})])


def loaded(repo: ModelRepository) -> set[str]:
    return {m.name for m in repo.loaded_models()}


def test_unload_dependents_unloads_composing_models_no_other_ensemble_uses(tmp_path: Path) -> None:
    er.write_identity(tmp_path, "m_shared", 0)
    er.write_identity(tmp_path, "m_own", 0)
    er.write_ensemble(tmp_path, "e_both", er.ensemble("e_both", er.FP4, [("A", "TYPE_FP32", [4]),
                                                                          ("B", "TYPE_FP32", [4])], [
        er.step("m_shared", {"INPUT0": "IN"}, {"OUTPUT0": "A"}),
        er.step("m_own", {"INPUT0": "IN"}, {"OUTPUT0": "B"})]))
    er.write_ensemble(tmp_path, "e_other", one_step("e_other", "m_shared"))

    async def test(repo: ModelRepository) -> None:
        await repo.load("e_both")  # loads m_shared and m_own first
        assert loaded(repo) == {"e_both", "m_shared", "m_own"}
        await repo.load("e_other")
        await repo.unload("e_both", unload_dependents=True)
        assert loaded(repo) == {"e_other", "m_shared"}  # m_shared still serves e_other
        await repo.unload("e_other")  # without the parameter, as Triton: composing models stay
        assert loaded(repo) == {"m_shared"}

    run_repository(test, tmp_path)


def test_ensembles_that_contain_each_other_are_refused(tmp_path: Path) -> None:
    er.write_ensemble(tmp_path, "ping", one_step("ping", "pong"))
    er.write_ensemble(tmp_path, "pong", one_step("pong", "ping"))

    async def test(repo: ModelRepository) -> None:
        await repo.load("ping")
        assert loaded(repo) == set()
        for name in ("ping", "pong"):
            failure = repo.load_failure(name)
            assert failure is not None and "circular dependency between ensembles" in failure.message, failure

    run_repository(test, tmp_path)


def test_at_start_up_ensembles_wait_for_what_they_contain(tmp_path: Path) -> None:
    er.write_identity(tmp_path, "m_slow", 0)
    er.write_ensemble(tmp_path, "e_outer", one_step("e_outer", "e_inner"))
    er.write_ensemble(tmp_path, "e_inner", one_step("e_inner", "m_slow"))

    async def test(repo: ModelRepository) -> None:
        await repo.load_all()
        assert loaded(repo) == {"e_outer", "e_inner", "m_slow"}
        assert all(repo.load_failure(n) is None for n in ("e_outer", "e_inner", "m_slow"))

    run_repository(test, tmp_path)
