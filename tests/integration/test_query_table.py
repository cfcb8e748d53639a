"""MapService.Query and GetAsOf over a Delta table the real pipeline wrote.

One table per module: two waves of events folded by ``start_map`` (Kafka,
Spark, Delta, Redis all real), the table version remembered after each. The
rows the service returns are compared with plain-Python filters over the
reference fold of the events; every call goes through a real server and channel.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import grpc
import orjson
import pytest
import redis
from deltalake import DeltaTable
from google.protobuf.timestamp_pb2 import Timestamp

from materializer.config import AppConfig
from materializer.contract.redis_layout import entity_key
from materializer.contract.table_layout import table_path
from materializer.job import start_map
from materializer.testing import create_topic, produce
from materializer.testing.reference import fold_latest
from materializer.v1 import map_service_pb2 as pb
from materializer.v1 import map_service_pb2_grpc as pb_grpc
from query_service.http import shapes
from tests.helpers.query_redis import Front, serve_http
from tests.helpers.query_redis import run as serve_and_run
from tests.helpers.slices import config, slice_config

T = TypeVar("T")
MAP = f"people{uuid.uuid4().hex[:8]}"
NO_TABLE = "people_later"
SCHEMA = "id STRING, name STRING, age INT, tags ARRAY<STRING>, score DOUBLE, joined TIMESTAMP"
FIELDS = ["id", "name", "age", "tags", "score", "joined"]
NAMES = ["Ann", "O'Brien", "back\\slash", "Zoë", "semi;colon", "--dash", "Bob", "ann"]
DEADLINE = 60.0
Entity = dict[str, Any]
Events = list[tuple[bytes | None, bytes | None]]
OLD_QUERY = pb.QueryRequest(map=MAP, where="age >= 20", page_size=5)
"""Started before the second wave and continued after it."""


def joined(i: int) -> str:
    """A timestamp in the exact form the pipeline writes (microseconds, Z), some with .000000."""
    when = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(days=i, microseconds=(i % 3) * 123_457)
    return when.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def person(i: int, *, age_shift: int = 0) -> Entity:
    doc: Entity = {"id": f"u{i:02d}", "name": NAMES[i % len(NAMES)], "score": i * 1.25}
    if i % 11:
        doc["age"] = (i * 7 + age_shift) % 100
    if i % 2 == 0:
        doc["tags"] = [f"t{i % 3}", f"t{(i + 1) % 3}"]
    if i % 4:
        doc["joined"] = joined(i)
    if i % 13 == 5:
        doc["name"] = None
    return doc


def upsert(doc: Entity) -> tuple[bytes, bytes]:
    return doc["id"].encode(), orjson.dumps(doc)


def tombstone(i: int) -> tuple[bytes, None]:
    return f"u{i:02d}".encode(), None


def first_wave() -> Events:
    events: Events = [upsert(person(i)) for i in range(70)]
    events += [upsert({**person(i), "name": f"renamed-{i}"}) for i in range(10)]
    events += [tombstone(i) for i in range(60, 65)]
    return events


def second_wave() -> Events:
    events: Events = [upsert(person(i, age_shift=1)) for i in range(20)]  # modified
    events += [tombstone(i) for i in range(20, 30)]  # deleted
    events += [upsert({**person(i), "name": None}) for i in range(30, 35)]  # a field removed
    events += [upsert(person(i)) for i in range(70, 80)]  # created
    return events


@dataclass
class Table:
    """What the module's pipeline wrote, and what the tests compare against."""

    cfg: AppConfig
    path: str
    first: dict[str, Entity]
    """The reference fold after the first wave: the table at ``first_version``."""
    latest: dict[str, Entity]
    """The reference fold after both waves: the table at ``latest_version``."""
    first_version: int
    latest_version: int
    old_pages: list[pb.QueryResponse]
    """The first page of ``OLD_QUERY``, read when ``first_version`` was the latest."""


def run(cfg: AppConfig, body: Callable[[pb_grpc.MapServiceStub], Awaitable[T]]) -> T:
    """``body`` against a freshly started server, through a real channel."""
    return serve_and_run(cfg, lambda channel: body(pb_grpc.MapServiceStub(channel)))


async def first_page(stub: pb_grpc.MapServiceStub, request: pb.QueryRequest) -> pb.QueryResponse:
    """One response of a query, then the call is cancelled: a client that stops reading."""
    call = stub.Query(request, timeout=DEADLINE)
    page = await call.read()
    call.cancel()
    assert isinstance(page, pb.QueryResponse)
    return page


