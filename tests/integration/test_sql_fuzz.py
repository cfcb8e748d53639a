"""Generated SQL statements, and requests around them, never break the SQL service.

Statements come from a small grammar (select lists, WHERE with operators, literals and
parameters, GROUP BY, ORDER BY, LIMIT, joins between the maps, WITH, UNION), spliced
with garbage tokens and keywords that write or read files, or are random text,
unicode, or too long. Each goes to ``SqlService.Execute`` and to ``POST /v1/sql`` (in
each of its answer formats): the answer is OK or a client error code, never
INTERNAL, UNKNOWN or an HTTP 500, an HTTP call never hangs, and both fronts agree.
After each fuzz the service still answers a normal statement correctly. The tables
are written with delta-rs; the service runs in this process, in a thread of its own.
"""

from __future__ import annotations

import http.client
import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import grpc
import orjson
import pyarrow as pa
import pytest
from deltalake import write_deltalake
from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from materializer.v1 import common_pb2 as common
from materializer.v1 import sql_service_pb2 as pb
from materializer.v1 import sql_service_pb2_grpc as pb_grpc
from query_service.client import sql_param
from tests.helpers.sql_calls import map_names, statement_processes, tables_config, threaded_service

USERS, ORDERS = map_names("users", "orders")
S = grpc.StatusCode
CLIENT_ERRORS = {
    S.INVALID_ARGUMENT,
    S.NOT_FOUND,
    S.PERMISSION_DENIED,
    S.RESOURCE_EXHAUSTED,
    S.DEADLINE_EXCEEDED,
    S.OUT_OF_RANGE,
}
ALLOWED = {S.OK, *CLIENT_ERRORS}
HTTP_STATUS = {S.OK: 200, S.INVALID_ARGUMENT: 400, S.OUT_OF_RANGE: 400, S.PERMISSION_DENIED: 403,
               S.NOT_FOUND: 404, S.RESOURCE_EXHAUSTED: 413, S.DEADLINE_EXCEEDED: 504}  # fmt: skip
JSON, NDJSON, ARROW = (
    "application/json",
    "application/x-ndjson",
    "application/vnd.apache.arrow.stream",
)
DEADLINE = 20.0
"""Each call's; the service's own ``query.sql.timeout`` (5 s) ends a heavy statement first."""
FUZZ = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@dataclass
class Service:
    stub: pb_grpc.SqlServiceStub
    base: str


