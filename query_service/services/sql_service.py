"""``materializer.v1.SqlService``: SQL over the maps' tables, answered in Arrow IPC.

The statement's checks, bounds and table versions are ``query_service.sql``'s; this
turns a request into its arguments and the answer into messages. The engine's
Arrow messages go out as the statement process wrote them, never decoded and
encoded again.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation

import grpc

from materializer.v1 import sql_service_pb2 as pb
from materializer.v1 import sql_service_pb2_grpc as pb_grpc
from query_service.errors import InvalidArgument
from query_service.freshness import watermark_to_proto
from query_service.sql.executor import Answer, Param, SqlExecutor, TableRead

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MIN_SECONDS = -62_135_596_800
"""0001-01-01T00:00:00Z, the first second of ``google.protobuf.Timestamp``'s range."""
_MAX_SECONDS = 253_402_300_799
"""9999-12-31T23:59:59Z, its last."""


class SqlServicer(pb_grpc.SqlServiceServicer):
    """Runs each call's statement through the process's ``SqlExecutor``."""

    def __init__(self, executor: SqlExecutor) -> None:
        self._executor = executor

    async def start(self, request: pb.ExecuteRequest, context: grpc.aio.ServicerContext) -> Answer:
        """The statement checked and started: its answer, with the tables it reads.

        The HTTP front calls this (as ``Execute``, for grants and metrics) to write
        the answer in its own formats.
        """
        return await self._executor.execute(
            request.sql,
            [param_value(p, i) for i, p in enumerate(request.params)],
            min_offsets=request.freshness.min_offsets,
            limit=request.limit,
            time_remaining=context.time_remaining(),
        )

    async def Execute(
        self, request: pb.ExecuteRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ExecuteResponse]:
        """The schema, the batches, then the tables read (see the .proto)."""
        answer = await self.start(request, context)
        try:
            yield pb.ExecuteResponse(arrow_schema=answer.schema_message)
            async for _, message in answer.batches():
                yield pb.ExecuteResponse(arrow_batch=message)
        finally:
            with contextlib.suppress(Exception):
                await answer.close()
        yield pb.ExecuteResponse(tables=tables_to_proto(answer.tables))


def tables_to_proto(tables: list[TableRead]) -> pb.TablesRead:
    """The tables an answer read, in their wire form."""
    message = pb.TablesRead()
    for table in tables:
        read = message.tables.add(
            map=table.map_name, version=table.version, redis=table.redis, index=table.index
        )
        if table.watermark is not None:
            read.watermark.CopyFrom(watermark_to_proto(table.watermark))
    return message


def param_value(param: pb.SqlParam, index: int) -> Param:
    """A bound value as the engine takes it."""
    kind = param.WhichOneof("value")
    if kind is None or kind == "null":
        return None
    if kind == "timestamp_value":
        ts = param.timestamp_value
        if not _MIN_SECONDS <= ts.seconds <= _MAX_SECONDS or not 0 <= ts.nanos < 1_000_000_000:
            raise InvalidArgument(
                f"params[{index}].timestamp_value: seconds {ts.seconds}, nanos {ts.nanos}: "
                "a timestamp is from 0001-01-01 to 9999-12-31, nanos from 0 to 999999999"
            )
        return _EPOCH + timedelta(seconds=ts.seconds, microseconds=ts.nanos // 1000)
    if kind == "decimal_value":
        try:
            number = Decimal(param.decimal_value)
        except InvalidOperation:
            raise InvalidArgument(
                f"params[{index}].decimal_value: not a decimal number: {param.decimal_value!r}"
            ) from None
        if not number.is_finite():
            raise InvalidArgument(f"params[{index}].decimal_value: must be finite")
        return number
    value: Param = getattr(param, kind)
    return value
