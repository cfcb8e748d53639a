"""Each record's entity key and whether it deletes the entity."""

from __future__ import annotations

from typing import TYPE_CHECKING

from materializer import record_columns as c
from materializer.config import KAFKA_KEY, MapConfig
from materializer.contract.redis_layout import RESERVED_KEYS
from materializer.errors import ConfigError, first_line
from materializer.source.debezium.ops import TRUNCATE
from materializer.source.decode import with_error

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def assign_keys(records: DataFrame, map_config: MapConfig) -> DataFrame:
    """Add ``__key`` and ``__deleted``; records without a usable key get a ``key`` error.

    A tombstone has no value, so its key can only be the record's Kafka key. A Debezium
    truncate has no key: it gets ``record_columns.TRUNCATE_KEY``.
    ``fold.delete_when`` marks events that delete the entity they are keyed to.
    """
    from pyspark.errors import PySparkException
    from pyspark.sql import functions as F

    kafka_key = F.col(c.KAFKA_KEY).cast("string")
    if c.VALUE_KEY in records.columns:
        kafka_key = F.col(c.VALUE_KEY)
    tombstone = F.col(c.VALUE).isNull()
    if map_config.key == KAFKA_KEY:
        key = kafka_key
        source = "the Kafka key"
    else:
        fields = c.entity_fields(records.columns)
        if map_config.key not in fields:
            known = ", ".join(fields) or "none"
            raise ConfigError("", [f"key: no field {map_config.key!r} (fields: {known})"])
        key = F.when(tombstone, kafka_key).otherwise(F.col(c.quote(map_config.key)).cast("string"))
        source = f"field {map_config.key!r}"
    deleted = tombstone
    truncate = F.lit(False)
    if c.DELETED in records.columns:  # the decoder's (a Debezium delete)
        deleted = tombstone | F.coalesce(F.col(c.DELETED), F.lit(False))
    if c.OP in records.columns:  # a Debezium truncate deletes every entity
        truncate = F.coalesce(F.col(c.OP) == TRUNCATE, F.lit(False))
        key = F.when(truncate, F.lit(c.TRUNCATE_KEY)).otherwise(key)
        deleted = deleted | truncate
    if map_config.fold.delete_when:
        condition = F.expr(map_config.fold.delete_when)
        try:
            records.select(condition)
        except PySparkException as exc:
            raise ConfigError("", [f"fold.delete_when: {first_line(exc)}"]) from None
        deleted = deleted | F.coalesce(condition, F.lit(False))
    df = records.withColumns({c.KEY: key, c.DELETED: deleted})
    df = with_error(
        df,
        "key",
        F.col(c.KEY).isNull(),
        F.when(tombstone, F.lit("tombstone without a Kafka key")).otherwise(
            F.lit(f"no key: {source} is missing or null")
        ),
    )
    return with_error(
        df,
        "key",
        F.col(c.KEY).isin(*RESERVED_KEYS, c.TRUNCATE_KEY) & ~truncate,
        F.lit("key is reserved by the Redis layout"),
    )
