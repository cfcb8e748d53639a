"""A map's fold in Redis as its query's first sink: Redis Functions, as Hazelcast applies an entry
processor to an IMap entry.

A map's fold query (``materializer.job``) does it all. Spark reads, decodes, transforms and keys
each micro-batch without any state of its own (``materializer.fold.base``
says what each mode computes per record); then one function takes the
batch's events as Arrow batches and, in a single pass:

- sends the records that fail to the dead-letter topic;
- applies each key's events of the batch to its entity in Redis, a chunk of
  keys per ``FCALL``, atomically per call;
- writes each touched entity's state after the call to the changelog topic.

A small batch (the live case) runs that function on the driver after one
Arrow collect: waking a Python worker per Kafka partition costs more than the
whole batch. A large one (a backlog) runs it on the executors, in parallel,
each key in one task.

``latest``: the entity becomes the winning record (a delete removes it), and
the winner's *order* is kept beside it under ``state_key``; the batch's
winner per key is picked in Arrow and Redis compares it with the stored order.
Why a replay is safe: a record already applied has an order no greater than
the one stored with its entity, so the function leaves the entity alone the
second time, whatever crashed in between, and writes no second change entry.

``merge`` and ``aggregate``: the fold's state per key (JSON) is kept under
``state_key``. Python reads the states (one ``MGET`` a chunk; on a cluster the
read function, with the entities) and an entity where it needs one, folds
each key's events into its state (``KeyFolder``), and writes the states
and entities whose state changed, each only if its state is still the one
read (another writer's change makes Python read and fold that key again).
Why a replay is safe: the mode's state recognises events it has folded (see
its module), so a replay folds to the same state and nothing is written.

Either way, the changelog gets each key's state *after* the call, applied or
not, so it gets the state even when the first attempt's write was lost; a
changelog record repeated with the same or a later state changes nothing for
its readers, who keep the last one per key.

Change entries (``<map>:__changes__``): on one server the functions append
them themselves, in the same atomic call as the entities they announce. On a
Redis Cluster the stream lives on one master: each master's chunk is applied
there (a state key has its entity's hash slot), and its applied keys'
entries follow in one transaction on the stream, so a crash between the two
can drop that chunk's entries; the watermark still tells a reader how far
the map is.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from materializer import record_columns as c
from materializer.batch import Batch, Sink
from materializer.config import FoldConfig
from materializer.fold.base import FoldMode
from materializer.fold.modes import fold_mode
from materializer.redis.apply import Applied, apply_batches, apply_partition, counts_schema
from materializer.redis.changelog_ends import ChangelogEnds
from materializer.redis.deliveries import new_producer
from materializer.redis.expiry import ExpirySweeper, sweep_expired
from materializer.redis.functions import FoldTarget
from materializer.redis.prepare import (
    AUX,
    LETTER_HEADERS,
    LETTER_KEY,
    LETTER_VALUE,
    ORDER,
    TIMESTAMP_US,
    VALUE,
)
from materializer.redis.truncate import alone
from materializer.source.dead_letters import dead_letter_columns

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from confluent_kafka import Producer
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructType

    from materializer.fold.entity_types import EntityTyper


DRIVER_ROWS = 10_000
"""Batches of up to this many records are applied on the driver, larger ones on the
executors: a Python worker per partition costs a small batch more than the driver's one
Arrow collect does, while a large batch gains from being applied in parallel
(docs/decisions/0002-small-batches-applied-on-the-driver.md)."""


class RedisFold:
    """A batch's records folded in Redis, its changelog and dead letters: one step.

    ``typer`` types a schemaless JSON map's documents first, so that Redis
    holds the typed entity. With ``on_error: fail`` the first bad record fails
    the batch before anything is applied.
    """

    def __init__(
        self,
        target: FoldTarget,
        fold: FoldConfig,
        *,
        fail_on_error: bool = False,
        typer: EntityTyper | None = None,
        spread_keys: bool = True,
    ) -> None:
        """``spread_keys=False``: a key's records all sit in one Kafka partition (the map is
        keyed by the Kafka key of one topic), so a large batch needs no shuffle by key."""
        self.target = target
        self.mode: FoldMode = fold_mode(fold)
        self.fail_on_error = fail_on_error
        self.typer = typer
        self.spread_keys = spread_keys
        self._producer: Producer | None = None
        self._columns: list[Column] | None = None
        self._lock = threading.Lock()
        """Held by a batch and by an expiry sweep: their changelog records never interleave
        (``materializer.redis.expiry``)."""

    def sweep(self) -> int:
        """Send the keys Redis expired to the change stream and the changelog (see
        ``materializer.redis.expiry``); how many."""
        with self._lock, self._dropped_on_failure():
            if self._producer is None:
                self._producer = new_producer(self.target)
            return sweep_expired(self.target, self._producer)

    def close(self) -> None:
        """Release the driver's producer once the query has stopped."""
        with self._lock:
            if self._producer is not None:
                self._producer.flush(30)
                self._producer = None

    def events(self, records: DataFrame) -> DataFrame:
        """Every record with ``__entity`` (the fold mode's, null for a delete or a record
        that failed), ``__order`` (null for a record that failed) and ``__aux``: the map's
        query computes them in its plan, so each batch comes with them. Fixes the mode's
        ``KeyFolder`` for these records' fields."""
        from pyspark.sql import functions as F

        from materializer.source.dead_letters import fail_on_error

        if self.fail_on_error:
            records = fail_on_error(records)
        folds = F.col(c.ERROR_STAGE).isNull()
        with_shared, shared = self.mode.shared(records)
        aux = self.mode.aux(with_shared)
        self.target = replace(self.target, folder=self.mode.folder(records))
        return with_shared.select(
            "*",
            F.when(folds & ~F.col(c.DELETED), self.mode.entity(records)).alias(c.ENTITY),
            F.when(folds, self.mode.order(records)).alias(ORDER),
            (F.lit(None).cast("string") if aux is None else F.when(folds, aux)).alias(AUX),
        ).drop(*shared)

    def entity_type(self, records: DataFrame) -> StructType:
        """The entity's struct (a schemaless map's: its document); checks the fold's config."""
        return self.mode.entity_type(records)

    def arrow_columns(self, events: DataFrame, keep: Sequence[str] = ()) -> DataFrame:
        """The columns ``apply_batches`` reads from a batch of ``events``, computed in the JVM,
        after the columns of ``events`` named in ``keep``.

        The expressions are built once: building them costs more py4j round trips
        than a small batch takes to compute.
        """
        from pyspark.sql import functions as F

        if self.typer is not None:
            events = self.typer.typed(events)
        if self._columns is None:
            failed = F.col(c.ERROR_STAGE).isNotNull()
            key, value, headers = dead_letter_columns()
            self._columns = [
                F.col(c.KEY),
                F.col(ORDER),
                self.mode.payload(F.col(c.ENTITY)).cast("binary").alias(VALUE),
                F.col(AUX),
                F.unix_micros(F.col(c.TIMESTAMP)).alias(TIMESTAMP_US),
                F.when(failed, key).alias(LETTER_KEY),
                F.when(failed, value).alias(LETTER_VALUE),
                # As JSON text: an Arrow column of nested headers costs the whole batch
                # several times more to hand over than flat ones, even when all null.
                F.when(failed, F.to_json(headers)).alias(LETTER_HEADERS),
            ]
        return events.select(*[F.col(name) for name in keep], *self._columns)

    def apply(
        self,
        events: DataFrame,
        batch_id: int,
        app_id: str,
        rows: int | None,
        batch_time_ms: int | None = None,
    ) -> Applied:
        """Apply one batch of ``events``: on the driver when it has at most ``DRIVER_ROWS``.
        ``batch_time_ms``: the batch's timestamp, which a mode with ``batch_in_order`` needs."""
        if self.mode.batch_in_order and batch_time_ms is None:
            raise ValueError(f"map {self.target.map_name}: the fold's order needs the batch's time")
        with self._lock, self._dropped_on_failure():
            return self._apply(events, batch_id, app_id, rows, batch_time_ms)

    @contextlib.contextmanager
    def _dropped_on_failure(self) -> Iterator[None]:
        """A call that failed drops the driver's producer: a transactional one may be left
        in a state no later transaction begins from; the next call makes another."""
        try:
            yield
        except BaseException:
            self._producer = None
            raise

    def _apply(
        self,
        events: DataFrame,
        batch_id: int,
        app_id: str,
        rows: int | None,
        batch_time_ms: int | None,
    ) -> Applied:
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import from_arrow_schema

        columns = self.arrow_columns(events)
        if rows is not None and rows <= DRIVER_ROWS:
            if self._producer is None:
                self._producer = new_producer(self.target)
            batches = columns.toArrow().to_batches()
            return apply_batches(
                self.target, batch_id, app_id, batches, self._producer, batch_time_ms
            )
        if self.spread_keys:
            # Two tasks applying one key would race to the changelog: the Delta table
            # could keep the older state. One task per key keeps its records in order.
            columns = columns.repartition(F.col(c.KEY))
        counts = columns.mapInArrow(
            functools.partial(apply_partition, self.target, batch_id, app_id, batch_time_ms),
            from_arrow_schema(counts_schema()),
        ).collect()
        total = Applied()
        for row in counts:
            total += Applied.from_row(row.asDict())
        if total.truncate is not None:
            # Again once every task is done: a task's pass missed what others wrote after it.
            if self._producer is None:
                self._producer = new_producer(self.target)
            batch = alone(total.truncate).to_batches()
            again = apply_batches(
                self.target, batch_id, app_id, batch, self._producer, batch_time_ms
            )
            total = total + again
        return total


