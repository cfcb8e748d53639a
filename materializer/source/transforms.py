"""Single-message transforms, applied in order to decoded records (Kafka Connect's SMTs).

Every transform is a Spark expression over the record's top-level fields, so
the JVM runs them inside the same stage as the decoder: no Python per record.
They touch *live* records only — decoded, not a tombstone, not already failed
— so a tombstone still deletes its entity and a failed record reaches the
dead-letter topic as it was read; a ``filter`` passes Debezium's deletes too.

Field names are checked against the schema when the map starts: a missing
field, a bad SQL expression or an unknown type is a ConfigError naming the
transform's key path (``transforms.2.fields.userName``), never a stream that
fails later. A value that cannot be converted (``cast``, ``timestamp_convert``)
is a record error of stage ``transform`` and follows the map's error policy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from materializer import record_columns as c
from materializer.config import (
    CastTransform,
    ComputeTransform,
    DropTransform,
    ExtractFieldTransform,
    FilterTransform,
    FlattenTransform,
    InsertFieldTransform,
    KeepTransform,
    MaskTransform,
    RenameTransform,
    TimestampConvertTransform,
    Transform,
    ValueToKeyTransform,
)
from materializer.errors import ConfigError, first_line
from materializer.source.record_errors import with_error

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType

STAGE = "transform"
DEFAULT_TIMESTAMP_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSSXXX"


def apply_transforms(records: DataFrame, transforms: Sequence[Transform]) -> DataFrame:
    """Each transform in turn; a problem found in the schema names its key path."""
    from pyspark.errors import PySparkException

    for i, transform in enumerate(transforms):
        path = f"transforms.{i}"
        try:
            records = _APPLY[type(transform)](records, transform, path)
        except PySparkException as exc:
            # An expression Spark cannot parse or resolve against the record's fields.
            raise ConfigError("", [f"{path}: {first_line(exc)}"]) from None
    return records


def _live(records: DataFrame) -> Column:
    """Records a transform applies to: decoded, not a tombstone, not failed earlier."""
    from pyspark.sql import functions as F

    return F.col(c.ERROR_STAGE).isNull() & F.col(c.VALUE).isNotNull()


def _field(name: str) -> Column:
    from pyspark.sql import functions as F

    return F.col(c.quote(name))


def _require(records: DataFrame, names: Sequence[str], path: str) -> None:
    """Every named field exists, or a ConfigError naming the first missing one's key path."""
    fields = c.entity_fields(records.columns)
    for name in names:
        if name not in fields:
            known = ", ".join(fields) or "none"
            raise ConfigError("", [f"{path}.{name}: no such field (fields: {known})"])


def _check_new_names(records: DataFrame, names: Sequence[str], path: str) -> None:
    for name in names:
        if not name or c.is_internal(name):
            raise ConfigError(
                "", [f"{path}: {name!r} is not a field name (names starting with __ are reserved)"]
            )


def _filter(records: DataFrame, t: FilterTransform, path: str) -> DataFrame:
    """Tombstones, deletes and failed records pass: a filter never loses a delete or a dead
    letter."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    condition = F.expr(t.condition)
    dtype = records.select(condition).schema[0].dataType
    if not isinstance(dtype, T.BooleanType):
        raise ConfigError(
            "", [f"{path}.condition: must be a condition (true/false), not {dtype.simpleString()}"]
        )
    keep = ~_live(records) | F.coalesce(condition, F.lit(False))
    if c.DELETED in records.columns:
        # A delete the decoder marked (Debezium's d and t) carries the primary key at most:
        # a condition on the row's other columns must not keep the entity from its delete.
        keep = keep | F.coalesce(F.col(c.DELETED), F.lit(False))
    return records.where(keep)


def _rename(records: DataFrame, t: RenameTransform, path: str) -> DataFrame:
    _require(records, list(t.fields), f"{path}.fields")
    _check_new_names(records, list(t.fields.values()), f"{path}.fields")
    kept = set(c.entity_fields(records.columns)) - set(t.fields)
    targets = list(t.fields.values())
    for old, new in t.fields.items():
        if new in kept or targets.count(new) > 1:
            raise ConfigError("", [f"{path}.fields.{old}: {new!r} would name two fields"])
    return records.withColumnsRenamed(t.fields)


def _drop(records: DataFrame, t: DropTransform, path: str) -> DataFrame:
    _require(records, t.fields, f"{path}.fields")
    return records.drop(*[_field(n) for n in t.fields])


def _keep(records: DataFrame, t: KeepTransform, path: str) -> DataFrame:
    _require(records, t.fields, f"{path}.fields")
    gone = [n for n in c.entity_fields(records.columns) if n not in t.fields]
    return records.drop(*[_field(n) for n in gone])


def empty_value(dtype: DataType) -> Column:
    """The empty value of a type: "", 0, false, the epoch, empty bytes/array/map, or a
    struct of empty values; a masked field keeps its type, so the table's schema holds."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if isinstance(dtype, T.StringType):
        return F.lit("")
    if isinstance(dtype, T.NumericType):
        return F.lit(0).cast(dtype)
    if isinstance(dtype, T.BooleanType):
        return F.lit(False)
    if isinstance(dtype, T.BinaryType):
        return F.lit(bytearray())
    if isinstance(dtype, T.DateType | T.TimestampType | T.TimestampNTZType):
        return F.lit(0).cast("timestamp").cast(dtype)
    if isinstance(dtype, T.ArrayType):
        return F.array().cast(dtype)
    if isinstance(dtype, T.MapType):
        return F.create_map().cast(dtype)
    if isinstance(dtype, T.StructType):
        return F.struct(*[empty_value(f.dataType).alias(f.name) for f in dtype.fields])
    return F.lit(None).cast(dtype)


