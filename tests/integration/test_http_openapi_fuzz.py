"""The HTTP front fuzzed by schemathesis from the OpenAPI document it serves.

The hand-written tests check what their authors thought of; a fuzzer that no
one here wrote reads only ``GET /openapi.json`` and holds the server to it:
no 5xx but the 503 and 504 an operation declares, no status, media type or
body the document does not declare, every request the document calls valid
taken (positive data) and every request it calls invalid refused (negative
data). Each operation of the live document is fuzzed, so an endpoint added to
``ENDPOINTS`` is fuzzed without a change here.

The service runs on a real redis-server, with one map of a few entities, and
a real Kafka broker, which ``status`` asks for log ends (without one it waits
out the admin client's timeout). Bearer tokens are on, and every request
carries a token that may do everything: the authorizer runs on each call, as
in production, while the fuzzer's requests still reach the handlers instead of
stopping at 401.

What the document cannot know is drawn from the server's state, as a client
would. Half the requests name the map that exists (the rest a generated name,
a 404). In positive cases ``min_offsets`` names the topic that map reads, with
a short ``timeout_ms``, since a position never reached waits until the
deadline; a page token or a change id is one the server issued (none, or
``0``) rather than a generated string that is well formed but was never
issued; ``profile`` and ``spec`` name the configured profile and a join on
the map; enrichment events keep their integers within 64 bits, as the
document's prose says. Negative cases are left as generated, but for bodies
whose negation has no other form on the wire (``has_a_wire_form``).

The change stream, which never ends by itself, is called like every other
operation: schemathesis reads an event stream until the request timeout and
then closes it, which the server must take as a client gone.

Maps are created, changed and deleted in a catalog topic of the test's own. A
map's section is refused beyond its schema for what a schema cannot say (a
field that needs another, a topic that does not exist, a change the map's
state cannot follow, a map the file declares): such a 400 is taken as an
answer only when its message names the key path or the rule it refuses. The
sections read the topic the served map reads, which exists, so the valid ones
are created. A SQL statement is text a schema cannot check either: its 400 must
name the field it refuses (``sql: ...``, ``params: ...``).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import pkgutil
import re
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import orjson
import pytest
import redis
import schemathesis
import yaml
from confluent_kafka.admin import AdminClient, NewTopic
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    positive_data_acceptance,
    response_schema_conformance,
    status_code_conformance,
)

from materializer.config import parse_config
from query_service.http.endpoints import ENDPOINTS, NDJSON, Endpoint
from tests.helpers.query_redis import front, map_doc, write_batch


def _load_schemathesis() -> None:
    """Import every schemathesis module now, at collection, before any test of this worker
    runs. pytest rewrites a pytest plugin's modules with ``ast.parse`` as they are imported,
    and an earlier test in the same worker can leave CPython 3.11's AST constructor unable
    to parse (tests/unit/test_citations.py meets the same bug); a module schemathesis
    imports lazily would then fail to load in the middle of this file's tests."""
    for module in pkgutil.walk_packages(schemathesis.__path__, "schemathesis."):
        with contextlib.suppress(ImportError):  # optional integrations (allure)
            importlib.import_module(module.name)


_load_schemathesis()

TOKEN = "fuzz-admin-token-0123456789"
PROFILE = "fuzz"
OWN_DB = 13
WATERMARK = 3
"""The next offset of partition 0 the map's one batch reached."""
EXAMPLES = 30
"""Generated requests per operation and mode."""
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    positive_data_acceptance,
    negative_data_rejection,
]
CHECKED_BEYOND_SCHEMA = frozenset({"create_map", "put_map_config", "delete_map", "sql"})
"""Operations whose 400 may refuse what a schema cannot say (see the module's docstring)."""
BEYOND_SCHEMA = re.compile(
    r"maps\.[A-Za-z0-9][A-Za-z0-9_.-]*(\.\S+)?: |declared in the configuration file"
    r"|state cannot follow"
    # A statement's text: what SQL a schema cannot say, each refusal naming its field.
    r"|^(sql|params|limit|min_offsets\[\d+\]\.topic): "
)
CONFIG = schemathesis.Config.from_dict(
    {
        # 5xx are server errors, except the 503 and 504 the document declares (and
        # status_code_conformance fails any status an operation does not declare).
        "checks": {"not_a_server_error": {"expected-statuses": ["2xx", "3xx", "4xx", 503, 504]}},
        "request-timeout": 10,
        "operations": [{"include-operation-id": "changes", "request-timeout": 0.3}],
    }
)


