"""Every SQL statement is bounded, and the service keeps serving past each bound.

Rows (``query.sql.max_rows``), time (the call's deadline and ``query.sql.timeout``),
memory (``query.sql.memory_bytes``) and how many run at once (``query.sql.workers``
and ``query.sql.max_queued``): a statement past one is refused with its code, its
statement process is really ended (read from ``/proc``: the processes this test
process started), and the next statement is answered, with one worker, so a worker
left busy would show. The table is written with delta-rs; the service runs in this
process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import orjson
import pyarrow as pa
from deltalake import write_deltalake

from materializer.config import AppConfig
from query_service.http.endpoints import ARROW_STREAM, JSON, NDJSON
from tests.helpers.sql_calls import (
    SqlFront,
    grpc_code,
    grpc_sql,
    http_error,
    http_sql,
    map_names,
    processes_until,
    request,
    serve,
    statement_processes,
    tables_config,
)

USERS = 300
TIERS = ("gold", "silver", "bronze")
S = grpc.StatusCode


def users_config(redis_url: str, tmp_path: Path, **sql: Any) -> tuple[str, AppConfig]:
    """One map of ``USERS`` rows, one statement process, and ``sql`` for the rest."""
    (users,) = map_names("users")
    root = tmp_path / "warehouse"
    ids = [f"u{i:03d}" for i in range(USERS)]
    write_deltalake(
        str(root / users),
        pa.table({"_key": ids, "id": ids, "tier": [TIERS[i % 3] for i in range(USERS)]}),
    )
    return users, tables_config(redis_url, root, [users], sql={"workers": 1, **sql})


def heavy(users: str) -> str:
    """A statement that runs for minutes in little memory: 300⁴ rows to sum."""
    return (
        f"SELECT sum(length(a.id || b.id || c.id || d.id)) AS s "
        f"FROM {users} a, {users} b, {users} c, {users} d"
    )


async def normal(front: SqlFront, users: str) -> None:
    """A statement the service must still answer, over both fronts."""
    sql = f"SELECT tier, count(*) AS n FROM {users} GROUP BY tier ORDER BY tier"
    want = [{"tier": t, "n": USERS // 3} for t in sorted(TIERS)]
    assert (await grpc_sql(front.stub, sql)).rows == want
    assert (await http_sql(front, sql)).rows == want


async def until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Yield to the service (it runs on this loop) until ``condition`` holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"not {what} after {timeout:g} s")
        await asyncio.sleep(0.02)


def test_an_answer_over_max_rows_is_refused(redis_url: str, tmp_path: Path) -> None:
    users, config = users_config(redis_url, tmp_path, max_rows=1000)
    cross = f"SELECT a.id AS a, b.id AS b FROM {users} a, {users} b"

    async def body(front: SqlFront) -> None:
        code, details = await grpc_code(front.stub, cross)
        assert code == S.RESOURCE_EXHAUSTED, details
        assert "query.sql.max_rows" in details
        status, name, message = await http_error(front, {"sql": cross})
        assert (status, name) == (413, "RESOURCE_EXHAUSTED"), message
        await normal(front, users)
        # max_rows rows are an answer; one more is not.
        exact = f"SELECT id FROM ({cross}) AS x(id, other) LIMIT 1000"
        assert len((await grpc_sql(front.stub, exact)).rows) == 1000
        code, _ = await grpc_code(front.stub, exact.replace("1000", "1001"))
        assert code == S.RESOURCE_EXHAUSTED
        # A request's limit cuts the answer short instead, on both fronts.
        assert len((await grpc_sql(front.stub, cross, limit=10)).rows) == 10
        assert len((await http_sql(front, cross, limit=10)).rows) == 10
        status, name, _ = await http_error(front, {"sql": cross, "limit": 1001})
        assert (status, name) == (400, "INVALID_ARGUMENT")
        # An aggregate over the same rows is one row.
        answer = await grpc_sql(front.stub, f"SELECT count(*) AS n FROM ({cross}) AS x")
        assert answer.rows == [{"n": USERS * USERS}]

    serve(config, body)


def test_a_statement_past_the_calls_deadline_is_stopped(redis_url: str, tmp_path: Path) -> None:
    users, config = users_config(redis_url, tmp_path)

    async def body(front: SqlFront) -> None:
        await normal(front, users)
        (before,) = await processes_until(lambda p: len(p) == 1, "the pool's one process")
        code, _ = await grpc_code(front.stub, heavy(users), timeout=1.0)
        assert code == S.DEADLINE_EXCEEDED
        # Its process was ended, not left computing: it is gone, and the one worker answers.
        await processes_until(lambda p: before not in p, "without the stopped process")
        assert front.running == 0
        await normal(front, users)
        (after,) = await processes_until(lambda p: len(p) == 1, "back to the pool's size")
        status, name, message = await http_error(front, {"sql": heavy(users), "timeout_ms": 1000})
        assert (status, name) == (504, "DEADLINE_EXCEEDED"), message
        await processes_until(lambda p: after not in p, "without the stopped process")
        await normal(front, users)
        await processes_until(lambda p: len(p) == 1, "back to the pool's size")

    serve(config, body)


def test_a_statement_past_query_sql_timeout_is_stopped(redis_url: str, tmp_path: Path) -> None:
    # Long enough for a normal statement on a busy machine, a fresh process started first.
    users, config = users_config(redis_url, tmp_path, timeout="5 seconds")

    async def body(front: SqlFront) -> None:
        await normal(front, users)
        (before,) = statement_processes()
        code, details = await grpc_code(front.stub, heavy(users), timeout=60.0)
        assert code == S.DEADLINE_EXCEEDED
        assert "query.sql.timeout" in details, details
        await processes_until(lambda p: before not in p, "without the stopped process")
        await normal(front, users)
        status, name, message = await http_error(front, {"sql": heavy(users)})
        assert (status, name) == (504, "DEADLINE_EXCEEDED")
        assert "query.sql.timeout" in message
        await normal(front, users)
        await processes_until(lambda p: len(p) == 1, "back to the pool's size")

    serve(config, body)


def test_a_statement_past_the_memory_pool_is_refused(redis_url: str, tmp_path: Path) -> None:
    users, config = users_config(redis_url, tmp_path, memory_bytes=1 << 20)
    statements = [
        # A GROUP BY over 90,000 distinct keys.
        f"SELECT a.id || b.id AS k, count(*) AS n FROM {users} a, {users} b GROUP BY k",
        f"SELECT count(DISTINCT a.id || b.id) AS n FROM {users} a, {users} b",
        # A sort of every row before the first can go out.
        f"SELECT a.id || b.id || c.id AS k FROM {users} a, {users} b, {users} c "
        "ORDER BY k DESC LIMIT 100000 OFFSET 1000000",
    ]

    async def body(front: SqlFront) -> None:
        for sql in statements:
            code, details = await grpc_code(front.stub, sql)
            assert code == S.RESOURCE_EXHAUSTED, (sql, code, details)
            assert "query.sql.memory_bytes" in details, details
            status, name, message = await http_error(front, {"sql": sql})
            assert (status, name) == (413, "RESOURCE_EXHAUSTED"), (sql, message)
            await normal(front, users)
        await processes_until(lambda p: len(p) == 1, "the pool's one process")

    serve(config, body)


def test_statements_beyond_workers_and_queue_are_refused(redis_url: str, tmp_path: Path) -> None:
    """One worker and one place in the queue: with one statement running and one waiting,
    every further one is refused at once; when the caller of a running statement goes
    away its process ends, and the waiting one runs."""
    users, config = users_config(redis_url, tmp_path, max_queued=1)

    async def body(front: SqlFront) -> None:
        await normal(front, users)
        running = front.stub.Execute(request(heavy(users)), timeout=120)
        await until(lambda: front.running == 1, "running")
        (first,) = statement_processes()
        # Two more: one takes the queue's one place, the other is refused at once.
        contenders = [front.stub.Execute(request(heavy(users)), timeout=120) for _ in range(2)]
        codes = [asyncio.ensure_future(c.code()) for c in contenders]
        done, _ = await asyncio.wait(codes, return_when=asyncio.FIRST_COMPLETED)
        (refused,) = done
        assert refused.result() == S.RESOURCE_EXHAUSTED
        queued = next(c for c, f in zip(contenders, codes, strict=True) if f is not refused)
        # The queue is full now: every further statement is refused, over either front.
        code, details = await grpc_code(front.stub, heavy(users))
        assert code == S.RESOURCE_EXHAUSTED, details
        assert "query.sql.workers" in details and "query.sql.max_queued" in details
        status, name, _ = await http_error(front, {"sql": f"SELECT count(*) FROM {users}"})
        assert (status, name) == (413, "RESOURCE_EXHAUSTED")
        assert front.running == 1 and not queued.done()
        # The running statement's caller goes away: its process ends, the waiting one runs.
        running.cancel()
        await processes_until(lambda p: first not in p and len(p) == 1, "the next one's")
        await until(lambda: front.running == 1, "the waiting one running")
        queued.cancel()
        await until(lambda: front.running == 0, "idle")
        await processes_until(lambda p: not p, "every process ended")
        await normal(front, users)
        await processes_until(lambda p: len(p) == 1, "back to the pool's size")

    serve(config, body)


def test_an_http_client_that_goes_away_stops_its_statement(redis_url: str, tmp_path: Path) -> None:
    """Over each HTTP answer format, a caller that closes its connection mid-statement ends
    the statement's process long before ``query.sql.timeout``; the one worker is free."""
    users, config = users_config(redis_url, tmp_path, timeout="30 seconds")
    body = orjson.dumps({"sql": heavy(users)})

    async def gone(front: SqlFront) -> None:
        for accept in (JSON, NDJSON, ARROW_STREAM):
            await normal(front, users)
            (before,) = await processes_until(lambda p: len(p) == 1, "the pool's one process")
            post = front.http.post(front.base + "/v1/sql", data=body, headers={"Accept": accept})
            leaving = asyncio.ensure_future(post)
            await until(lambda: front.running == 1, "running")
            if leaving.done():
                leaving.result().close()  # a streamed answer's headers came: close the stream
            else:
                leaving.cancel()  # the connection closes with the request
            await until(lambda: front.running == 0, f"stopped ({accept})", timeout=10)
            await processes_until(lambda p, b=before: b not in p, "without the stopped process")
        await normal(front, users)

    serve(config, gone)
