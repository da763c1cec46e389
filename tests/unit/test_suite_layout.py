"""The suite's own layout: pytest imports each test module by its base name (conftest.py puts every test
folder on sys.path, and test modules import each other's builders by name), so two test files (or shared
builders) with one name in different folders stop the whole collection with "import file mismatch". Checked
here so a new file that repeats a name fails in the file's own slice, not only in a full run."""

from __future__ import annotations

import collections
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_file_name_is_unique():
    seen = collections.defaultdict(list)
    for path in TESTS.rglob("*.py"):
        if path.name != "__init__.py" and "fixtures" not in path.relative_to(TESTS).parts:
            seen[path.name].append(str(path.relative_to(TESTS)))
    assert {name: where for name, where in seen.items() if len(where) > 1} == {}
