"""The fold applied where the map lives: Redis Functions, as Hazelcast applies an entry
processor to an IMap entry.

A map runs one streaming query. Spark reads, decodes, transforms and keys
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

import base64
import functools
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar, cast

import orjson

from materializer import record_columns as c
from materializer.batch import Batch, Sink
from materializer.clients.kafka import librdkafka
from materializer.clients.redis import per_master
from materializer.config import FoldConfig, KafkaConfig, RedisConfig
from materializer.contract.changelog import APP_HEADER, BATCH_HEADER
from materializer.contract.markers import markers
from materializer.contract.redis_layout import (
    changes_key,
    entity_key,
    expiry_index_key,
)
from materializer.fold.base import Event, FoldMode, KeyFolder, with_batch_time
from materializer.fold.modes import fold_mode
from materializer.redis.expiry import ExpirySweeper, index_expiring, sweep_expired
from materializer.redis.functions import (
    FILL,
    FIXED_ARGS,
    LATEST,
    PUT,
    READ,
    Deliveries,
    FoldTarget,
    call_function,
    chunks_by_master,
    new_producer,
    state_key,
)
from materializer.redis.watermark import client_for
from materializer.source.dead_letters import dead_letter_columns

if TYPE_CHECKING:
    from collections.abc import Callable

    import pyarrow as pa
    from confluent_kafka import Producer
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructType

    from materializer.source.formats.batch_typing import EntityTyper


DRIVER_ROWS = 10_000
"""Batches of up to this many records are applied on the driver, larger ones on the
executors: a Python worker per partition costs ~0.1 s a task, the driver ~46 µs a record
(``bench/fold_spike.py``, docs/fold-design.md)."""

ORDER = "__order"
_VALUE = "__value"
_AUX = "__aux"
_TIMESTAMP_US = "__timestamp_us"
"""The record's Kafka timestamp in microseconds: the batch's newest folded one is its age."""
_LETTER_KEY, _LETTER_VALUE, _LETTER_HEADERS = "__dl_key", "__dl_value", "__dl_headers"
"""A failed record's key, value and headers (its own, then the error's, as a JSON array of
``{"key": ..., "value": <base64>}``); null for the others."""


def _arrow_schema() -> pa.Schema:
    """The columns ``RedisFold.arrow_columns`` hands over (a batch with none has no schema)."""
    import pyarrow as pa

    return pa.schema(
        [
            (c.KEY, pa.string()),
            (ORDER, pa.string()),
            (_VALUE, pa.binary()),
            (_AUX, pa.string()),
            (_TIMESTAMP_US, pa.int64()),
            (_LETTER_KEY, pa.binary()),
            (_LETTER_VALUE, pa.binary()),
            (_LETTER_HEADERS, pa.string()),
        ]
    )


@dataclass(frozen=True)
class Applied:
    """What one batch did: keys it touched (their states went to the changelog), dead letters,
    and the newest Kafka timestamp it folded (microseconds; None: it folded nothing).

    The fold counts these on the Arrow rows it already holds: Spark's ``observe`` would
    count them too, but its per-record accumulator sits outside the generated code and
    cost a 1M-record backlog 0.55-0.65 s (bench/latest_bulk_spike.py)."""

    keys: int = 0
    dead_letters: int = 0
    newest_timestamp_us: int | None = None

    def __add__(self, other: Applied) -> Applied:
        stamps = [t for t in (self.newest_timestamp_us, other.newest_timestamp_us) if t is not None]
        newest = max(stamps, default=None)
        return Applied(self.keys + other.keys, self.dead_letters + other.dead_letters, newest)


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

    deliveries = Deliveries(producer)
    chunks = list(batches)
    table = pa.Table.from_batches(chunks) if chunks else _arrow_schema().empty_table()
    letters = 0
    if target.dead_letter_topic is not None:
        letters = _send_dead_letters(deliveries, target.dead_letter_topic, table)
    headers = [(BATCH_HEADER, str(batch_id).encode()), (APP_HEADER, app_id.encode())]
    writer = _Writer(target, batch_id)
    # Every chunk in Redis before the first changelog record: a batch that fails on the
    # way (a server that lost the map's copy) leaves nothing in the changelog, so the
    # copy restored from it is the last whole batch's, which the replay then folds on.
    if target.folder is None:
        states = list(writer.latest(_winners(table)))
    else:
        states = list(writer.fold(target.folder, _events(table, batch_time_ms)))
    keys = 0
    for key, state in states:
        deliveries.send(target.changelog_topic, key.encode(), state, headers)
        keys += 1
    deliveries.flush()
    return Applied(keys=keys, dead_letters=letters, newest_timestamp_us=_newest(table))


def _newest(table: pa.Table) -> int | None:
    """The newest Kafka timestamp of the records that fold (a failed one has no order)."""
    import pyarrow.compute as pc

    newest = pc.max(pc.filter(table[_TIMESTAMP_US], pc.is_valid(table[ORDER]))).as_py()
    return None if newest is None else int(newest)


def _winners(table: pa.Table) -> list[tuple[str, tuple[str, bytes | None]]]:
    """Each key's record with the greatest order, picked in Arrow: Python touches one row
    per key, not one per record."""
    import pyarrow.compute as pc

    folding = table.filter(pc.is_valid(table[ORDER])).select([c.KEY, ORDER, _VALUE])
    best = folding.group_by(c.KEY, use_threads=False).aggregate([(ORDER, "max")])
    winners = folding.join(
        best, keys=[c.KEY, ORDER], right_keys=[c.KEY, f"{ORDER}_max"], join_type="inner"
    )
    orders_values = zip(winners[ORDER].to_pylist(), winners[_VALUE].to_pylist(), strict=True)
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
        folding[_VALUE].to_pylist(),
        folding[_AUX].to_pylist(),
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

    failed = table.filter(pc.is_valid(table[_LETTER_HEADERS]))
    for key, value, headers in zip(
        failed[_LETTER_KEY].to_pylist(),
        failed[_LETTER_VALUE].to_pylist(),
        failed[_LETTER_HEADERS].to_pylist(),
        strict=True,
    ):
        # A header whose value is null has no "value" member in the JSON.
        pairs = [
            (h["key"], None if h.get("value") is None else base64.b64decode(h["value"]))
            for h in orjson.loads(headers)
        ]
        deliveries.send(topic, key, value, pairs)
    return int(failed.num_rows)


_T = TypeVar("_T")

CONFLICT_ROUNDS = 10
"""How often a key is folded again because another writer changed its state first."""


def fill(
    config: RedisConfig, map_name: str, entities: list[tuple[str, tuple[bytes, int | None]]]
) -> int:
    """Write the entities (key, (JSON, PX milliseconds or None)) a server lost: each only
    where neither it nor its fold state is (``FILL``); how many were written."""
    client = client_for(config)
    written = 0
    for node, chunk in chunks_by_master(client, map_name, entities):
        args: list[bytes] = []
        for key, (value, px) in chunk:
            args += [entity_key(map_name, key).encode(), state_key(map_name, key), value]
            args.append(b"" if px is None else str(px).encode())
        options = {} if node is None else {"target_nodes": node}
        written += int(client.execute_command("FCALL", FILL, 1, args[0], *args, **options))  # type: ignore[no-untyped-call]
    expiring = [(key, px) for key, (_, px) in entities if px is not None]
    if expiring:
        keys, left = zip(*expiring, strict=True)
        index_expiring(client, map_name, list(keys), list(left))
    return written


class _Writer:
    """A batch's calls to Redis: chunks of keys, each sent to the master holding them."""

    def __init__(self, target: FoldTarget, batch_id: int) -> None:
        from redis.cluster import RedisCluster

        self.target = target
        self.batch_id = batch_id
        self.client = client_for(target.redis)
        self.cluster = isinstance(self.client, RedisCluster)
        self.stream = changes_key(target.map_name).encode()
        prefix = len(entity_key(target.map_name, "").encode())
        # The writing functions' first arguments; a cluster appends changes itself.
        self.fixed = [
            b"" if self.cluster else self.stream,
            b"" if target.ttl_ms is None else str(target.ttl_ms).encode(),
            str(batch_id).encode(),
            str(target.changes_max_len).encode(),
            str(prefix).encode(),
        ]
        self.markers = markers(self.client, target.map_name)
        self.indexes = (
            {}
            if target.ttl_ms is None
            else per_master(self.client, target.map_name, expiry_index_key)
        )

    def _fixed(self, node: Any) -> list[bytes]:
        """The writing functions' first arguments on ``node``: its marker, how long a
        deleted entity's state stays, its expiry index."""
        name = "" if node is None else node.name
        marker = self.markers[name].encode()
        index = self.indexes.get(name, "").encode()
        return [*self.fixed, marker, str(self.target.deleted_retention_ms).encode(), index]

    def _chunks(self, items: list[tuple[str, _T]]) -> Iterator[tuple[Any, list[tuple[str, _T]]]]:
        return chunks_by_master(self.client, self.target.map_name, items)

    def call(self, function: str, route: bytes, args: list[bytes], node: Any) -> list[Any]:
        """``call_function`` on this batch's client."""
        return call_function(self.client, self.target, function, route, args, node)

    def latest(
        self, winners: list[tuple[str, tuple[str, bytes | None]]]
    ) -> Iterator[tuple[str, bytes | None]]:
        """Apply each key's winning record; each key with its state after the call."""
        name = self.target.map_name
        for node, chunk in self._chunks(winners):
            args = self._fixed(node)
            for key, (order, value) in chunk:
                args += [entity_key(name, key).encode(), state_key(name, key), order.encode()]
                args.append(b"" if value is None else value)
            answers = self.call(LATEST, args[FIXED_ARGS], args, node)
            states = [
                (key, value if answer == 1 else answer)
                for (key, (_, value)), answer in zip(chunk, answers, strict=True)
            ]
            applied = [kv for kv, answer in zip(states, answers, strict=True) if answer == 1]
            self._append_changes(applied)
            yield from states

    def fold(
        self, folder: KeyFolder, keyed: list[tuple[str, list[Event]]]
    ) -> Iterator[tuple[str, bytes | None]]:
        """Fold each key's events into its state read from Redis and write what changed."""
        name = self.target.map_name
        for node, chunk in self._chunks(keyed):
            pending = chunk
            for _ in range(CONFLICT_ROUNDS):
                read = self._read([key for key, _ in pending], node)
                writes: list[tuple[str, bytes | None]] = []
                put = self._fixed(node)
                retry = []
                unchanged = []
                for (key, events), (before, current) in zip(pending, read, strict=True):
                    start = before
                    if before is None and current is not None:
                        start = folder.seed(current)  # restored, or from an earlier version
                    state, value = folder(start, events)
                    if state == before:
                        unchanged.append((key, current))  # applied before
                        continue
                    put += [entity_key(name, key).encode(), state_key(name, key)]
                    put += [before or b"", state, b"" if value is None else value]
                    writes.append((key, value))
                    retry.append((key, events))
                # Their entities go to the changelog as Redis has them.
                yield from self._entities(unchanged)
                if not writes:
                    break
                answers = self.call(PUT, put[FIXED_ARGS], put, node)
                applied = [kv for kv, answer in zip(writes, answers, strict=True) if answer == 1]
                self._append_changes(applied)
                yield from applied
                pending = [kv for kv, answer in zip(retry, answers, strict=True) if answer != 1]
                if not pending:
                    break
            else:
                keys = ", ".join(key for key, _ in pending[:3])
                raise RuntimeError(
                    f"map {name}: another writer kept changing the fold state of {keys}"
                )

    def _read(self, keys: list[str], node: Any) -> list[tuple[bytes | None, bytes | None]]:
        """Each key's fold state, and its entity where the fold needs it to seed a state
        (a key without one); elsewhere the entity may be None and not read.

        On one server: an ``MGET`` of the states, then of the entities of the keys
        without one (a key's first event, or an entity restored without its state).
        The read function costs Redis ~6 µs a key and this process ~8, an ``MGET`` of
        the states ~1 and ~3 (bench/fold_read_spike.py); the fold needs a key's entity
        only to seed its state, or to send it to the changelog when its events change
        nothing (a replay), and reads it then. On a cluster a chunk's keys span slots,
        which ``MGET`` refuses: the function reads states and entities together.
        """
        name = self.target.map_name
        if self.cluster:
            args: list[bytes] = []
            for key in keys:
                args += [state_key(name, key), entity_key(name, key).encode()]
            read = self.call(READ, args[1], args, node)
            return list(zip(read[::2], read[1::2], strict=True))
        # The client answers bytes: it never decodes responses.
        states = cast("list[bytes | None]", self.client.mget([state_key(name, k) for k in keys]))
        entities: list[bytes | None] = [None] * len(keys)
        missing = [i for i, state in enumerate(states) if state is None]
        if missing:
            wanted = [entity_key(name, keys[i]) for i in missing]
            found = cast("list[bytes | None]", self.client.mget(wanted))
            for i, entity in zip(missing, found, strict=True):
                entities[i] = entity
        return list(zip(states, entities, strict=True))

    def _entities(
        self, unchanged: list[tuple[str, bytes | None]]
    ) -> list[tuple[str, bytes | None]]:
        """The keys whose events changed their states in nothing (a replay), each with its
        entity as Redis holds it: on one server read now, since ``_read`` reads the
        entities of keys without a state only."""
        if self.cluster or not unchanged:
            return unchanged
        name = self.target.map_name
        wanted = [entity_key(name, key) for key, _ in unchanged]
        found = cast("list[bytes | None]", self.client.mget(wanted))
        return [(key, entity) for (key, _), entity in zip(unchanged, found, strict=True)]

    def _append_changes(self, applied: list[tuple[str, bytes | None]]) -> None:
        """A cluster's change entries for the keys a chunk applied, in one transaction (on one
        server the functions append them)."""
        if not self.cluster or not applied:
            return
        with self.client.pipeline(transaction=True) as pipe:
            for key, value in applied:
                entry: dict[Any, Any] = {"key": key, "op": "delete" if value is None else "upsert"}
                entry["batch_id"] = str(self.batch_id)
                pipe.xadd(self.stream, entry, maxlen=self.target.changes_max_len, approximate=True)
            pipe.execute()


