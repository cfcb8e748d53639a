"""The HTTP front fuzzed by schemathesis from the OpenAPI document it serves, and the
console from its own.

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
name the field it refuses (``sql: ...``, ``params: ...``). Such refusals
must not hide a server that refuses everything: each of these operations
must also have taken some of its valid requests (a map created, changed and
deleted, a statement answered), so a client writes real statements beside
the generated text, and deletes maps it created. Each negative run must have
sent requests, not filtered them all away.

The console is fuzzed the same way from its document
(``query_service.console.openapi``), as a browser uses it: logged in through
its form, the session's cookie and CSRF token on each request, redirects
taken as answers. A browser's form sends a section that reads a topic that
exists and the map's name typed to confirm a button; form fields are text on
the wire, so a negative case counts only when its request is invalid as sent
(``negated_on_the_wire``).

The documents are held to the server too: the routes the running
application serves are exactly those of its documents, each in one.

The cases a run of schemathesis from outside found (every check, on the
service's own ``/openapi.json``) are pinned at the end, each checked against
the document and the server alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import importlib
import json
import logging
import pkgutil
import re
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import jsonschema
import orjson
import pytest
import redis
import requests
import schemathesis
import yaml
from aiohttp import web
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
from query_service.console.app import CSRF_HEADER
from query_service.console.openapi import FORM, ROUTES, Route, console_document
from query_service.console.sessions import COOKIE
from query_service.http.endpoints import ENDPOINTS, JSON, NDJSON, YAML, Endpoint
from tests.helpers.query_redis import map_doc, started, write_batch


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
ACCEPTED = {"create_map": 201, "put_map_config": 200, "delete_map": 200, "sql": 200}
"""The answer each of them must have given to some valid request of a run: the 400s a
schema cannot foresee may not be all it answers."""
DELETED = 3
"""Maps created before ``delete_map`` is fuzzed, for its valid requests to delete."""
BEYOND_SCHEMA = re.compile(
    r"maps\.[A-Za-z0-9][A-Za-z0-9_.-]*(\.\S+)?: |declared in the configuration file"
    r"|state cannot follow"
    # A statement's text: what SQL a schema cannot say, each refusal naming its field.
    r"|^(sql|params|limit|min_offsets\[\d+\]\.topic): "
)
STREAM_READ = {"request-timeout": 1.0, "request-retries": 2}
"""How a change stream is read: for a second, then closed as a client gone. Its headers
come once the stream is positioned, which a loaded machine can hold past that second: the
request is then sent again (twice at most), as a client would, rather than failing."""
CONFIG = schemathesis.Config.from_dict(
    {
        # 5xx are server errors, except the 503 and 504 the document declares (and
        # status_code_conformance fails any status an operation does not declare).
        "checks": {"not_a_server_error": {"expected-statuses": ["2xx", "3xx", "4xx", 503, 504]}},
        "request-timeout": 10,
        "operations": [{"include-operation-id": "changes", **STREAM_READ}],
    }
)
CONSOLE = "/ui"
"""The console's base path: ``query.console.base_path`` by default."""
CONSOLE_SETTINGS: dict[str, Any] = {
    "checks": {"not_a_server_error": {"expected-statuses": ["2xx", "3xx", "4xx", 503, 504]}},
    "request-timeout": 10,
    "operations": [{"include-operation-id": "changes_stream", **STREAM_READ}],
    # The session is a browser's, sent by the test: not a generated cookie.
    "generation": {"with-security-parameters": False},
}
CONSOLE_BEYOND_SCHEMA = frozenset({"new_map", "edit_map", "map_action", "run_sql"})
"""Console operations whose 400 may refuse what a schema cannot say, as the API's."""
CONSOLE_BEYOND_SCHEMA_PAGE = re.compile(
    r"maps\.[A-Za-z0-9][A-Za-z0-9_.-]*(\.\S+)?: |declared in the configuration file"
    r"|state cannot follow|no materializer|exists already|\b(sql|params\[\d+\]): "
)
CONSOLE_ACCEPTED = {
    "new_map": 303,
    "edit_map": 303,
    "map_action": 303,
    "run_sql": 200,
    "login": 303,
    "static": 200,
}
"""The answer each console operation must have given to some valid request of a run."""


