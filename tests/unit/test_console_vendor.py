"""The console's vendored JavaScript is what its README says: every file in the vendor
folder has its line in SHA256SUMS, and every line matches its file."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

VENDOR = Path(__file__).resolve().parents[2] / "query_service" / "console" / "static" / "vendor"
SUMS = VENDOR / "SHA256SUMS"
_LINE = re.compile(r"([0-9a-f]{64}) [ *](\S+)")


def listed() -> dict[str, str]:
    """The files SHA256SUMS names (``sha256sum`` format), each with its digest."""
    sums: dict[str, str] = {}
    for number, line in enumerate(SUMS.read_text().splitlines(), 1):
        found = _LINE.fullmatch(line)
        assert found, f"SHA256SUMS line {number} is not '<sha256>  <file>': {line!r}"
        digest, name = found.groups()
        assert name not in sums, f"SHA256SUMS lists {name} twice"
        sums[name] = digest
    return sums


@pytest.mark.parametrize("name", sorted(listed()))
def test_every_listed_file_matches(name: str) -> None:
    path = VENDOR / name
    assert path.is_file(), f"SHA256SUMS lists {name}, which the vendor folder lacks"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == listed()[name], (
        f"{name} differs from its SHA256SUMS line: update it as the folder's README says"
    )


def test_every_file_is_listed() -> None:
    present = {p.name for p in VENDOR.iterdir() if p.name != SUMS.name}
    assert not any(p.is_dir() for p in VENDOR.iterdir()), "the vendor folder is flat"
    unlisted = sorted(present - listed().keys())
    assert not unlisted, f"SHA256SUMS has no line for: {unlisted}"
