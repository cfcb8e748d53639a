"""MapService.Query answered through a map's indexes in Redis, against the plain-Python
reference fold of what the real pipeline wrote: the rows a filter keeps, in the index's
order (value, then key), the source and index each page names, filters no index serves
left to the Delta table, and pages that read on after their last entry while the map
is written."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pyarrow as pa
import pytest

from materializer.catalog.live import LiveMaps
from materializer.clients.redis import client_for
from materializer.config import AppConfig, KafkaConfig
from materializer.contract import index_entries
from materializer.redis.deliveries import producer_settings
from materializer.redis.functions import FoldTarget
from materializer.redis.indexes import rebuild
from materializer.v1 import map_service_pb2 as pb
from query_service.client import MaterializerClient
from query_service.sql.executor import SqlExecutor
from query_service.stores.delta import DeltaTables
from query_service.tables.snapshots import TableSnapshots
from tests.helpers.query_redis import Front, serve_http, started
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
    rows_of,
    run,
)
from tests.helpers.redis_fold import apply

T = TypeVar("T")
MAP = new_map_name()
INDEXES = ["name", {"field": "age", "kind": "sorted"}, {"field": "score", "kind": "sorted"}]
INDEX = pb.QueryResponse.REDIS_INDEX
TABLE = pb.QueryResponse.TABLE


@pytest.fixture(scope="module")
def table(
    spark: Any, kafka_bootstrap: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Table:
    tmp: Path = tmp_path_factory.mktemp("query-indexes")
    built = build_table(spark, kafka_bootstrap, redis_url, tmp, MAP, INDEXES)
    # Declared after the map folded: built from what Redis holds.
    rebuild(client_for(built.cfg.redis), MAP, built.cfg.maps[MAP].indexes, expiring=False)
    return built


def in_index_order(rows: list[tuple[str, Entity]], field: str) -> list[tuple[str, Entity]]:
    return sorted(rows, key=lambda kv: index_entries.entry(kv[1][field], kv[0]))


CASES: list[tuple[dict[str, Any], str | None, Callable[[Entity], bool]]] = [
    ({"where": "name = 'Ann'"}, "name", has("name", lambda v: v == "Ann")),
    (
        {"where": "name IN ('Zoë', 'O''Brien', 'nobody', 'Ann')"},
        "name",
        has("name", lambda v: v in {"Zoë", "O'Brien", "Ann"}),
    ),
    ({"where": "age >= 50"}, "age", has("age", lambda a: a >= 50)),
    ({"where": "10 > age"}, "age", has("age", lambda a: a < 10)),
    (
        {"where": "age > 20 AND age <= 40 AND score > 10"},
        "age",
        lambda e: 20 < e.get("age", -1) <= 40 and e["score"] > 10,
    ),
    (
        {"where": "(score BETWEEN 10 AND 50.5) AND name LIKE '%n%'"},
        "score",
        lambda e: 10 <= e["score"] <= 50.5 and "n" in (e.get("name") or ""),
    ),
    ({"where": "name = 'Ann' AND age > 200"}, "name", lambda e: False),
    ({"where": "age > 60 AND age < 30"}, "age", lambda e: False),
    ({"predicate": cmp("age", Op.GE, n(90))}, "age", has("age", lambda a: a >= 90)),
    (
        {"predicate": cmp("name", Op.IN, values=[pb.Value(string_value="Bob")])},
        "name",
        has("name", lambda v: v == "Bob"),
    ),
    # Left to the table: no index serves them.
    (
        {"where": "age > 50 OR name = 'Ann'"},
        None,
        lambda e: e.get("age", 0) > 50 or e.get("name") == "Ann",
    ),
    ({"where": "lower(name) = 'ann'"}, None, has("name", lambda v: v.lower() == "ann")),
    ({"where": "id = 'u03'"}, None, lambda e: e["id"] == "u03"),
    ({"where": "age = '7'"}, None, has("age", lambda a: a == 7)),
]


@pytest.mark.parametrize(("request_", "field", "keep"), CASES, ids=[str(c[0]) for c in CASES])
def test_a_filter_an_index_serves_is_answered_from_redis_as_the_table_would(
    table: Table, request_: dict[str, Any], field: str | None, keep: Callable[[Entity], bool]
) -> None:
    pages = query(table, page_size=4, **request_)
    rows = rows_of(pages)
    wanted = expected(table.latest, keep)
    if field is None:
        assert {p.source for p in pages} == {TABLE}
        assert rows == wanted
        return
    assert {(p.source, p.index) for p in pages} == {(INDEX, field)}
    assert rows == in_index_order(wanted, field)
    assert all(p.HasField("watermark") for p in pages)
    assert {p.table_version for p in pages} == {table.latest_version}
    # A projection, as from the table.
    projected = rows_of(query(table, fields=["name"], **request_))
    assert projected == [(k, {"name": e["name"]} if "name" in e else {}) for k, e in rows]


SQL_CASES: list[tuple[str, list[Any], str | None]] = [
    ("SELECT _key, name, age FROM {m} WHERE name = $1 ORDER BY _key", ["Ann"], "name"),
    ("SELECT * FROM {m} WHERE name IN ('Bob', 'Zoë') ORDER BY _key", [], "name"),
    (
        "SELECT _key, tags, joined FROM {m} WHERE age BETWEEN $1 AND $2 AND score > 10 "
        "ORDER BY _key",
        [20, 40],
        "age",
    ),
    (
        "SELECT count(*) AS n, max(age) AS oldest, sum(score) AS s FROM {m} WHERE age >= 50",
        [],
        "age",
    ),
    (
        "SELECT name, count(*) AS n FROM {m} WHERE score < $1 GROUP BY name ORDER BY name",
        [30.5],
        "score",
    ),
    ("SELECT _key FROM {m} WHERE NAME = 'nobody'", [], "name"),
    ("SELECT _key FROM {m} WHERE age > 10 ORDER BY age DESC, _key LIMIT 3", [], "age"),
    # Left to the table: no index serves them.
    ("SELECT _key FROM {m} WHERE age > 50 OR name = 'Ann' ORDER BY _key", [], None),
    ("SELECT _key FROM {m} WHERE age = $1 ORDER BY _key", [Decimal(30)], None),
    ("SELECT p._key FROM {m} p WHERE p.name = 'Ann' ORDER BY 1", [], None),
]


def serve_sql(cfg: AppConfig, body: Callable[[MaterializerClient], Awaitable[T]]) -> T:
    """``body`` with a client of a query service started for it."""

    async def main() -> T:
        async with (
            started(cfg) as servers,
            MaterializerClient(f"127.0.0.1:{servers.port}") as client,
        ):
            return await body(client)

    return asyncio.run(main())


def engine_answer(cfg: AppConfig, text: str, params: list[Any]) -> pa.Table:
    """The statement's answer from the engine over the table, never through Redis."""

    async def generation(map_name: str) -> int:
        return 0

    async def main() -> pa.Table:
        live = LiveMaps(cfg)
        executor = SqlExecutor(live, TableSnapshots(DeltaTables(live)), generation)
        try:
            return await (await executor.execute(text, params)).table()
        finally:
            await executor.close()

    return asyncio.run(main())


