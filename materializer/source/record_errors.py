"""The two error columns every stage may set, first failure wins.

A record that fails a stage keeps flowing with ``__error_stage`` and
``__error_message`` set; later stages leave it alone, and the map's error
policy (dead letter, skip, fail) decides where it ends up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from materializer import record_columns as c

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame


def with_error(df: DataFrame, stage: str, failed: Column, message: Column) -> DataFrame:
    """Mark records where ``failed`` holds, unless an earlier stage already marked them.

    Each column reads each earlier one once: a filter Spark pushes down through the
    stages (``on_error: fail``) copies every stage's expression into it, and columns that
    read the stage twice doubled at every stage, a plan too large to build for a map of
    many stages."""
    from pyspark.sql import functions as F

    failing = F.coalesce(failed, F.lit(False))
    earlier = F.col(c.ERROR_STAGE)
    return df.withColumns(
        {
            c.ERROR_STAGE: F.coalesce(earlier, F.when(failing, F.lit(stage))),
            c.ERROR_MESSAGE: F.when(earlier.isNull(), F.when(failing, message)).otherwise(
                F.col(c.ERROR_MESSAGE)
            ),
        }
    )


def without_errors(raw: DataFrame) -> DataFrame:
    """Raw records with both error columns present and null."""
    from pyspark.sql import functions as F

    return raw.withColumns(
        {
            c.ERROR_STAGE: F.lit(None).cast("string"),
            c.ERROR_MESSAGE: F.lit(None).cast("string"),
        }
    )