@schemathesis.serializer(NDJSON)
def ndjson(_: Any, value: Any) -> bytes:
    """The document describes an NDJSON body as the array of its lines' objects."""
    items = value if isinstance(value, list) else [value]
    return b"".join(json.dumps(item).encode() + b"\n" for item in items)


@schemathesis.serializer(
    # Every YAML type: schemathesis takes the first of the family it has, text/yaml.
    *("text/yaml", "text/x-yaml", "text/vnd.yaml", "text/yml"),
    *("application/yaml", "application/x-yaml"),
)
def configuration(_: Any, value: Any) -> bytes:
    """The document describes the body as the configuration's text: sent as it is, not as a
    YAML string holding it (an empty text would go as ``''``)."""
    return value.encode() if isinstance(value, str) else yaml.safe_dump(value).encode()


@dataclass(frozen=True)
class Served:
    base: str
    map: str
    topic: str


@pytest.fixture(scope="module")
def served(
    redis_url: str, kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """The query service on its own event loop in a thread: schemathesis calls it blocking.

    It has a Redis database of its own, emptied afterwards: the fuzzer creates and deletes
    maps by the generated names, which no other test should see."""
    redis_url = urlunsplit(urlsplit(redis_url)._replace(path=f"/{OWN_DB}"))
    client = redis.Redis.from_url(redis_url)
    name = f"fuzz-{uuid.uuid4().hex[:12]}"
    topic = f"{name}-events"
    entities = {k: orjson.dumps({"id": k, "name": k.upper()}) for k in ("a", "b", "c")}
    write_batch(redis_url, name, 0, entities, {topic: {0: WATERMARK}})
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1)])[topic].result(30)
    tokens = tmp_path_factory.mktemp("auth") / "tokens.yaml"
    grant = {"name": "fuzz", "token": TOKEN, "maps": ["*"], "verbs": ["*"]}
    tokens.write_text(yaml.safe_dump({"tokens": [grant]}))
    lookup = {"map": name, "key_field": "id"}
    cfg = parse_config(
        {
            "kafka": {"bootstrap_servers": kafka_bootstrap},
            "redis": {"url": redis_url},
            "catalog": {"topic": f"maps-{name}"},
            "query": {
                "auth": {"tokens_file": str(tokens)},
                "enrich_profiles": {PROFILE: {"lookups": [lookup]}},
            },
            "maps": {name: map_doc(name)},
        }
    )
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    serving = front(cfg)
    started = asyncio.run_coroutine_threadsafe(serving.__aenter__(), loop).result(30)
    try:
        yield Served(started.base, name, topic)
    finally:
        asyncio.run_coroutine_threadsafe(serving.__aexit__(None, None, None), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        client.flushdb()
        client.close()


@pytest.fixture(scope="module")
def schema(served: Served) -> Any:
    return schemathesis.openapi.from_url(served.base + "/openapi.json", config=CONFIG)


def test_the_document_is_the_endpoint_table(schema: Any) -> None:
    paths = schema.raw_schema["paths"]
    served = {op["operationId"] for item in paths.values() for op in item.values()}
    assert served == {e.name for e in ENDPOINTS}


def violable(endpoint: Endpoint) -> bool:
    """A path parameter is any string: an operation with nothing else has no invalid data."""
    return endpoint.body is not None or any(p.where != "path" for p in endpoint.params)


CASES = [
    pytest.param(e, mode, id=f"{e.name}-{mode.value}")
    for e in ENDPOINTS
    for mode in GenerationMode
    if mode is GenerationMode.POSITIVE or violable(e)
]


@pytest.mark.parametrize(("endpoint", "mode"), CASES)
def test_every_operation_keeps_to_its_document(
    schema: Any,
    served: Served,
    endpoint: Endpoint,
    mode: GenerationMode,
    caplog: pytest.LogCaptureFixture,
) -> None:
    operation = schema.find_operation_by_id(endpoint.name)
    generated = operation.as_strategy(mode)
    if "{map}" in endpoint.path:
        generated = st.one_of(
            generated, operation.as_strategy(mode, path_parameters={"map": served.map})
        )
    if mode is GenerationMode.POSITIVE:
        generated = generated.map(lambda case: as_a_client(case, served))
    else:
        generated = generated.filter(has_a_wire_form)

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=generated)
    def fuzz(case: Any) -> None:
        response = case.call(headers={"Authorization": f"Bearer {TOKEN}"})
        checks = CHECKS
        beyond = mode is GenerationMode.POSITIVE and endpoint.name in CHECKED_BEYOND_SCHEMA
        if beyond and response.status_code == 400:
            message = response.json()["error"]["message"]
            assert BEYOND_SCHEMA.search(message), message
            checks = [check for check in CHECKS if check is not positive_data_acceptance]
        case.validate_response(response, checks=checks)

    fuzz()
    # A 500 answered to a client that had gone (a change stream it stopped reading) is seen
    # only in the server's log.
    unhandled = [r for r in caplog.records if r.name == "query_service.http.server"]
    assert not unhandled, [r.getMessage() for r in unhandled]


