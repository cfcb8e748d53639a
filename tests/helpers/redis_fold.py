"""Driving the Redis fold directly: Arrow batches of records, applied as a batch would
be, for tests of the fold and of what reads it."""

from __future__ import annotations

import orjson
import pyarrow as pa

from materializer import record_columns as c
from materializer.redis.apply import apply_batches
from materializer.redis.deliveries import new_producer
from materializer.redis.functions import FoldTarget
from materializer.redis.prepare import ORDER


def records(
    rows: list[tuple[str, str, dict | None]], timestamps_us: list[int] | None = None
) -> list[pa.RecordBatch]:
    """(key, order, entity or None for a delete) as the columns ``arrow_columns`` selects,
    with the records' Kafka timestamps (by default their indexes)."""
    return [
        pa.RecordBatch.from_pydict(
            {
                c.KEY: [k for k, _, _ in rows],
                ORDER: [o for _, o, _ in rows],
                "__value": pa.array(
                    [None if e is None else orjson.dumps(e) for _, _, e in rows], pa.binary()
                ),
                "__aux": pa.array([None] * len(rows), pa.string()),
                "__timestamp_us": pa.array(timestamps_us or range(len(rows)), pa.int64()),
                "__dl_key": pa.array([None] * len(rows), pa.binary()),
                "__dl_value": pa.array([None] * len(rows), pa.binary()),
                "__dl_headers": pa.array([None] * len(rows), pa.string()),
            }
        )
    ]


def apply(target: FoldTarget, batch: int, rows: list[tuple[str, str, dict | None]]) -> int:
    return apply_batches(target, batch, "app", records(rows), new_producer(target)).keys
