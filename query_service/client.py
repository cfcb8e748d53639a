"""A typed asyncio client of the query service.

Every call has a deadline (gRPC has none by default: a call to a stuck
server would wait forever). Unary calls are retried on ``UNAVAILABLE`` only —
the one status that says the same call may succeed later, and every unary
call here is idempotent — with jittered exponential backoff inside the
call's deadline. Other statuses raise at once as ``grpc.aio.AioRpcError``.

    async with MaterializerClient("localhost:50051", token=...) as client:
        user = await client.get("users", "u-1")
        async for enriched in client.enrich(batches, profile="orders-with-users"):
            ...
        answer = await client.sql("SELECT tier, count(*) FROM users GROUP BY tier")
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any, Literal, TypeVar

import grpc
import orjson
import pyarrow as pa

from materializer.v1 import admin_service_pb2 as admin_pb
from materializer.v1 import admin_service_pb2_grpc as admin_grpc
from materializer.v1 import common_pb2 as common
from materializer.v1 import enrich_service_pb2 as enrich_pb
from materializer.v1 import enrich_service_pb2_grpc as enrich_grpc
from materializer.v1 import map_service_pb2 as map_pb
from materializer.v1 import map_service_pb2_grpc as map_grpc
from materializer.v1 import sql_service_pb2 as sql_pb
from materializer.v1 import sql_service_pb2_grpc as sql_grpc
from query_service.transport import MAX_MESSAGE_BYTES

T = TypeVar("T")
DEFAULT_DEADLINE = 5.0
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
]

Offsets = dict[tuple[str, int], int]
"""Next offsets by (topic, partition): the form of a watermark and of read-your-writes."""
SqlValue = None | bool | int | float | str | bytes | Decimal | datetime
"""A value bound to a statement's ``$n``; a ``datetime`` must say its zone."""


@dataclass(frozen=True)
class Watermark:
    """The batch a response reflects: next offsets per partition, and when it was written."""

    batch_id: int
    offsets: Offsets
    updated_at_ms: int

    @classmethod
    def from_proto(cls, message: common.Watermark) -> Watermark:
        """The client's form of a response's watermark."""
        return cls(
            batch_id=message.batch_id,
            offsets={(o.topic, o.partition): o.offset for o in message.offsets},
            updated_at_ms=message.updated_at.ToMilliseconds()
            if message.HasField("updated_at")
            else 0,
        )


@dataclass(frozen=True)
class Lookup:
    """One entity (``None`` when absent) and the watermark it reflects at least."""

    entity: dict[str, Any] | None
    watermark: Watermark | None
    table_version: int | None = None
    """Set when the map's Delta table answered, at this version: Redis lost the map's copy
    and its run is writing it back."""


@dataclass(frozen=True)
class Enriched:
    """One event's outcome in an Enrich stream."""

    event: dict[str, Any] | None
    dropped: bool = False
    error: str = ""
    missed: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class TableRead:
    """A table an SQL answer read: the Delta version and the source offsets it reflects."""

    map: str
    version: int
    """The Delta table version; -1 when the answer came from the map's Redis copy."""
    watermark: Watermark | None
    """``None`` when the version's commits record no offsets."""
    redis: bool
    """Answered from the Redis copy as ``get`` is: a plain key lookup, or a statement one
    of the map's indexes narrows."""
    index: str = ""
    """The field whose index was read, when one was."""


@dataclass(frozen=True)
class SqlAnswer:
    """A statement's whole answer, and every table it read."""

    table: pa.Table
    tables: list[TableRead]


