"""Calls of ``SqlService.Execute`` and ``POST /v1/sql`` as the SQL tests make them, a query
service over Delta tables written with delta-rs, and the statement processes it started.

Answers of both fronts are brought to one form (``SqlAnswer``): rows as dicts of Python
values, decimals as ``Decimal`` and timestamps as aware UTC datetimes, so a test compares
the gRPC answer (Arrow IPC, decoded here) and the HTTP one (JSON) with one expectation.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import grpc
import orjson
import pyarrow as pa

from materializer.config import AppConfig, parse_config
from materializer.v1 import common_pb2 as common
from materializer.v1 import sql_service_pb2 as pb
from materializer.v1 import sql_service_pb2_grpc as pb_grpc
from query_service.client import sql_param
from query_service.server import Servers
from tests.helpers.query_redis import started

T = TypeVar("T")
DEADLINE = 60.0
WORKER_MODULE = "query_service.sql.worker"
Row = dict[str, Any]
Offsets = Mapping[str, Mapping[int, int]]


@dataclass
class SqlAnswer:
    """One answer, whichever front gave it."""

    columns: list[str]
    rows: list[Row]
    tables: dict[str, TableRead] = field(default_factory=dict)


@dataclass(frozen=True)
class TableRead:
    version: int
    offsets: dict[str, dict[int, int]] | None
    """The watermark's source offsets (next offsets per partition); None without one."""


@dataclass
class SqlFront:
    """A started query service: its gRPC stub, an HTTP session on its front, the servers."""

    servers: Servers
    stub: pb_grpc.SqlServiceStub
    http: aiohttp.ClientSession
    base: str

    @property
    def running(self) -> int:
        """Statements running now in the service."""
        assert self.servers.sql is not None
        return self.servers.sql.running


@asynccontextmanager
async def sql_front(config: AppConfig) -> AsyncIterator[SqlFront]:
    """A query service on free ports (gRPC and HTTP), stopped with its statement processes."""
    async with (
        started(config) as servers,
        aiohttp.ClientSession() as http,
        grpc.aio.insecure_channel(f"127.0.0.1:{servers.port}") as channel,
    ):
        yield SqlFront(
            servers,
            pb_grpc.SqlServiceStub(channel),
            http,
            f"http://127.0.0.1:{servers.http_port}",
        )


@contextmanager
def threaded_service(config: AppConfig) -> Iterator[Servers]:
    """A query service on an event loop of its own, in a thread: for synchronous callers
    (hypothesis's tests), over a blocking gRPC channel and plain HTTP."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    service = started(config)
    servers = asyncio.run_coroutine_threadsafe(service.__aenter__(), loop).result(60)
    try:
        yield servers
    finally:
        asyncio.run_coroutine_threadsafe(service.__aexit__(None, None, None), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def serve(config: AppConfig, body: Callable[[SqlFront], Awaitable[T]]) -> T:
    """``body`` against a query service started for it (pytest-asyncio is not used)."""

    async def main() -> T:
        async with sql_front(config) as front:
            return await body(front)

    # Statement processes of services other tests in this process left running are not
    # this service's: the counts below leave them out.
    _OTHERS.clear()
    _OTHERS.update(_children())
    return asyncio.run(main())


def tables_config(
    redis_url: str,
    root: Path,
    maps: Sequence[str],
    *,
    sql: Mapping[str, Any] | None = None,
    auth: Mapping[str, Any] | None = None,
) -> AppConfig:
    """Maps reading ``<map>-events``, their tables under ``root`` (``delta.root``)."""
    query: dict[str, Any] = {"sql": dict(sql or {})}
    if auth is not None:
        query["auth"] = dict(auth)
    return parse_config(
        {
            "kafka": {"bootstrap_servers": "127.0.0.1:9"},
            "redis": {"url": redis_url},
            "delta": {"root": str(root)},
            "query": query,
            "maps": {
                name: {"source": {"topics": [f"{name}-events"], "schema": "id STRING"}, "key": "id"}
                for name in maps
            },
        }
    )


def map_names(*stems: str) -> list[str]:
    """Map names of one test's own (tests share a Redis), lower-case: bare SQL names."""
    tag = uuid.uuid4().hex[:8]
    return [f"{stem}{tag}" for stem in stems]


def request(
    sql: str,
    params: Sequence[pb.SqlParam] = (),
    *,
    min_offsets: Offsets | None = None,
    limit: int = 0,
) -> pb.ExecuteRequest:
    offsets = [
        common.PartitionOffset(topic=topic, partition=p, offset=o)
        for topic, parts in (min_offsets or {}).items()
        for p, o in parts.items()
    ]
    return pb.ExecuteRequest(
        sql=sql, params=params, freshness=common.Freshness(min_offsets=offsets), limit=limit
    )


