"""Arrow Flight SQL over the maps' tables: the SQL port for clients with a Flight SQL
driver (ADBC, the Flight SQL JDBC driver, DBeaver). ``docs/sql-flight.md`` says how to
connect; decision 0028 why Flight SQL.

It listens on ``query.sql.flight_port`` with the gRPC port's tokens and TLS. A statement
needs every map it reads granted, and the metadata calls list only the maps granted.

pyarrow.flight runs each call on a gRPC thread, while statements run on the service's
event loop (``SqlExecutor``): a handler hands its work to the loop and waits, watching
the call's cancellation. That is also how a client's deadline stops a statement:
pyarrow does not show a server the deadline itself, so a statement's own bound is
``query.sql.timeout``.

A statement runs at ``GetFlightInfo``, so a refusal reaches the client's ``execute``
and the FlightInfo carries the answer's schema; the answer waits for the ``DoGet`` of
its ticket, read once, by the token that ran it (``flight_answers``). Prepared
statements, which ADBC's driver makes of every statement, take one row of parameters
(``$1``, ``$2``…) by ``DoPut``. Tokens and errors are ``flight_calls``'s; metadata
answers ``flight_metadata``'s.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator
from datetime import date, datetime
from decimal import Decimal
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.flight as fl
from google.protobuf import any_pb2
from google.protobuf.message import DecodeError, Message

from materializer.catalog.live import LiveMaps
from materializer.config import TlsConfig
from materializer.errors import SetupError
from query_service.auth import Authorizer, Grant
from query_service.errors import InvalidArgument, QueryServiceError, StoreUnavailable
from query_service.server import read_pem
from query_service.sql import flight_metadata as metadata
from query_service.sql.executor import Param, SqlExecutor
from query_service.sql.flight_answers import (
    POLL_SECONDS,
    UNREAD_SECONDS,
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
M = TypeVar("M", bound=Message)

UNKNOWN_ANSWER = pa.schema([pa.field("unknown", pa.null())])
"""A prepared statement's answer schema, as a client is told it before the text first ran
here (planning it would take a statement process): a column, since the JDBC driver takes
a statement whose answer has none for an update. Answers carry their own schemas."""
CLOSE_SESSION_CLOSED = b"\x08\x01"
"""Flight's ``CloseSessionResult{status: CLOSED}``: the port keeps no session to close."""
_PARAM_TYPES = (bool, int, float, str, bytes, Decimal, datetime, date)
_STATEMENTS = (fsql.CommandStatementQuery, fsql.CommandPreparedStatementQuery)
_METADATA = (
    fsql.CommandGetSqlInfo,
    fsql.CommandGetCatalogs,
    fsql.CommandGetDbSchemas,
    fsql.CommandGetTables,
    fsql.CommandGetTableTypes,
    fsql.CommandGetPrimaryKeys,
    fsql.CommandGetExportedKeys,
    fsql.CommandGetImportedKeys,
    fsql.CommandGetCrossReference,
    fsql.CommandGetXdbcTypeInfo,
)
_WRITES = (
    fsql.CommandStatementUpdate,
    fsql.CommandPreparedStatementUpdate,
    fsql.CommandStatementIngest,
    fsql.CommandStatementSubstraitPlan,
)
_COMMANDS: dict[str, type[Message]] = {
    kind.DESCRIPTOR.full_name: kind
    for kind in (*_STATEMENTS, *_METADATA, *_WRITES, fsql.TicketStatementQuery)
}


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
        command = _command(descriptor.command)
        if isinstance(command, _STATEMENTS):
            text, params = self._statement(command, grant)
            self._checked(text, grant)
            ticket, schema = self._on_loop(context, self.answers.run(text, params, grant))
            self._prepared.ran(text, schema)
            handle = _pack(fsql.TicketStatementQuery(statement_handle=ticket))
            return fl.FlightInfo(schema, descriptor, [fl.FlightEndpoint(handle, [])], -1, -1)
        schema = _metadata_schema(command)
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
        command = _command(descriptor.command)
        if isinstance(command, _STATEMENTS):
            text, params = self._statement(command, grant)
            self._checked(text, grant)
            return fl.SchemaResult(self._on_loop(context, self.answers.schema_of(text, params)))
        return fl.SchemaResult(_metadata_schema(command))

    @answered
    def do_get(self, context: fl.ServerCallContext, ticket: fl.Ticket) -> fl.FlightDataStream:
        """Stream a statement's answer, or answer a metadata command."""
        grant = grant_of(context)
        command = _command(ticket.ticket)
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
        command = _command(descriptor.command)
        if not isinstance(command, fsql.CommandPreparedStatementQuery):
            raise _refused(command)
        handle = command.prepared_statement_handle
        prepared = self._prepared.get(handle, grant)
        prepared.params = parameters(reader.read_all())
        result = fsql.DoPutPreparedStatementResult(prepared_statement_handle=handle)
        writer.write(pa.py_buffer(result.SerializeToString()))

    @answered
    def do_action(self, context: fl.ServerCallContext, action: fl.Action) -> list[fl.Result]:
        """Create and close prepared statements."""
        grant = grant_of(context)
        body = action.body.to_pybytes() if action.body is not None else b""
        if action.type == "CreatePreparedStatement":
            request = _unpack(body, fsql.ActionCreatePreparedStatementRequest)
            if request.HasField("transaction_id"):
                raise InvalidArgument("transaction_id: statements only read; there are none")
            statement = self._checked(request.query, grant)
            handle = self._prepared.add(Prepared(request.query, statement.parameters, grant))
            result = fsql.ActionCreatePreparedStatementResult(
                prepared_statement_handle=handle,
                dataset_schema=_ipc(self._prepared.schema(request.query) or UNKNOWN_ANSWER),
                parameter_schema=parameter_schema(statement.parameters),
                is_update=False,
            )
            return [fl.Result(_pack(result))]
        if action.type == "ClosePreparedStatement":
            closing = _unpack(body, fsql.ActionClosePreparedStatementRequest)
            self._prepared.close(closing.prepared_statement_handle, grant)
            return []
        if action.type == "CloseSession":
            return [fl.Result(CLOSE_SESSION_CLOSED)]
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
        if isinstance(command, fsql.CommandStatementQuery):
            if command.HasField("transaction_id"):
                raise InvalidArgument("transaction_id: statements only read; there are none")
            return command.query, []
        assert isinstance(command, fsql.CommandPreparedStatementQuery)
        prepared = self._prepared.get(command.prepared_statement_handle, grant)
        return prepared.text, prepared.params

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
        return metadata.empty(_metadata_schema(command))

    async def _schemas(self, names: Iterable[str]) -> dict[str, pa.Schema]:
        """Each map's table schema, as SQL reads it; a map with no table yet has none."""
        found = {}
        for name in names:
            try:
                snapshot = await self._snapshots.latest(name, await self._generation(name))
            except TableNotFound:
                continue
            found[name] = pa.schema(snapshot.table.schema().to_arrow())
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


