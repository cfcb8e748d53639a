"""SQL benchmark: statements through the query service against the engine run in process.

All in one run, on one ``redis-server`` and a local warehouse (no Kafka, no Spark):

  tables       three maps' Delta tables, written as the pipeline's delta-rs engine writes
               them (``sql_maps``): ``users`` (1M entities), ``customers`` and ``orders``
               (100k each); ``users`` also in Redis, for ``Get``;
  statements   each statement through every endpoint of one ``query-service serve``
               process (as users run it): ``SqlService/Execute`` over gRPC, ``POST
               /v1/sql`` answered in Arrow IPC, and Arrow Flight SQL through ADBC's
               driver on ``query.sql.flight_port`` (a ``flight_sql`` line says why not
               when the port does not answer); and, as the baseline, the same statement
               run in this process by the engine itself: DataFusion's ``SessionContext``
               with the statement processes' configuration (target partitions, memory
               pool, no spilling, the same row limit) over the same Delta tables, one
               session kept across statements. The paths take turns, back to back, in
               a new random order each repetition, so none always follows the same
               one (what a call leaves behind, the engine's threads in this process or
               the statement process's, moves the next call's time); ``ratio`` is the
               engine's time over the endpoint's (p50), goal ≥ 0.8.
               ``engine_session_per_statement`` runs it in a new session with the
               tables registered for each statement, as a statement process does;
               ``floor`` is a statement the engine answers at once, so its endpoint
               times are the fixed cost of a statement;
  key_lookup   ``SELECT * FROM users WHERE _key = $1`` over gRPC against ``MapService/Get``
               for the same random keys, one call at a time, taking turns: p50 and p99,
               and which copy answered the statement (the table read it reports: the
               Delta table's version, or Redis).

Every endpoint's answer is checked against the engine's before it is timed; each time
includes the client's decoding of the answer into an Arrow table.

    .venv/bin/python bench/sql.py [--users N] [--orders N] [--reps R] [--warmup W]
                                  [--lookups L]

``REDIS_URL`` points it at a running Redis instead of starting one; the maps' keys are
written there and deleted at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import math
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import datafusion
import deltalake
import grpc
import numpy as np
import orjson
import pyarrow as pa
import redis
from cpu_window import loadavg
from harness import emit, machine
from query_services import redis_service, start_query_service
from sql_maps import Map, load_redis, maps, write_config, write_table

from materializer.config import SqlConfig
from materializer.contract.table_layout import TABLE_KEY
from materializer.testing import free_port
from materializer.v1 import map_service_pb2 as map_pb
from materializer.v1 import map_service_pb2_grpc as map_grpc
from materializer.v1 import sql_service_pb2 as sql_pb
from materializer.v1 import sql_service_pb2_grpc as sql_grpc
from query_service.event_loop import EventLoop
from query_service.sql.executor import TARGET_PARTITIONS
from query_service.sql.statement import check

TARGET_RATIO = 0.8
CALL_TIMEOUT = 60.0
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]
ARROW_STREAM = "application/vnd.apache.arrow.stream"

STATEMENTS = {
    "group_by": (
        "SELECT tier, region, count(*) AS entities, sum(spend) AS spend "
        "FROM users GROUP BY tier, region"
    ),
    "join_aggregate": (
        "SELECT c.region, count(*) AS orders, sum(o.amount) AS amount "
        "FROM orders o JOIN customers c ON o.user_id = c._key GROUP BY c.region"
    ),
    "join_rows": (
        "SELECT o._key, o.amount, c.tier, c.region "
        "FROM orders o JOIN customers c ON o.user_id = c._key"
    ),
    "floor": "SELECT _key FROM customers LIMIT 1",
}
GOALS = {"group_by", "join_aggregate", "join_rows"}
"""The statements with the ratio goal; ``floor`` shows the fixed cost."""
LOOKUP = "SELECT * FROM users WHERE _key = $1"
LOOKUP_MAP = "users"

Run = Callable[[str, list[str]], pa.Table]
"""A path's call: the statement and its parameters to the answer as an Arrow table."""


