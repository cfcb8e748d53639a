"""MapService.Query's filters over a Delta table the real pipeline wrote.

WHERE texts and structured predicates are checked against plain-Python filters
over the reference fold of the events; also projections, the entities' JSON
(byte for byte what lookups return), unknown columns, filters the engine cannot
evaluate, and injection attempts. The table (``tests.helpers.query_table``) is
built once for this module; every call goes through a real server and channel.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest
import redis
from deltalake import DeltaTable

from materializer.contract.redis_layout import entity_key
from materializer.v1 import map_service_pb2 as pb
from materializer.v1 import map_service_pb2_grpc as pb_grpc
from tests.helpers.query_table import (
    Entity,
    Op,
    Table,
    all_pages,
    build_table,
    cmp,
    expected,
    has,
    n,
    new_map_name,
    query,
    query_error,
    rows_of,
    run,
)

MAP = new_map_name()


@pytest.fixture(scope="module")
def table(
    spark: Any, kafka_bootstrap: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Table:
    tmp: Path = tmp_path_factory.mktemp("query-table")
    return build_table(spark, kafka_bootstrap, redis_url, tmp, MAP)


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