@schemathesis.serializer(NDJSON)
def ndjson(_: Any, value: Any) -> bytes:
    """The document describes an NDJSON body as the array of its lines' objects."""
    items = value if isinstance(value, list) else [value]
    return b"".join(json.dumps(item).encode() + b"\n" for item in items)


@dataclass(frozen=True)
class Served:
    base: str
    map: str
    topic: str
    app: web.Application
    """The application the service runs, with the routes it serves."""


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
    serving = started(cfg)
    servers = asyncio.run_coroutine_threadsafe(serving.__aenter__(), loop).result(30)
    assert servers.http is not None
    try:
        yield Served(f"http://127.0.0.1:{servers.http_port}", name, topic, servers.http.app)
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


def test_the_documents_are_the_routes_served(
    schema: Any, console_schema: Any, served: Served
) -> None:
    """What the router of the running application serves, read from aiohttp, against the
    documents: the one the service serves and the console's. Every route is in one of
    them, and every operation they hold is served."""
    api, console = routes(schema.raw_schema), routes(console_schema.raw_schema)
    assert api and console and not api & console
    assert served_routes(served.app) == api | console


def routes(document: dict[str, Any], prefix: str = "") -> set[tuple[str, str]]:
    """(method, path) of each operation of an OpenAPI document."""
    methods = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}
    return {
        (method.upper(), prefix + path)
        for path, item in document["paths"].items()
        for method in item
        if method in methods
    }


def served_routes(app: web.Application) -> set[tuple[str, str]]:
    """(method, path) of each route ``app`` serves, path parameters as OpenAPI writes them.

    A HEAD route aiohttp adds beside a GET is left out (HTTP says a HEAD answers as the
    GET without its body); a static directory is one route, ``{filename}`` its files."""
    out = set()
    for route in app.router.routes():
        resource = route.resource
        assert resource is not None
        path = resource.canonical
        if isinstance(resource, web.StaticResource):
            path += "/{filename}"
        out.add((route.method, path))
    return {(m, p) for m, p in out if m != "HEAD" or ("GET", p) not in out}


def violable(endpoint: Endpoint) -> bool:
    """A path parameter is any string: an operation with nothing else has no invalid data."""
    return endpoint.body is not None or any(p.where != "path" for p in endpoint.params)


def cases(operations: Any, violable: Any, prefix: str = "") -> list[Any]:
    """Each operation in positive mode, and in negative mode where invalid data exists."""
    return [
        pytest.param(op, mode, id=f"{prefix}{op.name}-{mode.value}")
        for op in operations
        for mode in GenerationMode
        if mode is GenerationMode.POSITIVE or violable(op)
    ]


CASES = cases(ENDPOINTS, violable)


@pytest.mark.parametrize(("endpoint", "mode"), CASES)
def test_every_operation_keeps_to_its_document(
    schema: Any,
    served: Served,
    endpoint: Endpoint,
    mode: GenerationMode,
    caplog: pytest.LogCaptureFixture,
) -> None:
    positive = mode is GenerationMode.POSITIVE
    operation = schema.find_operation_by_id(endpoint.name)
    generated = operation.as_strategy(mode)
    if "{map}" in endpoint.path:
        names = [served.map]
        if positive and endpoint.name == "delete_map":
            names += maps_created(served, DELETED)  # a client deletes maps that exist
        generated = st.one_of(
            generated,
            *(operation.as_strategy(mode, path_parameters={"map": name}) for name in names),
        )
    if positive and endpoint.name == "sql":
        generated = st.one_of(generated, generated.map(a_statement))  # as a client writes
    if positive:
        generated = generated.map(lambda case: as_a_client(case, served))
    else:
        generated = generated.filter(has_a_wire_form)

    def beyond_schema(response: Any) -> bool:
        if not (positive and endpoint.name in CHECKED_BEYOND_SCHEMA):
            return False
        message = response.json()["error"]["message"]
        assert BEYOND_SCHEMA.search(message), message
        return True

    answered = fuzzed(
        generated,
        lambda case: case.call(headers={"Authorization": f"Bearer {TOKEN}"}),
        beyond_schema,
    )
    # A 500 answered to a client that had gone (a change stream it stopped reading) is seen
    # only in the server's log.
    wanted = ACCEPTED.get(endpoint.name) if positive else None
    held(answered, caplog, "query_service.http.server", wanted)