class Engine:
    """DataFusion in this process, configured as a statement process configures it."""

    def __init__(self, warehouse: Path, names: list[str], config: SqlConfig) -> None:
        self._tables = {n: deltalake.DeltaTable(str(warehouse / n)) for n in names}
        self._config = config
        self._shared = self._session(names)

    def _session(self, names: list[str]) -> datafusion.SessionContext:
        session = datafusion.SessionContext(
            datafusion.SessionConfig()
            .with_target_partitions(TARGET_PARTITIONS)
            .with_information_schema(False),
            datafusion.RuntimeEnvBuilder()
            .with_greedy_memory_pool(self._config.memory_bytes)
            .with_disk_manager_disabled(),
        )
        for name in names:
            session.register_table(name, self._tables[name])
        return session

    def run(self, sql: str, params: list[str], tables: list[str] | None = None) -> pa.Table:
        """The answer in the kept session, or in a new one knowing only ``tables``."""
        session = self._shared if tables is None else self._session(tables)
        allowed = (
            datafusion.SQLOptions()
            .with_allow_ddl(False)
            .with_allow_dml(False)
            .with_allow_statements(False)
        )
        values = {str(i + 1): v for i, v in enumerate(params)} or None
        frame = session.sql_with_options(sql, allowed, param_values=values)
        frame = frame.limit(self._config.max_rows + 1)
        batches = frame.collect()  # the session must outlive the plan's run
        return pa.Table.from_batches(batches, frame.schema())


def grpc_execute(stub: sql_grpc.SqlServiceStub, sql: str, params: list[str]) -> pa.Table:
    table, _ = grpc_answer(stub, sql, params)
    return table


def grpc_answer(
    stub: sql_grpc.SqlServiceStub, sql: str, params: list[str]
) -> tuple[pa.Table, sql_pb.TablesRead]:
    """``Execute``'s answer decoded, and the tables it says it read."""
    request = sql_pb.ExecuteRequest(
        sql=sql, params=[sql_pb.SqlParam(string_value=p) for p in params]
    )
    schema: pa.Schema | None = None
    batches: list[pa.RecordBatch] = []
    tables = sql_pb.TablesRead()
    for part in stub.Execute(request, timeout=CALL_TIMEOUT):
        kind = part.WhichOneof("part")
        if kind == "arrow_schema":
            schema = pa.ipc.read_schema(pa.py_buffer(part.arrow_schema))
        elif kind == "arrow_batch":
            batches.append(pa.ipc.read_record_batch(pa.py_buffer(part.arrow_batch), schema))
        else:
            tables = part.tables
    return pa.Table.from_batches(batches, schema), tables


class HttpArrow:
    """``POST /v1/sql`` on one kept-alive connection, answered in Arrow IPC."""

    def __init__(self, port: int) -> None:
        self._connection = http.client.HTTPConnection("127.0.0.1", port, timeout=CALL_TIMEOUT)

    def __call__(self, sql: str, params: list[str]) -> pa.Table:
        body = orjson.dumps({"sql": sql, "params": params})
        headers = {"Content-Type": "application/json", "Accept": ARROW_STREAM}
        self._connection.request("POST", "/v1/sql", body=body, headers=headers)
        response = self._connection.getresponse()
        payload = response.read()
        if response.status != 200:
            raise RuntimeError(f"POST /v1/sql: {response.status} {payload[:300]!r}")
        return pa.ipc.open_stream(payload).read_all()

    def close(self) -> None:
        self._connection.close()


def flight_sql(port: int, stack: contextlib.ExitStack) -> tuple[Run | None, str | None]:
    """Arrow Flight SQL on ``query.sql.flight_port`` through ADBC's driver, or why not."""
    import adbc_driver_flightsql.dbapi as flight

    try:
        connection = flight.connect(f"grpc://127.0.0.1:{port}", autocommit=True)
    except Exception as exc:  # noqa: BLE001 - reported on the line instead of the figures
        return None, f"cannot connect: {exc}"
    stack.callback(connection.close)
    cursor = connection.cursor()
    stack.callback(cursor.close)

    def execute(sql: str, params: list[str]) -> pa.Table:
        cursor.execute(sql, params or None)
        table: pa.Table = cursor.fetch_arrow_table()
        return table

    try:
        execute(STATEMENTS["floor"], [])
    except Exception as exc:  # noqa: BLE001
        return None, f"query.sql.flight_port does not answer a statement: {exc}"
    return execute, None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--users", type=int, default=1_000_000, help="entities of users")
    parser.add_argument(
        "--orders", type=int, default=100_000, help="entities of orders and of customers"
    )
    parser.add_argument("--reps", type=int, default=30, help="timed repetitions of each path")
    parser.add_argument("--warmup", type=int, default=5, help="repetitions before timing")
    parser.add_argument("--lookups", type=int, default=1000, help="key lookups of each kind")
    args = parser.parse_args()
    # SIGTERM ends the run like Ctrl-C does: through every ``finally``.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    run(args)


