"""What the reference-page generators share: Markdown that stays well-formed whatever the
source text holds, and the command line that writes a page or checks it.

The pages are read by MkDocs (Python-Markdown) and, for the chart's README, by GitHub's
renderer; the two split table cells differently around pipes inside code, so a cell never
carries a raw pipe at all.
"""

from __future__ import annotations

import argparse
import html
import json
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]

_CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)
_RST_LITERAL = re.compile(r"``([^`]+)``")


def _code_html(content: str) -> str:
    """A code span as HTML, for content a Markdown code span cannot hold in a table cell."""
    return "<code>" + html.escape(content, quote=False).replace("|", "&#124;") + "</code>"


def _plain(text: str) -> str:
    """Prose outside code spans: no cell separator, and nothing read as an HTML tag."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def inline(text: str) -> str:
    """Prose (a docstring, a comment) as one line of Markdown, safe inside a table cell.

    Docstrings write literals as reStructuredText's double backticks; they become code
    spans. Paragraphs are kept apart with line breaks, since a cell is a single line.
    """
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text.strip())]
    return "<br><br>".join(_escape_outside_code(p) for p in paragraphs if p)


def paragraphs(text: str) -> str:
    """Prose as Markdown paragraphs, for text outside tables."""
    parts = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text.strip())]
    return "\n\n".join(_escape_outside_code(p) for p in parts if p)


def _escape_outside_code(text: str) -> str:
    text = _RST_LITERAL.sub(lambda m: "`" + m.group(1) + "`", text)
    out: list[str] = []
    position = 0
    for match in _CODE_SPAN.finditer(text):
        out.append(_plain(text[position : match.start()]))
        content = match.group(2)
        out.append(_code_html(content) if "|" in content else match.group(0))
        position = match.end()
    out.append(_plain(text[position:]))
    return "".join(out)


def code(literal: str) -> str:
    """A literal (a key path, a value, a type name) as a code span that any cell can hold."""
    if "|" in literal or "`" in literal or "\n" in literal:
        return _code_html(" ".join(literal.split("\n")))
    return f"`{literal}`"


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A Markdown table of cells already escaped (by ``inline`` or ``code``)."""
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
    ]
    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"a row of {len(row)} cells under {len(header)} headers: {row}")
        lines.append("| " + " | ".join(cell or " " for cell in row) + " |")
    return "\n".join(lines) + "\n"


def anchor(anchor_id: str) -> str:
    """An explicit anchor: its id does not depend on how the site's theme slugs headings."""
    return f'<a id="{html.escape(anchor_id)}"></a>'


def schema_type(schema: Any, link: Callable[[str], str | None] | None = None) -> str:
    """A JSON schema as a short type for a table cell (``array of string``, ``integer (>= 1)``).

    ``link`` turns a ``$ref`` into a link where the page describes the schema it names.
    """
    if not isinstance(schema, dict):
        return "any" if schema is not False else "nothing"
    ref = schema.get("$ref")
    if isinstance(ref, str):
        return (link(ref) if link else None) or code(ref)
    if schema.get("not") == {}:
        return "not allowed"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " or ".join(schema_type(s, link) for s in schema[key])
    if "allOf" in schema:
        return " and ".join(schema_type(s, link) for s in schema["allOf"])
    if "const" in schema:
        return code(json.dumps(schema["const"]))
    if "enum" in schema:
        values = [v if isinstance(v, str) else json.dumps(v) for v in schema["enum"]]
        return "one of " + ", ".join(code(v) for v in values)
    kinds = schema.get("type")
    kind_list = kinds if isinstance(kinds, list) else [kinds] if kinds else []
    texts = [_one_schema_type(str(k), schema, link) for k in kind_list]
    return " or ".join(texts) if texts else "any"


def _one_schema_type(
    kind: str, schema: dict[str, Any], link: Callable[[str], str | None] | None
) -> str:
    if kind == "array":
        text = "array of " + schema_type(schema.get("items", True), link)
        sizes = [("minItems", "at least"), ("maxItems", "at most")]
        bounds = [f"{words} {schema[key]}" for key, words in sizes if key in schema]
        return text + (f" ({', '.join(bounds)})" if bounds else "")
    if kind == "object":
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict) and not schema.get("properties"):
            return "object of " + schema_type(extra, link)
        return "object"
    text = kind
    if "format" in schema:
        text += f" ({schema['format']})"
    limits = [
        ("minimum", ">="),
        ("exclusiveMinimum", ">"),
        ("maximum", "<="),
        ("exclusiveMaximum", "<"),
        ("minLength", "length >="),
        ("maxLength", "length <="),
    ]
    bounds = [f"{sign} {schema[key]}" for key, sign in limits if key in schema]
    if "pattern" in schema:
        bounds.append(f"pattern `{schema['pattern']}`")
    if bounds:
        text += " (" + ", ".join(bounds) + ")"
    return inline(text)


def generated_notice(tool: str, source: str) -> str:
    """The comment that tells an editor where the page comes from."""
    return (
        f"<!-- Generated from {source} by `python -m tools.{tool}`: "
        "edit the source and run it again, not this file. -->"
    )


def main(
    tool: str,
    description: str,
    pages: Callable[[], dict[Path, str]],
    argv: Sequence[str] | None = None,
) -> int:
    """Write the tool's pages, or with ``--check`` only report the stale ones (exit 1)."""
    parser = argparse.ArgumentParser(prog=f"python -m tools.{tool}", description=description)
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 when a page differs from what would be written",
    )
    args = parser.parse_args(argv)
    stale: list[Path] = []
    for path, text in pages().items():
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        stale.append(path)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("w", encoding="utf-8", newline="\n") as out:
                out.write(text)
    for path in stale:
        shown = path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path
        print(f"{'stale' if args.check else 'wrote'} {shown}")
    return 1 if args.check and stale else 0