@pytest.fixture(scope="module")
def service(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    root = tmp_path_factory.mktemp("sql-fuzz")
    ids = [f"u{i}" for i in range(8)]
    write_deltalake(
        str(root / USERS),
        pa.table(
            {
                "_key": ids,
                "id": ids,
                "name": ["Ann", "O'Brien", None, "Zoë", "a;b", "--", "", "☃"],
                "tier": ["gold", "silver", None, "gold", "bronze", None, "silver", "gold"],
                "age": pa.array([31, None, 7, 64, 18, 0, -1, 2**31 - 1], pa.int32()),
                "credit": pa.array(
                    [Decimal("10.50"), None, Decimal("0.01"), Decimal("99999999.99")] * 2,
                    pa.decimal128(10, 2),
                ),
                "joined": pa.array(
                    [datetime(2026, 1, 1 + i, tzinfo=UTC) if i % 3 else None for i in range(8)],
                    pa.timestamp("us", "UTC"),
                ),
                "active": [True, False, None, True, True, False, None, True],
            }
        ),
    )
    order_ids = [f"o{j}" for j in range(12)]
    write_deltalake(
        str(root / ORDERS),
        pa.table(
            {
                "_key": order_ids,
                "id": order_ids,
                "user_id": [f"u{j % 10}" for j in range(12)],
                "amount": pa.array(
                    [Decimal(j * 7 % 50) / 4 if j % 5 else None for j in range(12)],
                    pa.decimal128(10, 2),
                ),
                "created_at": pa.array(
                    [datetime(2026, 2, 1, j, tzinfo=UTC) for j in range(12)],
                    pa.timestamp("us", "UTC"),
                ),
            }
        ),
    )
    config = tables_config(redis_url, root, [USERS, ORDERS], sql={"timeout": "5 seconds"})
    with (
        threaded_service(config) as servers,
        grpc.insecure_channel(f"127.0.0.1:{servers.port}") as channel,
    ):
        yield Service(pb_grpc.SqlServiceStub(channel), f"http://127.0.0.1:{servers.http_port}")


# --- what a call answers ---


def grpc_call(service: Service, message: pb.ExecuteRequest) -> tuple[S, str]:
    """The call's status; an answer must be a readable Arrow IPC stream and end with the
    tables read."""
    try:
        parts = list(service.stub.Execute(message, timeout=DEADLINE))
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    assert parts[0].WhichOneof("part") == "arrow_schema"
    assert parts[-1].WhichOneof("part") == "tables"
    stream = b"".join(p.arrow_schema or p.arrow_batch for p in parts[:-1])
    pa.ipc.open_stream(stream).read_all()
    return S.OK, ""


def http_call(service: Service, body: dict[str, Any], accept: str = JSON) -> tuple[S, str]:
    """The call's outcome as a gRPC code: the status of a JSON answer, or the error a
    streamed one ends with. It must not hang, and never be a 500."""
    raw = json.dumps(body).encode()  # integers past 64 bits and NaN too, as clients send them
    asked = urllib.request.Request(
        service.base + "/v1/sql",
        data=raw,
        headers={"Content-Type": JSON, "Accept": accept},
        method="POST",
    )
    try:
        with urllib.request.urlopen(asked, timeout=DEADLINE) as response:  # noqa: S310
            status, content = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, content = error.code, error.read()
    except http.client.IncompleteRead:
        assert accept == ARROW, "only an Arrow stream is cut short, on an error past its start"
        return S.RESOURCE_EXHAUSTED, "an Arrow stream cut short"
    assert status != 500, content[:500]
    if status != 200:
        error = orjson.loads(content)["error"]
        code = S[error["code"]]
        assert HTTP_STATUS[code] == status, (status, error)
        return code, error["message"]
    if accept == NDJSON and content:
        last = orjson.loads(content.splitlines()[-1])
        if isinstance(last, dict) and set(last) == {"error"}:
            return S[last["error"]["code"]], last["error"]["message"]
    elif accept == ARROW:
        pa.ipc.open_stream(content).read_all()
    elif accept == JSON:
        orjson.loads(content)
    return S.OK, ""


def check(
    service: Service,
    sql: str,
    params: list[Any] | None = None,
    accept: str = JSON,
) -> None:
    """Both fronts answer OK or a client error, and the same one."""
    params = params or []
    got, details = grpc_call(
        service, pb.ExecuteRequest(sql=sql, params=[sql_param(p) for p in params])
    )
    assert got in ALLOWED, (sql, got, details)
    over_http, message = http_call(service, {"sql": sql, "params": params}, accept)
    assert over_http in ALLOWED, (sql, over_http, message)
    timing = {S.DEADLINE_EXCEEDED, S.RESOURCE_EXHAUSTED}
    if got not in timing and over_http not in timing:
        assert got == over_http, (sql, got, details, over_http, message)


def still_serving(service: Service) -> None:
    """A normal statement, answered right on both fronts; no statement process left over."""
    sql = f"SELECT tier, count(*) AS n FROM {USERS} GROUP BY tier ORDER BY tier NULLS LAST"
    parts = list(service.stub.Execute(pb.ExecuteRequest(sql=sql), timeout=DEADLINE))
    stream = b"".join(p.arrow_schema or p.arrow_batch for p in parts[:-1])
    want = [
        {"tier": "bronze", "n": 1},
        {"tier": "gold", "n": 3},
        {"tier": "silver", "n": 2},
        {"tier": None, "n": 2},
    ]
    assert pa.ipc.open_stream(stream).read_all().to_pylist() == want
    with urllib.request.urlopen(  # noqa: S310
        urllib.request.Request(
            service.base + "/v1/sql", data=orjson.dumps({"sql": sql}), method="POST"
        ),
        timeout=DEADLINE,
    ) as response:
        assert orjson.loads(response.read())["rows"] == want
    assert len(statement_processes()) <= 2  # query.sql.workers


# --- the grammar ---

USER_COLUMNS = ["_key", "id", "name", "tier", "age", "credit", "joined", "active"]
ORDER_COLUMNS = ["_key", "id", "user_id", "amount", "created_at"]
JOINED = [f"u.{c}" for c in USER_COLUMNS] + [f"o.{c}" for c in ORDER_COLUMNS]
UNKNOWN = ["nope", '"Name"', "u.nope", "x.y.z"]
LITERALS = ["NULL", "TRUE", "FALSE", "0", "-1", "1.5", "0.01", "1e400", "-0.0", "2147483648",
            "9223372036854775808", "'2026-01-02T00:00:00Z'", "DATE '2026-01-01'",
            "INTERVAL '1 day'", "X'00ff'", "''", "'O''Brien'", "'☃'", "'\\'", "now()",
            "CAST('2026-01-01' AS TIMESTAMP)", "'NaN'::double", "CAST(1 AS DECIMAL(38, 10))",
            "make_array(1, 2)", "named_struct('a', 1)", "$1", "$2", "$3", "$0"]  # fmt: skip
BINARY = ["=", "<>", "!=", "<", ">", "<=", ">=", "LIKE", "ILIKE", "NOT LIKE", "||", "+", "-",
          "*", "/", "%", "AND", "OR", "IS DISTINCT FROM", "~", "@>", "&", "<<", "^"]  # fmt: skip
FUNCTIONS = {"lower": 1, "upper": 1, "length": 1, "abs": 1, "coalesce": 3, "count": 1,
             "sum": 1, "avg": 1, "min": 1, "max": 1, "date_trunc": 2, "round": 2, "substr": 3,
             "concat": 3, "nullif": 2, "array_agg": 1, "string_agg": 2, "to_timestamp": 1,
             "arrow_cast": 2, "sqrt": 1, "power": 2, "regexp_match": 2, "date_part": 2,
             "greatest": 3, "md5": 1, "read_parquet": 1, "read_csv": 1, "read_json": 1,
             "generate_series": 2, "pg_read_file": 1, "http_get": 1, "load_extension": 1,
             "nosuchfunction": 2}  # fmt: skip
"""Functions and how many arguments they take at most (the parser checks the counts it
knows); those that read files or the network are refused by name."""
TYPES = ["INT", "BIGINT", "DOUBLE", "DECIMAL(5, 2)", "VARCHAR", "TIMESTAMP", "DATE", "BOOLEAN",
         "BYTEA", "INTERVAL", "nosuchtype"]  # fmt: skip
TABLES: list[tuple[str, list[str]]] = [
    (USERS, USER_COLUMNS),
    (ORDERS, ORDER_COLUMNS),
    (f"{USERS} u", USER_COLUMNS + JOINED[: len(USER_COLUMNS)]),
    (f"{ORDERS} o", ORDER_COLUMNS + JOINED[len(USER_COLUMNS) :]),
    (f"{USERS} u JOIN {ORDERS} o ON o.user_id = u.id", JOINED),
    (f"{USERS} u LEFT JOIN {ORDERS} o ON o.user_id = u.id AND o.amount > 1", JOINED),
    (f"{ORDERS} o RIGHT JOIN {USERS} u ON u.id = o.user_id", JOINED),
    (f"{ORDERS} o FULL JOIN {USERS} u USING (id)", JOINED),
    (f"{USERS} u, {ORDERS} o", JOINED),
    (f"{USERS} u CROSS JOIN {USERS} b CROSS JOIN {ORDERS} o", JOINED),
    (f"(SELECT * FROM {USERS}) AS u", USER_COLUMNS),
    (f'"{USERS}"', USER_COLUMNS),
    ("(VALUES (1), (2)) AS v(x)", ["x", "v.x"]),
    ("unnest(make_array(1, 2)) AS t(x)", ["x"]),
    ("nosuch", ["x"]),
    ('"Users"', USER_COLUMNS),
    ("information_schema.tables", ["table_name"]),
    ("read_parquet('/etc/passwd')", ["x"]),
    ("generate_series(1, 10)", ["value"]),
    (f"public.{USERS}", USER_COLUMNS),
]
"""What a statement reads, and the columns it can name there; the valid come first and
are drawn more often."""
SPLICES = ["DROP TABLE users", f"DROP TABLE {USERS}", f"COPY {USERS} TO '/tmp/sql-fuzz.csv'",
           ";", "; SELECT 1", "--", "/*", "*/", "'", '"', "\x00", "\u202e", "\ufeff",
           f"DELETE FROM {USERS}", f"INSERT INTO {USERS} VALUES (1)", "SET x = 1",
           "CREATE TABLE t (a INT)", "ATTACH DATABASE 'x' AS y", "PRAGMA x", "\\", "$",
           "$-1", "EXPLAIN", "EXPLAIN ANALYZE", "UNION ALL SELECT 1", "LIMIT -1",
           "OFFSET 99999999999999999999", ")", "(", ",", "SELECT", "FROM", "WHERE", "𝕊𝕈𝕃",
           "read_csv('x')", "COPY (SELECT 1) TO 'x'"]  # fmt: skip

literals = (
    st.sampled_from(LITERALS)
    | st.integers(-(2**70), 2**70).map(str)
    | st.floats(allow_nan=False, allow_infinity=False).map(repr)
    | st.text(max_size=12).map(lambda t: "'" + t.replace("'", "''") + "'")
)


def expressions(columns: list[str]) -> st.SearchStrategy[str]:
    """Expressions over ``columns`` that parse, most of them; what they mean is left to
    chance (now and then a column no table has)."""
    names = st.sampled_from(columns) | st.sampled_from(columns) | st.sampled_from(UNKNOWN)
    return st.recursive(
        names | names | literals,
        lambda inner: st.one_of(
            st.builds(lambda a, op, b: f"{a} {op} {b}", inner, st.sampled_from(BINARY), inner),
            st.sampled_from(sorted(FUNCTIONS)).flatmap(
                lambda f: st.lists(inner, min_size=1, max_size=FUNCTIONS[f]).map(
                    lambda args: f"{f}({', '.join(args)})"
                )
            ),
            st.builds(lambda e: f"({e})", inner),
            st.builds(lambda e: f"NOT {e}", inner),
            st.builds(lambda e, t: f"CAST({e} AS {t})", inner, st.sampled_from(TYPES)),
            st.builds(lambda c, a, b: f"CASE WHEN {c} THEN {a} ELSE {b} END", inner, inner, inner),
            st.builds(
                lambda e, n: f"{e} IS {n}",
                inner,
                st.sampled_from(["NULL", "NOT NULL", "TRUE", "NOT FALSE"]),
            ),  # fmt: skip
            st.builds(lambda e, a, b: f"{e} BETWEEN {a} AND {b}", inner, inner, inner),
            st.builds(
                lambda e, xs: f"{e} IN ({', '.join(xs)})",
                inner,
                st.lists(inner, min_size=1, max_size=3),
            ),  # fmt: skip
            st.builds(
                lambda e, t: f"{e} IN (SELECT id FROM {t})",
                inner,
                st.sampled_from([USERS, ORDERS, "nosuch"]),
            ),  # fmt: skip
            st.builds(
                lambda f, e, p: f"{f}({e}) OVER (PARTITION BY {p})",
                st.sampled_from(["sum", "count", "max", "first_value"]),
                inner,
                names,
            ),  # fmt: skip
            st.builds(
                lambda e, o: f"row_number() OVER (ORDER BY {e}{o})",
                inner,
                st.sampled_from(["", " DESC", " NULLS FIRST"]),
            ),  # fmt: skip
        ),
        max_leaves=6,
    )


EXPRESSIONS = {table: expressions(columns) for table, columns in TABLES}


@st.composite
def selects(draw: st.DrawFn) -> str:
    table = draw(st.sampled_from(TABLES[:11]) | st.sampled_from(TABLES))[0]
    exprs = EXPRESSIONS[table]
    select = draw(
        st.lists(exprs, min_size=1, max_size=4).map(", ".join)
        | st.sampled_from(["*", "u.*", "count(*)", "*, 1"])
    )
    distinct = draw(st.sampled_from(["", "DISTINCT "]))
    sql = f"SELECT {distinct}{select} FROM {table}"
    if draw(st.booleans()):
        sql += f" WHERE {draw(exprs)}"
    if draw(st.booleans()):
        sql += f" GROUP BY {', '.join(draw(st.lists(exprs, min_size=1, max_size=2)))}"
        if draw(st.booleans()):
            sql += f" HAVING {draw(exprs)}"
    if draw(st.booleans()):
        direction = draw(st.sampled_from(["", " DESC", " ASC NULLS FIRST", " DESC NULLS LAST"]))
        sql += f" ORDER BY {draw(exprs)}{direction}"
    if draw(st.booleans()):
        sql += f" LIMIT {draw(st.integers(-5, 2**64))}"
    if draw(st.booleans()):
        sql += f" OFFSET {draw(st.integers(-5, 50))}"
    return sql


KINDS = {
    USERS: {"text": ["id", "name", "tier", "_key"], "number": ["age", "credit"],
            "time": ["joined"], "bool": ["active"]},
    ORDERS: {"text": ["id", "user_id", "_key"], "number": ["amount"], "time": ["created_at"],
             "bool": []},
}  # fmt: skip
"""The maps' columns by kind, for statements that mostly plan."""
TYPED_LITERALS = {
    "text": st.sampled_from(["'u1'", "'gold'", "'O''Brien'", "'☃'", "$1"])
    | st.text(max_size=6).map(lambda t: "'" + t.replace("'", "''") + "'"),
    "number": st.integers(-100, 10**6).map(str)
    | st.decimals(-(10**6), 10**6, places=2).map(str)
    | st.sampled_from(["$1", "0.01", "CAST($1 AS DECIMAL(10, 2))"]),
    "time": st.sampled_from(
        ["'2026-01-03T00:00:00Z'", "now()", "CAST($1 AS TIMESTAMP)", "TIMESTAMP '2026-02-01 05:00'"]
    ),
    "bool": st.sampled_from(["TRUE", "FALSE", "$1"]),
}


@st.composite
def typed_selects(draw: st.DrawFn) -> str:
    """A statement over the maps that plans, most of the time: filters compare a column
    with a value of its kind, aggregates are grouped, windows partitioned."""
    if draw(st.booleans()):
        source = f"{USERS} u JOIN {ORDERS} o ON o.user_id = u.id"
        kinds = {
            kind: [f"u.{c}" for c in KINDS[USERS][kind]] + [f"o.{c}" for c in KINDS[ORDERS][kind]]
            for kind in KINDS[USERS]
        }
    else:
        source = draw(st.sampled_from([USERS, ORDERS]))
        kinds = KINDS[source]
    kind = draw(st.sampled_from([k for k, columns in kinds.items() if columns]))
    column = draw(st.sampled_from(kinds[kind]))
    op = draw(st.sampled_from(["=", "<>", "<", ">=", "IS NULL", "IS NOT NULL", "LIKE"]))
    where = f"{column} {op}" if "NULL" in op else f"{column} {op} {draw(TYPED_LITERALS[kind])}"
    text = draw(st.sampled_from(kinds["text"]))
    number = draw(st.sampled_from(kinds["number"]))
    shape = draw(st.integers(0, 2))
    if shape == 0:
        aggregate = draw(st.sampled_from(["count(*)", f"sum({number})", f"avg({number})",
                                          f"min({column})", f"max({column})",
                                          f"count(DISTINCT {column})"]))  # fmt: skip
        sql = f"SELECT {text} AS g, {aggregate} AS a FROM {source} WHERE {where} GROUP BY {text}"
        if draw(st.booleans()):
            sql += f" HAVING count(*) > {draw(st.integers(-1, 3))}"
        return sql + " ORDER BY g NULLS FIRST"
    if shape == 1:
        order = draw(st.sampled_from(["", " DESC", " DESC NULLS LAST"]))
        return (
            f"SELECT {text} AS t, {number} AS n, row_number() OVER "
            f"(PARTITION BY {text} ORDER BY {number}{order}) AS r FROM {source} WHERE {where}"
        )
    picked = draw(st.lists(st.sampled_from([c for cs in kinds.values() for c in cs]),
                           min_size=1, max_size=4, unique=True))  # fmt: skip
    limit = draw(st.integers(0, 20))
    return (
        f"SELECT {', '.join(picked)} FROM {source} WHERE {where} "
        f"ORDER BY {column} NULLS LAST LIMIT {limit}"
    )


@st.composite
def statements(draw: st.DrawFn) -> str:
    sql = draw(typed_selects() | selects())
    shape = draw(st.integers(0, 4))
    if shape == 1:
        sql = f"WITH w AS ({draw(typed_selects() | selects())}) {sql}"
    elif shape == 2:
        combine = draw(st.sampled_from(["UNION", "UNION ALL", "EXCEPT", "INTERSECT"]))
        sql = f"{sql} {combine} {draw(typed_selects() | selects())}"
    elif shape == 3:
        # A garbage token or a forbidden keyword spliced in anywhere.
        at = draw(st.integers(0, len(sql)))
        splice = draw(st.sampled_from(SPLICES) | st.text(max_size=8))
        sql = f"{sql[:at]} {splice} {sql[at:]}"
    return sql


value = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)


