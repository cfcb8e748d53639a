"""The metadata answers of Arrow Flight SQL: what a client browses before it runs SQL.

Each schema here is the one the Flight SQL specification fixes (``FlightSql.proto``),
field for field and nullability included: drivers compare them exactly (ADBC's refuses
an answer whose schema differs). The maps are tables of one schema, ``public``, in no
catalog, and only the maps a caller's token is granted are listed; a table's primary
key is ``_key``, since a map's table holds one row per key.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

import pyarrow as pa

from materializer import __version__
from materializer.contract.table_layout import COMMENT, TABLE_KEY
from query_service.sql.flightsql import FlightSql_pb2 as fsql
from query_service.sql.statement import MAX_SQL_CHARS

SCHEMA_NAME = "public"
"""The one schema the maps are listed under (DataFusion's default schema)."""
TABLE_TYPE = "TABLE"
SERVER_NAME = "Materializer"

_TEXT = pa.string()
CATALOGS = pa.schema([pa.field("catalog_name", _TEXT, nullable=False)])
DB_SCHEMAS = pa.schema(
    [pa.field("catalog_name", _TEXT), pa.field("db_schema_name", _TEXT, nullable=False)]
)
TABLES = pa.schema(
    [
        pa.field("catalog_name", _TEXT),
        pa.field("db_schema_name", _TEXT),
        pa.field("table_name", _TEXT, nullable=False),
        pa.field("table_type", _TEXT, nullable=False),
    ]
)
TABLES_WITH_SCHEMA = TABLES.append(pa.field("table_schema", pa.binary(), nullable=False))
TABLE_TYPES = pa.schema([pa.field("table_type", _TEXT, nullable=False)])
PRIMARY_KEYS = pa.schema(
    [
        pa.field("catalog_name", _TEXT),
        pa.field("db_schema_name", _TEXT),
        pa.field("table_name", _TEXT, nullable=False),
        pa.field("column_name", _TEXT, nullable=False),
        pa.field("key_sequence", pa.int32(), nullable=False),
        pa.field("key_name", _TEXT),
    ]
)
FOREIGN_KEYS = pa.schema(
    [
        pa.field("pk_catalog_name", _TEXT),
        pa.field("pk_db_schema_name", _TEXT),
        pa.field("pk_table_name", _TEXT, nullable=False),
        pa.field("pk_column_name", _TEXT, nullable=False),
        pa.field("fk_catalog_name", _TEXT),
        pa.field("fk_db_schema_name", _TEXT),
        pa.field("fk_table_name", _TEXT, nullable=False),
        pa.field("fk_column_name", _TEXT, nullable=False),
        pa.field("key_sequence", pa.int32(), nullable=False),
        pa.field("fk_key_name", _TEXT),
        pa.field("pk_key_name", _TEXT),
        pa.field("update_rule", pa.uint8(), nullable=False),
        pa.field("delete_rule", pa.uint8(), nullable=False),
    ]
)
"""Imported keys, exported keys and cross references: maps have no foreign keys."""
XDBC_TYPE_INFO = pa.schema(
    [
        pa.field("type_name", _TEXT, nullable=False),
        pa.field("data_type", pa.int32(), nullable=False),
        pa.field("column_size", pa.int32()),
        pa.field("literal_prefix", _TEXT),
        pa.field("literal_suffix", _TEXT),
        pa.field("create_params", pa.list_(pa.field("item", _TEXT, nullable=False))),
        pa.field("nullable", pa.int32(), nullable=False),
        pa.field("case_sensitive", pa.bool_(), nullable=False),
        pa.field("searchable", pa.int32(), nullable=False),
        pa.field("unsigned_attribute", pa.bool_()),
        pa.field("fixed_prec_scale", pa.bool_(), nullable=False),
        pa.field("auto_increment", pa.bool_()),
        pa.field("local_type_name", _TEXT),
        pa.field("minimum_scale", pa.int32()),
        pa.field("maximum_scale", pa.int32()),
        pa.field("sql_data_type", pa.int32(), nullable=False),
        pa.field("datetime_subcode", pa.int32()),
        pa.field("num_prec_radix", pa.int32()),
        pa.field("interval_precision", pa.int32()),
    ]
)
"""Answered empty: a client then falls back to the types the answers' schemas carry."""

_INFO_VALUE = pa.dense_union(
    [
        pa.field("string_value", _TEXT, nullable=False),
        pa.field("bool_value", pa.bool_(), nullable=False),
        pa.field("bigint_value", pa.int64(), nullable=False),
        pa.field("int32_bitmask", pa.int32(), nullable=False),
        pa.field("string_list", pa.list_(_TEXT), nullable=False),
        pa.field(
            "int32_to_int32_list_map",
            pa.map_(pa.int32(), pa.list_(pa.int32())),
            nullable=False,
        ),
    ]
)
SQL_INFO = pa.schema(
    [
        pa.field("info_name", pa.uint32(), nullable=False),
        pa.field("value", _INFO_VALUE, nullable=False),
    ]
)
InfoValue = str | bool | int | list[str]
_STRING, _BOOL, _BIGINT, _INT32 = 0, 1, 2, 3
_STRING_LIST = 4


def empty(schema: pa.Schema) -> pa.Table:
    """No rows, of a metadata schema (catalogs, foreign keys, type info)."""
    return schema.empty_table()


def server_info() -> dict[int, tuple[int, InfoValue]]:
    """``GetSqlInfo``'s answers, by info code: each with its member of the value union."""
    info = fsql.SqlInfo
    grammar = (1 << fsql.SQL_MINIMUM_GRAMMAR) | (1 << fsql.SQL_CORE_GRAMMAR)
    subqueries = (
        (1 << fsql.SQL_SUBQUERIES_IN_COMPARISONS)
        | (1 << fsql.SQL_SUBQUERIES_IN_EXISTS)
        | (1 << fsql.SQL_SUBQUERIES_IN_INS)
    )
    unions = (1 << fsql.SQL_UNION) | (1 << fsql.SQL_UNION_ALL)
    return {
        info.FLIGHT_SQL_SERVER_NAME: (_STRING, SERVER_NAME),
        info.FLIGHT_SQL_SERVER_VERSION: (_STRING, __version__),
        info.FLIGHT_SQL_SERVER_ARROW_VERSION: (_STRING, pa.__version__),
        info.FLIGHT_SQL_SERVER_READ_ONLY: (_BOOL, True),
        info.FLIGHT_SQL_SERVER_SQL: (_BOOL, True),
        info.FLIGHT_SQL_SERVER_SUBSTRAIT: (_BOOL, False),
        info.FLIGHT_SQL_SERVER_TRANSACTION: (_INT32, fsql.SQL_SUPPORTED_TRANSACTION_NONE),
        info.FLIGHT_SQL_SERVER_CANCEL: (_BOOL, False),
        info.FLIGHT_SQL_SERVER_BULK_INGESTION: (_BOOL, False),
        info.SQL_DDL_CATALOG: (_BOOL, False),
        info.SQL_DDL_SCHEMA: (_BOOL, False),
        info.SQL_DDL_TABLE: (_BOOL, False),
        # Bare names are lower-cased (PostgreSQL's rule); "quoted" ones are kept as written.
        info.SQL_IDENTIFIER_CASE: (_INT32, fsql.SQL_CASE_SENSITIVITY_LOWERCASE),
        info.SQL_IDENTIFIER_QUOTE_CHAR: (_STRING, '"'),
        info.SQL_ALL_TABLES_ARE_SELECTABLE: (_BOOL, True),
        info.SQL_NULL_ORDERING: (_INT32, fsql.SQL_NULLS_SORTED_HIGH),
        info.SQL_SEARCH_STRING_ESCAPE: (_STRING, "\\"),
        info.SQL_SUPPORTS_COLUMN_ALIASING: (_BOOL, True),
        info.SQL_NULL_PLUS_NULL_IS_NULL: (_BOOL, True),
        info.SQL_SUPPORTS_TABLE_CORRELATION_NAMES: (_BOOL, True),
        info.SQL_SUPPORTS_EXPRESSIONS_IN_ORDER_BY: (_BOOL, True),
        info.SQL_SUPPORTED_GRAMMAR: (_INT32, grammar),
        info.SQL_OUTER_JOINS_SUPPORT_LEVEL: (_INT32, fsql.SQL_FULL_OUTER_JOINS),
        info.SQL_SCHEMA_TERM: (_STRING, "schema"),
        info.SQL_CATALOG_TERM: (_STRING, "catalog"),
        info.SQL_SELECT_FOR_UPDATE_SUPPORTED: (_BOOL, False),
        info.SQL_STORED_PROCEDURES_SUPPORTED: (_BOOL, False),
        info.SQL_SUPPORTED_SUBQUERIES: (_INT32, subqueries),
        info.SQL_CORRELATED_SUBQUERIES_SUPPORTED: (_BOOL, True),
        info.SQL_SUPPORTED_UNIONS: (_INT32, unions),
        info.SQL_MAX_STATEMENT_LENGTH: (_BIGINT, MAX_SQL_CHARS),
        info.SQL_TRANSACTIONS_SUPPORTED: (_BOOL, False),
        info.SQL_BATCH_UPDATES_SUPPORTED: (_BOOL, False),
        info.SQL_SAVEPOINTS_SUPPORTED: (_BOOL, False),
        info.SQL_NAMED_PARAMETERS_SUPPORTED: (_BOOL, False),
    }


def sql_info(codes: Sequence[int]) -> pa.Table:
    """The answer to ``CommandGetSqlInfo``: the codes asked for that this server knows, or
    all of them when none is asked for."""
    known = server_info()
    wanted = [code for code in codes if code in known] if codes else sorted(known)
    children: list[list[InfoValue]] = [[] for _ in _INFO_VALUE]
    kinds, offsets = [], []
    for code in wanted:
        kind, value = known[code]
        kinds.append(kind)
        offsets.append(len(children[kind]))
        children[kind].append(value)
    # Built from buffers: ``UnionArray.from_dense`` would make the members nullable.
    value = pa.Array.from_buffers(
        _INFO_VALUE,
        len(wanted),
        [None, pa.array(kinds, pa.int8()).buffers()[1], pa.array(offsets, pa.int32()).buffers()[1]],
        children=[
            pa.array(values, field.type)
            for values, field in zip(children, _INFO_VALUE, strict=True)
        ],
    )
    return pa.Table.from_arrays([pa.array(wanted, pa.uint32()), value], schema=SQL_INFO)


def like(pattern: str) -> re.Pattern[str]:
    """A SQL ``LIKE`` pattern of the metadata filters (``%``, ``_``, ``\\`` escapes) as a
    regular expression matching the whole name."""
    parts, escaped = [], False
    for char in pattern:
        if escaped:
            parts.append(re.escape(char))
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == "%":
            parts.append(".*")
        elif char == "_":
            parts.append(".")
        else:
            parts.append(re.escape(char))
    return re.compile("".join(parts), re.DOTALL)


def _in_namespace(catalog: str | None, db_schema_pattern: str | None) -> bool:
    """Whether a filter's catalog and schema pattern admit the maps' namespace."""
    if catalog:
        return False  # the maps are in no catalog; "" asks for exactly those
    return db_schema_pattern is None or like(db_schema_pattern).fullmatch(SCHEMA_NAME) is not None


def db_schemas(command: fsql.CommandGetDbSchemas) -> pa.Table:
    """The answer to ``CommandGetDbSchemas``: ``public``, unless the filters leave it out."""
    catalog = command.catalog if command.HasField("catalog") else None
    pattern = (
        command.db_schema_filter_pattern if command.HasField("db_schema_filter_pattern") else None
    )
    names = [SCHEMA_NAME] if _in_namespace(catalog, pattern) else []
    return pa.Table.from_arrays(
        [pa.array([None] * len(names), _TEXT), pa.array(names, _TEXT)], schema=DB_SCHEMAS
    )


def listed_tables(command: fsql.CommandGetTables, maps: Iterable[str]) -> list[str]:
    """The maps (granted ones, passed in) that ``CommandGetTables``'s filters keep, sorted."""
    catalog = command.catalog if command.HasField("catalog") else None
    pattern = (
        command.db_schema_filter_pattern if command.HasField("db_schema_filter_pattern") else None
    )
    if not _in_namespace(catalog, pattern):
        return []
    if command.table_types and TABLE_TYPE not in command.table_types:
        return []
    if command.HasField("table_name_filter_pattern"):
        name = like(command.table_name_filter_pattern)
        maps = [m for m in maps if name.fullmatch(m)]
    return sorted(maps)


REMARKS = b"ARROW:FLIGHT:SQL:REMARKS"
"""The column metadata key Flight SQL gives a column's description under."""


def described(schema: pa.Schema) -> pa.Schema:
    """A table's schema as ``CommandGetTables`` gives it: a column with a comment (one the
    map gained while it ran says which table version added it, and when) has it as its
    remarks, as JDBC's ``getColumns`` shows them."""
    fields = []
    for field in schema:
        meta = field.metadata or {}
        comment = meta.get(COMMENT.encode())
        fields.append(field.with_metadata({**meta, REMARKS: comment}) if comment else field)
    return pa.schema(fields, schema.metadata)


def tables(names: Sequence[str], schemas: Mapping[str, pa.Schema] | None) -> pa.Table:
    """The answer to ``CommandGetTables``; with ``schemas`` (``include_schema``), each
    table's Arrow schema as an IPC message (an empty one for a map with no table yet)."""
    columns = [
        pa.array([None] * len(names), _TEXT),
        pa.array([SCHEMA_NAME] * len(names), _TEXT),
        pa.array(names, _TEXT),
        pa.array([TABLE_TYPE] * len(names), _TEXT),
    ]
    if schemas is None:
        return pa.Table.from_arrays(columns, schema=TABLES)
    encoded = [schemas.get(name, pa.schema([])).serialize().to_pybytes() for name in names]
    columns.append(pa.array(encoded, pa.binary()))
    return pa.Table.from_arrays(columns, schema=TABLES_WITH_SCHEMA)


def table_types() -> pa.Table:
    """The answer to ``CommandGetTableTypes``: maps are tables."""
    return pa.Table.from_arrays([pa.array([TABLE_TYPE], _TEXT)], schema=TABLE_TYPES)


def primary_keys(command: fsql.CommandGetPrimaryKeys, maps: Iterable[str]) -> pa.Table:
    """The answer to ``CommandGetPrimaryKeys``: ``_key``, for a granted map in the maps'
    namespace."""
    catalog = command.catalog if command.HasField("catalog") else None
    db_schema = command.db_schema if command.HasField("db_schema") else None
    found = not catalog and db_schema in (None, SCHEMA_NAME) and command.table in set(maps)
    rows = 1 if found else 0
    return pa.Table.from_arrays(
        [
            pa.array([None] * rows, _TEXT),
            pa.array([SCHEMA_NAME] * rows, _TEXT),
            pa.array([command.table] * rows, _TEXT),
            pa.array([TABLE_KEY] * rows, _TEXT),
            pa.array([1] * rows, pa.int32()),
            pa.array([None] * rows, _TEXT),
        ],
        schema=PRIMARY_KEYS,
    )
