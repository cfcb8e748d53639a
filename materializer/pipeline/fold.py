"""The fold: entity state per key, kept in Spark's state store.

``latest`` is a streaming aggregation: per key, the record with the greatest
(partition, offset) wins, deletes included, so a tombstone that comes last
removes the entity. In ``update`` output mode each micro-batch emits one row per
key it touched — exactly the rows to project — and the aggregation state is
checkpointed together with the source offsets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from materializer.pipeline import columns as c

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def fold_latest(records: DataFrame) -> DataFrame:
    """One row per key: ``_key``, ``_deleted``, ``_entity``, ``partition``, ``offset``."""
    from pyspark.sql import functions as F

    last = F.max_by(
        F.struct(
            F.col(c.DELETED).alias(c.DELETED),
            F.col(c.ENTITY).alias(c.ENTITY),
            F.col(c.PARTITION).alias(c.PARTITION),
            F.col(c.OFFSET).alias(c.OFFSET),
        ),
        F.struct(F.col(c.PARTITION), F.col(c.OFFSET)),
    )
    return records.groupBy(c.KEY).agg(last.alias("_last")).select(c.KEY, "_last.*")
