"""Tests of engine/repository/fingerprint.py: what a model folder's fingerprint holds and how it splits by
version folder. Plain functions over a tmp folder."""

from __future__ import annotations

import os
from pathlib import Path

from engine.repository.fingerprint import fingerprint, split_fingerprint


def make_folder(root: Path) -> Path:
    folder = root / "m"
    (folder / "1").mkdir(parents=True)
    (folder / "2").mkdir()
    (folder / "1" / "model.txt").write_text("one")
    (folder / "2" / "model.txt").write_text("two!")
    (folder / "config.pbtxt").write_text("backend: 'identity'")
    return folder


def test_a_missing_folder_has_no_fingerprint(tmp_path: Path) -> None:
    assert fingerprint(tmp_path / "absent") is None


def test_the_fingerprint_lists_every_file_by_relative_path_and_size(tmp_path: Path) -> None:
    fp = fingerprint(make_folder(tmp_path))
    assert fp is not None
    assert [(path, size) for path, size, _ in fp] == [("1/model.txt", 3), ("2/model.txt", 4),
                                                      ("config.pbtxt", 19)]


def test_editing_a_file_changes_the_fingerprint(tmp_path: Path) -> None:
    folder = make_folder(tmp_path)
    before = fingerprint(folder)
    os.utime(folder / "1" / "model.txt", ns=(1, 1))  # same size, another mtime
    assert fingerprint(folder) != before


def test_split_keys_version_folders_by_name_and_the_rest_by_the_empty_string(tmp_path: Path) -> None:
    folder = make_folder(tmp_path)
    (folder / "notes").mkdir()
    (folder / "notes" / "readme").write_text("x")
    parts = split_fingerprint(fingerprint(folder))
    assert sorted(parts) == ["", "1", "2"]
    assert [path for path, _, _ in parts["1"]] == ["1/model.txt"]
    assert [path for path, _, _ in parts[""]] == ["config.pbtxt", "notes/readme"]


def test_split_of_no_fingerprint_is_empty() -> None:
    assert split_fingerprint(None) == {}
