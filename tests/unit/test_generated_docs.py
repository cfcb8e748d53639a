"""The generated reference pages are what their tools write now, and say what they must.

Each page is rendered from its source (the config models, the protos, the OpenAPI
document, the chart's schema) and compared with the committed file; a difference means
the source changed and the page was not regenerated. The content checks read the
sources independently of the tools, so a tool that drops something fails here too.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from materializer.config import TRANSFORM_TYPES, AppConfig
from tools import config_reference, grpc_reference, helm_values, http_reference, pages

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"


def stale(path: Path, tool: str) -> str:
    return f"{path.relative_to(REPO)} is stale: run `python -m tools.{tool}` and commit the result"


def committed(path: Path) -> str:
    assert path.exists(), f"{path.relative_to(REPO)} is missing"
    return path.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def configuration() -> str:
    return config_reference.page()


@pytest.fixture(scope="module")
def grpc_page() -> str:
    return grpc_reference.page()


@pytest.fixture(scope="module")
def openapi() -> dict[str, Any]:
    return http_reference.document()


@pytest.fixture(scope="module")
def http_page(openapi: dict[str, Any]) -> str:
    return http_reference.page(openapi)


# --- up to date ----------------------------------------------------------------------------


def test_configuration_reference_is_up_to_date(configuration: str) -> None:
    page = config_reference.PAGE
    assert committed(page) == configuration, stale(page, config_reference.TOOL)


def test_grpc_reference_is_up_to_date(grpc_page: str) -> None:
    page = grpc_reference.PAGE
    assert committed(page) == grpc_page, stale(page, grpc_reference.TOOL)


def test_http_reference_is_up_to_date(http_page: str, openapi: dict[str, Any]) -> None:
    page, document = http_reference.PAGE, http_reference.DOCUMENT
    assert committed(page) == http_page, stale(page, http_reference.TOOL)
    assert committed(document) == http_reference.document_text(openapi), stale(
        document, http_reference.TOOL
    )


def test_helm_readme_values_are_up_to_date() -> None:
    readme = helm_values.README
    assert committed(readme) == helm_values.page(), stale(readme, helm_values.TOOL)


# --- what the pages say --------------------------------------------------------------------


def rows_of(markdown: str) -> set[str]:
    """The first cell of every table row, without its code span."""
    return {
        m.group(1)
        for m in re.finditer(r"^\| (?:<a id=\"[^\"]*\"></a>)?`([^`]+)` \|", markdown, re.M)
    }


def test_configuration_lists_every_key_of_the_file(configuration: str) -> None:
    keys = rows_of(configuration)
    for name, info in AppConfig.model_fields.items():
        key = info.alias or name
        assert key in keys, f"top-level key {key} has no row"
        assert f"\n## `{key}`\n" in configuration, f"top-level key {key} has no section"
    for path in (
        "maps.<name>.source.topics",
        "maps.<name>.fold.mode",
        "maps.<name>.transforms[].condition",
        "enrichments.<name>.lookups[].on_miss",
        "query.near_cache.<name>.max_entries",
    ):
        assert path in keys, f"{path} has no row"
    for kind in TRANSFORM_TYPES:
        assert f"`type: {kind}`" in configuration, f"transform {kind} is not described"
    for fmt in ("json", "json_schema", "avro", "protobuf", "string"):
        assert re.search(rf"^\| `{fmt}` \|", configuration, re.M), f"format {fmt} has no row"


def test_configuration_shows_defaults_and_descriptions(configuration: str) -> None:
    # A default, a required key, and a description read from an attribute docstring.
    assert '| `kafka.bootstrap_servers` | string | `"localhost:9092"` |' in configuration
    assert re.search(r"^\| `maps\.<name>\.key` \| [^|]+ \| required \| ", configuration, re.M)
    assert re.search(
        r"^\| `query\.http_port` \|.*\| The HTTP/JSON front on the same host", configuration, re.M
    )


def proto_declarations() -> dict[str, list[str]]:
    """Each service's RPCs, read from the .proto text without protoc."""
    services: dict[str, list[str]] = {}
    for proto in sorted((REPO / "proto" / "materializer").rglob("*.proto")):
        text = re.sub(r"//[^\n]*", "", proto.read_text(encoding="utf-8"))
        for service, body in re.findall(r"\bservice\s+(\w+)\s*\{(.*?)\n\}", text, re.S):
            services[service] = re.findall(r"\brpc\s+(\w+)\s*\(", body)
    return services


