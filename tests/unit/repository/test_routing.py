"""Tests of engine/repository/routing.py's pure parts: requested version strings, and the inside-the-root
check. Routing to loaded versions and the index are exercised through ModelRepository
(test_repository.py) and real servers (test_lifecycle.py, test_repository_api.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.errors import EngineError, ErrorCode
from engine.repository.routing import inside, parse_version


def test_a_version_string_of_digits_is_its_number() -> None:
    assert parse_version("1") == 1
    assert parse_version("0012") == 12


@pytest.mark.parametrize("given, words", [
    ("-1", "invalid model version specified '-1' , version should be an integral value > 0"),
    ("abc", "failed to get model version from specified version string 'abc', version should be an integral"),
    ("１", "failed to get model version"),  # a full-width digit is a digit to str.isdigit, not to Triton
])
def test_other_version_strings_are_refused_in_tritons_words(given: str, words: str) -> None:
    with pytest.raises(EngineError) as info:
        parse_version(given)
    assert info.value.code is ErrorCode.INVALID_ARG
    assert info.value.message.startswith(words)


def test_inside_follows_symbolic_links(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    (root / "m").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (root / "link").symlink_to(tmp_path / "elsewhere")
    assert inside(root / "m", root)
    assert inside(root / "m" / "not-yet", root)  # need not exist
    assert not inside(root / "link", root)
    assert not inside(root / ".." / "elsewhere", root)
