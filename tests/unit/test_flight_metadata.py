"""The Flight SQL port's metadata answers: the specification's schemas, the filters'
patterns, and the union GetSqlInfo answers in."""

from __future__ import annotations

import pyarrow as pa
import pytest

from materializer.contract.table_layout import AddedColumn
from query_service.sql import flight_metadata as metadata
from query_service.sql.flightsql import FlightSql_pb2 as fsql

MAPS = ["orders", "users", "user_events", "users2"]


@pytest.mark.parametrize(
    ("pattern", "matches"),
    [
        ("users", ["users"]),
        ("user%", ["user_events", "users", "users2"]),
        ("users_", ["users2"]),
        ("user\\_%", ["user_events"]),
        ("%", MAPS),
        ("USERS", []),
    ],
)
def test_table_name_patterns_are_sql_like(pattern: str, matches: list[str]):
    command = fsql.CommandGetTables(table_name_filter_pattern=pattern)

    assert metadata.listed_tables(command, MAPS) == sorted(matches)


def test_tables_are_in_schema_public_of_no_catalog():
    def listed(**filters: object) -> list[str]:
        return metadata.listed_tables(fsql.CommandGetTables(**filters), MAPS)

    assert listed() == sorted(MAPS)
    assert listed(catalog="") == sorted(MAPS)  # "": the tables of no catalog
    assert listed(catalog="main") == []
    assert listed(db_schema_filter_pattern="pub%") == sorted(MAPS)
    assert listed(db_schema_filter_pattern="other") == []
    assert listed(table_types=["VIEW", "TABLE"]) == sorted(MAPS)
    assert listed(table_types=["VIEW"]) == []
    assert metadata.db_schemas(fsql.CommandGetDbSchemas()).to_pylist() == [
        {"catalog_name": None, "db_schema_name": "public"}
    ]
    assert metadata.db_schemas(fsql.CommandGetDbSchemas(catalog="main")).num_rows == 0


def test_a_table_schema_travels_as_an_ipc_message():
    schema = pa.schema([pa.field("_key", pa.string(), nullable=False), ("n", pa.int64())])

    answer = metadata.tables(["users", "empty"], {"users": schema})

    assert answer.schema == metadata.TABLES_WITH_SCHEMA
    users, empty = answer.column("table_schema").to_pylist()
    assert pa.ipc.read_schema(pa.py_buffer(users)) == schema
    assert pa.ipc.read_schema(pa.py_buffer(empty)) == pa.schema([])  # no table yet
    assert metadata.tables(["users"], None).schema == metadata.TABLES


def test_sql_info_answers_in_the_specifications_union():
    info = fsql.SqlInfo
    answer = metadata.sql_info(
        [info.FLIGHT_SQL_SERVER_NAME, info.FLIGHT_SQL_SERVER_READ_ONLY, 9999]
    )

    answer.validate(full=True)
    assert answer.schema == metadata.SQL_INFO
    assert [field.nullable for field in answer.schema.field("value").type] == [False] * 6
    assert answer.to_pylist() == [
        {"info_name": info.FLIGHT_SQL_SERVER_NAME, "value": "Materializer"},
        {"info_name": info.FLIGHT_SQL_SERVER_READ_ONLY, "value": True},
    ]
    everything = metadata.sql_info([])
    assert everything.num_rows == len(metadata.server_info())
    assert (
        dict(zip(*everything.to_pydict().values(), strict=True))[info.SQL_IDENTIFIER_QUOTE_CHAR]
        == '"'
    )


def test_the_primary_key_is_the_key_column():
    def keys(**command: object) -> list[dict[str, object]]:
        return metadata.primary_keys(fsql.CommandGetPrimaryKeys(**command), MAPS).to_pylist()

    assert keys(table="users") == [
        {
            "catalog_name": None,
            "db_schema_name": "public",
            "table_name": "users",
            "column_name": "_key",
            "key_sequence": 1,
            "key_name": None,
        }
    ]
    assert keys(table="secret") == []  # not among the maps granted
    assert keys(table="users", db_schema="other") == []


def test_a_columns_comment_is_its_remarks():
    added = AddedColumn(12, "2026-12-01T06:00:00.123Z")
    schema = pa.schema(
        [
            pa.field("_key", pa.string(), nullable=False),
            pa.field("note", pa.string(), metadata={b"comment": added.comment().encode()}),
        ]
    )

    key, note = metadata.described(schema)

    assert key.metadata is None
    assert note.metadata[metadata.REMARKS] == b"added at table version 12, 2026-12-01T06:00:00.123Z"
    assert AddedColumn.of(note.metadata[metadata.REMARKS].decode()) == added
    assert AddedColumn.of("a comment of the team's own") is None
    assert AddedColumn.of("added at table version 3, yesterday") is None
