"""MapService.Query's pages and GetAsOf's time travel over a Delta table the real pipeline wrote.

Pages, limits and page tokens (a token reads the table version it began on, even
after more data was written), sizes and tokens refused, unknown maps; GetAsOf by
version and by time against the reference fold after each wave of events; and
both over the HTTP front. The table (``tests.helpers.query_table``) is built once
for this module; every call goes through a real server and channel.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest
from deltalake import DeltaTable
from google.protobuf.timestamp_pb2 import Timestamp

from materializer.v1 import map_service_pb2 as pb
from materializer.v1 import map_service_pb2_grpc as pb_grpc
from query_service.http import shapes
from tests.helpers.query_redis import Front, serve_http
from tests.helpers.query_table import (
    DEADLINE,
    NO_TABLE,
    OLD_QUERY,
    Entity,
    Op,
    Table,
    build_table,
    cmp,
    expected,
    first_page,
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


# --- Query: pages -------------------------------------------------------------------------


def test_every_row_comes_back_in_key_order_with_the_latest_version(table: Table):
    pages = query(table)

    assert rows_of(pages) == expected(table.latest, lambda e: True)
    assert {p.table_version for p in pages} == {table.latest_version}
    assert pages[-1].page_token == ""


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
