"""Records that cannot be folded, sent to the map's dead-letter topic.

Each keeps its original key, value and headers and gains ``x-error-stage``,
``x-error-message``, ``x-source-topic``, ``x-source-partition`` and
``x-source-offset`` headers. Spark computes these columns with the batch's
events; the fold sends them (``materializer.redis.apply``) with an idempotent
producer, at least once: after a crash a dead letter may appear twice, never
zero times.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from materializer import record_columns as c

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

ERROR_HEADERS = (
    ("x-error-stage", c.ERROR_STAGE),
    ("x-error-message", c.ERROR_MESSAGE),
    ("x-source-topic", c.TOPIC),
    ("x-source-partition", c.PARTITION),
    ("x-source-offset", c.OFFSET),
)


def _header(name: str, column: str) -> Column:
    from pyspark.sql import functions as F

    return F.struct(
        F.lit(name).alias("key"), F.col(column).cast("string").cast("binary").alias("value")
    )


def fail_on_error(records: DataFrame) -> DataFrame:
    """For ``on_error: fail``: the good records, and a query failure at the first bad one.

    The check runs inside the fold's own query, so the batch holding a bad
    record never commits: after a fix and a restart it is read again.
    """
    from pyspark.sql import functions as F

    message = F.format_string(
        "record %s/%d@%d failed at %s: %s",
        F.col(c.TOPIC),
        F.col(c.PARTITION),
        F.col(c.OFFSET),
        F.col(c.ERROR_STAGE),
        F.col(c.ERROR_MESSAGE),
    )
    return records.where(
        F.when(F.col(c.ERROR_STAGE).isNull(), F.lit(True)).otherwise(F.raise_error(message))
    )


def dead_letter_columns() -> list[Column]:
    """The Kafka record of a failed record: its key, its value, its headers and ours."""
    from pyspark.sql import functions as F

    original = F.coalesce(
        F.col(c.HEADERS), F.array().cast("array<struct<key:string,value:binary>>")
    )
    added = F.array(*[_header(name, col) for name, col in ERROR_HEADERS])
    return [
        F.col(c.KAFKA_KEY).alias("key"),
        F.col(c.VALUE).alias("value"),
        F.concat(original, added).alias("headers"),
    ]
