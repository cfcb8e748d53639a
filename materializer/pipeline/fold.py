"""The fold: entity state per key, kept in Spark's state store.

``latest`` is a streaming aggregation: per key, the event with the greatest
order (the event-time field if declared, then partition and offset) wins,
deletes included, so a tombstone that comes last removes the entity. In
``update`` output mode each micro-batch emits one row per key it touched —
exactly the rows to project — and the aggregation state is checkpointed
together with the source offsets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from materializer.config import FoldConfig
from materializer.errors import ConfigError
from materializer.pipeline import columns as c

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def fold_latest(records: DataFrame, fold: FoldConfig) -> DataFrame:
    """One row per key touched: ``__key``, ``__deleted``, ``__entity``."""
    from pyspark.sql import functions as F

    order = [F.col(c.PARTITION), F.col(c.OFFSET)]
    if fold.event_time:
        order.insert(0, F.col(c.quote(fold.event_time)))
    entity = F.struct(*[F.col(c.quote(f)) for f in c.entity_fields(records.columns)])
    last = F.max_by(
        F.struct(
            F.col(c.DELETED).alias(c.DELETED),
            F.when(F.col(c.DELETED), F.lit(None)).otherwise(entity).alias(c.ENTITY),
        ),
        F.struct(*order),
    )
    return records.groupBy(c.KEY).agg(last.alias("__last")).select(c.KEY, "__last.*")


def fold(records: DataFrame, config: FoldConfig) -> DataFrame:
    """The map's fold, by mode: ``latest`` here, ``merge`` and ``aggregate`` in their modules.

    Every mode returns one row per key touched by a micro-batch (``__key``,
    ``__deleted``, ``__entity``), for a query in ``update`` output mode.
    """
    if config.mode == "latest":
        return fold_latest(records, config)
    if config.mode == "merge":
        from materializer.pipeline.fold_merge import fold_merge

        return fold_merge(records, config)
    if config.mode == "aggregate":
        # Imported here: the aggregate fold loads PySpark's pandas stateful API.
        from materializer.pipeline.fold_aggregate import fold_aggregate

        return fold_aggregate(records, config)
    raise ConfigError("", [f"fold.mode: unknown mode {config.mode!r}"])
