"""The HTTP API reference, ``docs/reference/http.md`` and ``docs/reference/openapi.json``,
from the OpenAPI document the query service serves: ``python -m tools.http_reference``.

The service builds that document from its route table at start; the page is rendered
from the same call, so the reference says what ``GET /openapi.json`` says and nothing
the router does not do.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from query_service.http.openapi import openapi_document
from tools import pages

TOOL = "http_reference"
PAGE = pages.REPO_ROOT / "docs" / "reference" / "http.md"
DOCUMENT = PAGE.with_name("openapi.json")
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
"""The operation keys of an OpenAPI path item, in the order the page lists them."""

_REF = "#/components/schemas/"
COMMON_ANCHOR = "common-responses"


def document() -> dict[str, Any]:
    """The OpenAPI document, exactly as the service builds it."""
    doc: dict[str, Any] = json.loads(openapi_document())
    return doc


def document_text(doc: dict[str, Any] | None = None) -> str:
    """``openapi.json``: the document indented for review, in the order the service gives it."""
    return json.dumps(document() if doc is None else doc, indent=2, ensure_ascii=False) + "\n"


def operations(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(path, method, operation) in the document's order of paths."""
    return [
        (path, method, item[method])
        for path, item in doc.get("paths", {}).items()
        for method in METHODS
        if method in item
    ]


def _operation_anchor(path: str, method: str, operation: dict[str, Any]) -> str:
    op_id = operation.get("operationId") or f"{method}-{path}"
    return "op-" + "".join(c if c.isalnum() or c in "-_" else "-" for c in op_id)


def _schema_anchor(name: str) -> str:
    return "schema-" + name


def _schema_text(schema: Any, schemas: dict[str, Any]) -> str:
    """A JSON schema as a short type, linking named schemas to their section."""

    def link(ref: str) -> str | None:
        name = ref.removeprefix(_REF)
        if ref.startswith(_REF) and name in schemas:
            return f"[{pages.code(name)}](#{_schema_anchor(name)})"
        return None

    return pages.schema_type(schema, link)


def _content_cells(content: dict[str, Any], schemas: dict[str, Any]) -> tuple[str, str]:
    media = ", ".join(pages.code(m) for m in content)
    shown = [_schema_text(c.get("schema", True), schemas) for c in content.values()]
    return media or "—", ", ".join(shown) or "—"


def _common_responses(ops: Sequence[tuple[str, str, dict[str, Any]]]) -> dict[str, Any]:
    """Responses every operation gives alike (the errors), listed once instead of each time."""
    if len(ops) < 2:
        return {}
    first = ops[0][2].get("responses", {})
    return {
        code: response
        for code, response in first.items()
        if all(op.get("responses", {}).get(code) == response for _, _, op in ops[1:])
    }


def _security_text(operation: dict[str, Any], doc: dict[str, Any]) -> str:
    requirements = operation.get("security", doc.get("security"))
    if not requirements:
        return ""
    options = [
        " and ".join(pages.code(name) for name in sorted(req)) if req else "none"
        for req in requirements
    ]
    return "Authentication: " + " or ".join(options) + "."


def _operation_section(
    path: str,
    method: str,
    operation: dict[str, Any],
    doc: dict[str, Any],
    common: dict[str, Any],
) -> list[str]:
    schemas = doc.get("components", {}).get("schemas", {})
    out = [
        pages.anchor(_operation_anchor(path, method, operation)),
        "",
        f"### {pages.code(f'{method.upper()} {path}')}",
        "",
    ]
    if operation.get("summary"):
        out += [pages.paragraphs(operation["summary"]), ""]
    facts = [pages.inline(operation["description"])] if operation.get("description") else []
    if operation.get("operationId"):
        facts.append(f"Operation id {pages.code(operation['operationId'])}.")
    if _security_text(operation, doc):
        facts.append(_security_text(operation, doc))
    if facts:
        out += [" ".join(facts), ""]
    params = operation.get("parameters", [])
    if params:
        out.append("Parameters:")
        out.append("")
        out.append(
            pages.table(
                ["Name", "In", "Type", "Required", "Description"],
                (
                    [
                        pages.code(p.get("name", "")),
                        p.get("in", ""),
                        _schema_text(p.get("schema", True), schemas),
                        "yes" if p.get("required") else "no",
                        pages.inline(p.get("description", "")),
                    ]
                    for p in params
                ),
            )
        )
    body = operation.get("requestBody")
    if body:
        media, shown = _content_cells(body.get("content", {}), schemas)
        required = "required" if body.get("required") else "optional"
        out += [f"Request body ({required}): {media}, {shown}.", ""]
    own = {c: r for c, r in operation.get("responses", {}).items() if c not in common}
    rows = []
    for code, response in own.items():
        media, shown = _content_cells(response.get("content", {}), schemas)
        rows.append([pages.code(code), pages.inline(response.get("description", "")), media, shown])
    if rows:
        out.append("Responses:")
        out.append("")
        out.append(pages.table(["Status", "Description", "Media type", "Schema"], rows))
    if common:
        codes = ", ".join(common)
        out += [f"And the [common responses](#{COMMON_ANCHOR}) ({codes}).", ""]
    return out