def fuzzed(cases: Any, send: Any, beyond_schema: Any) -> Counter[int]:
    """Each generated case sent (``send``) and its answer held to the document by
    ``CHECKS``, but a 400 ``beyond_schema`` says a schema could not foresee is not held to
    taking valid data; the statuses answered, counted."""
    answered: Counter[int] = Counter()

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=cases)
    def fuzz(case: Any) -> None:
        response = send(case)
        answered[response.status_code] += 1
        checks = CHECKS
        if response.status_code == 400 and beyond_schema(response):
            checks = [check for check in CHECKS if check is not positive_data_acceptance]
        case.validate_response(response, checks=checks)

    fuzz()
    return answered


def held(
    answered: Counter[int], caplog: pytest.LogCaptureFixture, logger: str, wanted: int | None
) -> None:
    """What every fuzzed operation must show after its run: no unhandled error in the
    log of the front (``logger``) or of the calls it made, some request sent, and the
    answer ``wanted`` (if any) given to one."""
    loggers = {logger, "query_service.interceptors"}
    unhandled = [r for r in caplog.records if r.name in loggers and r.levelno >= logging.ERROR]
    assert not unhandled, [r.getMessage() for r in unhandled]
    assert answered, "no request was sent: the generated cases were all filtered out"
    if wanted:
        assert answered[wanted], f"no valid request was taken: {answered}"


def a_section(served: Served) -> dict[str, Any]:
    """A map's section reading the served map's topic (which exists)."""
    doc = map_doc("any")
    return {**doc, "source": {**doc["source"], "topics": [served.topic]}}


def maps_created(served: Served, count: int) -> list[str]:
    """``count`` maps created through the API, reading the served map's topic."""
    names = [f"{served.map}-deleted-{i}" for i in range(count)]
    for name in names:
        created = requests.post(
            f"{served.base}/v1/maps",
            json={"name": name, "config": a_section(served)},
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=30,
        )
        assert created.status_code == 201, created.text
    return names


def a_statement(case: Any) -> Any:
    """A statement a client would send with the generated parameters: each one selected
    (an empty list, one constant), read at once (no table, so no read-your-writes)."""
    body = case.body
    if isinstance(body, dict):
        count = len(body.get("params") or [])
        columns = [f"${i} AS p{i}" for i in range(1, count + 1)] or ["1 AS one"]
        body.update(sql="SELECT " + ", ".join(columns), min_offsets={}, timeout_ms=None)
    return case


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
    """NDJSON is written from a list, one line per item: another JSON type negating the
    body is no different request."""
    if case.media_type == NDJSON:
        return isinstance(case.body, list)
    return True


# --- The console, from a document of its own ---------------------------------------------


@dataclass(frozen=True)
class Login:
    """A console session: what a browser holds after logging in."""

    cookie: str
    csrf: str

    def headers(self) -> dict[str, str]:
        return {"Cookie": f"{COOKIE}={self.cookie}", CSRF_HEADER: self.csrf}


