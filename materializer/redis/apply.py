"""A batch's records applied to Redis, on the driver or an executor: its dead letters sent,
each key's records applied (``writer``), and each touched key's state after the call sent
to the changelog. See ``materializer.redis.sink`` for why a replay is safe.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from materializer import record_columns as c
from materializer.contract.changelog import APP_HEADER, BATCH_HEADER
from materializer.fold.base import Event, with_batch_time
from materializer.redis.deliveries import Deliveries, new_producer
from materializer.redis.functions import FoldTarget
from materializer.redis.prepare import (
    AUX,
    LETTER_HEADERS,
    LETTER_KEY,
    LETTER_VALUE,
    ORDER,
    TIMESTAMP_US,
    VALUE,
    arrow_schema,
)
from materializer.redis.truncate import delete_all, split
from materializer.redis.writer import Writer
from materializer.runtime.freshness import Freshness
from materializer.runtime.freshness import add as add_freshness

if TYPE_CHECKING:
    import pyarrow as pa
    from confluent_kafka import Producer


@dataclass(frozen=True)
class Applied:
    """What one batch did: keys it touched (their states went to the changelog), dead letters,
    the newest Kafka timestamp it folded (microseconds; None: it folded nothing), how
    old its folded records were when their Redis writes landed (``runtime.freshness``), and
    where its changelog records went (``redis.changelog_ends``).

    The fold counts these on the Arrow rows it already holds: Spark's ``observe`` would
    count them too, but its per-record accumulator sits outside the generated code and
    slows a backlog's decode (docs/decisions/0018-fold-metrics-counted-on-arrow-rows.md)."""

    keys: int = 0
    dead_letters: int = 0
    newest_timestamp_us: int | None = None
    freshness: Freshness | None = None
    changelog_ends: dict[int, int] | None = field(default_factory=dict)
    """Per changelog partition it wrote, the next offset after its last record there, from
    the delivery reports; ``None``: unknown (a delivery came back without its offset)."""
    truncate: str | None = None
    """The order of its last truncate (``redis.truncate``); None: it had none."""

    def __add__(self, other: Applied) -> Applied:
        stamps = [t for t in (self.newest_timestamp_us, other.newest_timestamp_us) if t is not None]
        return Applied(
            self.keys + other.keys,
            self.dead_letters + other.dead_letters,
            max(stamps, default=None),
            add_freshness(self.freshness, other.freshness),
            further(self.changelog_ends, other.changelog_ends),
            max((t for t in (self.truncate, other.truncate) if t is not None), default=None),
        )

    def to_row(self) -> dict[str, list[Any]]:
        """The one row of counts an executor task sends back (``COUNTS``)."""
        counts, sum_us, max_us = (
            (None, None, None) if self.freshness is None else self.freshness.to_row()
        )
        ends = self.changelog_ends
        return {
            "keys": [self.keys],
            "dead_letters": [self.dead_letters],
            "newest_timestamp_us": [self.newest_timestamp_us],
            "freshness_counts": [counts],
            "freshness_sum_us": [sum_us],
            "freshness_max_us": [max_us],
            "changelog_partitions": [None if ends is None else list(ends)],
            "changelog_ends": [None if ends is None else list(ends.values())],
            "truncate": [self.truncate],
        }

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Applied:
        """``to_row``'s row back, as Spark collected it."""
        return cls(
            row["keys"],
            row["dead_letters"],
            row["newest_timestamp_us"],
            Freshness.from_row(
                row["freshness_counts"], row["freshness_sum_us"], row["freshness_max_us"]
            ),
            None
            if row["changelog_partitions"] is None
            else dict(zip(row["changelog_partitions"], row["changelog_ends"], strict=True)),
            row["truncate"],
        )


def further(a: Mapping[int, int] | None, b: Mapping[int, int] | None) -> dict[int, int] | None:
    """Per partition, the further of two sets of next offsets; ``None`` if either is unknown."""
    return None if a is None or b is None else furthest(a, b)


def furthest(a: Mapping[int, int], b: Mapping[int, int]) -> dict[int, int]:
    """Per partition, the further of two sets of next offsets."""
    out = dict(a)
    for partition, end in b.items():
        if end > out.get(partition, 0):
            out[partition] = end
    return out


