"""A parsed struct column spread into the record's top-level fields."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from materializer.source.record_errors import with_error

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructType

PARSED = "__parsed"


def spread_parsed(df: DataFrame, bad: Column, message: str) -> DataFrame:
    """Mark ``bad`` rows as decode errors and spread ``__parsed`` into top-level fields."""
    from pyspark.sql import functions as F

    df = with_error(df, "decode", bad, F.lit(message))
    parsed = cast("StructType", df.schema[PARSED].dataType)
    fields = [F.col(PARSED).getField(f.name).alias(f.name) for f in parsed.fields]
    return df.select(*[F.col(n) for n in df.columns if n != PARSED], *fields)
