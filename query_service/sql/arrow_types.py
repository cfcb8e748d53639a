"""Answer types every Arrow reader knows.

DataFusion reads a Delta table's strings as string views and may answer with
dictionaries; many clients (older Arrow libraries, JDBC drivers, Arrow JS) lack
one or the other. Every answer, from the engine or from Redis, goes out in the
plain types, so the same statement has the same schema whichever path answers it.
"""

from __future__ import annotations

import pyarrow as pa


def portable(schema: pa.Schema) -> pa.Schema:
    """``schema`` with view and dictionary types as the plain ones."""
    return pa.schema([field.with_type(plain(field.type)) for field in schema])


def plain(kind: pa.DataType) -> pa.DataType:
    """One type as ``portable`` makes it."""
    if pa.types.is_dictionary(kind):
        return plain(kind.value_type)
    if pa.types.is_string_view(kind):
        return pa.string()
    if pa.types.is_binary_view(kind):
        return pa.binary()
    if pa.types.is_list_view(kind) or pa.types.is_large_list_view(kind):
        return pa.list_(plain(kind.value_type))
    if pa.types.is_list(kind):
        return pa.list_(kind.value_field.with_type(plain(kind.value_type)))
    if pa.types.is_struct(kind):
        return pa.struct([f.with_type(plain(f.type)) for f in kind])
    if pa.types.is_map(kind):
        return pa.map_(plain(kind.key_type), plain(kind.item_type))
    return kind


def cast(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` in ``schema`` (``portable`` of its own)."""
    if batch.schema.equals(schema):
        return batch
    return pa.RecordBatch.from_arrays(
        [column.cast(field.type) for column, field in zip(batch.columns, schema, strict=True)],
        schema=schema,
    )
