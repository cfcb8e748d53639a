"""The values table of the chart's README, ``helm/materializer/README.md``, from
``values.schema.json`` and ``values.yaml``: ``python -m tools.helm_values``.

Helm checks every install against the schema, so the schema's keys are exactly the
values the chart takes; defaults come from ``values.yaml`` and descriptions from the
schema, else from the comment above the key in ``values.yaml``, which is where the
chart's authors explain a value. Only the text between the markers is generated: the
rest of the README is written by hand.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tools import pages

TOOL = "helm_values"
CHART = pages.REPO_ROOT / "helm" / "materializer"
README = CHART / "README.md"
SCHEMA = CHART / "values.schema.json"
VALUES = CHART / "values.yaml"
START = "<!-- values:start -->"
END = "<!-- values:end -->"
LONGEST_DEFAULT = 60
"""A default longer than this (a whole example map) is left to ``values.yaml`` to show."""

_KEY_LINE = re.compile(r"^(\s*)([A-Za-z0-9_./-]+|\"[^\"]+\"|'[^']+'):(\s|$)")
_RULE = re.compile(r"^[-=#*~\s]{3,}$")


class MarkersMissing(Exception):
    """The README lacks the markers between which the table goes."""


@dataclass(frozen=True)
class Row:
    """One value of the chart."""

    path: str
    schema: dict[str, Any]
    default: Any
    has_default: bool


def values_comments(text: str) -> dict[str, str]:
    """The comment block right above each block-mapping key, by dotted path.

    Banner blocks (between ``# ----`` rules) describe a whole part of the file, not the
    key under them, and are left out.
    """
    found: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    pending: list[str] = []
    in_banner = False
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            pending, in_banner = [], False
            continue
        if stripped.startswith("#"):
            body = stripped.lstrip("#").strip()
            if _RULE.match(body):
                pending, in_banner = [], True
            elif not in_banner:
                pending.append(body)
            continue
        match = _KEY_LINE.match(line)
        if match:
            indent, key = len(match.group(1)), match.group(2).strip("\"'")
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, key))
            if pending:
                found[".".join(k for _, k in stack)] = " ".join(pending)
        pending, in_banner = [], False
    return found


def _lookup(values: Any, parts: Sequence[str]) -> tuple[bool, Any]:
    node = values
    for part in parts:
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def rows(schema: dict[str, Any], values: Any) -> Iterator[Row]:
    """Every property the schema declares, depth first in the schema's order."""

    def walk(
        node: dict[str, Any], prefix: list[str], value_path: list[str] | None
    ) -> Iterator[Row]:
        for name, spec in node.get("properties", {}).items():
            if not isinstance(spec, dict):
                continue
            path = [*prefix, name]
            found, default = (
                _lookup(values, [*value_path, name]) if value_path is not None else (False, None)
            )
            yield Row(".".join(path), spec, default, found)
            child_values = [*value_path, name] if value_path is not None else None
            yield from walk(spec, path, child_values)
            items = spec.get("items")
            if isinstance(items, dict) and items.get("properties"):
                yield from walk(items, [*path[:-1], path[-1] + "[]"], None)
            extra = spec.get("additionalProperties")
            if isinstance(extra, dict) and extra.get("properties"):
                yield from walk(extra, [*path, "<name>"], None)

    yield from walk(schema, [], [])


def _default_text(row: Row) -> str:
    if not row.has_default:
        return "—"
    if isinstance(row.default, dict) and row.default and row.schema.get("properties"):
        return ""  # the keys below show theirs
    text = yaml.safe_dump(
        row.default, default_flow_style=True, sort_keys=False, width=1_000_000
    ).strip()
    text = text.removesuffix("...").strip()
    if len(text) > LONGEST_DEFAULT:
        return "see `values.yaml`"
    return pages.code(text)


def table(
    schema: dict[str, Any] | None = None,
    values_text: str | None = None,
) -> str:
    """The generated part of the README: the notice and the values table."""
    schema = json.loads(SCHEMA.read_text(encoding="utf-8")) if schema is None else schema
    if values_text is None:
        values_text = VALUES.read_text(encoding="utf-8")
    values = yaml.safe_load(values_text) or {}
    comments = values_comments(values_text)
    body = pages.table(
        ["Key", "Type", "Default", "Description"],
        (
            [
                pages.code(row.path),
                pages.schema_type(row.schema),
                _default_text(row),
                pages.inline(str(row.schema.get("description") or comments.get(row.path, ""))),
            ]
            for row in rows(schema, values)
        ),
    )
    notice = pages.generated_notice(TOOL, "`values.schema.json` and `values.yaml`")
    return f"{notice}\n\n{body}"


def readme(current: str, generated: str | None = None) -> str:
    """The README with the text between its markers replaced by the table."""
    start, end = current.find(START), current.find(END)
    if start < 0 or end < start:
        raise MarkersMissing(f"{README}: put {START} and {END} where the values table goes")
    generated = table() if generated is None else generated
    return current[: start + len(START)] + "\n" + generated + current[end:]


def page() -> str:
    """The whole README, as it should be."""
    return readme(README.read_text(encoding="utf-8"))


def pages_to_write() -> dict[Path, str]:
    """The files this tool owns (its generated part), with their text."""
    return {README: page()}


def main(argv: Sequence[str] | None = None) -> int:
    """Write (or ``--check``) the values table of the chart's README."""
    return pages.main(
        TOOL, "Write the values table of helm/materializer/README.md.", pages_to_write, argv
    )


if __name__ == "__main__":
    raise SystemExit(main())