@pytest.mark.parametrize(("text", "params", "index"), SQL_CASES, ids=[c[0] for c in SQL_CASES])
def test_a_statement_an_index_narrows_is_answered_from_redis_as_the_table_would(
    table: Table, text: str, params: list[Any], index: str | None
) -> None:
    statement = text.format(m=MAP)

    answer = serve_sql(table.cfg, lambda client: client.sql(statement, params))
    engine = engine_answer(table.cfg, statement, params)
    [read] = answer.tables
    if index is None:
        assert (read.redis, read.index, read.version) == (False, "", table.latest_version)
    else:
        assert (read.redis, read.index, read.version) == (True, index, -1)
        assert read.watermark is not None
    # The same answer as the engine's over the table, to the type of each column.
    assert answer.table.schema == engine.schema
    assert answer.table.to_pylist() == engine.to_pylist()


def test_a_statement_through_an_index_keeps_what_the_reference_keeps(table: Table) -> None:
    statement = f"SELECT _key, name FROM {MAP} WHERE name = $1"

    answer = serve_sql(table.cfg, lambda client: client.sql(statement, ["Ann"]))
    assert answer.tables[0].index == "name"
    assert sorted(answer.table["_key"].to_pylist()) == [
        k for k, _ in expected(table.latest, has("name", lambda v: v == "Ann"))
    ]


