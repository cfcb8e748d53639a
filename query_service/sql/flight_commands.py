"""The Flight SQL protocol's messages as the port reads and writes them: the commands it
takes (each packed in a ``google.protobuf.Any``), the schemas it answers them with, and a
prepared statement's parameters.

Statements and metadata commands are answered; the writes a Flight SQL client may send
(updates, ingestion, Substrait plans) are refused by name, as the port only reads.
"""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal
from typing import TypeVar

import pyarrow as pa
from google.protobuf import any_pb2
from google.protobuf.message import DecodeError, Message

from query_service.errors import InvalidArgument
from query_service.sql import flight_metadata as metadata
from query_service.sql.executor import Param
from query_service.sql.flightsql import FlightSql_pb2 as fsql

M = TypeVar("M", bound=Message)

UNKNOWN_ANSWER = pa.schema([pa.field("unknown", pa.null())])
"""A prepared statement's answer schema, as a client is told it before the text first ran
here (planning it would take a statement process): a column, since the JDBC driver takes
a statement whose answer has none for an update. Answers carry their own schemas."""
CLOSE_SESSION_CLOSED = b"\x08\x01"
"""Flight's ``CloseSessionResult{status: CLOSED}``: the port keeps no session to close."""
STATEMENTS = (fsql.CommandStatementQuery, fsql.CommandPreparedStatementQuery)
"""The commands that run a statement."""
_PARAM_TYPES = (bool, int, float, str, bytes, Decimal, datetime, date)
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
    for kind in (*STATEMENTS, *_METADATA, *_WRITES, fsql.TicketStatementQuery)
}


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
    return ipc(pa.schema([pa.field(f"${i}", pa.string()) for i in range(1, count + 1)]))


def ipc(schema: pa.Schema) -> bytes:
    """A schema as the protocol's messages carry one: an encapsulated IPC message."""
    return bytes(schema.serialize().to_pybytes())


def metadata_schema(command: Message) -> pa.Schema:
    """The schema of a metadata command's answer; any other command is refused."""
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
        raise refused(command)
    return schema


def refused(command: Message) -> InvalidArgument:
    """The error for a command the call does not take; a write says the port only reads."""
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


def command(data: bytes | None) -> Message:
    """A Flight SQL command, packed in a ``google.protobuf.Any`` as the protocol sends it."""
    packed = _any(data)
    kind = _COMMANDS.get(packed.TypeName())
    if kind is None:
        raise InvalidArgument(
            f"{packed.TypeName() or 'an empty command'}: not a Flight SQL command this port takes"
        )
    found = kind()
    packed.Unpack(found)
    return found


def unpack(body: bytes, kind: type[M]) -> M:
    """An action's request, packed as its command would be."""
    packed = _any(body)
    request = kind()
    if not packed.Unpack(request):
        raise InvalidArgument(f"the action's body must be a {kind.DESCRIPTOR.name}")
    return request


def pack(message: Message) -> bytes:
    """A message packed in a ``google.protobuf.Any``, as the protocol sends its own."""
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed.SerializeToString()