def test_grpc_reference_lists_every_rpc(grpc_page: str) -> None:
    services = proto_declarations()
    assert services, "no services found under proto/"
    for service, rpcs in services.items():
        assert f"### Service `{service}`" in grpc_page, f"service {service} is missing"
        assert rpcs, f"service {service} has no rpc"
        for rpc in rpcs:
            anchor = f'<a id="materializer-v1-{service}-{rpc}"></a>`{rpc}`'
            assert anchor in grpc_page, f"rpc {service}.{rpc} is missing"


def test_grpc_reference_lists_every_message(grpc_page: str) -> None:
    for proto in sorted((REPO / "proto" / "materializer").rglob("*.proto")):
        text = proto.read_text(encoding="utf-8")
        for message in re.findall(r"^message\s+(\w+)", text, re.M):
            assert f"### Message `{message}`" in grpc_page, f"message {message} is missing"


def test_grpc_reference_shows_streaming_and_comments(grpc_page: str) -> None:
    enrich = next(line for line in grpc_page.splitlines() if "`Enrich` |" in line)
    assert enrich.count("stream [") == 2, "Enrich streams both ways"
    assert "The current entity stored under one key" in grpc_page


def test_http_reference_lists_every_operation(http_page: str, openapi: dict[str, Any]) -> None:
    assert openapi["paths"], "the OpenAPI document has no paths"
    for path, item in openapi["paths"].items():
        for method in item:
            assert f"### `{method.upper()} {path}`" in http_page, f"{method} {path} is missing"
    for name in openapi["components"]["schemas"]:
        assert f"### `{name}`" in http_page, f"schema {name} is missing"
    assert "](openapi.json)" in http_page, "the page links the whole document"


def test_helm_readme_lists_every_value() -> None:
    readme = committed(helm_values.README)
    start, end = readme.index(helm_values.START), readme.index(helm_values.END)
    generated = rows_of(readme[start:end])
    schema = json.loads(helm_values.SCHEMA.read_text(encoding="utf-8"))

    def paths(node: dict[str, Any], prefix: str) -> list[str]:
        found = []
        for name, spec in node.get("properties", {}).items():
            found.append(prefix + name)
            found += paths(spec, f"{prefix}{name}.")
            items = spec.get("items")
            if isinstance(items, dict):
                found += paths(items, f"{prefix}{name}[].")
        return found

    expected = paths(schema, "")
    assert expected, "the schema declares no values"
    missing = [p for p in expected if p not in generated]
    assert not missing, f"values missing from the README: {missing}"
    assert "helm install" in readme[:start], "the hand-written part lost its install command"


def test_helm_readme_needs_its_markers() -> None:
    with pytest.raises(helm_values.MarkersMissing):
        helm_values.readme("# A README without markers\n", generated="")


# --- valid for a strict site build ---------------------------------------------------------


@pytest.mark.parametrize(
    "page", [config_reference.PAGE, grpc_reference.PAGE, http_reference.PAGE], ids=lambda p: p.name
)
def test_links_resolve_within_the_docs(page: Path) -> None:
    text = committed(page)
    anchors = set(re.findall(r'<a id="([^"]+)"></a>', text))
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith("#"):
            assert target[1:] in anchors, f"{page.name}: no anchor for {target}"
            continue
        assert "://" not in target, f"{page.name}: unexpected external link {target}"
        resolved = (page.parent / target.split("#")[0]).resolve()
        assert resolved.is_relative_to(DOCS), f"{page.name}: {target} leaves docs/"
        assert resolved.exists(), f"{page.name}: {target} does not exist"


@pytest.mark.parametrize(
    "page",
    [config_reference.PAGE, grpc_reference.PAGE, http_reference.PAGE, helm_values.README],
    ids=lambda p: p.name,
)
def test_tables_are_well_formed(page: Path) -> None:
    """Every row has its table's number of cells once escaped pipes are set aside."""
    width = None
    for number, line in enumerate(committed(page).splitlines(), 1):
        if not line.startswith("|"):
            width = None
            continue
        cells = len(re.findall(r"(?<!\\)\|", line)) - 1
        if width is None:
            width = cells
        assert cells == width, f"{page.name}:{number}: {cells} cells, the table has {width}"


def test_cells_never_hold_a_raw_pipe() -> None:
    assert "|" not in pages.inline("a | b").replace("\\|", "")
    assert "|" not in pages.inline("see `a|b` here").replace("\\|", "")
    assert "|" not in pages.code("x|y")
    assert pages.inline("first\n\nsecond") == "first<br><br>second"
