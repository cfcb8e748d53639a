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

from collections.abc import Sequence

import pyarrow as pa

from materializer.contract.table_layout import TABLE_KEY
from query_service.sql.arrow_types import portable
from query_service.sql.statement import KeyLookup
from query_service.tables.entity_rows import readable, typed_rows


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
        if not readable(field.type):
            return None
        fields.append(field)
    return portable(pa.schema(fields))


def row(schema: pa.Schema, key: str, entity: bytes | None) -> pa.RecordBatch | None:
    """The one row of ``key``'s entity (none when absent) in ``schema``; ``None`` when a
    value does not read back as its column's type."""
    return typed_rows(schema, [key] if entity else [], [entity] if entity else [])
