"""A statement that is a plain key lookup of one map, answered from Redis.

``SELECT * | <columns> FROM <map> WHERE _key = <string | $n>`` asks for what
``Get`` answers: so it is answered as ``Get`` is, one Redis round trip, never a
scan of the table, whose files hold keys in no order its statistics could prune
by. The row has the table's own column types: the entity's JSON is read against
the schema of the table's newest version. The answer then reflects the Redis copy
(fresher than the table), and says so: its one table read has no version and the
Redis watermark, and ``min_offsets`` waits on the Redis copy, as ``Get`` does.

Whatever this cannot answer exactly as the engine would goes to the engine: a
column the table lacks or a column of its own (``_updated_at``), a type JSON does
not carry as the table has it (binary, maps), a value that does not read back.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from materializer.contract.table_layout import TABLE_KEY
from query_service.sql.arrow_types import portable
from query_service.sql.statement import KeyLookup

_TEXT_FIRST = (pa.types.is_date, pa.types.is_time)
"""Types the JSON reader does not parse from text itself: read as text, then cast."""


def lookup_key(lookup: KeyLookup, params: Sequence[object]) -> str | None:
    """The key looked up, or ``None`` when the parameter is not a string (the engine
    then decides what the comparison means)."""
    key = lookup.key if lookup.param is None else params[lookup.param - 1]
    return key if isinstance(key, str) else None


def answer_schema(lookup: KeyLookup, table: pa.Schema, meta: Sequence[str]) -> pa.Schema | None:
    """The columns the statement returns, typed as the table has them; ``None`` when the
    engine must answer (see the module docstring)."""
    names = table.names if lookup.columns is None else list(lookup.columns)
    fields = []
    for name in names:
        if name not in table.names or (name in meta and name != TABLE_KEY):
            return None
        field = table.field(name)
        if not _readable(field.type):
            return None
        fields.append(field)
    return portable(pa.schema(fields))


def row(schema: pa.Schema, key: str, entity: bytes | None) -> pa.RecordBatch | None:
    """The one row of ``key``'s entity (none when absent) in ``schema``; ``None`` when a
    value does not read back as its column's type."""
    if entity is None:
        return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)
    return typed_rows(schema, [key], [entity])


def typed_rows(
    schema: pa.Schema, keys: Sequence[str], entities: Sequence[bytes]
) -> pa.RecordBatch | None:
    """The entities (compact JSON, one per key) as rows of ``schema``, typed as the table
    types them; ``None`` when a value does not read back as its column's type."""
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


def _as_read(kind: pa.DataType) -> pa.DataType:
    if any(test(kind) for test in _TEXT_FIRST):
        return pa.string()
    return kind


def _readable(kind: pa.DataType) -> bool:
    """Whether the JSON the pipeline writes for this type reads back as it exactly (a
    double's NaN, written as text, fails its row instead, which the engine then answers)."""
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_map(kind):
        return False
    if pa.types.is_struct(kind):
        return all(_readable(f.type) for f in kind)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _readable(kind.value_type)
    return not pa.types.is_dictionary(kind)
