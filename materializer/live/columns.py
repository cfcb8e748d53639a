"""The columns the real-time writer reads, by name (``io.materializer.live.Record``).

Each map's events leave its part of the query as the micro-batch path hands them to the
fold (``RedisFold.arrow_columns``: key, order, the mode's payload and aux, a failed
record's dead letter), with the map's index in the writer's spec, the record's source
position, and its Redis keys, computed by Spark so that the writer knows nothing of the
key layout.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from materializer import record_columns as c
from materializer.contract.redis_layout import STATE_MARK, entity_key
from materializer.redis.prepare import (
    AUX,
    LETTER_HEADERS,
    LETTER_KEY,
    LETTER_VALUE,
    ORDER,
    TIMESTAMP_US,
    VALUE,
)
from materializer.redis.sink import RedisFold

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame


def state_key_column(physical: str, key: Column) -> Column:
    """``redis_layout.state_key`` as Spark computes it for each record: ``<map>\\0o:`` and
    the entity key's own hash tag when it has one (a ``{`` whose next ``}`` is not right
    after it), else the whole entity key in braces. Found with string functions: a regular
    expression tried on every record was a twentieth of the real-time query's CPU."""
    from pyspark.sql import functions as F

    entity = F.concat(F.lit(entity_key(physical, "")), key)
    opens = F.instr(entity, "{")
    after = entity.substr(opens + 1, F.length(entity))
    tagged = (opens > 0) & (F.instr(after, "}") > 1)
    mark = F.lit(physical + STATE_MARK.decode())
    whole = F.concat(mark, F.lit("{"), entity, F.lit("}"))
    return F.when(tagged, F.concat(mark, key)).otherwise(whole).cast("binary")


def writer_columns(fold: RedisFold, events: DataFrame, index: int, physical: str) -> DataFrame:
    """One map's events as the writer reads them; ``index``: the map's place in its spec."""
    from pyspark.sql import functions as F

    handed = fold.arrow_columns(events, keep=[c.TOPIC, c.PARTITION, c.OFFSET])
    key = F.col(c.KEY)
    return handed.select(
        F.lit(index).alias("map"),
        F.col(c.TOPIC).alias("topic"),
        F.col(c.PARTITION).alias("partition"),
        F.col(c.OFFSET).alias("offset"),
        F.col(TIMESTAMP_US).alias("timestamp_us"),
        key.alias("key"),
        F.concat(F.lit(entity_key(physical, "")), key).alias("entity"),
        state_key_column(physical, key).alias("state"),
        F.col(ORDER).alias("order"),
        F.col(VALUE).alias("value"),
        F.col(AUX).alias("aux"),
        F.col(LETTER_KEY).alias("letter_key"),
        F.col(LETTER_VALUE).alias("letter_value"),
        F.col(LETTER_HEADERS).alias("letter_headers"),
    )
