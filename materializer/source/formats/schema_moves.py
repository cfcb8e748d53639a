"""A registry subject that gained fields while a map reads it: the map takes the new version.

A registry map's reader is the latest version of its subject when its queries
start. Records of a newer writer still decode with it (Avro resolution and
protobuf skip the fields the reader lacks), but then the new fields would be
lost for those records. So an executor that meets a writer schema id it has
not seen compares the writer's fields with the reader's. When the writer has
more, it asks the registry for the subject's latest version; if that is not
the reader and only adds fields (every field of the reader kept with its
type), the record raises ``arrow_decode.SchemaMoved``. That fails the batch before
anything of it is written; the run restarts the map's queries, which read
the latest version as their reader, and the batch is read again from the
checkpoint with the new fields (``run.lifecycle``). This is Auto Loader's
``addNewColumns``: stop on the first record that carries a new column, take
the wider schema, go on.

A latest version that removes or retypes a field is not taken while the map
runs (the fold's entities and the table would change shape under it): records
go on decoding with the reader they started with, and a rebuild takes the
new version. The verdict for each (reader, writer) pair is kept per process,
so the registry is asked once per new writer id.
"""

from __future__ import annotations

import threading
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
    """Whether ``new`` keeps every field of ``old`` with its type, nested structs only
    gaining fields (nullability aside: every decoded field is nullable)."""
    return _widens(old, new)


def _widens(old: DataType, new: DataType) -> bool:
    from pyspark.sql.types import ArrayType, MapType, StructType

    if isinstance(old, StructType) and isinstance(new, StructType):
        after = {f.name: f.dataType for f in new.fields}
        return all(f.name in after and _widens(f.dataType, after[f.name]) for f in old.fields)
    if isinstance(old, ArrayType) and isinstance(new, ArrayType):
        return _widens(old.elementType, new.elementType)
    if isinstance(old, MapType) and isinstance(new, MapType):
        return old.keyType == new.keyType and _widens(old.valueType, new.valueType)
    return bool(old == new)


_verdicts: dict[tuple[str, str, int, int], bool] = {}
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
    subject's latest version is a wider reader; return when the record may be read as
    it is. ``reader`` and ``writer`` are (schema id, fields); ``fields_of`` types the
    latest version. A registry that does not answer is a RegistryError (a decode error
    naming it), asked again on the next record."""
    reader_id, reader_fields = reader
    writer_id, writer_fields = writer
    key = (url, subject, reader_id, writer_id)
    with _lock:
        known = _verdicts.get(key)
    if known is not None:
        return _verdict(known, subject, reader_id, writer_id)
    moved = ""
    if added_fields(reader_fields, writer_fields()):
        latest = client_for(url).latest(subject, fmt)
        if latest.id != reader_id:
            wider = fields_of(latest)
            added = added_fields(reader_fields, wider)
            if added and only_adds(reader_fields, wider):
                moved = f"schema id {latest.id}, which adds {', '.join(added)}"
    with _lock:
        _verdicts[key] = not moved
    if moved:
        raise SchemaMoved(
            f"subject {subject} moved from schema id {reader_id} to {moved} (first met in "
            f"a record of writer schema id {writer_id}): the map's queries start again on it"
        )
    return None


def _verdict(fine: bool, subject: str, reader_id: int, writer_id: int) -> None:
    if not fine:
        raise SchemaMoved(
            f"subject {subject} moved past schema id {reader_id} (records of writer schema "
            f"id {writer_id} carry fields it lacks): the map's queries start again on it"
        )