async def all_pages(
    stub: pb_grpc.MapServiceStub, request: pb.QueryRequest
) -> list[pb.QueryResponse]:
    return [page async for page in stub.Query(request, timeout=DEADLINE)]


@pytest.fixture(scope="module")
def table(
    spark: Any, kafka_bootstrap: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Table:
    tmp: Path = tmp_path_factory.mktemp("query-table")
    topic = create_topic(kafka_bootstrap, 2)
    doc = slice_config(tmp, kafka_bootstrap, redis_url, topic, map_name=MAP)
    doc["maps"][MAP]["source"]["schema"] = SCHEMA
    doc["maps"][NO_TABLE] = {
        "source": {"topics": [f"{topic}-later"], "schema": SCHEMA},
        "key": "id",
    }
    cfg = config(doc)
    path = table_path(cfg, MAP)

    events = []

    def write(records: Events) -> dict[str, Entity]:
        positions = produce(kafka_bootstrap, topic, records)
        events.extend((p, o, k, v) for (p, o), (k, v) in zip(positions, records, strict=True))
        queries.process_all_available()
        return fold_latest(events, "id", FIELDS)

    queries = start_map(spark, cfg, MAP)
    try:
        first = write(first_wave())
        first_version = DeltaTable(path).version()
        old_pages = [run(cfg, lambda stub: first_page(stub, OLD_QUERY))]
        latest = write(second_wave())
        latest_version = DeltaTable(path).version()
    finally:
        queries.stop()
    assert latest_version > first_version
    return Table(cfg, path, first, latest, first_version, latest_version, old_pages)


def rows_of(pages: list[pb.QueryResponse]) -> list[tuple[str, Entity]]:
    return [(row.key, orjson.loads(row.entity)) for page in pages for row in page.rows]


def expected(
    reference: dict[str, Entity], keep: Callable[[Entity], bool]
) -> list[tuple[str, Entity]]:
    return [(key, entity) for key, entity in sorted(reference.items()) if keep(entity)]


def query(table: Table, **request: Any) -> list[pb.QueryResponse]:
    message = pb.QueryRequest(**{"map": MAP, **request})
    return run(table.cfg, lambda stub: all_pages(stub, message))


def query_error(table: Table, **request: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        query(table, **request)
    return info.value


def has(field: str, test: Callable[[Any], bool]) -> Callable[[Entity], bool]:
    """SQL's three-valued logic for a comparison: a missing (null) field never matches."""
    return lambda e: e.get(field) is not None and test(e[field])


# --- Query --------------------------------------------------------------------------------


def test_every_row_comes_back_in_key_order_with_the_latest_version(table: Table):
    pages = query(table)

    assert rows_of(pages) == expected(table.latest, lambda e: True)
    assert {p.table_version for p in pages} == {table.latest_version}
    assert pages[-1].page_token == ""


WHERE_CASES: list[tuple[str, Callable[[Entity], bool]]] = [
    ("age >= 50", has("age", lambda a: a >= 50)),
    ("Age < 10 OR name IS NULL", lambda e: e.get("age", 100) < 10 or "name" not in e),
    ("NOT (age > 40)", has("age", lambda a: not a > 40)),
    (
        "age BETWEEN 20 AND 30 AND score > 10",
        lambda e: 20 <= e.get("age", -1) <= 30 and e["score"] > 10,
    ),
    ("name = 'O''Brien'", has("name", lambda n: n == "O'Brien")),
    ("name = 'back\\slash'", has("name", lambda n: n == "back\\slash")),
    ("name LIKE '%;%' OR name LIKE '--%'", has("name", lambda n: ";" in n or n.startswith("--"))),
    ("lower(name) = 'ann'", has("name", lambda n: n.lower() == "ann")),
    ("id IN ('u01', 'u02', 'u25', 'u99')", lambda e: e["id"] in {"u01", "u02", "u25", "u99"}),
    ("array_contains(tags, 't2')", has("tags", lambda t: "t2" in t)),
    (
        "score * 2 > 100 AND age % 2 = 0",
        lambda e: e["score"] * 2 > 100 and e.get("age", 1) % 2 == 0,
    ),
    # The reference holds timestamps as the pipeline writes them, so strings compare as times.
    (
        "joined >= '2026-02-15T00:00:00Z'",
        has("joined", lambda j: j >= "2026-02-15T00:00:00.000000Z"),
    ),
    (
        "\"_key\" > 'u7' AND length(name) <= 3",
        lambda e: e["id"] > "u7" and len(e.get("name", "long")) <= 3,
    ),
    ("coalesce(age, -1) = -1", lambda e: "age" not in e),
]


@pytest.mark.parametrize(("where", "keep"), WHERE_CASES, ids=[w for w, _ in WHERE_CASES])
def test_where_matches_a_plain_python_filter(
    table: Table, where: str, keep: Callable[[Entity], bool]
):
    want = expected(table.latest, keep)
    assert want, "a case that matches nothing proves little"

    assert rows_of(query(table, where=where)) == want


Op = pb.Comparison.Operator


def cmp(field: str, op: int, value: pb.Value | None = None, **kw: Any) -> pb.Predicate:
    return pb.Predicate(comparison=pb.Comparison(field=field, op=op, value=value, **kw))


def all_of(*parts: pb.Predicate) -> pb.Predicate:
    return pb.Predicate(**{"and": pb.Predicate.And(all=list(parts))})


def any_of(*parts: pb.Predicate) -> pb.Predicate:
    return pb.Predicate(**{"or": pb.Predicate.Or(any=list(parts))})


def negate(part: pb.Predicate) -> pb.Predicate:
    return pb.Predicate(**{"not": part})


def at(text: str) -> pb.Value:
    value = pb.Value()
    value.timestamp_value.FromDatetime(datetime.fromisoformat(text))
    return value


def s(text: str) -> pb.Value:
    return pb.Value(string_value=text)


def n(number: int) -> pb.Value:
    return pb.Value(int_value=number)


PREDICATE_CASES: list[tuple[str, pb.Predicate, Callable[[Entity], bool]]] = [
    ("eq", cmp("name", Op.EQ, s("Zoë")), has("name", lambda v: v == "Zoë")),
    ("ne", cmp("name", Op.NE, s("Ann")), has("name", lambda v: v != "Ann")),
    ("lt", cmp("age", Op.LT, n(15)), has("age", lambda v: v < 15)),
    ("le", cmp("age", Op.LE, n(14)), has("age", lambda v: v <= 14)),
    ("gt", cmp("score", Op.GT, pb.Value(double_value=80.5)), lambda e: e["score"] > 80.5),
    (
        "ge",
        cmp("joined", Op.GE, at("2026-03-01T00:00:00+00:00")),
        has("joined", lambda j: j >= "2026-03-01T00:00:00.000000Z"),
    ),
    ("in", cmp("age", Op.IN, values=[n(7), n(14), n(22)]), has("age", lambda v: v in {7, 14, 22})),
    ("is-null", cmp("joined", Op.IS_NULL), lambda e: "joined" not in e),
    ("is-not-null", cmp("tags", Op.IS_NOT_NULL), lambda e: "tags" in e),
    ("like", cmp("name", Op.LIKE, s("%a%")), has("name", lambda v: "a" in v)),
    ("key", cmp("_key", Op.GE, s("u70")), lambda e: e["id"] >= "u70"),
    (
        "and-or-not",
        all_of(
            any_of(cmp("age", Op.LT, n(30)), cmp("name", Op.EQ, s("Bob"))),
            negate(cmp("tags", Op.IS_NULL)),
        ),
        lambda e: (e.get("age", 99) < 30 or e.get("name") == "Bob") and "tags" in e,
    ),
]


@pytest.mark.parametrize(
    ("predicate", "keep"),
    [(p, k) for _, p, k in PREDICATE_CASES],
    ids=[name for name, _, _ in PREDICATE_CASES],
)
def test_predicate_matches_a_plain_python_filter(
    table: Table, predicate: pb.Predicate, keep: Callable[[Entity], bool]
):
    want = expected(table.latest, keep)
    assert want

    assert rows_of(query(table, predicate=predicate)) == want


def test_entities_are_byte_for_byte_what_lookups_return(table: Table, redis_client: redis.Redis):
    """Same JSON conventions as the Redis entity: field order, timestamps, nulls left out."""
    rows = [row for page in query(table) for row in page.rows]

    assert rows
    for row in rows:
        assert row.entity == redis_client.get(entity_key(MAP, row.key)), row.key


def test_projection_returns_only_the_fields_asked(table: Table):
    pages = query(table, fields=["age", "name", "_key"], where="id < 'u10'")

    assert rows_of(pages) == [
        (key, {f: e[f] for f in ("name", "age") if f in e})
        for key, e in expected(table.latest, lambda e: e["id"] < "u10")
    ]
    both = next(row for page in pages for row in page.rows if row.key == "u01")
    assert list(orjson.loads(both.entity)) == ["name", "age"]  # table order, not request order


def test_unknown_field_is_invalid_argument_naming_it(table: Table):
    error = query_error(table, fields=["name", "salary"])

    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "salary" in error.details() and "fields[1]" in error.details()


def test_unknown_column_in_filters_is_invalid_argument_naming_it(table: Table):
    for request in (
        {"where": "salary > 10"},
        {"predicate": cmp("salary", Op.GT, n(10))},
    ):
        error = query_error(table, **request)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "salary" in error.details()


def test_limit_stops_after_that_many_rows_across_pages(table: Table):
    pages = query(table, limit=7, page_size=3)

    assert [len(p.rows) for p in pages] == [3, 3, 1]
    assert rows_of(pages) == expected(table.latest, lambda e: True)[:7]
    assert [bool(p.page_token) for p in pages] == [True, True, False]


def test_small_pages_cover_everything_once(table: Table):
    pages = query(table, page_size=4, where="age IS NOT NULL")

    assert all(0 < len(p.rows) <= 4 for p in pages)
    assert all(p.page_token for p in pages[:-1]) and not pages[-1].page_token
    assert rows_of(pages) == expected(table.latest, lambda e: "age" in e)


def test_page_tokens_continue_without_gaps_or_repeats(table: Table):
    """A client reads one page per call and resumes with its token, with fresh servers."""
    request = pb.QueryRequest(map=MAP, page_size=6, where="score >= 5", limit=40)
    pages = []
    while True:
        page = run(table.cfg, lambda stub: first_page(stub, request))
        pages.append(page)
        if not page.page_token:
            break
        request.page_token = page.page_token

    assert len(pages) == 7  # 40 rows: six full pages and four more
    assert rows_of(pages) == expected(table.latest, lambda e: e["score"] >= 5)[:40]


def test_a_token_reads_its_version_after_more_data_was_written(table: Table):
    first = table.old_pages[0]
    assert first.table_version == table.first_version and first.page_token

    rest = query(table, where=OLD_QUERY.where, page_size=5, page_token=first.page_token)

    assert {p.table_version for p in rest} == {table.first_version}
    keep = has("age", lambda a: a >= 20)
    assert rows_of([first, *rest]) == expected(table.first, keep)
    assert expected(table.first, keep) != expected(table.latest, keep)  # the data did change
    latest = query(table, where=OLD_QUERY.where)
    assert rows_of(latest) == expected(table.latest, keep)


@pytest.mark.parametrize(
    "other",
    [
        {"where": "age >= 21"},
        {"where": OLD_QUERY.where, "fields": ["name"]},
        {"predicate": cmp("age", Op.GE, n(30))},
        {},
    ],
    ids=["other-where", "other-fields", "other-predicate", "no-filter"],
)
def test_a_token_of_another_query_is_invalid_argument(table: Table, other: dict[str, Any]):
    token = table.old_pages[0].page_token

    error = query_error(table, page_token=token, **other)

    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "page_token" in error.details()


@pytest.mark.parametrize("token", ["garbage", "eyJmIjoxfQ", "x" * 10, "e30"])
def test_a_malformed_token_is_invalid_argument(table: Table, token: str):
    error = query_error(table, page_token=token)

    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "page_token" in error.details()


@pytest.mark.parametrize(
    "request_fields",
    [{"page_size": 10_001}, {"page_size": -1}, {"limit": -5}],
    ids=["page-too-big", "page-negative", "limit-negative"],
)
def test_bad_sizes_are_invalid_argument(table: Table, request_fields: dict[str, int]):
    assert query_error(table, **request_fields).code() == grpc.StatusCode.INVALID_ARGUMENT


INJECTIONS = [
    "1=1; DROP TABLE people",
    "age > 1; SELECT * FROM people",
    "id IN (SELECT id FROM people)",
    "age > 1 UNION SELECT * FROM people",
    "age > (SELECT max(age) FROM map_table)",
    "EXISTS (SELECT 1 FROM people_later)",
    "map_table.age > 1",
    "people.age > 1",
    "read_parquet('/etc/passwd') IS NOT NULL",
    "read_csv('/etc/passwd') IS NOT NULL",
    "age > 1 -- AND name = 'x'",
    "age > 1 /* ; DROP TABLE people */",
    "name = 'x' OR '1'='1' --",
    "name = 'x'' OR ''1''=''1'",  # one string literal, not an injection: must find nothing
    'name = "x" OR 1=1',
]


def test_injection_attempts_are_refused_and_the_server_keeps_serving(table: Table):
    async def body(stub: pb_grpc.MapServiceStub) -> list[Any]:
        outcomes: list[Any] = []
        for where in INJECTIONS:
            try:
                outcomes.append(
                    rows_of(await all_pages(stub, pb.QueryRequest(map=MAP, where=where)))
                )
            except grpc.aio.AioRpcError as exc:
                outcomes.append(exc.code())
        outcomes.append(rows_of(await all_pages(stub, pb.QueryRequest(map=MAP))))
        return outcomes

    *refused, quoted, double_quoted, after = run(table.cfg, body)

    assert refused == [grpc.StatusCode.INVALID_ARGUMENT] * (len(INJECTIONS) - 2)
    assert quoted == []
    assert double_quoted == grpc.StatusCode.INVALID_ARGUMENT  # "x" is a column: unknown
    assert after == expected(table.latest, lambda e: True)
    assert DeltaTable(table.path).version() == table.latest_version


def test_filter_the_engine_cannot_evaluate_is_invalid_argument(table: Table):
    for where in ("age = TRUE", "tags = 'x'", "age / 0 > 1"):
        error = query_error(table, where=where)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, where
        assert error.details()


def test_unknown_map_and_map_without_table_are_not_found(table: Table):
    unknown = query_error(table, map="nobody")
    no_table = query_error(table, map=NO_TABLE)

    assert unknown.code() == grpc.StatusCode.NOT_FOUND
    assert "nobody" in unknown.details()
    assert no_table.code() == grpc.StatusCode.NOT_FOUND
    assert f"map {NO_TABLE!r} has no Delta table yet" in no_table.details()


# --- GetAsOf ------------------------------------------------------------------------------


def get_as_of(table: Table, key: str, **as_of: Any) -> pb.GetAsOfResponse:
    request = pb.GetAsOfRequest(map=MAP, key=key, **as_of)
    return run(table.cfg, lambda stub: stub.GetAsOf(request, timeout=DEADLINE))


def get_as_of_error(table: Table, key: str, **as_of: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        get_as_of(table, key, **as_of)
    return info.value


def entity(response: pb.GetAsOfResponse) -> Entity | None:
    return orjson.loads(response.entity) if response.found else None


def commit_times(path: str) -> dict[int, int]:
    """Commit time (ms) per version, read with delta-rs directly."""
    return {
        c["version"]: int(c.get("inCommitTimestamp") or c["timestamp"])
        for c in DeltaTable(path).history()
    }


@pytest.mark.parametrize(
    "key",
    ["u05", "u25", "u31", "u75", "u62"],
    ids=["modified", "deleted", "field-removed", "created", "never-there"],
)
def test_versions_show_the_entity_of_their_time(table: Table, key: str):
    old = get_as_of(table, key, version=table.first_version)
    new = get_as_of(table, key, version=table.latest_version)

    assert (old.table_version, new.table_version) == (table.first_version, table.latest_version)
    assert entity(old) == table.first.get(key)
    assert entity(new) == table.latest.get(key)
    assert not old.found or old.entity  # found means an entity came with it


def test_versions_differ_where_the_second_wave_changed_things(table: Table):
    assert table.first["u05"] != table.latest["u05"]
    assert "u25" in table.first and "u25" not in table.latest
    assert "u75" not in table.first and "u75" in table.latest


def test_version_zero_is_the_empty_table_at_creation(table: Table):
    response = get_as_of(table, "u05", version=0)

    assert response.table_version == 0
    assert not response.found


def test_committed_at_comes_from_the_table_history(table: Table):
    times = commit_times(table.path)
    for version in (0, table.first_version, table.latest_version):
        response = get_as_of(table, "u01", version=version)
        assert response.committed_at.ToMilliseconds() == times[version]


def test_a_timestamp_reads_the_newest_version_committed_by_then(table: Table):
    times = commit_times(table.path)
    first_at = times[table.first_version]
    next_at = times[table.first_version + 1]

    cases = {
        first_at: table.first_version,  # exactly at a commit: that commit
        next_at - 1: table.first_version,  # just before the next one
        next_at: table.first_version + 1,
    }
    for when_ms, version in cases.items():
        stamp = {"timestamp": _timestamp_ms(when_ms)}
        response = get_as_of(table, "u05", **stamp)
        assert response.table_version == version, when_ms
    late = get_as_of(table, "u05", timestamp=_timestamp_ms(times[table.latest_version] + 3_600_000))
    assert late.table_version == table.latest_version
    assert entity(late) == table.latest["u05"]
    at_first = get_as_of(table, "u05", timestamp=_timestamp_ms(first_at))
    assert entity(at_first) == table.first["u05"]


def _timestamp_ms(ms: int) -> Timestamp:
    stamp = Timestamp()
    stamp.FromMilliseconds(ms)
    return stamp


def test_out_of_range_versions_and_times(table: Table):
    beyond = get_as_of_error(table, "u05", version=table.latest_version + 1)
    before = get_as_of_error(table, "u05", timestamp=_timestamp_ms(946_684_800_000))  # 2000

    assert beyond.code() == grpc.StatusCode.OUT_OF_RANGE
    assert str(table.latest_version) in beyond.details()
    assert before.code() == grpc.StatusCode.OUT_OF_RANGE
    assert "2000-01-01" in before.details()


def test_get_as_of_needs_a_version_or_time_and_a_known_map(table: Table):
    neither = get_as_of_error(table, "u05")
    negative = get_as_of_error(table, "u05", version=-1)
    with pytest.raises(grpc.aio.AioRpcError) as unknown:
        run(
            table.cfg,
            lambda stub: stub.GetAsOf(
                pb.GetAsOfRequest(map="nobody", key="u05", version=1), timeout=DEADLINE
            ),
        )
    with pytest.raises(grpc.aio.AioRpcError) as no_table:
        run(
            table.cfg,
            lambda stub: stub.GetAsOf(
                pb.GetAsOfRequest(map=NO_TABLE, key="u05", version=0), timeout=DEADLINE
            ),
        )

    assert neither.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert negative.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    assert no_table.value.code() == grpc.StatusCode.NOT_FOUND


# --- over HTTP ----------------------------------------------------------------------------


def test_http_query_pages_and_time_travel_answer_as_grpc_does(table: Table):
    async def body(f: Front) -> None:
        stub = pb_grpc.MapServiceStub(f.channel)
        path = f"/v1/maps/{MAP}/query?where=age%20%3E%3D%2020&page_size=5"
        page = await f.json("GET", path)
        grpc_page = await first_page(stub, pb.QueryRequest(map=MAP, where="age >= 20", page_size=5))
        assert [r["key"] for r in page["rows"]] == [r.key for r in grpc_page.rows]
        assert [r["entity"] for r in page["rows"]] == [
            orjson.loads(r.entity) for r in grpc_page.rows
        ]
        assert page["table_version"] == grpc_page.table_version == table.latest_version
        # Following next_page_token reads every matching row once, in key order.
        rows = list(page["rows"])
        while page["next_page_token"]:
            page = await f.json("GET", f"{path}&page_token={page['next_page_token']}")
            rows += page["rows"]
        matching = expected(table.latest, lambda e: (e.get("age") or 0) >= 20)
        assert [(r["key"], r["entity"]) for r in rows] == matching
        bad = await f.json("GET", f"/v1/maps/{MAP}/query?where=nope%20%3D%201", status=400)
        assert bad["error"]["code"] == "INVALID_ARGUMENT"

        # Time travel: the first wave's version holds the first fold.
        key = "u01"
        then = await f.json(
            "GET", f"/v1/maps/{MAP}/entities/{key}?as_of_version={table.first_version}"
        )
        assert then["found"] and then["entity"] == table.first[key]
        assert then["table_version"] == table.first_version and then["committed_at"]
        shapes.EntityAsOf.model_validate(then)  # the answer is what the OpenAPI document says
        document = await f.json("GET", "/openapi.json")
        answer = document["paths"]["/v1/maps/{map}/entities/{key}"]["get"]["responses"]["200"]
        lookup = answer["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
        shapes_named = str(document["components"]["schemas"][lookup])
        assert "EntityAsOf" in shapes_named and "Entity'" in shapes_named
        at = await f.json(
            "GET", f"/v1/maps/{MAP}/entities/{key}?as_of_timestamp={then['committed_at']}"
        )
        assert at["table_version"] >= table.first_version
        both = f"/v1/maps/{MAP}/entities/{key}?as_of_version=1&as_of_timestamp=2020-01-01T00:00:00Z"
        assert (await f.json("GET", both, status=400))["error"]["code"] == "INVALID_ARGUMENT"

    serve_http(table.cfg, body)
