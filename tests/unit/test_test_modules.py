"""Test modules have one name each across the suites: without packages, pytest imports a
test file by its basename, and a second file of that name fails the whole collection."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).parents[1]


def test_no_two_test_modules_share_a_name():
    names = Counter(
        path.name for path in TESTS.rglob("test_*.py") if "node_modules" not in path.parts
    )
    assert [name for name, count in names.items() if count > 1] == []
