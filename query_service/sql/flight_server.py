"""The Flight SQL port's calls: each Flight method a client sends, answered over the
service's ``SqlExecutor`` (``flight`` starts and stops the port).

pyarrow.flight runs each call on a gRPC thread, while statements run on the service's
event loop: a handler hands its work to the loop and waits (``_on_loop``), watching the
call's cancellation, so a client that cancels or passes its deadline stops the work.
Statements' answers and prepared statements are kept in ``flight_answers``; the
protocol's messages are read and written by ``flight_commands``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.flight as fl
from google.protobuf.message import Message

from materializer.catalog.live import LiveMaps
from query_service.auth import Authorizer, Grant
from query_service.errors import InvalidArgument, QueryServiceError, StoreUnavailable
from query_service.sql import flight_commands as commands
from query_service.sql import flight_metadata as metadata
from query_service.sql.executor import Param, SqlExecutor
from query_service.sql.flight_answers import (
    POLL_SECONDS,
    Answers,
    CallContext,
    Cancelled,
    Prepared,
    PreparedStatements,
    Stream,
)
from query_service.sql.flight_calls import (
    INTERNAL,
    STOPPING,
    Calls,
    Handshake,
    answered,
    flight_error,
    grant_of,
)
from query_service.sql.flightsql import FlightSql_pb2 as fsql
from query_service.sql.statement import Statement, check
from query_service.stores.delta import TableNotFound
from query_service.tables.snapshots import TableSnapshots

log = logging.getLogger(__name__)
T = TypeVar("T")


class FlightSqlServer(fl.FlightServerBase):  # type: ignore[misc]
    """The Flight SQL service over one query service's ``SqlExecutor``; it serves from
    its creation (``start_flight``)."""

    def __init__(
        self,
        location: str,
        *,
        executor: SqlExecutor,
        live: LiveMaps,
        snapshots: TableSnapshots,
        generation: Callable[[str], Awaitable[int]],
        calls: Calls,
        loop: asyncio.AbstractEventLoop,
        tls: dict[str, Any],
        unread_seconds: float,
    ) -> None:
        self._executor = executor
        self._live = live
        self._snapshots = snapshots
        self._generation = generation
        self._loop = loop
        timeout = live.config.query.sql.timeout.total_seconds()
        late = f"the statement ran longer than {timeout:g} s (query.sql.timeout); it was stopped"
        self.answers = Answers(executor, late, unread_seconds)
        self._prepared = PreparedStatements()
        self._waiting: set[concurrent.futures.Future[Any]] = set()
        self._waiting_lock = threading.Lock()
        super().__init__(location, auth_handler=Handshake(), middleware=calls.middleware(), **tls)

    # -- the calls -----------------------------------------------------------------------

    @answered
    def get_flight_info(
        self, context: fl.ServerCallContext, descriptor: fl.FlightDescriptor
    ) -> fl.FlightInfo:
        """Run a statement (its answer waits for ``DoGet``), or describe a metadata answer."""
        grant = grant_of(context)
        command = commands.command(descriptor.command)
        if isinstance(command, commands.STATEMENTS):
            text, params = self._statement(command, grant)
            ticket, schema = self._on_loop(context, self.answers.run(text, params, grant))
            self._prepared.ran(text, schema)
            handle = commands.pack(fsql.TicketStatementQuery(statement_handle=ticket))
            return fl.FlightInfo(schema, descriptor, [fl.FlightEndpoint(handle, [])], -1, -1)
        schema = commands.metadata_schema(command)
        # A metadata command is its own ticket: nothing is kept between the two calls.
        return fl.FlightInfo(
            schema, descriptor, [fl.FlightEndpoint(descriptor.command, [])], -1, -1
        )

    @answered
    def get_schema(
        self, context: fl.ServerCallContext, descriptor: fl.FlightDescriptor
    ) -> fl.SchemaResult:
        """An answer's schema; a statement's is learnt by running it for one row."""
        grant = grant_of(context)
        command = commands.command(descriptor.command)
        if isinstance(command, commands.STATEMENTS):
            text, params = self._statement(command, grant)
            return fl.SchemaResult(self._on_loop(context, self.answers.schema_of(text, params)))
        return fl.SchemaResult(commands.metadata_schema(command))

    @answered
    def do_get(self, context: fl.ServerCallContext, ticket: fl.Ticket) -> fl.FlightDataStream:
        """Stream a statement's answer, or answer a metadata command."""
        grant = grant_of(context)
        command = commands.command(ticket.ticket)
        if isinstance(command, fsql.TicketStatementQuery):
            handle = command.statement_handle
            schema = self._on_loop(context, self.answers.schema(handle, grant))
            return fl.GeneratorStream(schema, self._stream(context, handle, grant))
        return fl.RecordBatchStream(self._metadata(context, command, grant))

    @answered
    def do_put(
        self,
        context: fl.ServerCallContext,
        descriptor: fl.FlightDescriptor,
        reader: fl.MetadataRecordBatchReader,
        writer: fl.FlightMetadataWriter,
    ) -> None:
        """Bind a prepared statement's parameters: one row, a column per ``$n``."""
        grant = grant_of(context)
        command = commands.command(descriptor.command)
        if not isinstance(command, fsql.CommandPreparedStatementQuery):
            raise commands.refused(command)
        handle = command.prepared_statement_handle
        prepared = self._prepared.get(handle, grant)
        prepared.params = commands.parameters(reader.read_all())
        result = fsql.DoPutPreparedStatementResult(prepared_statement_handle=handle)
        writer.write(pa.py_buffer(result.SerializeToString()))

    @answered
    def do_action(self, context: fl.ServerCallContext, action: fl.Action) -> list[fl.Result]:
        """Create and close prepared statements."""
        grant = grant_of(context)
        body = action.body.to_pybytes() if action.body is not None else b""
        if action.type == "CreatePreparedStatement":
            request = commands.unpack(body, fsql.ActionCreatePreparedStatementRequest)
            if request.HasField("transaction_id"):
                raise InvalidArgument("transaction_id: statements only read; there are none")
            statement = self._checked(request.query, grant)
            handle = self._prepared.add(Prepared(request.query, statement.parameters, grant))
            result = fsql.ActionCreatePreparedStatementResult(
                prepared_statement_handle=handle,
                dataset_schema=commands.ipc(
                    self._prepared.schema(request.query) or commands.UNKNOWN_ANSWER
                ),
                parameter_schema=commands.parameter_schema(statement.parameters),
                is_update=False,
            )
            return [fl.Result(commands.pack(result))]
        if action.type == "ClosePreparedStatement":
            closing = commands.unpack(body, fsql.ActionClosePreparedStatementRequest)
            self._prepared.close(closing.prepared_statement_handle, grant)
            return []
        if action.type == "CloseSession":
            return [fl.Result(commands.CLOSE_SESSION_CLOSED)]
        raise InvalidArgument(
            f"action {action.type!r}: this port takes CreatePreparedStatement and "
            "ClosePreparedStatement only (statements only read: no transactions, no updates)"
        )

    def list_actions(self, context: fl.ServerCallContext) -> list[tuple[str, str]]:
        """The actions ``do_action`` takes."""
        return [
            ("CreatePreparedStatement", "Check a SELECT or WITH statement; its handle."),
            ("ClosePreparedStatement", "Forget a prepared statement."),
        ]

    def list_flights(
        self, context: fl.ServerCallContext, criteria: bytes
    ) -> Iterator[fl.FlightInfo]:
        """None: answers are reached through statements."""
        return iter(())

    # -- helpers -------------------------------------------------------------------------

    def _statement(self, command: Message, grant: Grant | None) -> tuple[str, list[Param]]:
        """A statement command's text (``_checked``) and parameters."""
        if isinstance(command, fsql.CommandStatementQuery):
            if command.HasField("transaction_id"):
                raise InvalidArgument("transaction_id: statements only read; there are none")
            text, params = command.query, []
        else:
            assert isinstance(command, fsql.CommandPreparedStatementQuery)
            prepared = self._prepared.get(command.prepared_statement_handle, grant)
            text, params = prepared.text, prepared.params
        self._checked(text, grant)
        return text, params

    def _checked(self, text: str, grant: Grant | None) -> Statement:
        """The statement checked, its maps granted (before they are looked up, as on the
        gRPC port) and known."""
        if grant is not None:
            Authorizer.check_maps(grant, check(text).maps)
        return self._executor.statement(text)

    def _stream(
        self, context: fl.ServerCallContext, ticket: bytes, grant: Grant | None
    ) -> Iterator[pa.RecordBatch]:
        """The answer's batches; leaving early (the client went away) stops the statement."""
        stream: Stream | None = None
        try:
            stream = self._on_loop(context, self.answers.stream(ticket, grant))
            while (batch := stream.next(context)) is not None:
                yield batch
        except QueryServiceError as exc:
            raise flight_error(exc, context) from None
        except fl.FlightError:
            raise
        except Exception:
            log.exception("streaming an Arrow Flight SQL answer failed")
            raise flight_error(QueryServiceError(INTERNAL), context) from None
        finally:
            if stream is not None:
                stream.stop()

    def _metadata(
        self, context: fl.ServerCallContext, command: Message, grant: Grant | None
    ) -> pa.Table:
        granted = [m for m in self._live.config.maps if grant is None or grant.allows_map(m)]
        if isinstance(command, fsql.CommandGetSqlInfo):
            return metadata.sql_info(list(command.info))
        if isinstance(command, fsql.CommandGetDbSchemas):
            return metadata.db_schemas(command)
        if isinstance(command, fsql.CommandGetTables):
            names = metadata.listed_tables(command, granted)
            schemas = (
                self._on_loop(context, self._schemas(names)) if command.include_schema else None
            )
            return metadata.tables(names, schemas)
        if isinstance(command, fsql.CommandGetTableTypes):
            return metadata.table_types()
        if isinstance(command, fsql.CommandGetPrimaryKeys):
            return metadata.primary_keys(command, granted)
        return metadata.empty(commands.metadata_schema(command))

    async def _schemas(self, names: Iterable[str]) -> dict[str, pa.Schema]:
        """Each map's table schema, as SQL reads it; a map with no table yet has none."""
        found = {}
        for name in names:
            try:
                snapshot = await self._snapshots.latest(name, await self._generation(name))
            except TableNotFound:
                continue
            found[name] = metadata.described(pa.schema(snapshot.table.schema().to_arrow()))
        return found

    def _on_loop(self, context: CallContext, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the event loop and wait for it on this thread; the call's
        cancellation cancels it."""
        try:
            future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        except RuntimeError:  # the loop is closed
            coro.close()
            raise StoreUnavailable(STOPPING) from None
        with self._waiting_lock:
            self._waiting.add(future)
        try:
            while True:
                try:
                    return future.result(timeout=POLL_SECONDS)
                except TimeoutError:
                    if future.done():
                        raise
                    if context.is_cancelled():
                        future.cancel()
                        raise Cancelled("the client cancelled the call") from None
                except concurrent.futures.CancelledError:
                    raise StoreUnavailable(STOPPING) from None
        finally:
            with self._waiting_lock:
                self._waiting.discard(future)

    def cancel_waiting(self) -> None:
        """Cancel the work of every call waiting on the event loop (the port is stopping)."""
        with self._waiting_lock:
            for future in self._waiting:
                future.cancel()
