"""engine/repository/single_model.py, pure: which folders are one model's files, and the repository made for
one (links to the folder's files, the config beside the version, hidden files left out)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.repository.single_model import is_single_model, single_model_repository


def _tree(root: Path, files: list[str]) -> Path:
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(name)
    return root


@pytest.mark.parametrize(("files", "single"), [
    (["model.onnx"], True),
    (["model.onnx", "model.onnx.data", "assets/vocab.txt"], True),  # a subfolder that is no model folder
    (["model.onnx", "config.pbtxt"], True),
    (["simple/config.pbtxt", "simple/1/model.onnx"], False),  # a repository
    (["model.onnx", "simple/1/model.onnx"], False),  # a model file beside a model folder: a repository
    (["model.onnx", "simple/config.pbtxt"], False),
    (["weights.onnx"], False),
    ([], False),
])
def test_which_folders_hold_one_model(tmp_path: Path, files: list[str], single: bool):
    assert is_single_model(_tree(tmp_path, files)) is single


def test_the_made_repository_links_the_files_into_version_1(tmp_path: Path):
    folder = _tree(tmp_path / "models", ["model.onnx", "model.onnx.data", "config.pbtxt", ".hidden"])
    root = single_model_repository(folder, "resnet")
    assert sorted(p.name for p in (root / "resnet" / "1").iterdir()) == ["model.onnx", "model.onnx.data"]
    assert (root / "resnet" / "1" / "model.onnx").resolve() == (folder / "model.onnx").resolve()
    assert (root / "resnet" / "config.pbtxt").read_text() == "config.pbtxt"
    assert sorted(p.name for p in root.iterdir()) == ["resnet"]