class RedisFoldSink(Sink):
    """The fold of a map folded in Redis, first among its query's sinks (``RedisFold``).

    Its rows out are the keys the batch touched; later sinks (the watermark,
    the group offsets) see the batch once it is applied.
    """

    name = "fold"

    def __init__(
        self,
        fold: RedisFold,
        end_offsets: Callable[[int], dict[str, dict[int, int]]],
        batch_time: Callable[[int], int],
        on_applied: Callable[[Applied], None] | None = None,
        changelog_ends: ChangelogEnds | None = None,
    ) -> None:
        """``batch_time``: a batch's timestamp as Spark keeps it (``Checkpoint.batch_time_ms``).
        ``on_applied`` hears what each batch did once Redis holds it (the metrics).
        ``changelog_ends`` follows where the changelog ends after each batch, for its
        table mark (``changelog_ends``)."""
        self.fold = fold
        self._end_offsets = end_offsets
        self._batch_time = batch_time
        self._on_applied = on_applied
        self._last: Applied | None = None
        self._ends = changelog_ends
        self._last_ends: tuple[int, dict[int, int] | None] | None = None
        self._sweeper = (
            None if fold.target.ttl_ms is None else ExpirySweeper(fold.target.map_name, fold.sweep)
        )

    def write(self, batch: Batch) -> None:
        """Apply the batch's records (``Batch.records``)."""
        if batch.records is None:
            raise ValueError("the fold in Redis needs the batch's records")
        rows = records_in(self._end_offsets, batch.batch_id)
        time_ms = self._batch_time(batch.batch_id) if self.fold.mode.batch_in_order else None
        self._last_ends = None
        self._last = self.fold.apply(batch.records, batch.batch_id, batch.app_id, rows, time_ms)
        if self._ends is not None:
            self._last_ends = (batch.batch_id, self._ends.after(self._last))
        if self._on_applied is not None:
            self._on_applied(self._last)

    def changelog_ends(self, batch_id: int) -> dict[int, int] | None:
        """Per changelog partition, a next offset past every record of ``batch_id`` and the
        batches before it, once this sink wrote that batch; ``None`` when unknown."""
        if self._last_ends is None or self._last_ends[0] != batch_id:
            return None
        return self._last_ends[1]

    def rows_out(self) -> int | None:
        """Keys the last batch touched."""
        return None if self._last is None else self._last.keys

    def close(self) -> None:
        """Stop the expiry sweeps and release the fold's producer and admin client."""
        if self._sweeper is not None:
            self._sweeper.stop()
        if self._ends is not None:
            self._ends.close()
        self.fold.close()


def records_in(
    end_offsets: Callable[[int], dict[str, dict[int, int]]], batch_id: int
) -> int | None:
    """How many records a batch holds, from its offsets and its predecessor's; None: unknown."""
    if batch_id == 0:
        return None
    try:
        before = end_offsets(batch_id - 1)
    except Exception:  # noqa: BLE001 - an offsets file already purged: the size is unknown
        return None
    total = 0
    for topic, partitions in end_offsets(batch_id).items():
        for partition, end in partitions.items():
            total += end - before.get(topic, {}).get(partition, 0)
    return total