def log_in(served: Served) -> Login:
    """Log in through the form with the token that may do everything, as a browser does;
    the CSRF token is the one every page carries."""
    answer = requests.post(
        f"{served.base}{CONSOLE}/login",
        data={"token": TOKEN, "next": f"{CONSOLE}/"},
        allow_redirects=False,
        timeout=30,
    )
    assert answer.status_code == 303, answer.text
    cookie = answer.cookies[COOKIE]
    page = requests.get(f"{served.base}{CONSOLE}/", cookies={COOKIE: cookie}, timeout=30)
    csrf = re.search(r'data-csrf="([^"]+)"', page.text)
    assert page.status_code == 200 and csrf, page.text
    return Login(cookie, html.unescape(csrf.group(1)))


@pytest.fixture(scope="module")
def console_schema(served: Served) -> Any:
    config = schemathesis.Config.from_dict({**CONSOLE_SETTINGS, "base-url": served.base})
    return schemathesis.openapi.from_dict(console_document(CONSOLE), config=config)


@pytest.fixture(scope="module")
def login(served: Served) -> Login:
    return log_in(served)


def console_violable(route: Route) -> bool:
    """Invalid data exists: a required field, or a parameter or field constrained beyond
    any string (a form field or a query parameter is text on the wire whatever else)."""
    constrained = [p.schema for p in route.params] + list(route.form.values())
    return bool(route.required) or any(set(c) - {"type", "description"} for c in constrained)


CONSOLE_CASES = cases(ROUTES, console_violable, "console-")