def sql_param(value: SqlValue) -> sql_pb.SqlParam:
    """A Python value in the wire form of a statement's parameter.

    Raises ``ValueError`` for a ``datetime`` without a zone (whose instant is unknown)
    and an ``int`` beyond 64 bits, ``TypeError`` for any other type.
    """
    if value is None:
        return sql_pb.SqlParam(null=True)
    if isinstance(value, bool):
        return sql_pb.SqlParam(bool_value=value)
    if isinstance(value, int):
        if not -(2**63) <= value < 2**63:
            raise ValueError(f"{value} does not fit 64 bits")
        return sql_pb.SqlParam(int_value=value)
    if isinstance(value, float):
        return sql_pb.SqlParam(double_value=value)
    if isinstance(value, str):
        return sql_pb.SqlParam(string_value=value)
    if isinstance(value, bytes):
        return sql_pb.SqlParam(bytes_value=value)
    if isinstance(value, Decimal):
        return sql_pb.SqlParam(decimal_value=str(value))
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError(f"{value.isoformat()}: a timestamp needs its zone (tzinfo)")
        param = sql_pb.SqlParam()
        param.timestamp_value.FromDatetime(value)
        return param
    raise TypeError(f"{type(value).__name__} is not a SQL parameter type")


def _table_read(message: sql_pb.TableRead) -> TableRead:
    return TableRead(
        message.map, message.version, _watermark(message), message.redis, message.index
    )


def _freshness(min_offsets: Offsets | None) -> common.Freshness:
    return common.Freshness(
        min_offsets=[
            common.PartitionOffset(topic=t, partition=p, offset=o)
            for (t, p), o in sorted((min_offsets or {}).items())
        ]
    )


def _entity(found: bool, raw: bytes) -> dict[str, Any] | None:
    return orjson.loads(raw) if found else None


def _watermark(message: Any) -> Watermark | None:
    return Watermark.from_proto(message.watermark) if message.HasField("watermark") else None