def test_a_statement_through_an_index_waits_for_min_offsets_on_redis(table: Table) -> None:
    statement = f"SELECT _key FROM {MAP} WHERE name = 'Bob'"
    [topic] = table.cfg.maps[MAP].source.topics

    async def body(client: MaterializerClient) -> tuple[Any, Any]:
        mark = (await client.sql(statement)).tables[0].watermark
        assert mark is not None
        covered = await client.sql(statement, min_offsets=dict(mark.offsets))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await client.sql(statement, min_offsets={(topic, 0): 10**9}, timeout=1.5)
        return covered, info.value

    covered, late = serve_sql(table.cfg, body)
    assert covered.tables[0].index == "name"
    assert covered.table.num_rows == sum(e.get("name") == "Bob" for e in table.latest.values())
    assert late.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def test_pages_read_on_after_their_last_entry_while_the_map_is_written(
    table: Table, kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    target = FoldTarget(
        redis=table.cfg.redis,
        map_name=MAP,
        changelog_topic=new_topic(1),
        producer=producer_settings(KafkaConfig(bootstrap_servers=kafka_bootstrap), 1_048_576),
    )
    rng = random.Random(3)

    async def body(stub: Any) -> list[pb.QueryResponse]:
        pages: list[pb.QueryResponse] = []
        request = pb.QueryRequest(map=MAP, where="age >= 0", page_size=5)
        while True:
            call = stub.Query(request, timeout=60)
            page = await call.read()
            call.cancel()  # one page a call: the next one reads on from its token
            pages.append(page)
            if not page.page_token:
                return pages
            # Between pages, some entities move: to a value the query passed, or one ahead.
            seen.update(row.key for row in page.rows)
            moving = (
                rng.sample(sorted(set(table.latest) - seen - moved), 2) if len(pages) < 6 else []
            )
            rows = [(k, "9", {**table.latest[k], "age": rng.choice([-1, 99])}) for k in moving]
            if rows:
                apply(target, len(pages), rows)
            moved.update(moving)
            request = pb.QueryRequest(
                map=MAP, where="age >= 0", page_size=5, page_token=page.page_token
            )

    moved: set[str] = set()
    seen: set[str] = set()
    pages = run(table.cfg, lambda stub: body(stub))
    keys = [row.key for page in pages for row in page.rows]
    assert len(pages) > 3
    stayed = [
        k
        for k, e in in_index_order(expected(table.latest, has("age", lambda a: a >= 0)), "age")
        if k not in moved
    ]
    # Every entity that kept its value is sent once, in the index's order; one that moved
    # before the query reached it is sent once with its new value, or not at all.
    assert [k for k in keys if k not in moved] == stayed
    assert len(keys) == len(set(keys))
    assert any(k in moved for k in keys)


def test_a_continuation_is_refused_for_another_query(table: Table) -> None:
    async def body(stub: Any) -> Any:
        first = [
            p
            async for p in stub.Query(
                pb.QueryRequest(map=MAP, where="age >= 0", page_size=3), timeout=60
            )
        ]
        other = pb.QueryRequest(
            map=MAP, where="age >= 1", page_size=3, page_token=first[0].page_token
        )
        with pytest.raises(Exception) as info:
            await all_pages(stub, other)
        return info.value

    error = run(table.cfg, lambda stub: body(stub))
    assert "issued for another query" in str(error)


def test_the_http_query_and_sql_say_they_read_an_index(table: Table) -> None:
    async def body(api: Front) -> tuple[Any, Any, Any]:
        indexed = await api.json("GET", f"/v1/maps/{MAP}/query?where=name%20%3D%20'Bob'")
        scanned = await api.json("GET", f"/v1/maps/{MAP}/query?where=id%20%3D%20'u06'")
        statement = {"sql": f"SELECT _key FROM {MAP} WHERE name = $1", "params": ["Bob"]}
        answer = await api.json("POST", "/v1/sql", json=statement)
        return indexed, scanned, answer

    indexed, scanned, answer = serve_http(table.cfg, body)
    [read] = answer["tables"]
    assert (read["redis"], read["index"], read["version"]) == (True, "name", -1)
    assert sorted(row["_key"] for row in answer["rows"]) == sorted(
        k for k, e in table.latest.items() if e.get("name") == "Bob"
    )
    assert (indexed["source"], indexed["index"]) == ("REDIS_INDEX", "name")
    assert [r["key"] for r in indexed["rows"]] == sorted(
        k for k, e in table.latest.items() if e.get("name") == "Bob"
    )
    assert indexed["watermark"] is not None
    assert (scanned["source"], scanned["index"]) == ("TABLE", None)


def test_an_answer_the_entries_decide_is_the_entities_as_stored(table: Table) -> None:
    exact = query(table, where="name = 'Ann'")
    checked = query(table, where="name = 'Ann' AND id >= ''")  # the filter applied as well
    assert {p.index for p in exact + checked} == {"name"}
    assert [(r.key, r.entity) for p in exact for r in p.rows] == [
        (r.key, r.entity) for p in checked for r in p.rows
    ]
    assert len(rows_of(exact)) == sum(e.get("name") == "Ann" for e in table.latest.values())
