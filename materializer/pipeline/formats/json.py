"""JSON values with a declared schema (Spark SQL DDL), parsed in the JVM."""

from __future__ import annotations

from typing import TYPE_CHECKING

from materializer.config import MapConfig
from materializer.errors import ConfigError
from materializer.pipeline import columns as c
from materializer.pipeline.formats.parsed import PARSED, spread_parsed
from materializer.pipeline.record_errors import without_errors

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

CORRUPT = "__corrupt_record"


def json_schema(map_config: MapConfig) -> StructType:
    """The declared JSON value schema, parsed from its DDL."""
    from pyspark.sql.types import StructType, _parse_datatype_string

    ddl = map_config.source.schema_
    try:
        parsed = _parse_datatype_string(ddl or "")
    except Exception as exc:  # pyspark raises several types for a bad DDL string
        raise ConfigError("", [f"source.schema: not valid Spark SQL DDL: {exc}"]) from None
    if not isinstance(parsed, StructType):
        raise ConfigError("", [f"source.schema: must be a struct, got {parsed.simpleString()}"])
    return parsed


def decode_json(raw: DataFrame, schema: StructType) -> DataFrame:
    """``from_json`` in permissive mode; a value that does not parse is a decode error."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    with_corrupt = StructType([*schema.fields, StructField(CORRUPT, StringType())])
    parsed = F.from_json(
        F.col(c.VALUE).cast("string"),
        with_corrupt,
        {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT},
    )
    df = without_errors(raw).withColumn(PARSED, parsed)
    bad = F.col(c.VALUE).isNotNull() & (
        F.col(PARSED).isNull() | F.col(PARSED).getField(CORRUPT).isNotNull()
    )
    df = spread_parsed(df, bad, "value is not JSON matching the declared schema")
    return df.drop(CORRUPT)
