"""InotifyTree on a real folder tree: the kernel queues an event before the call that caused it returns,
so each read below sees exactly what was done before it, with no waiting."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from engine.repository.inotify import InotifyTree, RootGone

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux's")


def test_changes_at_any_depth_are_read_and_an_idle_tree_reads_nothing(tmp_path: Path) -> None:
    (tmp_path / "old" / "1").mkdir(parents=True)
    tree = InotifyTree(tmp_path)
    try:
        assert tree.read().paths == []  # nothing queued: returns at once
        (tmp_path / "old" / "1" / "model.onnx").write_bytes(b"x")  # a folder there before the watch
        assert tmp_path / "old" / "1" / "model.onnx" in tree.read().paths
        (tmp_path / "new" / "1").mkdir(parents=True)  # created after: watched once its event is read
        assert tree.read().paths == [tmp_path / "new"]
        (tmp_path / "new" / "1" / "model.onnx").write_bytes(b"y")
        assert set(tree.read().paths) == {tmp_path / "new" / "1" / "model.onnx"}
        shutil.rmtree(tmp_path / "old")
        assert tmp_path / "old" in tree.read().paths
    finally:
        tree.close()


def test_the_root_going_away_ends_the_watch(tmp_path: Path) -> None:
    root = tmp_path / "repository"
    root.mkdir()
    tree = InotifyTree(root)
    try:
        root.rename(tmp_path / "elsewhere")
        with pytest.raises(RootGone):
            tree.read()
    finally:
        tree.close()
