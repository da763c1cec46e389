"""SettleTracker: when a model folder counts as settled (pure; clocks are passed in)."""

from __future__ import annotations

from engine.repository.watcher import SettleTracker

WALL0 = 1_700_000_000 * 10**9  # the wall clock (ns) at monotonic time 0 in these tests
OLD_MTIME = WALL0 - 3600 * 10**9  # files written an hour before


def fp(*files: tuple[str, int, int]) -> tuple:
    return tuple(files)


def wall(now: float) -> int:
    return WALL0 + int(now * 1e9)


def test_new_folder_is_due_only_after_the_quiet_time():
    tracker = SettleTracker(quiet_secs=1.0)
    tracker.observe("m", fp(("1/model.onnx", 10, OLD_MTIME)), now=0.0)
    assert tracker.pending({}) == ["m"]
    assert tracker.due({}, now=0.5, wall_ns=wall(0.5)) == []
    assert tracker.next_check({}, now=0.5, wall_ns=wall(0.5)) == 1.0
    assert tracker.due({}, now=1.0, wall_ns=wall(1.0)) == ["m"]


def test_each_change_restarts_the_quiet_time():
    tracker = SettleTracker(quiet_secs=1.0)
    for i, now in enumerate((0.0, 0.4, 0.8, 1.2)):  # a copy in progress: the file grows at every look
        tracker.observe("m", fp(("1/model.onnx", 100 * (i + 1), OLD_MTIME)), now=now)
        assert tracker.due({}, now=now, wall_ns=wall(now)) == []
    tracker.observe("m", fp(("1/model.onnx", 400, OLD_MTIME)), now=1.6)  # unchanged since 1.2
    assert tracker.due({}, now=2.1, wall_ns=wall(2.1)) == []
    assert tracker.due({}, now=2.2, wall_ns=wall(2.2)) == ["m"]


def test_a_recently_written_file_holds_the_folder_back_even_when_first_seen_late():
    tracker = SettleTracker(quiet_secs=1.0)
    # First looked at 10 s after it appeared (a scan, no events), but a file was written 0.2 s ago.
    tracker.observe("m", fp(("1/model.onnx", 10, wall(9.8))), now=0.0)
    assert tracker.settles_at("m", now=10.0, wall_ns=wall(10.0)) == 10.8
    assert tracker.due({}, now=10.0, wall_ns=wall(10.0)) == []
    assert tracker.due({}, now=10.8, wall_ns=wall(10.8)) == ["m"]


def test_a_future_mtime_does_not_hold_a_folder_forever():
    tracker = SettleTracker(quiet_secs=1.0)
    tracker.observe("m", fp(("1/model.onnx", 10, wall(5000.0))), now=0.0)  # clock skew
    assert tracker.due({}, now=1.0, wall_ns=wall(1.0)) == ["m"]


def test_what_is_loaded_is_not_due_and_a_removed_folder_is():
    loaded_fp = fp(("1/model.onnx", 10, OLD_MTIME))
    tracker = SettleTracker(quiet_secs=1.0)
    tracker.observe("m", loaded_fp, now=0.0)
    assert tracker.pending({"m": loaded_fp}) == []
    tracker.observe("m", None, now=5.0)  # the folder is gone
    assert tracker.pending({"m": loaded_fp}) == ["m"]
    assert tracker.due({"m": loaded_fp}, now=6.0, wall_ns=wall(6.0)) == ["m"]
    assert tracker.pending({}) == []  # unloaded, no folder: nothing to do


def test_busy_folders_are_left_out_of_the_next_check():
    tracker = SettleTracker(quiet_secs=1.0)
    tracker.observe("a", fp(("1/model.onnx", 1, OLD_MTIME)), now=0.0)
    tracker.observe("b", fp(("1/model.onnx", 1, OLD_MTIME)), now=3.0)
    assert tracker.next_check({}, now=5.0, wall_ns=wall(5.0)) == 1.0
    assert tracker.next_check({}, now=5.0, wall_ns=wall(5.0), skip={"a"}) == 4.0
    assert tracker.next_check({}, now=5.0, wall_ns=wall(5.0), skip={"a", "b"}) is None