@pytest.mark.parametrize(("route", "mode"), CONSOLE_CASES)
def test_every_console_operation_keeps_to_its_document(
    console_schema: Any,
    served: Served,
    login: Login,
    route: Route,
    mode: GenerationMode,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """As the API's operations, with a browser's session: the cookie and the CSRF token
    of a login, on every request but the login's own (and a logout ends a session of its
    own). Redirects are answers, not followed."""
    positive = mode is GenerationMode.POSITIVE
    operation = console_schema.find_operation_by_id(route.name)
    generated = operation.as_strategy(mode)
    if "{map}" in route.path:
        generated = st.one_of(
            generated, operation.as_strategy(mode, path_parameters={"map": served.map})
        )
    if positive and route.name in CONSOLE_CLIENTS:
        generated = st.one_of(generated, generated.map(CONSOLE_CLIENTS[route.name]))
    if positive:
        generated = generated.map(lambda case: as_a_browser(case, served))
    else:
        generated = generated.filter(negated_on_the_wire)

    def send(case: Any) -> Any:
        headers = {}
        if route.name == "logout":
            headers = log_in(served).headers()
        elif route.name != "login":  # a login would end the browser's session
            headers = login.headers()
        return case.call(headers=headers, allow_redirects=False)

    def beyond_schema(response: Any) -> bool:
        if not (positive and route.name in CONSOLE_BEYOND_SCHEMA):
            return False
        page = html.unescape(response.text)
        assert CONSOLE_BEYOND_SCHEMA_PAGE.search(page), page
        return True

    answered = fuzzed(generated, send, beyond_schema)
    wanted = CONSOLE_ACCEPTED.get(route.name) if positive else None
    held(answered, caplog, "query_service.console.app", wanted)
    # The session was never lost on the way: a logout ended only its own.
    assert requests.get(
        f"{served.base}{CONSOLE}/fragments/overview", headers=login.headers(), timeout=30
    ).ok


def as_a_browser(case: Any, served: Served) -> Any:
    """What a browser sends that the document cannot constrain: a map's section that
    reads a topic that exists, the map's name typed to confirm a button (as the page's
    forms have it)."""
    form = case.operation.definition.raw.get("requestBody", {}).get("content", {}).get(FORM)
    if form is None:
        return case
    if not isinstance(case.body, dict):
        case.body, case.media_type = {}, FORM
    fields = form["schema"]["properties"]
    if "config" in fields:
        case.body["config"] = yaml.safe_dump(a_section(served))
    if "confirm" in fields:
        case.body["confirm"] = case.path_parameters["map"]
    return case


def with_token(case: Any) -> Any:
    """The login form with the token that may do everything."""
    if isinstance(case.body, dict):
        case.body["token"] = TOKEN
    return case


def a_file(case: Any) -> Any:
    """One of the console's own files."""
    case.path_parameters = {"filename": "console.css"}
    return case


def a_typed_statement(case: Any) -> Any:
    """A statement an operator types, without parameters."""
    if isinstance(case.body, dict):
        case.body.update(sql="SELECT 1 AS one", params="")
    return case


CONSOLE_CLIENTS = {"login": with_token, "static": a_file, "run_sql": a_typed_statement}
"""What a browser also sends, beside the generated requests, for valid ones to do
something: a known token, a file that exists, a statement."""


def negated_on_the_wire(case: Any) -> bool:
    """A negative case whose request is invalid as the server reads it. A form's fields and
    the path are text: a number or a list in their place is a string that may well be
    valid, no different request from a positive one."""
    raw = case.operation.definition.raw
    checks: list[tuple[dict[str, Any], Any]] = []
    body = raw.get("requestBody")
    if body and isinstance(case.body, dict):
        sent = {k: text(v) for k, v in case.body.items()}
        checks.append(
            (body["content"][FORM]["schema"], {k: v for k, v in sent.items() if v is not None})
        )
    elif body and body["required"]:
        return True  # no form at all
    for param in raw["parameters"]:
        if param["in"] == "path":
            checks.append((param["schema"], text((case.path_parameters or {})[param["name"]])))
    return any(not jsonschema.Draft202012Validator(s).is_valid(v) for s, v in checks)


def text(value: Any) -> str | None:
    """A value as a form or a URL sends it (requests' encoding): a list as its first item
    (the one a form's reader takes), None as nothing."""
    if isinstance(value, list):
        return text(value[0]) if value else None
    return None if value is None else value if isinstance(value, str) else str(value)


# --- Found from outside: schemathesis on /openapi.json, every check, a fixed seed ---------


def operation_of(document: dict[str, Any], operation_id: str) -> dict[str, Any]:
    """The operation of the document with this id."""
    found = [
        op for item in document["paths"].values() for op in item.values()
        if isinstance(op, dict) and op.get("operationId") == operation_id
    ]  # fmt: skip
    assert len(found) == 1, operation_id
    return found[0]


def call(method: str, url: str, **kwargs: Any) -> requests.Response:
    """A request with the token that may do everything."""
    headers = {"Authorization": f"Bearer {TOKEN}", **kwargs.pop("headers", {})}
    return requests.request(method, url, headers=headers, timeout=30, **kwargs)


def refused(response: requests.Response, field: str) -> bool:
    """A 400 whose message starts with the field it refuses."""
    return response.status_code == 400 and response.json()["error"]["message"].startswith(
        f"{field}: "
    )


def test_an_enrichment_without_events_is_refused_as_its_document_requires_them(
    schema: Any, served: Served
) -> None:
    """``POST /v1/enrich?profile=...`` with no body was answered 200 and an empty stream,
    though the document requires a body: a body without an event is a 400 naming it."""
    body = operation_of(schema.raw_schema, "enrich")["requestBody"]
    events = jsonschema.Draft202012Validator(body["content"][NDJSON]["schema"])
    assert body["required"] and not events.is_valid([]) and events.is_valid([{"id": "a"}])
    url = f"{served.base}/v1/enrich?profile={PROFILE}"
    ndjson = {"Content-Type": NDJSON}
    for sent in ({}, {"data": b"", "headers": ndjson}, {"data": b"\n  \n", "headers": ndjson}):
        answer = call("POST", url, **sent)
        assert refused(answer, "body"), (sent, answer.status_code, answer.text)
        assert "no events" in answer.json()["error"]["message"]
    one = call("POST", url, data=b'{"id": "a"}\n', headers=ndjson)
    assert one.status_code == 200, one.text
    lines = [json.loads(line) for line in one.text.splitlines()]
    assert len(lines) == 1 and lines[0]["index"] == 0 and lines[0]["event"]["id"] == "a"


def test_a_configuration_to_validate_is_a_mapping_as_its_document_says(
    schema: Any, served: Served
) -> None:
    """``PUT /v1/config/validate`` with the YAML ``''`` was answered 200 though the
    document's schema refused it: what is not a mapping is a 400 naming the config, and a
    mapping's problems are the answer."""
    body = operation_of(schema.raw_schema, "validate")["requestBody"]
    document = jsonschema.Draft202012Validator(body["content"][YAML]["schema"])
    url = f"{served.base}/v1/config/validate"
    for text in ("''\n", "[]\n", "just text\n", "# only a comment\n", "---\n", "null\n"):
        assert not document.is_valid(yaml.safe_load(text)), text
        answer = call("PUT", url, data=text.encode(), headers={"Content-Type": YAML})
        assert refused(answer, "config"), (text, answer.status_code, answer.text)
        assert "not a mapping" in answer.json()["error"]["message"]
    empty = call("PUT", url, data=b"", headers={"Content-Type": YAML})
    assert refused(empty, "config") and "empty" in empty.json()["error"]["message"]
    assert refused(call("PUT", url, data=b"maps: \xff\n", headers={"Content-Type": YAML}), "config")
    text = "maps: {m: {key: id}}\n"
    assert document.is_valid(yaml.safe_load(text))
    checked = call("PUT", url, data=text.encode(), headers={"Content-Type": YAML})
    assert checked.status_code == 200, checked.text
    assert checked.json()["valid"] is False
    assert any(p.startswith("maps.m") for p in checked.json()["problems"])
    # Text the parser cannot read is answered with the parser's problem, as the document's
    # description says (a schema describes decoded values only).
    broken = call("PUT", url, data=b"maps: [\n", headers={"Content-Type": YAML})
    assert broken.status_code == 200 and broken.json()["valid"] is False, broken.text
    assert any("not valid YAML" in p for p in broken.json()["problems"])


def test_a_statement_is_what_the_document_says(schema: Any, served: Served) -> None:
    """``POST /v1/sql`` with ``"sql": "0"`` was refused though the document allowed any
    string: the document says what a statement is, and refuses text without a query."""
    sql = schema.raw_schema["components"]["schemas"]["SqlBody"]["properties"]["sql"]
    assert "SELECT or WITH" in sql["description"]
    url = f"{served.base}/v1/sql"
    for text in ("0", "x = 1", "selected", "EXPLAIN ANALYZE"):
        assert not re.search(sql["pattern"], text), text
        assert refused(call("POST", url, json={"sql": text}), "sql"), text
    for text in (
        "SELECT 1 AS one",
        "(select 1 as one)",
        "WITH t AS (SELECT 1 AS one) SELECT one FROM t",
        "-- a comment\nSELECT 1 AS one",
        "/* one */SELECT 1 AS one",
    ):
        assert re.search(sql["pattern"], text), text
        answer = call("POST", url, json={"sql": text}, headers={"Accept": JSON})
        assert answer.status_code == 200, (text, answer.text)
        assert answer.json()["rows"] == [{"one": 1}], text


def test_a_resume_position_that_is_not_a_change_id_is_a_400(schema: Any, served: Served) -> None:
    """``Last-Event-ID`` with a byte that is not UTF-8 was a 500 (no protobuf string holds
    it): a position that is not a change id is a 400 naming where it came from, as the
    document's pattern says."""
    params = {p["name"]: p for p in operation_of(schema.raw_schema, "changes")["parameters"]}
    url = f"{served.base}/v1/maps/{served.map}/changes"
    for bad in ("\x84", "x", "1-2-3"):
        assert not re.search(params["Last-Event-ID"]["schema"]["pattern"], bad), bad
        assert refused(call("GET", url, headers={"Last-Event-ID": bad}), "Last-Event-ID"), bad
        assert not re.search(params["after"]["schema"]["pattern"], bad), bad
        assert refused(call("GET", url, params={"after": bad}), "after"), bad