def apply_batches(
    target: FoldTarget,
    batch_id: int,
    app_id: str,
    batches: Iterable[pa.RecordBatch],
    producer: Producer,
    batch_time_ms: int | None = None,
) -> Applied:
    """Apply a batch's records (or one partition of them); see the module docstring.

    Runs on the driver or an executor, on the columns ``RedisFold.arrow_columns`` selects.
    ``batch_time_ms``: the batch's timestamp, for a mode whose order has it in it.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    chunks = list(batches)
    table = pa.Table.from_batches(chunks) if chunks else arrow_schema().empty_table()
    table, truncate = split(table)
    deliveries = Deliveries(producer, target)
    try:
        letters = 0
        if target.dead_letter_topic is not None:
            letters = _send_dead_letters(deliveries, target.dead_letter_topic, table)
        headers = [(BATCH_HEADER, str(batch_id).encode()), (APP_HEADER, app_id.encode())]
        writer = Writer(target, batch_id)
        # Every chunk in Redis before the first changelog record: a batch that fails on the
        # way (a server that lost the map's copy) leaves nothing in the changelog, so the
        # copy restored from it is the last whole batch's, which the replay then folds on.
        if target.folder is None:
            states = list(writer.latest(_winners(table)))
        else:
            states = list(writer.fold(target.folder, _events(table, batch_time_ms)))
        if truncate is not None:
            states += delete_all(writer, truncate, batch_time_ms)
        landed_us = time.time_ns() // 1000
        keys = 0
        for key, state in states:
            deliveries.send(target.changelog_topic, key.encode(), state, headers)
            keys += 1
    except BaseException:
        deliveries.abort()
        raise
    deliveries.flush()
    stamps = _folded_timestamps(table)
    newest = pc.max(stamps).as_py()
    return Applied(
        keys=keys,
        dead_letters=letters,
        newest_timestamp_us=None if newest is None else int(newest),
        freshness=Freshness.of(stamps.to_numpy(), landed_us),
        changelog_ends=(
            dict(deliveries.ends.get(target.changelog_topic, {})) if deliveries.ends_known else None
        ),
        truncate=truncate,
    )


def _folded_timestamps(table: pa.Table) -> pa.ChunkedArray:
    """The Kafka timestamps of the records that fold (a failed one has no order)."""
    import pyarrow.compute as pc

    return pc.filter(table[TIMESTAMP_US], pc.is_valid(table[ORDER])).drop_null()


def _winners(table: pa.Table) -> list[tuple[str, tuple[str, bytes | None]]]:
    """Each key's record with the greatest order, picked in Arrow: Python touches one row
    per key, not one per record."""
    import pyarrow.compute as pc

    folding = table.filter(pc.is_valid(table[ORDER])).select([c.KEY, ORDER, VALUE])
    best = folding.group_by(c.KEY, use_threads=False).aggregate([(ORDER, "max")])
    winners = folding.join(
        best, keys=[c.KEY, ORDER], right_keys=[c.KEY, f"{ORDER}_max"], join_type="inner"
    )
    orders_values = zip(winners[ORDER].to_pylist(), winners[VALUE].to_pylist(), strict=True)
    return list(zip(winners[c.KEY].to_pylist(), orders_values, strict=True))


def _events(table: pa.Table, batch_time_ms: int | None) -> list[tuple[str, list[Event]]]:
    """Each key's events in order (with the batch's time in it when given): sorted in
    Arrow, grouped in one pass."""
    import pyarrow.compute as pc

    folding = table.filter(pc.is_valid(table[ORDER]))
    if batch_time_ms is not None:
        orders = with_batch_time(folding[ORDER], batch_time_ms)
        folding = folding.set_column(folding.schema.get_field_index(ORDER), ORDER, orders)
    folding = folding.take(pc.sort_indices(folding, [(c.KEY, "ascending"), (ORDER, "ascending")]))
    out: list[tuple[str, list[Event]]] = []
    last: str | None = None
    events: list[Event] = []
    for key, order, value, aux in zip(
        folding[c.KEY].to_pylist(),
        folding[ORDER].to_pylist(),
        folding[VALUE].to_pylist(),
        folding[AUX].to_pylist(),
        strict=True,
    ):
        if key != last:
            events = []
            out.append((key, events))
            last = key
        events.append((order, value, aux))
    return out


def _send_dead_letters(deliveries: Deliveries, topic: str, table: pa.Table) -> int:
    """The failed records, each with its own headers and the error's; how many."""
    import pyarrow.compute as pc

    failed = table.filter(pc.is_valid(table[LETTER_HEADERS]))
    for key, value, headers in zip(
        failed[LETTER_KEY].to_pylist(),
        failed[LETTER_VALUE].to_pylist(),
        failed[LETTER_HEADERS].to_pylist(),
        strict=True,
    ):
        # A header whose value is null has no "value" member in the JSON.
        pairs = [
            (h["key"], None if h.get("value") is None else base64.b64decode(h["value"]))
            for h in orjson.loads(headers)
        ]
        deliveries.send(topic, key, value, pairs)
    return int(failed.num_rows)


def apply_partition(
    target: FoldTarget,
    batch_id: int,
    app_id: str,
    batch_time_ms: int | None,
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """Executor side of ``apply_batches``: one row of counts per partition."""
    import pyarrow as pa
    from pyspark import TaskContext

    # A large batch's task: a producer of its own costs little against its records.
    context = TaskContext.get()
    producer = new_producer(target, None if context is None else context.partitionId())
    done = apply_batches(target, batch_id, app_id, batches, producer, batch_time_ms)
    yield pa.RecordBatch.from_pydict(done.to_row(), schema=counts_schema())


COUNTS = (
    "keys",
    "dead_letters",
    "newest_timestamp_us",
    "freshness_counts",
    "freshness_sum_us",
    "freshness_max_us",
    "changelog_partitions",
    "changelog_ends",
    "truncate",
)
"""The row of counts each executor task of a large batch returns (``Applied.to_row``):
integers; ``freshness_counts``, ``changelog_partitions`` and ``changelog_ends`` lists of them;
``truncate`` text."""


_LISTS = ("freshness_counts", "changelog_partitions", "changelog_ends")


def counts_schema() -> pa.Schema:
    """``COUNTS`` as Arrow types, which Spark's ``mapInArrow`` is declared with too."""
    import pyarrow as pa

    def kind(name: str) -> pa.DataType:
        if name == "truncate":
            return pa.string()
        return pa.list_(pa.int64()) if name in _LISTS else pa.int64()

    return pa.schema([(n, kind(n)) for n in COUNTS])
