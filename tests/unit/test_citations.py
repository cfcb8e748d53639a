"""Docstrings and comments that name a file or a module name one that exists.

A move or a deletion that leaves a citation behind sends a reader to nothing;
this finds it while the change is still on the table.
"""

from __future__ import annotations

import ast
import io
import json
import re
import subprocess
import sys
import tokenize
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TREES = ("materializer", "query_service", "tools", "bench", "tests")
PATH = re.compile(
    r"(?<![\w./<{-])((?:[A-Za-z_][\w.-]*/)+[\w.-]+\.(?:py|md|lua|proto|yaml|yml|json|toml|xml))\b"
)
MODULE = re.compile(r"(?<![\w./-])((?:materializer|query_service|tools)(?:\.[A-Za-z_]\w*)+)")


GENERATED = ("materializer/v1/", "query_service/sql/flightsql/")
"""Code protoc writes, whose comments name the .proto files by their import paths."""


def sources() -> Iterator[Path]:
    for tree in TREES:
        for path in sorted((ROOT / tree).rglob("*.py")):
            generated = str(path.relative_to(ROOT)).startswith(GENERATED)
            if not generated and "node_modules" not in path.parts:
                yield path


def _prose_of(text: str) -> list[tuple[int, str]]:
    """Every docstring (and attribute docstring) and comment of a source, with its line."""
    found = [
        (node.lineno, node.value.value)
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    ]
    found += [
        (token.start[0], token.string)
        for token in tokenize.generate_tokens(io.StringIO(text).readline)
        if token.type == tokenize.COMMENT
    ]
    return found


def _defined_of(text: str) -> list[str]:
    """The names a module defines or imports at any depth."""
    names = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return sorted(names)


@cache
def _parsed() -> dict[str, Any]:
    """Every source parsed in a fresh interpreter: CPython 3.11's AST constructor can keep a
    wrong recursion depth after another test's deep parse in this process, and then refuses
    every parse with a SystemError."""
    dump = subprocess.run(
        [sys.executable, __file__], capture_output=True, text=True, check=True, cwd=ROOT
    )
    return json.loads(dump.stdout)  # type: ignore[no-any-return]


def prose(path: Path) -> list[tuple[int, str]]:
    return [(line, text) for line, text in _parsed()[str(path.relative_to(ROOT))]["prose"]]


def defined(module: Path) -> frozenset[str]:
    return frozenset(_parsed()[str(module.relative_to(ROOT))]["defined"])


def resolves(dotted: str) -> bool:
    """A package, a module, or a name defined in one (``module.name[.attr]``)."""
    if dotted.startswith("materializer.v1."):
        # The proto package: its full names (materializer.v1.MapService) name services.
        service = dotted.split(".")[2]
        return any(
            f"service {service} " in proto.read_text()
            for proto in (ROOT / "proto").rglob("*.proto")
        )
    parts = dotted.rstrip(".").split(".")
    for end in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:end])
        if base.is_dir() and (base / "__init__.py").is_file():
            rest, module = parts[end:], base / "__init__.py"
        elif base.with_suffix(".py").is_file():
            rest, module = parts[end:], base.with_suffix(".py")
        else:
            continue
        return not rest or rest[0] in defined(module) or (base / f"{rest[0]}.py").is_file()
    return False


def test_every_file_a_docstring_or_comment_names_exists() -> None:
    missing = [
        f"{path.relative_to(ROOT)}:{line}: {cited}"
        for path in sources()
        for line, text in prose(path)
        for cited in PATH.findall(text)
        if not (ROOT / cited).exists()
    ]
    assert not missing, "citations of files that do not exist:\n" + "\n".join(missing)


def test_every_module_a_docstring_or_comment_names_exists() -> None:
    missing = [
        f"{path.relative_to(ROOT)}:{line}: {cited}"
        for path in sources()
        for line, text in prose(path)
        for cited in MODULE.findall(text)
        if not resolves(cited)
    ]
    assert not missing, "citations of modules that do not exist:\n" + "\n".join(missing)


def test_the_checks_see_a_missing_file_and_a_missing_module() -> None:
    assert PATH.findall("see docs/no-such-page.md and `bench/gone.py`") == [
        "docs/no-such-page.md",
        "bench/gone.py",
    ]
    assert not (ROOT / "docs/no-such-page.md").exists()
    assert resolves("materializer.redis.writer.Writer")
    assert resolves("materializer.redis")
    assert not resolves("materializer.pipeline.redis_fold")
    assert not resolves("materializer.redis.writer.NoSuchThing")
    assert resolves("materializer.v1.MapService") and not resolves("materializer.v1.NoService")


if __name__ == "__main__":
    print(
        json.dumps(
            {
                str(path.relative_to(ROOT)): {
                    "prose": _prose_of(path.read_text()),
                    "defined": _defined_of(path.read_text()),
                }
                for path in sources()
            }
        )
    )
