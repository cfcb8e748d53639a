"""The README's layout section names every package and top-level module of the tree."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _layout() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Layout\n", 1)[1]
    return section.split("```", 2)[1]


def _listed(block: str) -> set[str]:
    """The paths the layout block names: ``name/`` or ``name.py`` at the start of a line,
    nested by indentation, plus the modules a line lists after a comma or semicolon."""
    listed: set[str] = set()
    parents: list[tuple[int, str]] = []
    for line in block.splitlines():
        found = re.match(r"^( *)([\w./]+(?:/|\.py))(?:,| |$)", line)
        if not found:
            continue
        indent, name = len(found.group(1)), found.group(2)
        while parents and parents[-1][0] >= indent:
            parents.pop()
        prefix = parents[-1][1] if parents else ""
        path = prefix + name
        listed.add(path.rstrip("/"))
        listed.update(p.as_posix() for p in Path(path).parents if p.as_posix() != ".")
        if name.endswith("/"):
            parents.append((indent, path))
        for extra in re.findall(r"(?:^|, |; )([a-z_]+\.py)", line.strip()):
            listed.add(prefix + extra)
    return listed


def test_the_layout_section_lists_every_package_and_module():
    listed = _listed(_layout())
    missing = []
    for top in ("materializer", "query_service"):
        for path in sorted((ROOT / top).rglob("*.py")):
            relative = path.relative_to(ROOT)
            folder = relative.parent
            if "v1" in folder.parts or path.name in ("__init__.py", "__main__.py"):
                continue
            if folder.as_posix() not in listed:
                missing.append(f"{folder.as_posix()}/")
            elif folder.as_posix() == top and relative.as_posix() not in listed:
                missing.append(relative.as_posix())
    # Packages nested deeper (pipeline/formats/) are described by their parent's line.
    unlisted = sorted({m for m in missing if m.count("/") <= 2})
    assert not unlisted, f"the README's layout section does not name: {unlisted}"