def as_a_client(case: Any, served: Served) -> Any:
    """The values the document cannot constrain, taken from the server's state."""
    query, body = case.query or {}, case.body
    section = body.get("config") if isinstance(body, dict) and "name" in body else body
    if case.operation.definition.raw.get("operationId") in CHECKED_BEYOND_SCHEMA:
        source = section.get("source") if isinstance(section, dict) else None
        if isinstance(source, dict):
            source["topics"] = [served.topic]  # one that exists
            source.pop("schema_registry_url", None)  # no registry to ask here
        if isinstance(body, dict):
            case.body = within_64_bits(body)
        return case
    waits = False
    if query.get("min_offsets"):
        items = [item.split(":") for item in query["min_offsets"].split(",") if item]
        query["min_offsets"] = ",".join(f"{served.topic}:{p}:{o}" for _, p, o in items)
        waits = bool(items)
    if isinstance(body, dict) and body.get("min_offsets"):
        merged: dict[str, int] = {}
        for partitions in body["min_offsets"].values():
            merged.update(partitions)
        body["min_offsets"] = {served.topic: merged}
        body["timeout_ms"] = min(body.get("timeout_ms") or 100, 100)
    if waits or "timeout_ms" in query:
        query["timeout_ms"] = min(query.get("timeout_ms") or 100, 100)
    if isinstance(body, list):
        case.body = [within_64_bits(event) for event in body]
    query.pop("page_token", None)
    for container, name in ((query, "after"), (case.headers or {}, "Last-Event-ID")):
        if name in container:
            container[name] = "0"
    if "profile" in query:
        query["profile"] = PROFILE
    if "spec" in query:
        query["spec"] = orjson.dumps({"lookups": [{"map": served.map, "key_field": "id"}]}).decode()
    return case


def within_64_bits(value: Any) -> Any:
    """An event as the document's prose has it: integers within 64 bits (as the server's
    JSON parser takes them), which JSON Schema cannot say of every nested value."""
    if isinstance(value, dict):
        return {k: within_64_bits(v) for k, v in value.items()}
    if isinstance(value, list):
        return [within_64_bits(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool):
        return max(-(2**63), min(value, 2**64 - 1))
    return value


def has_a_wire_form(case: Any) -> bool:
    """A body of a text media type is text on the wire whatever JSON type the generator gave
    it (YAML of an array is a document the validator answers), and NDJSON is written from a
    list: other negations of such bodies are no different request."""
    media = case.media_type or ""
    if media.endswith("yaml"):
        return isinstance(case.body, str)
    if media == NDJSON:
        return isinstance(case.body, list)
    return True