def parameters(rows: pa.Table) -> list[Param]:
    """A ``DoPut``'s parameters as the engine takes them: one row, column ``i`` is ``$i+1``."""
    if rows.num_rows != 1:
        raise InvalidArgument(
            f"parameters: {rows.num_rows} rows bound; bind one row, a value for each $n"
        )
    values: list[Param] = []
    for i, column in enumerate(rows.columns):
        value = column[0].as_py()
        if value is not None and not isinstance(value, _PARAM_TYPES):
            raise InvalidArgument(
                f"parameters: ${i + 1} is of Arrow type {column.type}; a parameter is text, a "
                "number, a boolean, binary, a decimal, a date or a timestamp"
            )
        values.append(value)
    return values


def parameter_schema(count: int) -> bytes:
    """The parameters a prepared statement takes, as a client is told them: ``$1``…, each
    text, the type a client binds for any value (the engine casts to what the statement
    needs); no message for a statement without parameters."""
    if not count:
        return b""
    return _ipc(pa.schema([pa.field(f"${i}", pa.string()) for i in range(1, count + 1)]))


def _ipc(schema: pa.Schema) -> bytes:
    """A schema as the protocol's messages carry one: an encapsulated IPC message."""
    return bytes(schema.serialize().to_pybytes())


def _metadata_schema(command: Message) -> pa.Schema:
    if isinstance(command, fsql.CommandGetTables):
        return metadata.TABLES_WITH_SCHEMA if command.include_schema else metadata.TABLES
    schemas: dict[type[Message], pa.Schema] = {
        fsql.CommandGetSqlInfo: metadata.SQL_INFO,
        fsql.CommandGetCatalogs: metadata.CATALOGS,
        fsql.CommandGetDbSchemas: metadata.DB_SCHEMAS,
        fsql.CommandGetTableTypes: metadata.TABLE_TYPES,
        fsql.CommandGetPrimaryKeys: metadata.PRIMARY_KEYS,
        fsql.CommandGetExportedKeys: metadata.FOREIGN_KEYS,
        fsql.CommandGetImportedKeys: metadata.FOREIGN_KEYS,
        fsql.CommandGetCrossReference: metadata.FOREIGN_KEYS,
        fsql.CommandGetXdbcTypeInfo: metadata.XDBC_TYPE_INFO,
    }
    schema = schemas.get(type(command))
    if schema is None:
        raise _refused(command)
    return schema