@st.composite
def with_params(draw: st.DrawFn) -> tuple[str, list[Any]]:
    """A statement and, most often, as many parameters as it uses."""
    sql = draw(statements())
    used = max((int(n) for n in re.findall(r"\$(\d{1,3})\b", sql)), default=0)
    values = draw(st.lists(value, min_size=used, max_size=used) | st.lists(value, max_size=3))
    return sql, values


def test_generated_statements(service: Service) -> None:
    @FUZZ
    @given(asked=with_params(), accept=st.sampled_from([JSON, JSON, NDJSON, ARROW]))
    def fuzz(asked: tuple[str, list[Any]], accept: str) -> None:
        check(service, *asked, accept=accept)

    fuzz()
    still_serving(service)


def test_random_text_unicode_and_long_statements(service: Service) -> None:
    long_text = st.sampled_from(
        [
            "SELECT " + " + ".join(["1"] * 500) + f" FROM {USERS}",
            "SELECT " + "(" * 3000 + "1" + ")" * 3000,
            f"SELECT * FROM {USERS} WHERE id IN ("
            + ", ".join(f"'u{i}'" for i in range(8000))
            + ")",
            "SELECT '" + "x" * 100_001 + "'",
            f"SELECT * FROM {USERS} " + "-- comment\n" * 2000,
            ";" * 5000,
        ]
    )

    @settings(FUZZ, max_examples=80)
    @given(
        sql=st.text(max_size=200)
        | st.text(alphabet=st.characters(codec="utf-8"), max_size=60).map(
            lambda t: f"SELECT {t} FROM {USERS}"
        )
        | long_text
    )
    def fuzz(sql: str) -> None:
        check(service, sql)

    fuzz()
    still_serving(service)