async def grpc_sql(
    stub: pb_grpc.SqlServiceStub,
    sql: str,
    params: Sequence[Any] = (),
    *,
    timeout: float = DEADLINE,
    metadata: Sequence[tuple[str, str]] | None = None,
    min_offsets: Offsets | None = None,
    limit: int = 0,
) -> SqlAnswer:
    """The answer over gRPC: the Arrow IPC payloads read as one stream, and the tables."""
    message = request(sql, [sql_param(p) for p in params], min_offsets=min_offsets, limit=limit)
    parts = [
        part async for part in stub.Execute(message, timeout=timeout, metadata=metadata or None)
    ]
    kinds = [part.WhichOneof("part") for part in parts]
    assert kinds[0] == "arrow_schema" and kinds[-1] == "tables", kinds
    assert set(kinds[1:-1]) <= {"arrow_batch"}, kinds
    stream = b"".join(part.arrow_schema or part.arrow_batch for part in parts[:-1])
    table = pa.ipc.open_stream(stream).read_all()
    rows = [{name: from_arrow(v) for name, v in row.items()} for row in table.to_pylist()]
    tables = {}
    for read in parts[-1].tables.tables:
        offsets: dict[str, dict[int, int]] | None = None
        if read.HasField("watermark"):
            offsets = defaultdict(dict)
            for at in read.watermark.offsets:
                offsets[at.topic][at.partition] = at.offset
        tables[read.map] = TableRead(read.version, None if offsets is None else dict(offsets))
    return SqlAnswer(table.column_names, rows, tables)


async def grpc_code(
    stub: pb_grpc.SqlServiceStub, sql: str, params: Sequence[Any] = (), **kw: Any
) -> tuple[grpc.StatusCode, str]:
    """The status of a call and its details; ``OK`` and ``""`` when it answered."""
    try:
        await grpc_sql(stub, sql, params, **kw)
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


async def http_post(
    front: SqlFront, body: Mapping[str, Any], headers: Mapping[str, str] | None = None
) -> tuple[int, Any]:
    """``POST /v1/sql`` with a JSON body: the status and the decoded JSON answer."""
    async with front.http.post(
        front.base + "/v1/sql",
        data=orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS),
        headers=dict(headers or {}),
    ) as response:
        raw = await response.read()
        assert response.content_type == "application/json", (response.status, raw[:200])
        return response.status, orjson.loads(raw)


async def http_sql(
    front: SqlFront,
    sql: str,
    params: Sequence[Any] = (),
    *,
    headers: Mapping[str, str] | None = None,
    **body: Any,
) -> SqlAnswer:
    """The answer over HTTP JSON, its values brought to the gRPC answer's Python types by
    the column types the answer states."""
    status, answer = await http_post(front, {"sql": sql, "params": list(params), **body}, headers)
    assert status == 200, (status, answer)
    kinds = {column["name"]: column["type"] for column in answer["columns"]}
    rows = [{name: from_json(v, kinds[name]) for name, v in row.items()} for row in answer["rows"]]
    tables = {
        read["map"]: TableRead(
            read["version"],
            {
                topic: {int(p): o for p, o in parts.items()}
                for topic, parts in read["watermark"]["offsets"].items()
            }
            if read.get("watermark")
            else None,
        )
        for read in answer["tables"]
    }
    return SqlAnswer([column["name"] for column in answer["columns"]], rows, tables)


async def http_error(
    front: SqlFront, body: Mapping[str, Any], headers: Mapping[str, str] | None = None
) -> tuple[int, str, str]:
    """An HTTP refusal: its status, the error's code name and message."""
    status, answer = await http_post(front, body, headers)
    assert status != 200, answer
    error = answer["error"]
    return status, error["code"], error["message"]


def from_arrow(value: Any) -> Any:
    """An Arrow answer value as the tests compare it: timestamps as aware UTC datetimes."""
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    return value


def from_json(value: Any, arrow_type: str) -> Any:
    """A JSON answer value by its column's Arrow type: decimals come as text, timestamps as
    RFC 3339 (a zone-less one is UTC, as the Arrow column without a zone is)."""
    if value is None:
        return None
    if arrow_type.startswith("decimal"):
        return Decimal(value)
    if arrow_type.startswith("timestamp"):
        return from_arrow(datetime.fromisoformat(value))
    return value


_OTHERS: set[int] = set()
"""Statement processes alive when ``serve`` started its service."""


def statement_processes() -> set[int]:
    """The live statement processes the service ``serve`` started (from ``/proc``)."""
    return _children() - _OTHERS


def _children() -> set[int]:
    """The live statement processes this test process started."""
    me = os.getpid()
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue  # ended meanwhile
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if int(ppid) == me and state != "Z" and WORKER_MODULE.encode() in cmdline:
            found.add(int(entry.name))
    return found


async def processes_until(
    check: Callable[[set[int]], bool], what: str, timeout: float = 20.0
) -> set[int]:
    """Poll ``statement_processes()`` until ``check`` holds of it (the service reaps its
    processes on this event loop, so the wait yields to it); that set."""
    deadline = time.monotonic() + timeout
    while True:
        now = statement_processes()
        if check(now):
            return now
        if time.monotonic() > deadline:
            raise AssertionError(f"statement processes {sorted(now)}: not {what}")
        await asyncio.sleep(0.05)