class MaterializerClient:
    """Lookups, queries, change streams, enrichment and admin calls over one channel."""

    def __init__(
        self,
        target: str,
        *,
        token: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        deadline: float = DEFAULT_DEADLINE,
        retries: int = 3,
        backoff: float = 0.05,
    ) -> None:
        if credentials is None:
            self._channel = grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)
        else:
            self._channel = grpc.aio.secure_channel(target, credentials, options=CHANNEL_OPTIONS)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None
        self._deadline = deadline
        self._retries = retries
        self._backoff = backoff
        self.maps = map_grpc.MapServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self.enrichment = enrich_grpc.EnrichServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self.admin = admin_grpc.AdminServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self.sql_service = sql_grpc.SqlServiceStub(self._channel)  # type: ignore[no-untyped-call]

    async def __aenter__(self) -> MaterializerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the channel; calls in flight are cancelled."""
        await self._channel.close()

    async def _unary(
        self, call: Callable[..., Awaitable[T]], request: Any, timeout: float | None
    ) -> T:
        """One call with retries on UNAVAILABLE, all inside one deadline."""
        deadline = time.monotonic() + (timeout or self._deadline)
        attempt = 0
        while True:
            remaining = deadline - time.monotonic()
            try:
                return await call(request, timeout=max(remaining, 0.001), metadata=self._metadata)
            except grpc.aio.AioRpcError as exc:
                attempt += 1
                if exc.code() != grpc.StatusCode.UNAVAILABLE or attempt > self._retries:
                    raise
                pause = self._backoff * 2 ** (attempt - 1) * random.uniform(0.5, 1.5)  # noqa: S311
                if time.monotonic() + pause >= deadline:
                    raise
                await asyncio.sleep(pause)

    # ------------------------------------------------------------ lookups

    async def get(
        self,
        map_name: str,
        key: str,
        *,
        min_offsets: Offsets | None = None,
        timeout: float | None = None,
    ) -> Lookup:
        """One entity; with ``min_offsets``, once the map has caught up to them."""
        request = map_pb.GetRequest(map=map_name, key=key, freshness=_freshness(min_offsets))
        response = await self._unary(self.maps.Get, request, timeout)
        version = response.table_version if response.from_table else None
        return Lookup(_entity(response.found, response.entity), _watermark(response), version)

    async def batch_get(
        self,
        map_name: str,
        keys: Sequence[str],
        *,
        min_offsets: Offsets | None = None,
        timeout: float | None = None,
    ) -> tuple[dict[str, dict[str, Any] | None], Watermark | None]:
        """Many entities of one map in one call, by key (``None`` for absent ones)."""
        request = map_pb.BatchGetRequest(map=map_name, keys=keys, freshness=_freshness(min_offsets))
        response = await self._unary(self.maps.BatchGet, request, timeout)
        entities = {e.key: _entity(e.found, e.entity) for e in response.entries}
        return entities, _watermark(response)

    async def get_as_of(
        self,
        map_name: str,
        key: str,
        *,
        version: int | None = None,
        at: datetime | None = None,
        timeout: float | None = None,
    ) -> tuple[dict[str, Any] | None, int]:
        """An entity as the map's Delta table held it, and the table version read."""
        request = map_pb.GetAsOfRequest(map=map_name, key=key)
        if version is not None:
            request.version = version
        if at is not None:
            request.timestamp.FromDatetime(at)
        response = await self._unary(self.maps.GetAsOf, request, timeout)
        return _entity(response.found, response.entity), response.table_version

    async def get_schema(
        self, map_name: str, *, timeout: float | None = None
    ) -> map_pb.GetSchemaResponse:
        """The map's fields as its Delta table holds them, and when each came."""
        request = map_pb.GetSchemaRequest(map=map_name)
        response: map_pb.GetSchemaResponse = await self._unary(
            self.maps.GetSchema, request, timeout
        )
        return response

    async def query(
        self,
        map_name: str,
        *,
        where: str = "",
        fields: Sequence[str] = (),
        limit: int = 0,
        page_size: int = 0,
        timeout: float | None = None,
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Rows of the map's table matching a SQL condition, in key order: (key, fields)."""
        request = map_pb.QueryRequest(
            map=map_name, where=where, fields=fields, limit=limit, page_size=page_size
        )
        call = self.maps.Query(request, timeout=timeout or self._deadline, metadata=self._metadata)
        async for page in call:
            for row in page.rows:
                yield row.key, orjson.loads(row.entity)

    async def watch(
        self,
        map_name: str,
        *,
        after_change_id: str = "",
        include_entities: bool = False,
        keys: Sequence[str] = (),
        where: str | None = None,
        include_left: bool = False,
        timeout: float | None = None,
    ) -> AsyncIterator[map_pb.Change]:
        """The map's changes as they come; resume with the last ``change_id`` seen.

        With ``where`` (a SQL filter, as ``query``'s), only the changes after which the
        entity matches; with ``include_left`` too, the one after which an entity sent as
        matching no longer does (``Change.left``). No deadline unless ``timeout`` is
        given: a change stream is meant to stay open.
        """
        request = map_pb.WatchRequest(
            map=map_name,
            after_change_id=after_change_id,
            include_entities=include_entities,
            keys=keys,
            include_left=include_left,
        )
        if where is not None:
            request.where = where
        async for response in self.maps.Watch(request, timeout=timeout, metadata=self._metadata):
            for change in response.changes:
                yield change

    # ------------------------------------------------------------ SQL

    async def sql(
        self,
        statement: str,
        params: Sequence[SqlValue] = (),
        *,
        min_offsets: Offsets | None = None,
        limit: int = 0,
        timeout: float | None = None,
    ) -> SqlAnswer:
        """One SELECT or WITH statement over the maps (each a table by its name), its whole
        answer in memory, and the tables it read with their versions and watermarks.

        ``params`` are the values of ``$1``, ``$2``…; with ``min_offsets``, the tables
        reading those topics reflect them first; ``limit`` cuts the answer short (0: the
        server's ``query.sql.max_rows``, past which it fails). One attempt, never
        retried: a statement may be long, and its deadline is the caller's to spend.
        """
        request = sql_pb.ExecuteRequest(
            sql=statement,
            params=[sql_param(value) for value in params],
            freshness=_freshness(min_offsets),
            limit=limit,
        )
        call = self.sql_service.Execute(
            request, timeout=timeout or self._deadline, metadata=self._metadata
        )
        ipc: list[bytes] = []
        tables: list[TableRead] | None = None
        async for response in call:
            part = response.WhichOneof("part")
            if part == "tables":
                tables = [_table_read(t) for t in response.tables.tables]
            elif part is not None:
                ipc.append(getattr(response, part))
        if not ipc or tables is None:
            # grpc ends a failed stream with its status: an answer this short is a bug.
            raise RuntimeError("SqlService.Execute ended without its schema or tables read")
        return SqlAnswer(pa.ipc.open_stream(b"".join(ipc)).read_all(), tables)

    # ------------------------------------------------------------ enrichment

    async def enrich(
        self,
        batches: AsyncIterable[Sequence[dict[str, Any]]] | Iterable[Sequence[dict[str, Any]]],
        *,
        profile: str = "",
        spec: enrich_pb.JoinSpec | None = None,
        timeout: float | None = None,
    ) -> AsyncIterator[list[Enriched]]:
        """Stream batches of events through Enrich; one list of outcomes per batch, in order.

        Give a ``profile`` name from the server's configuration, or a ``spec``.
        Batches are sent as they come while answers flow back, so the server
        can batch lookups across the batches in flight.
        """
        if bool(profile) == (spec is not None):
            raise ValueError("give exactly one of profile, spec")

        async def requests() -> AsyncIterator[enrich_pb.EnrichRequest]:
            first = True
            async for batch in _aiter(batches):
                request = enrich_pb.EnrichRequest(events=[orjson.dumps(e) for e in batch])
                if first:
                    if spec is not None:
                        request.spec.CopyFrom(spec)
                    else:
                        request.profile = profile
                    first = False
                yield request

        call = self.enrichment.Enrich(requests(), timeout=timeout, metadata=self._metadata)
        async for response in call:
            yield [
                Enriched(
                    event=orjson.loads(e.event) if e.event else None,
                    dropped=e.dropped,
                    error=e.error,
                    missed=list(e.missed),
                )
                for e in response.events
            ]

    # ------------------------------------------------------------ admin

    async def status(
        self, map_name: str = "", *, timeout: float | None = None
    ) -> list[admin_pb.MapStatus]:
        """State, lag and rates of one map, or of all."""
        request = admin_pb.GetStatusRequest(map=map_name)
        return list((await self._unary(self.admin.GetStatus, request, timeout)).maps)

    async def pause(self, map_name: str, *, timeout: float | None = None) -> None:
        """Ask the materializer to pause a map (it obeys within a second or so)."""
        await self._unary(self.admin.Pause, admin_pb.ControlRequest(map=map_name), timeout)

    async def resume(self, map_name: str, *, timeout: float | None = None) -> None:
        """Ask the materializer to resume a paused map."""
        await self._unary(self.admin.Resume, admin_pb.ControlRequest(map=map_name), timeout)

    async def restart(self, map_name: str, *, timeout: float | None = None) -> None:
        """Ask the materializer to restart a map's queries."""
        await self._unary(self.admin.Restart, admin_pb.ControlRequest(map=map_name), timeout)

    async def start_operation(
        self,
        map_name: str,
        kind: Literal["verify", "rehydrate", "rebuild"],
        *,
        timeout: float | None = None,
    ) -> admin_pb.Operation:
        """Ask the run that holds the map for an operation; its record, ``REQUESTED``
        (``FAILED_PRECONDITION`` while another is under way, or no run holds the map)."""
        request = admin_pb.OperationRequest(map=map_name, kind=kind)
        return await self._unary(self.admin.StartOperation, request, timeout)

    async def last_operation(
        self, map_name: str, *, timeout: float | None = None
    ) -> admin_pb.Operation:
        """The last operation asked of the map, as its run reports it (``NOT_FOUND``: none)."""
        request = admin_pb.GetOperationRequest(map=map_name)
        return await self._unary(self.admin.GetOperation, request, timeout)

    async def validate_config(self, text: str, *, timeout: float | None = None) -> list[str]:
        """The problems of a configuration document; empty when it is valid."""
        request = admin_pb.ValidateConfigRequest(config=text)
        return list((await self._unary(self.admin.ValidateConfig, request, timeout)).problems)


async def _aiter(items: AsyncIterable[T] | Iterable[T]) -> AsyncIterator[T]:
    if isinstance(items, AsyncIterable):
        async for item in items:
            yield item
    else:
        for item in items:
            yield item