def _refused(command: Message) -> InvalidArgument:
    name = command.DESCRIPTOR.name
    if isinstance(command, _WRITES):
        return InvalidArgument(f"{name}: the SQL port only reads; send a SELECT or WITH query")
    return InvalidArgument(f"{name}: not a command this call takes")


def _any(data: bytes | None) -> any_pb2.Any:
    packed = any_pb2.Any()
    try:
        packed.ParseFromString(data or b"")
    except DecodeError:
        raise InvalidArgument("the command is not a Flight SQL command") from None
    return packed


def _command(data: bytes | None) -> Message:
    """A Flight SQL command, packed in a ``google.protobuf.Any`` as the protocol sends it."""
    packed = _any(data)
    kind = _COMMANDS.get(packed.TypeName())
    if kind is None:
        raise InvalidArgument(
            f"{packed.TypeName() or 'an empty command'}: not a Flight SQL command this port takes"
        )
    command = kind()
    packed.Unpack(command)
    return command


def _unpack(body: bytes, kind: type[M]) -> M:
    """An action's request, packed as its command would be."""
    packed = _any(body)
    request = kind()
    if not packed.Unpack(request):
        raise InvalidArgument(f"the action's body must be a {kind.DESCRIPTOR.name}")
    return request


def _pack(message: Message) -> bytes:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed.SerializeToString()


def tls_options(tls: TlsConfig | None) -> dict[str, Any]:
    """``FlightServerBase``'s TLS arguments from the gRPC port's PEM files; a client CA
    turns on mutual TLS."""
    if tls is None:
        return {}
    read = read_pem
    options: dict[str, Any] = {
        "tls_certificates": [(read("cert_file", tls.cert_file), read("key_file", tls.key_file))]
    }
    if tls.client_ca_file:
        options["verify_client"] = True
        options["root_certificates"] = read("client_ca_file", tls.client_ca_file)
    return options


class FlightSqlPort:
    """A running Flight SQL port: its ``port``, and ``close``."""

    def __init__(self, server: FlightSqlServer, calls: Calls) -> None:
        self._server = server
        self._calls = calls
        self._closed = False
        self.port: int = server.port

    async def close(self, grace: float = 0.0) -> None:
        """Refuse new calls, let running ones finish for up to ``grace`` seconds, then stop
        the rest (their statements end, their clients get UNAVAILABLE) and the server.
        Closing again does nothing."""
        if self._closed:
            return
        self._closed = True
        self._calls.stopping = True
        loop = asyncio.get_running_loop()
        until = loop.time() + grace
        while self._calls.running and loop.time() < until:
            await asyncio.sleep(POLL_SECONDS)
        self._server.cancel_waiting()
        await self._server.answers.close()
        await asyncio.to_thread(self._server.shutdown)


async def start_flight(
    executor: SqlExecutor,
    live: LiveMaps,
    snapshots: TableSnapshots,
    generation: Callable[[str], Awaitable[int]],
    authorizer: Authorizer | None,
    address: str,
    *,
    unread_seconds: float = UNREAD_SECONDS,
) -> FlightSqlPort:
    """Serve Arrow Flight SQL on ``address`` (``host:port``; port 0 picks a free one) over
    ``executor``, with ``query.tls`` and ``authorizer`` (``None``: open), from now on.

    ``snapshots`` and ``generation`` are the executor's, for the tables' schemas that
    ``GetTables`` lists. Call from the event loop the executor runs on; ``close`` stops it.
    """
    host, _, port = address.rpartition(":")
    tls = tls_options(live.config.query.tls)
    scheme = "grpc+tls" if tls else "grpc"
    calls = Calls(authorizer)
    try:
        server = await asyncio.to_thread(
            FlightSqlServer,
            f"{scheme}://{host}:{port}",
            executor=executor,
            live=live,
            snapshots=snapshots,
            generation=generation,
            calls=calls,
            loop=asyncio.get_running_loop(),
            tls=tls,
            unread_seconds=unread_seconds,
        )
    except (pa.ArrowException, OSError) as exc:
        raise SetupError(f"cannot serve Arrow Flight SQL on {address}: {exc}") from None
    return FlightSqlPort(server, calls)