def _mask(records: DataFrame, t: MaskTransform, path: str) -> DataFrame:
    """A null stays null: masking must not invent a value where the event had none."""
    from pyspark.sql import functions as F

    _require(records, t.fields, f"{path}.fields")
    masked = {}
    for name in t.fields:
        col = _field(name)
        empty = empty_value(records.schema[name].dataType)
        masked[name] = F.when(_live(records) & col.isNotNull(), empty).otherwise(col)
    return records.withColumns(masked)


def _converted(
    records: DataFrame, name: str, converted: Column, path: str, describe: Column
) -> DataFrame:
    """Set a field to ``converted``; a live non-null value that converts to null is an error."""
    from pyspark.sql import functions as F

    col = _field(name)
    failed = _live(records) & col.isNotNull() & converted.isNull()
    records = with_error(records, STAGE, failed, F.concat(F.lit(f"{path}: {name}: "), describe))
    return records.withColumn(name, F.when(_live(records), converted).otherwise(F.lit(None)))


def _shown(col: Column) -> Column:
    """A value for an error message, cut so a big value cannot swell the header."""
    from pyspark.sql import functions as F

    return F.substring(col.cast("string"), 1, 200)


def _cast(records: DataFrame, t: CastTransform, path: str) -> DataFrame:
    from pyspark.errors import PySparkException
    from pyspark.sql import functions as F

    _require(records, list(t.fields), f"{path}.fields")
    for name, type_name in t.fields.items():
        try:
            target = records.select(_field(name).try_cast(type_name)).schema[0].dataType
        except PySparkException as exc:  # an unknown type name
            raise ConfigError(
                "", [f"{path}.fields.{name}: cannot cast to {type_name!r}: {first_line(exc)}"]
            ) from None
        col = _field(name)
        describe = F.concat(
            F.lit("cannot cast '"), _shown(col), F.lit(f"' to {target.simpleString()}")
        )
        records = _converted(records, name, col.try_cast(target), path, describe)
    return records


def _flatten(records: DataFrame, t: FlattenTransform, path: str) -> DataFrame:
    """Nested structs (at any depth) become top-level fields ``parent<delimiter>child``."""
    from pyspark.sql import types as T

    out: list[Column] = []
    names: list[str] = []

    def walk(col: Column, name: str, dtype: DataType) -> None:
        if isinstance(dtype, T.StructType) and dtype.fields:
            for f in dtype.fields:
                walk(col.getField(f.name), f"{name}{t.delimiter}{f.name}", f.dataType)
        else:
            out.append(col.alias(name))
            names.append(name)

    internal = []
    for f in records.schema.fields:
        if c.is_internal(f.name):
            internal.append(_field(f.name))
        else:
            walk(_field(f.name), f.name, f.dataType)
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:
        raise ConfigError(
            "", [f"{path}.delimiter: flattening makes two fields named {clashes[0]!r}"]
        )
    return records.select(*out, *internal)