def _apply_partition(
    target: FoldTarget,
    batch_id: int,
    app_id: str,
    batch_time_ms: int | None,
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """Executor side of ``apply_batches``: one row of counts per partition."""
    import pyarrow as pa

    # A large batch's task: a producer of its own costs little against its records.
    producer = new_producer(target)
    done = apply_batches(target, batch_id, app_id, batches, producer, batch_time_ms)
    yield pa.RecordBatch.from_pydict(
        {
            "keys": [done.keys],
            "dead_letters": [done.dead_letters],
            "newest_timestamp_us": [done.newest_timestamp_us],
        },
        schema=pa.schema([(name, pa.int64()) for name in _COUNTS]),
    )


_COUNTS = ("keys", "dead_letters", "newest_timestamp_us")
"""The row of counts each executor task of a large batch returns (``Applied``)."""


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
        with self._lock:
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
            (F.lit(None).cast("string") if aux is None else F.when(folds, aux)).alias(_AUX),
        ).drop(*shared)

    def entity_type(self, records: DataFrame) -> StructType:
        """The entity's struct (a schemaless map's: its document); checks the fold's config."""
        return self.mode.entity_type(records)

    def arrow_columns(self, events: DataFrame) -> DataFrame:
        """The columns ``apply_batches`` reads from a batch of ``events``, computed in the JVM.

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
                self.mode.payload(F.col(c.ENTITY)).cast("binary").alias(_VALUE),
                F.col(_AUX),
                F.unix_micros(F.col(c.TIMESTAMP)).alias(_TIMESTAMP_US),
                F.when(failed, key).alias(_LETTER_KEY),
                F.when(failed, value).alias(_LETTER_VALUE),
                # As JSON text: an Arrow column of nested headers costs the whole batch
                # several times more to hand over than flat ones, even when all null.
                F.when(failed, F.to_json(headers)).alias(_LETTER_HEADERS),
            ]
        return events.select(*self._columns)

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
        with self._lock:
            return self._apply(events, batch_id, app_id, rows, batch_time_ms)

    def _apply(
        self,
        events: DataFrame,
        batch_id: int,
        app_id: str,
        rows: int | None,
        batch_time_ms: int | None,
    ) -> Applied:
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

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
            functools.partial(_apply_partition, self.target, batch_id, app_id, batch_time_ms),
            T.StructType([T.StructField(name, T.LongType()) for name in _COUNTS]),
        ).collect()
        total = Applied()
        for row in counts:
            total += Applied(*(row[name] for name in _COUNTS))
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
    ) -> None:
        """``batch_time``: a batch's timestamp as Spark keeps it (``Checkpoint.batch_time_ms``).
        ``on_applied`` hears what each batch did once Redis holds it (the metrics)."""
        self.fold = fold
        self._end_offsets = end_offsets
        self._batch_time = batch_time
        self._on_applied = on_applied
        self._last: Applied | None = None
        self._sweeper = (
            None if fold.target.ttl_ms is None else ExpirySweeper(fold.target.map_name, fold.sweep)
        )

    def write(self, batch: Batch) -> None:
        """Apply the batch's records (``Batch.records``)."""
        if batch.records is None:
            raise ValueError("the fold in Redis needs the batch's records")
        rows = records_in(self._end_offsets, batch.batch_id)
        time_ms = self._batch_time(batch.batch_id) if self.fold.mode.batch_in_order else None
        self._last = self.fold.apply(batch.records, batch.batch_id, batch.app_id, rows, time_ms)
        if self._on_applied is not None:
            self._on_applied(self._last)

    def rows_out(self) -> int | None:
        """Keys the last batch touched."""
        return None if self._last is None else self._last.keys

    def close(self) -> None:
        """Stop the expiry sweeps and release the fold's producer."""
        if self._sweeper is not None:
            self._sweeper.stop()
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


def producer_settings(kafka: KafkaConfig, max_record_bytes: int) -> tuple[tuple[str, Any], ...]:
    """librdkafka settings for a map's own records: idempotent, and partitioned by key as
    Kafka's Java clients do (``murmur2``), so a key stays in the partition it always had."""
    settings = librdkafka(
        kafka,
        **{
            "enable.idempotence": "true",
            "acks": "all",
            "partitioner": "murmur2_random",
            "message.max.bytes": str(max_record_bytes),
            "linger.ms": "5",
        },
    )
    return tuple(sorted(settings.items()))