def run(args: argparse.Namespace) -> None:
    sql_config = SqlConfig()
    work = Path(tempfile.mkdtemp(prefix="materializer-bench-sql-"))
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, work, True)
        emit(
            name="setup",
            **machine(),
            datafusion=datafusion.__version__,
            deltalake=deltalake.__version__,
            pyarrow=pa.__version__,
            target_partitions=TARGET_PARTITIONS,
            memory_bytes=sql_config.memory_bytes,
            statement_workers=sql_config.workers,
            reps=args.reps,
            warmup=args.warmup,
            lookups=args.lookups,
        )
        all_maps = maps(args.users, args.orders, args.orders)
        warehouse = work / "warehouse"
        rng = np.random.default_rng(7)
        for m in all_maps:
            emit(name="table", **write_table(warehouse, m, rng))

        redis_url, own_redis = stack.enter_context(redis_service())
        client = redis.Redis.from_url(redis_url)
        stack.callback(client.close)
        users = next(m for m in all_maps if m.name == LOOKUP_MAP)
        if not own_redis:
            stack.callback(delete_map, client, users.name)
        emit(name="redis_load", **load_redis(client, users))

        flight_port = free_port()
        config = work / "query.yaml"
        write_config(config, redis_url, warehouse, all_maps, flight_port)
        port, http_port = free_port(), free_port()
        service = start_query_service(work, config, port, http_port, EventLoop.UVLOOP)
        stack.callback(service.stop)
        channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=CHANNEL_OPTIONS)
        stack.callback(channel.close)
        sql_stub = sql_grpc.SqlServiceStub(channel)  # type: ignore[no-untyped-call]
        http_arrow = HttpArrow(http_port)
        stack.callback(http_arrow.close)

        engine = Engine(warehouse, [m.name for m in all_maps], sql_config)
        paths: dict[str, Run] = {
            "engine": engine.run,
            "grpc": lambda sql, params: grpc_execute(sql_stub, sql, params),
            "http_arrow": http_arrow,
        }
        flight, why_not = flight_sql(flight_port, stack)
        if flight is not None:
            paths["flight_sql"] = flight
        else:
            emit(name="flight_sql", skipped=why_not)

        for label, statement in STATEMENTS.items():
            tables = list(check(statement).maps)

            def fresh(sql: str, params: list[str], tables: list[str] = tables) -> pa.Table:
                return engine.run(sql, params, tables)

            every = {**paths, "engine_session_per_statement": fresh}
            measure(label, statement, every, args.reps, args.warmup)

        key_lookups(engine, channel, sql_stub, users, args.lookups)


def measure(
    label: str,
    statement: str,
    paths: dict[str, Run],
    reps: int,
    warmup: int,
) -> None:
    """Each path's time for ``statement``, the paths taking turns; one line each."""
    expected = paths["engine"](statement, [])
    for name, call in paths.items():
        if not same_rows(expected, call(statement, [])):
            raise RuntimeError(f"{label}: {name} does not answer what the engine does")
    times: dict[str, list[float]] = {name: [] for name in paths}
    names = list(paths)
    order = random.Random(label)
    for rep in range(warmup + reps):
        order.shuffle(names)
        for name in names:
            started = time.perf_counter()
            paths[name](statement, [])
            elapsed = (time.perf_counter() - started) * 1000
            if rep >= warmup:
                times[name].append(elapsed)
    engine_p50, engine_min = statistics.median(times["engine"]), min(times["engine"])
    fresh = times.pop("engine_session_per_statement")
    emit(
        name=f"sql_{label}_engine",
        statement=statement,
        rows=expected.num_rows,
        p50_ms=round(engine_p50, 1),
        min_ms=round(engine_min, 1),
        session_per_statement_p50_ms=round(statistics.median(fresh), 1),
        session_per_statement_min_ms=round(min(fresh), 1),
        loadavg_1m=loadavg(),
    )
    for name, samples in times.items():
        if name == "engine":
            continue
        p50, low = statistics.median(samples), min(samples)
        ratio = engine_p50 / p50
        goal = {"target_ratio": TARGET_RATIO, "goal_met": ratio >= TARGET_RATIO}
        emit(
            name=f"sql_{label}_{name}",
            statement=statement,
            rows=expected.num_rows,
            p50_ms=round(p50, 1),
            min_ms=round(low, 1),
            engine_p50_ms=round(engine_p50, 1),
            engine_min_ms=round(engine_min, 1),
            ratio=round(ratio, 3),
            ratio_min=round(engine_min / low, 3),
            overhead_p50_ms=round(p50 - engine_p50, 1),
            **(goal if label in GOALS else {}),
        )