def _schema_section(name: str, schema: dict[str, Any], schemas: dict[str, Any]) -> list[str]:
    out = [pages.anchor(_schema_anchor(name)), "", f"### {pages.code(name)}", ""]
    if schema.get("description"):
        out += [pages.paragraphs(schema["description"]), ""]
    properties = schema.get("properties")
    if not properties:
        out += [f"Type: {_schema_text(schema, schemas)}.", ""]
        return out
    required = set(schema.get("required", []))
    out.append(
        pages.table(
            ["Property", "Type", "Required", "Description"],
            (
                [
                    pages.code(prop),
                    _schema_text(spec, schemas),
                    "yes" if prop in required else "no",
                    pages.inline(spec.get("description", "") if isinstance(spec, dict) else ""),
                ]
                for prop, spec in properties.items()
            ),
        )
    )
    if schema.get("additionalProperties") is False:
        out += ["No other properties.", ""]
    return out


def page(doc: dict[str, Any] | None = None) -> str:
    """The whole page, as ``http.md`` should hold it."""
    doc = document() if doc is None else doc
    info = doc.get("info", {})
    schemas: dict[str, Any] = doc.get("components", {}).get("schemas", {})
    ops = operations(doc)
    common = _common_responses(ops)
    out = [
        "# HTTP API reference",
        "",
        pages.generated_notice(TOOL, "the query service's OpenAPI document"),
        "",
    ]
    if info.get("description"):
        out += [pages.paragraphs(info["description"]), ""]
    served = any(path == "/openapi.json" for path, _, _ in ops)
    out += [
        f"{info.get('title', 'The API')}, version {pages.code(str(info.get('version', '')))}; "
        f"OpenAPI {pages.code(str(doc.get('openapi', '')))}. The whole document: "
        "[openapi.json](openapi.json)"
        + (" (the service serves it at `GET /openapi.json`)." if served else "."),
        "",
        "## Operations",
        "",
        pages.table(
            ["Method", "Path", "Summary"],
            (
                [
                    method.upper(),
                    f"[{pages.code(path)}](#{_operation_anchor(path, method, op)})",
                    pages.inline(op.get("summary", "")),
                ]
                for path, method, op in ops
            ),
        ),
    ]
    for path, method, op in ops:
        out += _operation_section(path, method, op, doc, common)
    if common:
        out += [pages.anchor(COMMON_ANCHOR), "", "## Common responses", ""]
        out += ["Every operation may answer these.", ""]
        rows = []
        for code, response in common.items():
            media, shown = _content_cells(response.get("content", {}), schemas)
            rows.append(
                [pages.code(code), pages.inline(response.get("description", "")), media, shown]
            )
        out.append(pages.table(["Status", "Description", "Media type", "Schema"], rows))
    if schemas:
        out += ["## Schemas", ""]
        for name in sorted(schemas):
            out += _schema_section(name, schemas[name], schemas)
    schemes = doc.get("components", {}).get("securitySchemes", {})
    if schemes:
        out += ["## Security schemes", ""]
        out.append(
            pages.table(
                ["Name", "Type", "Scheme"],
                (
                    [
                        pages.code(n),
                        pages.inline(s.get("type", "")),
                        pages.inline(s.get("scheme", "")),
                    ]
                    for n, s in sorted(schemes.items())
                ),
            )
        )
    return "\n".join(out).rstrip("\n") + "\n"


def pages_to_write() -> dict[Path, str]:
    """The files this tool owns, with their text: both from one build of the document."""
    doc = document()
    return {PAGE: page(doc), DOCUMENT: document_text(doc)}


def main(argv: Sequence[str] | None = None) -> int:
    """Write (or ``--check``) the HTTP reference and the OpenAPI document."""
    return pages.main(
        TOOL, "Write docs/reference/http.md and docs/reference/openapi.json.", pages_to_write, argv
    )


if __name__ == "__main__":
    raise SystemExit(main())
