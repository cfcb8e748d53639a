"""A registry subject that gained fields while a map reads it: the map takes the new version.

A registry map's reader is the latest version of its subject when its queries
start. Records of a newer writer still decode with it (Avro resolution and
protobuf skip the fields the reader lacks), but then the new fields would be
lost for those records. So an executor that meets a writer schema id it has
not seen compares the writer's fields with the reader's. When the writer has
more, it asks the registry for the subject's latest version; if that is not
the reader and only adds fields at the top (every field of the reader kept with
its type), the record raises ``arrow_decode.SchemaMoved``. That fails the batch before
anything of it is written; the run restarts the map's queries, which read
the latest version as their reader, and the batch is read again from the
checkpoint with the new fields (``run.lifecycle``). This is Auto Loader's
``addNewColumns``: stop on the first record that carries a new column, take
the wider schema, go on.

A latest version that removes or retypes a field, or adds one inside a struct, is
not taken while the map runs (the fold's entities and the table would change
shape under it): records go on decoding with the reader they started with, and
a rebuild takes the new version. A "read it as it is" verdict for a (reader,
writer) pair is kept per process for a while, so the registry is asked about a
new writer id once in that while.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from materializer.source.formats.arrow_decode import SchemaMoved
from materializer.source.formats.registry import RegisteredSchema, client_for

if TYPE_CHECKING:
    from pyspark.sql.types import DataType, StructType


def _children(dtype: DataType) -> StructType | None:
    """The struct a type holds: itself, an array's element or a map's value."""
    from pyspark.sql.types import ArrayType, MapType, StructType

    while isinstance(dtype, ArrayType | MapType):
        dtype = dtype.elementType if isinstance(dtype, ArrayType) else dtype.valueType
    return dtype if isinstance(dtype, StructType) else None


def added_fields(old: StructType, new: StructType, prefix: str = "") -> list[str]:
    """The dotted paths of ``new``'s fields that ``old`` lacks, at every depth."""
    known = {f.name: f.dataType for f in old.fields}
    added: list[str] = []
    for field in new.fields:
        path = f"{prefix}{field.name}"
        if field.name not in known:
            added.append(path)
            continue
        before, after = _children(known[field.name]), _children(field.dataType)
        if before is not None and after is not None:
            added += added_fields(before, after, f"{path}.")
    return added


def only_adds(old: StructType, new: StructType) -> bool:
    """Whether ``new`` keeps every field of ``old`` with its type and adds fields only at the
    top, where a map's table can gain them as columns (nullability aside: every decoded
    field is nullable). A field added inside a struct changes a column's type: not this."""
    after = {f.name: f.dataType for f in new.fields}
    return all(f.name in after and _same(f.dataType, after[f.name]) for f in old.fields)


def _same(old: DataType, new: DataType) -> bool:
    from pyspark.sql.types import ArrayType, MapType, StructType

    if isinstance(old, StructType) and isinstance(new, StructType):
        return old.names == new.names and all(
            _same(a.dataType, b.dataType) for a, b in zip(old.fields, new.fields, strict=True)
        )
    if isinstance(old, ArrayType) and isinstance(new, ArrayType):
        return _same(old.elementType, new.elementType)
    if isinstance(old, MapType) and isinstance(new, MapType):
        return old.keyType == new.keyType and _same(old.valueType, new.valueType)
    return bool(old == new)


VERDICT_TTL_S = 30.0
"""How long a "read it as it is" verdict stands before the registry is asked again: a
registry that answered with an older latest version (a follower behind) is asked again."""
_fine: dict[tuple[str, str, int, int], float] = {}
_lock = threading.Lock()


def check_writer(
    url: str,
    subject: str,
    reader: tuple[int, StructType],
    writer: tuple[int, Callable[[], StructType]],
    fields_of: Callable[[RegisteredSchema], StructType],
    fmt: str | None = None,
) -> None:
    """Raise :class:`SchemaMoved` when the writer carries fields the reader lacks and the
    subject's latest version adds fields to the reader's and changes none; return when the
    record may be read as it is. ``reader`` and ``writer`` are (schema id, the map's fields
    as each types them); ``fields_of`` types the latest version so. A registry that does
    not answer is a RegistryError (a decode error naming it; the client remembers it for a
    few seconds). Only "read it as it is" is remembered, for ``VERDICT_TTL_S``: after a
    move the reader is another, and a subject rolled back is asked again."""
    reader_id, reader_fields = reader
    writer_id, writer_fields = writer
    key = (url, subject, reader_id, writer_id)
    now = time.monotonic()
    with _lock:
        if now - _fine.get(key, -VERDICT_TTL_S) < VERDICT_TTL_S:
            return
    if added_fields(reader_fields, writer_fields()):
        latest = client_for(url).latest(subject, fmt)
        if latest.id != reader_id:
            wider = fields_of(latest)
            added = [f for f in wider.names if f not in reader_fields.names]
            if added and only_adds(reader_fields, wider):
                raise SchemaMoved(
                    f"subject {subject} moved from schema id {reader_id} to schema id "
                    f"{latest.id}, which adds {', '.join(added)} (first met in a record of "
                    f"writer schema id {writer_id}): the map's queries start again on it"
                )
    with _lock:
        _fine[key] = now
