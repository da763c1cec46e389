"""The ready line and the reload lines (engine/lifecycle_log.py), pure: what each says for each outcome. The
server writing them is tested in test_startup.py (ready) and test_lifecycle.py (reloads)."""

from __future__ import annotations

import time

from engine.lifecycle_log import process_age_s, ready_line, reload_line
from engine.model import ModelState
from engine.repository.routing import IndexEntry

READY, UNAVAILABLE = ModelState.READY, ModelState.UNAVAILABLE
WHERE = "HTTP on 0.0.0.0:8000, gRPC on 0.0.0.0:8001, metrics on 0.0.0.0:8002"


def key(files: str = "f", config: bytes = b"c", top: str | None = None) -> tuple[str, str, str, bytes]:
    """A version key as the repository builds it: (folder, the model's own files, the version's files, config
    bytes); an edited config.pbtxt changes the model's own files and the config."""
    return ("/repo/m", files if top is None else top, files, config)


def test_ready_line_counts_models_not_versions_and_names_the_failed_ones():
    index = [IndexEntry("a", "1", READY), IndexEntry("a", "2", READY), IndexEntry("b", "1", READY),
             IndexEntry("broken", "1", UNAVAILABLE, "not an ONNX file"),
             IndexEntry("half", "1", UNAVAILABLE, "bad file"), IndexEntry("half", "2", READY)]
    assert ready_line(2.345, index, WHERE) == \
        f"ready in 2.3 s: 3 models ready, 1 failed to load (broken; the reasons are above); {WHERE}"


def test_ready_line_in_explicit_mode_lists_what_was_not_asked_for_apart_from_failures():
    index = [IndexEntry("a", "1", READY), IndexEntry("b", "", UNAVAILABLE, "not loaded"),
             IndexEntry("c", "", UNAVAILABLE, "not loaded")]
    assert ready_line(0.5, index, WHERE) == f"ready in 0.5 s: 1 model ready, 2 not loaded (b, c); {WHERE}"


def test_ready_line_with_no_model_and_many_failures():
    assert ready_line(0.04, [], WHERE) == f"ready in 0.0 s: 0 models ready; {WHERE}"
    index = [IndexEntry(f"m{i}", "1", UNAVAILABLE, "x") for i in range(7)]
    assert "7 failed to load (m0, m1, m2, m3, m4 and 2 more; " in ready_line(1, index, WHERE)


def test_a_rebuilt_version_says_what_changed():
    assert reload_line("x", {1: key()}, {1: key("g")}, kept=[]) == \
        "model 'x' reloaded: version 1 → 1 (files changed)"
    assert reload_line("x", {1: key()}, {1: key(config=b"d", top="edited")}, kept=[]) == \
        "model 'x' reloaded: version 1 → 1 (config changed)"
    assert reload_line("x", {1: key()}, {1: key(top="labels.txt edited")}, kept=[]) == \
        "model 'x' reloaded: version 1 → 1 (files changed)"
    assert reload_line("x", {1: key()}, {1: key("g", b"d")}, kept=[]) == \
        "model 'x' reloaded: version 1 → 1 (files and config changed)"


def test_versions_added_and_retired_and_one_of_several_rebuilt():
    assert reload_line("x", {1: key()}, {2: key()}, kept=[]) == \
        "model 'x' reloaded: version 1 → 2 (version 2 added, version 1 retired)"
    assert reload_line("x", {1: key(), 2: key()}, {1: key(), 2: key("g")}, kept=[1]) == \
        "model 'x' reloaded: versions 1, 2 → 1, 2 (version 2: files changed)"
    assert reload_line("x", {1: key()}, {1: key("g"), 2: key()}, kept=[]) == \
        "model 'x' reloaded: version 1 → 1, 2 (version 2 added, version 1: files changed)"


def test_a_load_that_changed_nothing_writes_no_line():
    """An ensemble's load loads its composing models again: the same copies serve on, nothing to say."""
    assert reload_line("x", {1: key()}, {1: key()}, kept=[1]) is None


def test_ready_in_counts_from_the_process_start():
    """The test process started well before this test (its imports alone take a while), and not hours ago."""
    assert 0.05 < process_age_s(time.monotonic()) < 24 * 3600