def timestamps() -> st.SearchStrategy[Timestamp]:
    return st.builds(
        Timestamp,
        seconds=st.integers(-(2**63), 2**63 - 1) | st.integers(-(10**10), 10**11),
        nanos=st.integers(-(2**31), 2**31 - 1) | st.integers(0, 999_999_999),
    )


grpc_param_values = st.one_of(
    st.builds(pb.SqlParam, null=st.booleans()),
    st.builds(pb.SqlParam, bool_value=st.booleans()),
    st.builds(pb.SqlParam, int_value=st.integers(-(2**63), 2**63 - 1)),
    st.builds(pb.SqlParam, double_value=st.floats()),
    st.builds(pb.SqlParam, string_value=st.text(max_size=20)),
    st.builds(pb.SqlParam, bytes_value=st.binary(max_size=20)),
    st.builds(pb.SqlParam, timestamp_value=timestamps()),
    st.builds(
        pb.SqlParam,
        decimal_value=st.sampled_from(["12.50", "-0", "1e400", "NaN", "inf", "abc", ""])
        | st.decimals(allow_nan=True).map(str)
        | st.text(max_size=12),
    ),
    st.just(pb.SqlParam()),
)
PARAM_STATEMENTS = [
    (f"SELECT id FROM {USERS} WHERE joined >= $1", 1),
    (f"SELECT id FROM {USERS} WHERE credit > $1 AND age < $2", 2),
    (f"SELECT $1 AS a, $2 AS b, $3 AS c FROM {USERS}", 3),
    (f"SELECT id FROM {USERS} WHERE name = $1 OR id = $2", 2),
    (f"SELECT count(*) FROM {ORDERS} WHERE amount * $1 > $2", 2),
    (f"SELECT * FROM {USERS} WHERE _key = $1", 1),
    (f"SELECT CAST($1 AS TIMESTAMP) AS t, CAST($2 AS DECIMAL(10, 2)) AS d FROM {USERS}", 2),
]
"""Statements with parameters, and how many they use."""
offsets = st.lists(
    st.builds(
        common.PartitionOffset,
        topic=st.sampled_from([f"{USERS}-events", f"{ORDERS}-events"]) | st.text(max_size=8),
        partition=st.integers(-(2**31), 2**31 - 1),
        offset=st.integers(-(2**63), -1),  # a position to wait for is the pipeline test's
    ),
    min_size=1,
    max_size=2,
)
json_values = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | st.text(max_size=20)
    | st.sampled_from(["2026-01-01T00:00:00Z", "12.50", "not a time"])
)


