"""Table reads without services: page tokens, rows as entity JSON, the SQL of each fetch."""

from __future__ import annotations

import base64
from datetime import UTC, date, datetime
from decimal import Decimal

import orjson
import pyarrow as pa
import pytest

from materializer.contract.entity_json import encode_rows
from materializer.v1 import map_service_pb2 as pb
from query_service.errors import InvalidArgument
from query_service.filters import Columns
from query_service.tables import query_plan
from query_service.tables.page_token import PageToken, fingerprint
from query_service.tables.query_plan import QueryPlan

# --- page tokens ---------------------------------------------------------------------------


def test_token_round_trips_and_is_url_safe():
    token = PageToken(version=12, last_key="ü/+?=' k", sent=500, fingerprint="abc")
    text = token.encode()

    assert PageToken.decode(text) == token
    assert set(text) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


@pytest.mark.parametrize(
    "doc",
    [
        {"f": 2, "v": 1, "k": "a", "n": 1, "q": "x"},  # another format
        {"f": 1, "v": -1, "k": "a", "n": 1, "q": "x"},
        {"f": 1, "v": True, "k": "a", "n": 1, "q": "x"},
        {"f": 1, "v": 1, "k": 5, "n": 1, "q": "x"},
        {"f": 1, "v": 1, "k": "a", "n": 0, "q": "x"},
        {"f": 1, "v": 1, "k": "a", "n": 1},
        [1, 2],
        "text",
    ],
)
def test_tokens_that_are_not_ours_are_invalid_argument(doc: object):
    text = base64.urlsafe_b64encode(orjson.dumps(doc)).decode()
    with pytest.raises(InvalidArgument, match="page_token"):
        PageToken.decode(text)


@pytest.mark.parametrize("text", ["", "!!!", "a", "////", "eyJmIjox"])
def test_garbage_is_invalid_argument(text: str):
    with pytest.raises(InvalidArgument, match="page_token"):
        PageToken.decode(text)


def test_fingerprint_tells_queries_apart():
    base = fingerprint("users", '("age" > 1)', ("name",))
    assert fingerprint("users", '("age" > 1)', ("name",)) == base
    assert fingerprint("orders", '("age" > 1)', ("name",)) != base
    assert fingerprint("users", '("age" > 2)', ("name",)) != base
    assert fingerprint("users", None, ("name",)) != base
    assert fingerprint("users", '("age" > 1)', ("name", "age")) != base
    token = PageToken(version=1, last_key="k", sent=1, fingerprint=base)
    token.check(base)
    with pytest.raises(InvalidArgument, match="another query"):
        token.check(fingerprint("users", None, ()))


# --- rows as entity JSON -------------------------------------------------------------------


def test_rows_encode_like_the_pipelines_json():
    ts = pa.timestamp("us", "UTC")
    table = pa.table(
        {
            "_key": pa.array(["a", "b"], pa.string_view()),
            "name": ["Ann", None],
            "joined": pa.array([datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), None], ts),
            "local": pa.array([datetime(2026, 1, 2, 3, 4, 5, 6), None], pa.timestamp("us")),
            "day": pa.array([date(2026, 1, 2), None], pa.date32()),
            "score": [float("nan"), float("-inf")],
            "price": pa.array([Decimal("1.50"), None], pa.decimal128(5, 2)),
            "raw": pa.array([b"\x00\x01", None], pa.binary()),
            "tags": pa.array([["x", None], None], pa.list_(pa.string())),
            "addr": pa.array(
                [{"city": "Oslo", "zip": None}, None],
                pa.struct([("city", pa.string()), ("zip", pa.string())]),
            ),
            "attrs": pa.array([[("k", 1), ("n", None)], None], pa.map_(pa.string(), pa.int64())),
        }
    )

    rows = encode_rows(table, "_key")

    assert [k for k, _ in rows] == ["a", "b"]
    assert rows[0][1] == (
        b'{"name":"Ann","joined":"2026-01-02T03:04:05.000000Z",'
        b'"local":"2026-01-02T03:04:05.000006","day":"2026-01-02","score":"NaN",'
        b'"price":1.50,"raw":"AAE=","tags":["x",null],"addr":{"city":"Oslo"},'
        b'"attrs":{"k":1,"n":null}}'
    )
    assert rows[1][1] == b'{"score":"-Infinity"}'


# --- the SQL of a query ---------------------------------------------------------------------


COLUMNS = Columns("users", ("_key", "name", "age"))


def plan(**kw: object) -> QueryPlan:
    values: dict[str, object] = {
        "map_name": "users",
        "version": 3,
        "filter_sql": None,
        "fields": ("name", "age"),
        "page_size": 5,
        "limit": 0,
    }
    values.update(kw)
    return QueryPlan(**values)  # type: ignore[arg-type]


def test_each_fetch_continues_after_the_last_key_in_key_order():
    assert plan().select(None, 41) == (
        'SELECT "_key", "name", "age" FROM "map_table" ORDER BY "_key" LIMIT 41'
    )
    assert plan(filter_sql='("age" > 1)', fields=()).select("it's", 6) == (
        'SELECT "_key" FROM "map_table" WHERE (("age" > 1)) AND ("_key" > \'it\'\'s\') '
        'ORDER BY "_key" LIMIT 6'
    )


def test_fetch_sizes_respect_the_limit_over_the_whole_query():
    assert plan().fetch_size(0) == 5 * query_plan.PAGES_PER_FETCH
    assert plan(limit=12).fetch_size(0) == 12
    assert plan(limit=12).fetch_size(10) == 2
    assert plan(limit=12).fetch_size(12) == 0
    assert plan(limit=12).fetch_size(20) == 0  # a continuation sent with a smaller limit
    assert plan(limit=12).has_more(fetched=13, asked=12, sent=12) is False
    assert plan().has_more(fetched=41, asked=40, sent=40) is True
    assert plan().has_more(fetched=40, asked=40, sent=40) is False


def test_page_size_and_limit_are_checked():
    assert query_plan.page_size(pb.QueryRequest()) == query_plan.DEFAULT_PAGE_SIZE
    assert query_plan.page_size(pb.QueryRequest(page_size=10_000)) == 10_000
    for bad in (-1, 10_001):
        with pytest.raises(InvalidArgument, match="page_size"):
            query_plan.page_size(pb.QueryRequest(page_size=bad))
    with pytest.raises(InvalidArgument, match="limit"):
        query_plan.limit(pb.QueryRequest(limit=-1))


def test_projection_is_in_table_order_and_ignores_the_key():
    request = pb.QueryRequest(fields=["age", "_key", "name", "age"])
    assert query_plan.projection(request, COLUMNS) == ("name", "age")
    assert query_plan.projection(pb.QueryRequest(), COLUMNS) == ("name", "age")
    with pytest.raises(InvalidArgument, match=r"fields\[1\]: unknown column 'Name'"):
        query_plan.projection(pb.QueryRequest(fields=["age", "Name"]), COLUMNS)