def key_lookups(
    engine: Engine,
    channel: grpc.Channel,
    sql_stub: sql_grpc.SqlServiceStub,
    users: Map,
    n: int,
) -> None:
    """SQL's key lookup and ``Get`` for the same random keys, one call at a time, in
    turns; the engine's own time for the statement beside them."""
    maps = map_grpc.MapServiceStub(channel)  # type: ignore[no-untyped-call]
    keys = users.columns[TABLE_KEY]
    rng = random.Random(11)
    warm = [str(keys[rng.randrange(len(keys))]) for _ in range(50)]
    measured = [str(keys[rng.randrange(len(keys))]) for _ in range(n)]
    answered_by: set[str] = set()

    def get(key: str) -> bytes:
        reply = maps.Get(map_pb.GetRequest(map=users.name, key=key), timeout=CALL_TIMEOUT)
        if not reply.found:
            raise RuntimeError(f"Get {key}: not found")
        return bytes(reply.entity)

    def lookup(key: str) -> pa.Table:
        table, tables = grpc_answer(sql_stub, LOOKUP, [key])
        answered_by.update(source(t) for t in tables.tables)
        return table

    for key in warm:
        entity, row = orjson.loads(get(key)), lookup(key).to_pylist()
        if row != [{TABLE_KEY: key, **entity}]:
            raise RuntimeError(f"{LOOKUP} of {key}: {row}, Get: {entity}")
    get_ms: list[float] = []
    sql_ms: list[float] = []
    for i, key in enumerate(measured):
        calls: list[tuple[Callable[[str], object], list[float]]] = [
            (get, get_ms),
            (lookup, sql_ms),
        ]
        for call, samples in calls if i % 2 else calls[::-1]:
            started = time.perf_counter()
            call(key)
            samples.append((time.perf_counter() - started) * 1000)
    engine_ms = []
    for i, key in enumerate(measured[: 3 + 20]):
        started = time.perf_counter()
        engine.run(LOOKUP, [key])
        if i >= 3:
            engine_ms.append((time.perf_counter() - started) * 1000)
    get_line = percentiles(get_ms)
    sql_line = percentiles(sql_ms)
    emit(name="get", map=users.name, entities=users.rows, calls=len(get_ms), **get_line)
    emit(
        name="sql_key_lookup_grpc",
        statement=LOOKUP,
        entities=users.rows,
        calls=len(sql_ms),
        answered_by=sorted(answered_by),
        **sql_line,
        get_p50_ms=get_line["p50_ms"],
        get_p99_ms=get_line["p99_ms"],
        p50_over_get=round(sql_line["p50_ms"] / get_line["p50_ms"], 2),
        p99_over_get=round(sql_line["p99_ms"] / get_line["p99_ms"], 2),
        engine_p50_ms=round(statistics.median(engine_ms), 1),
    )


def source(read: sql_pb.TableRead) -> str:
    """Which copy a table read says it read: Redis, or the Delta table's version."""
    return "redis" if read.redis else f"delta version {read.version}"


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_ms": round(statistics.median(ordered), 2),
        "p99_ms": round(ordered[min(len(ordered) - 1, math.ceil(len(ordered) * 0.99) - 1)], 2),
        "max_ms": round(ordered[-1], 2),
    }


def same_rows(a: pa.Table, b: pa.Table) -> bool:
    """The same rows in any order, floats equal up to the order they were summed in."""
    if a.num_rows != b.num_rows or a.column_names != b.column_names:
        return False
    return all(
        len(x) == len(y) and all(_close(u, v) for u, v in zip(x, y, strict=True))
        for x, y in zip(_sorted_rows(a), _sorted_rows(b), strict=True)
    )


def _sorted_rows(table: pa.Table) -> Iterator[tuple[Any, ...]]:
    rows = zip(*(column.to_pylist() for column in table.columns), strict=True)
    yield from sorted(rows, key=lambda row: tuple(repr(v) for v in row if not isinstance(v, float)))


def _close(u: Any, v: Any) -> bool:
    if isinstance(u, float) and isinstance(v, float):
        return math.isclose(u, v, rel_tol=1e-9)
    return bool(u == v)


def delete_map(client: redis.Redis, name: str) -> None:
    """Remove a map's keys from a Redis that is not ours."""
    batch = []
    for key in client.scan_iter(match=f"{name}*", count=10_000):
        batch.append(key)
        if len(batch) >= 10_000:
            client.unlink(*batch)
            batch.clear()
    if batch:
        client.unlink(*batch)


if __name__ == "__main__":
    main()
