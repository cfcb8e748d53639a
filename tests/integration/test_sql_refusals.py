"""What SQL over the maps refuses, and with which code, over gRPC and over HTTP.

Statements that write or define (DDL, DML, COPY, SET), read files (``read_parquet``,
``read_csv``), come two at a time, name a map the token is not granted, name no map
at all, or miss their parameters: each is refused with its code and a message naming
what was refused, and the service answers the next statement. The tables are written
with delta-rs; the service runs in this process with bearer tokens on.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pyarrow as pa
import pytest
import yaml
from deltalake import write_deltalake

from materializer.config import AppConfig
from tests.helpers.sql_calls import (
    SqlFront,
    grpc_code,
    grpc_sql,
    http_error,
    http_sql,
    map_names,
    serve,
    tables_config,
)

ALL_MAPS = "sql-all-maps-token-0123456789"
USERS_ONLY = "sql-users-only-token-0123456789"
HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
}
S = grpc.StatusCode


@pytest.fixture()
def front_config(redis_url: str, tmp_path: Path) -> tuple[str, str, AppConfig]:
    users, orders = map_names("users", "orders")
    root = tmp_path / "warehouse"
    write_deltalake(
        str(root / users),
        pa.table({"_key": ["u1", "u2"], "id": ["u1", "u2"], "tier": ["gold", None]}),
    )
    write_deltalake(
        str(root / orders),
        pa.table({"_key": ["o1"], "id": ["o1"], "user_id": ["u1"]}),
    )
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(
        yaml.safe_dump(
            {
                "tokens": [
                    {"name": "all", "token": ALL_MAPS, "maps": ["*"], "verbs": ["query"]},
                    {"name": "users", "token": USERS_ONLY, "maps": [users], "verbs": ["query"]},
                ]
            }
        )
    )
    config = tables_config(
        redis_url, root, [users, orders], auth={"tokens_file": str(tokens)}, sql={"workers": 1}
    )
    return users, orders, config


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def refusals(users: str, orders: str) -> list[tuple[str, list[object], S, list[str]]]:
    """(statement, params, code, words its message must hold, case-insensitively)."""
    return [
        ("CREATE TABLE t (a INT)", [], S.INVALID_ARGUMENT, ["CREATE"]),
        (f"CREATE TABLE t AS SELECT * FROM {users}", [], S.INVALID_ARGUMENT, ["CREATE"]),
        (
            "CREATE EXTERNAL TABLE t STORED AS CSV LOCATION '/etc/passwd'",
            [],
            S.INVALID_ARGUMENT,
            [],
        ),
        (f"CREATE VIEW v AS SELECT * FROM {users}", [], S.INVALID_ARGUMENT, ["CREATE"]),
        (f"DROP TABLE {users}", [], S.INVALID_ARGUMENT, ["DROP"]),
        (f"ALTER TABLE {users} ADD COLUMN x INT", [], S.INVALID_ARGUMENT, []),
        (f"INSERT INTO {users} VALUES ('u3', 'u3', 'gold')", [], S.INVALID_ARGUMENT, ["INSERT"]),
        (f"INSERT INTO {users} SELECT * FROM {users}", [], S.INVALID_ARGUMENT, ["INSERT"]),
        (f"UPDATE {users} SET tier = 'x'", [], S.INVALID_ARGUMENT, ["UPDATE"]),
        (f"DELETE FROM {users} WHERE id = 'u1'", [], S.INVALID_ARGUMENT, ["DELETE"]),
        (f"COPY {users} TO '/tmp/sql-out.csv'", [], S.INVALID_ARGUMENT, ["COPY"]),
        (
            f"COPY (SELECT * FROM {users}) TO '/tmp/sql-out.parquet'",
            [],
            S.INVALID_ARGUMENT,
            ["COPY"],
        ),
        ("SELECT * FROM read_parquet('/etc/passwd')", [], S.INVALID_ARGUMENT, ["read_parquet"]),
        ("SELECT * FROM read_csv('/etc/passwd')", [], S.INVALID_ARGUMENT, ["read_csv"]),
        ("SELECT read_csv('/etc/passwd')", [], S.INVALID_ARGUMENT, ["read_csv"]),
        (
            f"SELECT * FROM {users} JOIN read_parquet('x.parquet') p ON true",
            [],
            S.INVALID_ARGUMENT,
            ["read_parquet"],
        ),
        (
            f"WITH gone AS (DELETE FROM {orders} RETURNING *) SELECT * FROM gone",
            [],
            S.INVALID_ARGUMENT,
            [],
        ),
        ("SELECT 1; SELECT 2", [], S.INVALID_ARGUMENT, ["2 statements"]),
        (f"SELECT * FROM {users}; DROP TABLE {users}", [], S.INVALID_ARGUMENT, []),
        ("SET datafusion.execution.batch_size = 1", [], S.INVALID_ARGUMENT, ["SET"]),
        (
            "SELECT * FROM information_schema.tables",
            [],
            S.INVALID_ARGUMENT,
            ["information_schema"],
        ),
        ("SELECT * FROM nosuchmap", [], S.NOT_FOUND, ["nosuchmap"]),
        (
            f"SELECT * FROM {users} u JOIN nosuchmap n ON u.id = n.id",
            [],
            S.NOT_FOUND,
            ["nosuchmap"],
        ),
        (f"SELECT * FROM {users} WHERE id = $1", [], S.INVALID_ARGUMENT, ["params"]),
        (f"SELECT * FROM {users} WHERE id = $1", ["u1", "u2"], S.INVALID_ARGUMENT, ["params"]),
        (f"SELECT * FROM {users} WHERE id = $2", ["u1"], S.INVALID_ARGUMENT, ["params"]),
        ("SELECT 1", ["surplus"], S.INVALID_ARGUMENT, ["params"]),
        ("   ", [], S.INVALID_ARGUMENT, []),
        ("SELEC * FRM", [], S.INVALID_ARGUMENT, []),
    ]


def test_refused_statements_have_their_codes_over_grpc_and_http(
    front_config: tuple[str, str, AppConfig],
) -> None:
    users, orders, config = front_config

    async def body(front: SqlFront) -> list[str]:
        failures: list[str] = []
        auth = bearer(ALL_MAPS)
        for sql, params, code, words in refusals(users, orders):
            got, details = await grpc_code(front.stub, sql, params, metadata=tuple(auth.items()))
            if got != code or not all(w.lower() in details.lower() for w in words):
                failures.append(f"gRPC {sql!r}: {got.name} {details!r}, wanted {code.name} {words}")
            status, name, message = await http_error(
                front, {"sql": sql, "params": params}, headers=auth
            )
            if (status, name) != (HTTP_STATUS[code], code.name) or not all(
                w.lower() in message.lower() for w in words
            ):
                failures.append(f"HTTP {sql!r}: {status} {name} {message!r}, wanted {code.name}")
        # A position in a topic no table the statement reads follows.
        sql = f"SELECT count(*) AS n FROM {users}"
        elsewhere = {f"{orders}-events": {0: 1}}
        got, details = await grpc_code(
            front.stub, sql, metadata=tuple(auth.items()), min_offsets=elsewhere
        )
        if got != S.INVALID_ARGUMENT or f"{orders}-events" not in details:
            failures.append(f"gRPC min_offsets elsewhere: {got.name} {details!r}")
        status, name, message = await http_error(
            front, {"sql": sql, "min_offsets": elsewhere}, headers=auth
        )
        if (status, name) != (400, "INVALID_ARGUMENT"):
            failures.append(f"HTTP min_offsets elsewhere: {status} {name} {message!r}")
        # The service answers after all of them.
        answer = await grpc_sql(front.stub, sql, metadata=tuple(auth.items()))
        assert answer.rows == [{"n": 2}]
        assert (await http_sql(front, sql, headers=auth)).rows == [{"n": 2}]
        return failures

    assert serve(config, body) == []


def test_a_map_the_token_is_not_granted_is_refused_by_name(
    front_config: tuple[str, str, AppConfig],
) -> None:
    users, orders, config = front_config
    statements = [
        f"SELECT * FROM {orders}",
        f"SELECT u.id, o.id AS order_id FROM {users} u JOIN {orders} o ON o.user_id = u.id",
        f"WITH o AS (SELECT * FROM {orders}) SELECT count(*) FROM o",
        f"SELECT id FROM {users} WHERE id IN (SELECT user_id FROM {orders})",
        f'SELECT * FROM "{orders}"',
    ]

    async def body(front: SqlFront) -> None:
        auth = bearer(USERS_ONLY)
        # The granted map is answered, on both fronts.
        sql = f"SELECT id, tier FROM {users} ORDER BY id"
        want = [{"id": "u1", "tier": "gold"}, {"id": "u2", "tier": None}]
        assert (await grpc_sql(front.stub, sql, metadata=tuple(auth.items()))).rows == want
        assert (await http_sql(front, sql, headers=auth)).rows == want
        # No token at all: not authenticated, on both fronts.
        code, _ = await grpc_code(front.stub, sql)
        assert code == S.UNAUTHENTICATED
        status, name, _ = await http_error(front, {"sql": sql})
        assert (status, name) == (401, "UNAUTHENTICATED")
        for sql in statements:
            code, details = await grpc_code(front.stub, sql, metadata=tuple(auth.items()))
            assert code == S.PERMISSION_DENIED, (sql, code, details)
            assert orders in details, details
            status, name, message = await http_error(front, {"sql": sql}, headers=auth)
            assert (status, name) == (403, "PERMISSION_DENIED"), (sql, message)
            assert orders in message, message

    serve(config, body)