def _as_timestamp(dtype: DataType, col: Column, fmt: str | None) -> Column | None:
    """A field's value as a timestamp, by its type; None for a type that is no time."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if isinstance(dtype, T.StringType):
        return F.try_to_timestamp(col, F.lit(fmt)) if fmt else F.try_to_timestamp(col)
    if isinstance(dtype, T.IntegralType):
        return F.timestamp_millis(col)  # Kafka Connect's convention: epoch milliseconds
    if isinstance(dtype, T.TimestampType | T.TimestampNTZType | T.DateType):
        return col.cast("timestamp")
    return None


def _timestamp_convert(records: DataFrame, t: TimestampConvertTransform, path: str) -> DataFrame:
    from pyspark.sql import functions as F

    _require(records, [t.field], f"{path}.field")
    col = _field(t.field)
    dtype = records.schema[t.field].dataType
    ts = _as_timestamp(dtype, col, t.format)
    if ts is None:
        raise ConfigError(
            "",
            [
                f"{path}.field: {t.field} is {dtype.simpleString()}; timestamp_convert reads "
                "strings, epoch milliseconds (integers), dates and timestamps"
            ],
        )
    target: Column = {
        "timestamp": lambda: ts,
        "string": lambda: F.date_format(ts, t.format or DEFAULT_TIMESTAMP_FORMAT),
        "unix_millis": lambda: F.unix_millis(ts),
        "date": lambda: F.to_date(ts),
    }[t.target]()
    how = f" with format {t.format!r}" if t.format else ""
    describe = F.concat(F.lit("cannot read '"), _shown(col), F.lit(f"' as a timestamp{how}"))
    return _converted(records, t.field, target, path, describe)


def _value_to_key(records: DataFrame, t: ValueToKeyTransform, path: str) -> DataFrame:
    """The record key (``$kafka_key``) from value fields; the original key stays for dead
    letters. One field gives its value as a string, several a JSON object of them."""
    from pyspark.sql import functions as F

    _require(records, t.fields, f"{path}.fields")
    if len(t.fields) == 1:
        key = _field(t.fields[0]).cast("string")
    else:
        key = F.to_json(F.struct(*[_field(n).alias(n) for n in t.fields]))
    current = (
        F.col(c.VALUE_KEY) if c.VALUE_KEY in records.columns else F.col(c.KAFKA_KEY).cast("string")
    )
    return records.withColumn(c.VALUE_KEY, F.when(_live(records), key).otherwise(current))


def _extract_field(records: DataFrame, t: ExtractFieldTransform, path: str) -> DataFrame:
    from pyspark.sql import types as T

    _require(records, [t.field], f"{path}.field")
    dtype = records.schema[t.field].dataType
    if not isinstance(dtype, T.StructType):
        raise ConfigError("", [f"{path}.field: {t.field} is {dtype.simpleString()}, not a struct"])
    inner = [_field(t.field).getField(f.name).alias(f.name) for f in dtype.fields]
    internal = [_field(n) for n in records.columns if c.is_internal(n)]
    return records.select(*inner, *internal)


_METADATA = {
    "topic": c.TOPIC,
    "partition": c.PARTITION,
    "offset": c.OFFSET,
    "timestamp": c.TIMESTAMP,
}


def _insert_field(records: DataFrame, t: InsertFieldTransform, path: str) -> DataFrame:
    from pyspark.sql import functions as F

    _check_new_names(records, [t.field], f"{path}.field")
    value = F.col(_METADATA[t.from_]) if t.from_ else F.lit(t.value)
    return records.withColumn(t.field, value)


def _compute(records: DataFrame, t: ComputeTransform, path: str) -> DataFrame:
    """Expressions see the record as it was before this transform, like one SQL SELECT."""
    from pyspark.errors import PySparkException
    from pyspark.sql import functions as F

    _check_new_names(records, list(t.fields), f"{path}.fields")
    computed = {}
    for name, expression in t.fields.items():
        try:
            expr = F.expr(expression)
            records.select(expr)  # resolves now, so the error names this field
        except PySparkException as exc:
            raise ConfigError("", [f"{path}.fields.{name}: {first_line(exc)}"]) from None
        computed[name] = F.when(_live(records), expr)
    return records.withColumns(computed)


_APPLY: dict[type, Callable[[DataFrame, Any, str], DataFrame]] = {
    FilterTransform: _filter,
    RenameTransform: _rename,
    DropTransform: _drop,
    KeepTransform: _keep,
    MaskTransform: _mask,
    CastTransform: _cast,
    FlattenTransform: _flatten,
    TimestampConvertTransform: _timestamp_convert,
    ValueToKeyTransform: _value_to_key,
    ExtractFieldTransform: _extract_field,
    InsertFieldTransform: _insert_field,
    ComputeTransform: _compute,
}
