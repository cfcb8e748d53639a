"""Decoding in Python on the executors, one Arrow batch at a time (``mapInArrow``).

For formats the JVM cannot decode on its own (Confluent's wire format, protobuf
without a Spark protobuf jar). Each Arrow batch of raw records passes through
unchanged and gains the entity's fields and the two error columns: a
:class:`ValueDecoder` turns one value into a dict of the fields, and the batch
of dicts becomes Arrow columns in one conversion. A value the decoder rejects,
or whose fields do not fit the map's schema, becomes a decode error with a
message; it never fails the batch, save for a record that shows the map's
registry subject moved on (:class:`SchemaMoved`). A null value (a tombstone) decodes to null
fields and no error.

What runs on the executors must pickle: decoders hold plain data (schema text,
descriptor bytes, URLs) and build what they parse from it once per process.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, cast

from materializer import record_columns as c
from materializer.errors import ConfigError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame
    from pyspark.sql.types import DataType, StructType

STAGE = "decode"


class DecodeFailure(ValueError):
    """A value that does not decode; the message goes to the dead-letter headers."""


class SchemaMoved(Exception):  # noqa: N818 - it names what happened, as Fenced does
    """The map's registry subject has a version with the fields a record carries and its
    reader lacks (``schema_moves``): the map's queries must start again on it. Never a dead
    letter: the batch fails, so that nothing of it is written without them."""


class ValueDecoder(ABC):
    """Executor side: one raw value to the entity's fields.

    ``decode`` returns a dict keyed by the map's field names with values that
    Arrow converts to the fields' Spark types (missing keys are null), or
    raises. A :class:`DecodeFailure` carries its own message; any other
    exception is a decode error named by its type, so bad bytes never stop
    the stream.
    """

    reads_key = False
    """Whether the record's Kafka key is decoded too (``decode_record``)."""

    @abstractmethod
    def decode(self, value: bytes) -> dict[str, Any]:
        """The fields of one non-null value."""

    def decode_record(self, key: bytes | None, value: bytes) -> dict[str, Any]:
        """The fields of one non-null value and its key (``reads_key``)."""
        return self.decode(value)


def _describe(exc: Exception) -> str:
    if isinstance(exc, DecodeFailure):
        return str(exc)
    detail = str(exc) or "no detail"
    return f"{type(exc).__name__}: {detail}"


class ArrowDecode:
    """The ``mapInArrow`` function: raw batches in, the same rows plus decoded fields out."""

    def __init__(self, decoder: ValueDecoder, fields: StructType) -> None:
        self.decoder = decoder
        self.fields_json = fields.json()

    def _arrow_type(self) -> pa.DataType:
        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_schema
        from pyspark.sql.types import StructType

        fields = StructType.fromJson(_loads(self.fields_json))
        # Timestamps cross in UTC, as Spark hands mapInArrow its timestamp columns.
        return pa.struct(list(to_arrow_schema(fields, timezone="UTC")))

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Decode each batch's ``__value`` column."""
        import pyarrow as pa

        arrow_type = self._arrow_type()
        for batch in batches:
            values = batch.column(batch.schema.get_field_index(c.VALUE)).to_pylist()
            keys = [None] * len(values)
            if self.decoder.reads_key:
                keys = batch.column(batch.schema.get_field_index(c.KAFKA_KEY)).to_pylist()
            rows: list[dict[str, Any] | None] = []
            stages: list[str | None] = []
            messages: list[str | None] = []
            decode = self.decoder.decode_record
            for key, value in zip(keys, values, strict=True):
                row, message = None, None
                if value is not None:
                    try:
                        row = decode(key, value)
                    except SchemaMoved:  # not the record's fault: the batch waits for a reader
                        raise
                    except Exception as exc:  # bad bytes are data, whatever the decoder raised
                        message = _describe(exc)
                rows.append(row)
                stages.append(None if message is None else STAGE)
                messages.append(message)
            struct = _struct_array(rows, arrow_type, stages, messages)
            arrays = [
                *batch.columns,
                *struct.flatten(),
                pa.array(stages, pa.string()),
                pa.array(messages, pa.string()),
            ]
            names = [
                *batch.schema.names,
                *[f.name for f in arrow_type],
                c.ERROR_STAGE,
                c.ERROR_MESSAGE,
            ]
            yield pa.RecordBatch.from_arrays(arrays, names=names)


def _struct_array(
    rows: list[dict[str, Any] | None],
    arrow_type: pa.DataType,
    stages: list[str | None],
    messages: list[str | None],
) -> pa.StructArray:
    """The rows as one struct array; rows that do not convert become errors, the rest stay."""
    import pyarrow as pa

    try:
        return pa.array(rows, type=arrow_type)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        pass
    # The slow path, only for a batch holding a misfit: find the rows that fail alone.
    for i, row in enumerate(rows):
        if row is None:
            continue
        try:
            pa.array([row], type=arrow_type)
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
            rows[i] = None
            stages[i] = STAGE
            messages[i] = f"decoded value does not fit the map's schema: {exc}"
    return pa.array(rows, type=arrow_type)


def _loads(text: str) -> Any:
    import orjson

    return orjson.loads(text)


def nullable(dtype: DataType) -> DataType:
    """The type with every field, element and map value nullable, at every depth.

    A tombstone or a failed record has null fields whatever the schema says,
    and a Delta column must not promise NOT NULL for a later version to break.
    """
    from pyspark.sql import types as T

    if isinstance(dtype, T.StructType):
        return T.StructType([T.StructField(f.name, nullable(f.dataType)) for f in dtype.fields])
    if isinstance(dtype, T.ArrayType):
        return T.ArrayType(nullable(dtype.elementType), True)
    if isinstance(dtype, T.MapType):
        return T.MapType(dtype.keyType, nullable(dtype.valueType), True)
    return dtype


def decode_in_python(
    raw: DataFrame, fields: StructType, decoder: ValueDecoder, own: StructType | None = None
) -> DataFrame:
    """Raw records plus the decoded ``fields`` and the error columns, decoded on the executors.

    Every decoded field is nullable (see :func:`nullable`). ``own``: columns of the
    pipeline's the decoder adds too (their names start with ``__``).
    """
    from pyspark.sql.types import StringType, StructField, StructType

    clash = [f.name for f in fields.fields if c.is_internal(f.name)]
    if clash:
        names = ", ".join(clash)
        raise ConfigError(
            "", [f"source: fields {names} start with {c.PREFIX!r}, kept for the pipeline's own"]
        )
    fields = cast("StructType", nullable(fields))
    if own is not None:
        fields = StructType([*fields.fields, *own.fields])
    schema = StructType(
        [
            *raw.schema.fields,
            *fields.fields,
            StructField(c.ERROR_STAGE, StringType()),
            StructField(c.ERROR_MESSAGE, StringType()),
        ]
    )
    return raw.mapInArrow(ArrowDecode(decoder, fields), schema)
