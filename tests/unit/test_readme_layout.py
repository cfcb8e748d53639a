"""The README's layout section and the tree agree: every package has its line, and every
folder or module the section names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOPS = ("materializer", "query_service")

_ENTRY = re.compile(r"^( *)([\w.-]+(?:/[\w.-]+)*/|[\w.-]+\.py)(?: |,|;|$)")
_FOLDER_MENTION = re.compile(r"(?<![\w/.-])([a-z_][\w-]*)/(?=[\s,);]|$)")
_MODULE_MENTION = re.compile(r"(?<![\w/.-])([a-z_]\w*\.py)\b")


def _layout() -> str:
    text = (ROOT / "README.md").read_text()
    assert "\n## Layout\n" in text, "the README has no '## Layout' section"
    section = text.split("\n## Layout\n", 1)[1]
    return section.split("```", 2)[1]


def _named(block: str) -> tuple[set[str], set[str], set[str]]:
    """The folders that have a line of their own, and every folder and module the block
    names: a line's entry (nested by indentation) and, in its description, folders
    (``formats/``) and modules (``run.py``) in the line's folder, or beside its module."""
    lines: set[str] = set()
    folders: set[str] = set()
    modules: set[str] = set()
    parents: list[tuple[int, str]] = []
    for line in block.splitlines():
        found = _ENTRY.match(line)
        if not found:
            continue
        indent, name = len(found.group(1)), found.group(2)
        while parents and parents[-1][0] >= indent:
            parents.pop()
        prefix = parents[-1][1] if parents else ""
        path = prefix + name
        description = line[found.end() :]
        if name.endswith("/"):
            lines.add(path.rstrip("/"))
            folders.add(path.rstrip("/"))
            parents.append((indent, path))
            here = path
        else:
            modules.add(path)
            here = prefix
        folders.update(here + m for m in _FOLDER_MENTION.findall(description))
        modules.update(here + m for m in _MODULE_MENTION.findall(description))
    return lines, folders, modules


def _packages() -> set[str]:
    """Every folder of the two Python trees that holds a module, generated code included."""
    found = set()
    for top in TOPS:
        for path in (ROOT / top).rglob("*.py"):
            if "__pycache__" not in path.parts:
                found.add(path.parent.relative_to(ROOT).as_posix())
    return found


def test_every_package_has_a_line_in_the_layout():
    lines, folders, _ = _named(_layout())
    packages = _packages()
    # A package's subpackages (source/formats/) may be named on their parent's line.
    unlisted = sorted(
        p
        for p in packages
        if p not in lines and not (p.count("/") >= 2 and p in {f.rstrip("/") for f in folders})
    )
    assert not unlisted, f"the README's layout section has no line for: {unlisted}"


def test_everything_the_layout_names_exists():
    lines, folders, modules = _named(_layout())
    assert {"materializer", "query_service"} <= lines
    gone = sorted(f + "/" for f in folders if not (ROOT / f).is_dir())
    gone += sorted(m for m in modules if not (ROOT / m).is_file())
    assert not gone, f"the README's layout section names what the tree does not hold: {gone}"


def test_the_reader_of_the_layout_sees_nesting_and_mentions():
    lines, folders, modules = _named(
        "top/     the root; cli.py, its command\n"
        "  pkg/   a package (sub/)\n"
        "  run.py a module; job.py beside it\n"
        "other/   tests: unit/, interop/\n"
    )
    assert lines == {"top", "top/pkg", "other"}
    assert folders == lines | {"top/pkg/sub", "other/unit", "other/interop"}
    assert modules == {"top/cli.py", "top/run.py", "top/job.py"}
