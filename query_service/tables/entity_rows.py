"""Entities as Redis holds them (compact JSON) read as rows of their map's table, typed as
the table types them: for the answers Redis gives in the table's shape (an SQL key
lookup, a query or a statement through an index), which must equal what the table
would give for the same entities."""

from __future__ import annotations

import io
from collections.abc import Collection, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
from datafusion import SessionContext

from materializer.contract.table_layout import TABLE_KEY
from query_service.errors import InvalidArgument
from query_service.stores.delta import TABLE

_TEXT_FIRST = (pa.types.is_date, pa.types.is_time)
"""Types the JSON reader does not parse from text itself: read as text, then cast."""


def typed_rows(
    schema: pa.Schema, keys: Sequence[str], entities: Sequence[bytes]
) -> pa.RecordBatch | None:
    """The entities (compact JSON, one per key) as rows of ``schema``, typed as the table
    types them; ``None`` when a value does not read back as its column's type."""
    if not entities:
        return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)
    fields = [f for f in schema if f.name != TABLE_KEY]
    reading = pa.schema([f.with_type(_as_read(f.type)) for f in fields])
    try:
        read = pa_json.read_json(
            io.BytesIO(b"\n".join(entities)),
            parse_options=pa_json.ParseOptions(
                explicit_schema=reading, unexpected_field_behavior="ignore"
            ),
        )
        columns = {f.name: pc.cast(read.column(f.name), f.type).combine_chunks() for f in fields}
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    columns[TABLE_KEY] = pa.array(keys, pa.string())
    return pa.RecordBatch.from_arrays([columns[f.name] for f in schema], schema=schema)


def entity_schema(table_schema: pa.Schema, meta: Collection[str]) -> pa.Schema:
    """The table's columns an entity in Redis has: all but the table's own (``meta`` less
    the key, which every row read from Redis gets from its key)."""
    return pa.schema([f for f in table_schema if f.name not in meta or f.name == TABLE_KEY])


def filtered(batch: pa.RecordBatch, statement: str, map_name: str) -> pa.Table:
    """``statement``, a filter's ``SELECT``, run over ``batch`` as the table named ``TABLE``
    (blocking: DataFusion); ``InvalidArgument`` when the filter does not apply to the
    rows, as it would not to the table's."""
    context = SessionContext()
    context.register_record_batches(TABLE, [[batch]])
    try:
        return context.sql(statement).to_arrow_table()
    except Exception as exc:  # noqa: BLE001 - DataFusion's: the filter, as on the table
        raise InvalidArgument(
            f"the filter does not apply to the rows of map {map_name!r}: {exc}"
        ) from None


def readable(kind: pa.DataType) -> bool:
    """Whether the JSON the pipeline writes for this type reads back as it exactly (a
    double's NaN, written as text, fails its row instead, which the engine then answers)."""
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_map(kind):
        return False
    if pa.types.is_struct(kind):
        return all(readable(f.type) for f in kind)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return readable(kind.value_type)
    return not pa.types.is_dictionary(kind)


def _as_read(kind: pa.DataType) -> pa.DataType:
    if any(test(kind) for test in _TEXT_FIRST):
        return pa.string()
    return kind