def asked(values: st.SearchStrategy[Any]) -> st.SearchStrategy[tuple[str, list[Any]]]:
    """A statement with its parameters: most often as many as it uses."""
    return st.sampled_from(PARAM_STATEMENTS).flatmap(
        lambda statement: st.tuples(
            st.just(statement[0]),
            st.lists(values, min_size=statement[1], max_size=statement[1])
            | st.lists(values, max_size=4),
        )
    )


limits = st.just(0) | st.integers(0, 20) | st.integers(-(2**63), 2**63 - 1)


def test_generated_requests(service: Service) -> None:
    """Parameters of every kind (timestamps past any calendar, decimals that are not
    numbers), limits and positions, in the gRPC message and in the JSON body."""

    @settings(FUZZ, max_examples=150)
    @given(
        request=asked(grpc_param_values),
        limit=limits,
        positions=st.just([]) | st.just([]) | offsets,
    )
    def over_grpc(
        request: tuple[str, list[pb.SqlParam]],
        limit: int,
        positions: list[common.PartitionOffset],
    ) -> None:
        message = pb.ExecuteRequest(
            sql=request[0],
            params=request[1],
            limit=limit,
            freshness=common.Freshness(min_offsets=positions),
        )
        code, details = grpc_call(service, message)
        assert code in ALLOWED, (message, code, details)

    @settings(FUZZ, max_examples=100)
    @given(
        request=asked(json_values),
        limit=limits | st.integers(2**63, 2**70),
        timeout_ms=st.none() | st.integers(-5, 2**40),
        extra=st.just({}) | st.dictionaries(st.text(max_size=5), st.integers(), max_size=1),
    )
    def over_http(
        request: tuple[str, list[Any]], limit: int, timeout_ms: int | None, extra: dict[str, int]
    ) -> None:
        body: dict[str, Any] = {"sql": request[0], "params": request[1], "limit": limit, **extra}
        if timeout_ms is not None:
            body["timeout_ms"] = timeout_ms
        code, message = http_call(service, body)
        assert code in ALLOWED, (body, code, message)

    over_grpc()
    over_http()
    still_serving(service)


def test_statements_the_fuzz_found_worth_keeping(service: Service) -> None:
    """Cases seen once, kept: values the JSON answer must still write, and requests whose
    parameters must be refused as the caller's error."""
    for sql in [
        f"SELECT now() AS t, INTERVAL '1 month 2 days' AS i FROM {USERS}",
        f"SELECT arrow_cast(-99999999999, 'Timestamp(Second, None)') AS t FROM {USERS}",
        "SELECT make_array(INTERVAL '1 day', NULL) AS a, named_struct('t', now()) AS s",
    ]:
        for accept in (JSON, NDJSON, ARROW):
            code, message = http_call(service, {"sql": sql}, accept)
            assert code == S.OK, (sql, accept, message)
    for stamp in (Timestamp(seconds=2**62), Timestamp(seconds=0, nanos=-1)):
        message = pb.ExecuteRequest(
            sql=f"SELECT id FROM {USERS} WHERE joined >= $1",
            params=[pb.SqlParam(timestamp_value=stamp)],
        )
        code, details = grpc_call(service, message)
        assert code == S.INVALID_ARGUMENT, (stamp, code, details)
    still_serving(service)
