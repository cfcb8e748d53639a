"""The fold applied where the map lives: a Redis Function per fold mode, as Hazelcast
applies an entry processor to an IMap entry.

A map folded here runs one streaming query. Spark reads, decodes, transforms
and keys each micro-batch without any state of its own; then one function
takes the batch's records as Arrow batches and, in a single pass:

- sends the records that fail to the dead-letter topic;
- pre-folds the rest per key (the greatest order wins) and applies each key's
  winner with ``FCALL``, a chunk of keys per call, atomically per call;
- writes each touched entity's state after the call to the changelog topic.

A small batch (the live case) runs that function on the driver after one
Arrow collect: waking a Python worker per Kafka partition costs more than the
whole batch. A large one (a backlog) runs it on the executors, in parallel.

``latest``: the entity becomes the winning record (a delete removes it), and
the winner's *order* is kept beside it under ``order_key``. Orders are byte
strings that compare as the fold orders its events: the event-time field
when declared, then partition and offset (``order_column``).

Why a replay is safe: a record already applied has an order no greater than
the one stored with its entity, so the function leaves the entity alone the
second time, whatever crashed in between, and writes no second change entry.
Its answer for every key is the entity's state *after* the call, applied or
not, so the changelog gets the state even when the first attempt's write was
lost; a changelog record repeated with the same or a later state changes
nothing for its readers, who keep the last one per key.

Change entries (``<map>:__changes__``): on one server the function appends
them itself, in the same atomic call as the entities they announce. On a
Redis Cluster the stream lives on one master: each master's chunk is applied
there (an order key has its entity's hash slot), and its applied keys'
entries follow in one transaction on the stream, so a crash between the two
can drop that chunk's entries; the watermark still tells a reader how far
the map is.
"""

from __future__ import annotations

import base64
import functools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from materializer.config import FoldConfig, RedisConfig
from materializer.errors import ConfigError
from materializer.layout import changes_key, entity_key
from materializer.pipeline import columns as c
from materializer.pipeline.dead_letter import dead_letter_columns
from materializer.sinks.base import Batch, Sink
from materializer.sinks.changelog import APP_HEADER, BATCH_HEADER
from materializer.sinks.encoding import entity_json
from materializer.sinks.redis import client_for

if TYPE_CHECKING:
    from collections.abc import Callable

    import pyarrow as pa
    from confluent_kafka import Producer
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType, StructType

    from materializer.pipeline.formats.batch_typing import EntityTyper

REDIS_FOLD_MODES = ("latest",)
"""The fold modes applied in Redis; the others still fold in Spark's state store."""

LIBRARY = "materializer"
LATEST = "materializer_latest_v1"

SOURCE = f"""#!lua name={LIBRARY}
-- Materializer's fold functions. Loaded with FUNCTION LOAD REPLACE at every start.
--
-- KEYS[1] is one entity key of the call, which routes it to its master on a cluster;
-- every key a call touches comes in ARGV, and lives on that master (the flag below).

-- Whether a sorts after b byte by byte: Lua's own '<' on strings follows the server's
-- locale (strcoll), the fold's orders follow bytes, as Spark compares strings.
local function after(a, b)
  if a == b then return false end
  local n = math.min(#a, #b)
  if string.sub(a, 1, n) == string.sub(b, 1, n) then return #a > #b end
  local lo, hi = 1, n
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if string.sub(a, 1, mid) == string.sub(b, 1, mid) then lo = mid + 1 else hi = mid end
  end
  return string.byte(a, lo) > string.byte(b, lo)
end

-- ARGV: the change stream ('' for none), PX milliseconds or '', batch id, stream
-- MAXLEN, the entity keys' prefix length, then per record its entity key, order
-- key, order and value ('' deletes). Returns per record 1 when applied, else the
-- entity's current value (false: none).
local function latest(keys, args)
  local stream, ttl, batch, maxlen = args[1], args[2], args[3], args[4]
  local prefix = tonumber(args[5])
  local out = {{}}
  for i = 0, (#args - 5) / 4 - 1 do
    local entity, order_key = args[6 + 4 * i], args[7 + 4 * i]
    local order, value = args[8 + 4 * i], args[9 + 4 * i]
    local current = redis.call('GET', order_key)
    if (not current) or after(order, current) then
      local op = 'upsert'
      if value == '' then
        redis.call('DEL', entity)
        op = 'delete'
      elseif ttl == '' then
        redis.call('SET', entity, value)
      else
        redis.call('SET', entity, value, 'PX', ttl)
      end
      if ttl == '' then
        redis.call('SET', order_key, order)
      else
        redis.call('SET', order_key, order, 'PX', ttl)
      end
      if stream ~= '' then
        redis.call('XADD', stream, 'MAXLEN', '~', maxlen, '*',
          'key', string.sub(entity, prefix + 1), 'op', op, 'batch_id', batch)
      end
      out[i + 1] = 1
    else
      out[i + 1] = redis.call('GET', entity)
    end
  end
  return out
end

redis.register_function{{function_name='{LATEST}', callback=latest,
  flags={{'allow-cross-slot-keys'}}}}
"""

CHUNK = 1000
"""Keys per ``FCALL``: enough to amortise the round trip, few enough not to hold up
Redis's other clients for long."""

DRIVER_ROWS = 10_000
"""Batches of up to this many records are applied on the driver, larger ones on the
executors: a Python worker per partition costs ~0.1 s a task, the driver ~46 µs a record
(``bench/fold_spike.py``, docs/fold-design.md)."""

ORDER = "__order"
_VALUE = "__value"
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
            (_LETTER_KEY, pa.binary()),
            (_LETTER_VALUE, pa.binary()),
            (_LETTER_HEADERS, pa.string()),
        ]
    )


ORDER_MARK = b"\x00o:"
"""Joins a map's physical name and the rest of an order key: no entity key holds it there."""


def order_key(map_name: str, key: str) -> bytes:
    """Where an entity's winning order is kept: ``<map>\\0o:`` and a hash tag of the entity
    key's slot, so the fold of one key touches one slot.

    An entity key without a hash tag hashes whole, so the order key tags it
    whole; one with a tag (``{...}`` in the key) keeps that tag. Order keys
    never match ``<map>:*``, so scans of a map's entities never see them.
    """
    entity = entity_key(map_name, key).encode()
    start = entity.find(b"{")
    end = entity.find(b"}", start + 1) if start >= 0 else -1
    rest = key.encode() if start >= 0 and end > start + 1 else b"{" + entity + b"}"
    return map_name.encode() + ORDER_MARK + rest


def order_keys_pattern(map_name: str) -> bytes:
    """A ``SCAN`` pattern for a map's order keys (map names hold no glob characters)."""
    return map_name.encode() + ORDER_MARK + b"*"


def order_column(records: DataFrame, event_time: str | None = None) -> Column:
    """The record's order as text whose byte order is the fold's order.

    Partition and offset as fixed-width digits; an event time before them,
    null lowest, then integers, dates and timestamps as 20 digits of their
    value shifted to be positive, or a string as it is, ended by a zero byte
    so that a string sorts before its extensions.
    """
    from pyspark.sql import functions as F

    position = F.format_string("%010d%019d", F.col(c.PARTITION), F.col(c.OFFSET))
    if event_time is None:
        return position
    if event_time not in records.columns:
        known = ", ".join(c.entity_fields(records.columns))
        raise ConfigError("", [f"fold.event_time: no field {event_time!r} ({known})"])
    value = F.col(c.quote(event_time))
    return F.concat(
        F.when(value.isNull(), F.lit("0")).otherwise(
            F.concat(F.lit("1"), _sortable(value, records.schema[event_time].dataType))
        ),
        F.lit("\x00"),
        position,
    )


def _sortable(value: Column, dtype: DataType) -> Column:
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if isinstance(dtype, T.StringType):
        return value
    if isinstance(dtype, T.IntegralType):
        number = value.cast("long")
    elif isinstance(dtype, T.DateType):
        number = F.unix_date(value).cast("long")
    elif isinstance(dtype, T.TimestampType | T.TimestampNTZType):
        number = F.unix_micros(value.cast("timestamp"))
    else:
        raise ConfigError(
            "",
            [
                "fold.event_time: events are ordered by integers, dates, timestamps or "
                f"strings; this field is {dtype.simpleString()}"
            ],
        )
    shift = F.lit("9223372036854775808").cast("decimal(20,0)")
    return F.lpad((number.cast("decimal(20,0)") + shift).cast("string"), 20, "0")


def load_library(config: RedisConfig) -> None:
    """``FUNCTION LOAD REPLACE`` on every master, so the fold can ``FCALL`` at once."""
    from redis.cluster import RedisCluster

    client = client_for(config)
    if isinstance(client, RedisCluster):
        for node in client.get_primaries():  # type: ignore[no-untyped-call]
            client.execute_command(  # type: ignore[no-untyped-call]
                "FUNCTION LOAD", "REPLACE", SOURCE, target_nodes=node
            )
    else:
        client.function_load(SOURCE, replace=True)


@dataclass(frozen=True)
class FoldTarget:
    """Where one map's batches go: what the applier needs on the driver or an executor."""

    redis: RedisConfig
    map_name: str
    """The physical name: the generation's keys."""
    changelog_topic: str
    producer: tuple[tuple[str, str], ...]
    """librdkafka settings for the changelog and dead-letter records."""
    dead_letter_topic: str | None = None
    ttl_ms: int | None = None
    changes_max_len: int = 100_000


@dataclass(frozen=True)
class Applied:
    """What one batch did: keys it touched (their states went to the changelog), dead letters."""

    keys: int = 0
    dead_letters: int = 0

    def __add__(self, other: Applied) -> Applied:
        return Applied(self.keys + other.keys, self.dead_letters + other.dead_letters)


def _new_producer(target: FoldTarget) -> Producer:
    from confluent_kafka import Producer

    return Producer(dict(target.producer))


class _Deliveries:
    """Produces records and fails loudly if any is not delivered by the flush."""

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self.errors: list[str] = []

    def _done(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self.errors.append(str(err))

    def send(self, topic: str, key: bytes | None, value: bytes | None, headers: Any) -> None:
        while True:
            try:
                self.producer.produce(
                    topic, key=key, value=value, headers=headers, on_delivery=self._done
                )
                return
            except BufferError:
                self.producer.poll(0.05)

    def flush(self) -> None:
        remaining = self.producer.flush(120)
        if self.errors or remaining:
            raise RuntimeError(
                f"Kafka did not take {len(self.errors) + remaining} records: {self.errors[:3]}"
            )


def apply_batches(
    target: FoldTarget,
    batch_id: int,
    app_id: str,
    batches: Iterable[pa.RecordBatch],
    producer: Producer,
) -> Applied:
    """Apply a batch's records (or one partition of them); see the module docstring.

    Runs on the driver or an executor, on the columns ``RedisFold.arrow_columns`` selects.
    """
    import pyarrow as pa

    deliveries = _Deliveries(producer)
    chunks = list(batches)
    table = pa.Table.from_batches(chunks) if chunks else _arrow_schema().empty_table()
    letters = 0
    if target.dead_letter_topic is not None:
        letters = _send_dead_letters(deliveries, target.dead_letter_topic, table)
    keys, orders, values = _winners(table)
    headers = [(BATCH_HEADER, str(batch_id).encode()), (APP_HEADER, app_id.encode())]
    winners = list(zip(keys, zip(orders, values, strict=True), strict=True))
    for key, state in _apply_latest(target, batch_id, winners):
        deliveries.send(target.changelog_topic, key.encode(), state, headers)
    deliveries.flush()
    return Applied(keys=len(winners), dead_letters=letters)


def _winners(table: pa.Table) -> tuple[list[str], list[str], list[bytes | None]]:
    """Each key's record with the greatest order, picked in Arrow: Python touches one row
    per key, not one per record."""
    import pyarrow.compute as pc

    folding = table.filter(pc.is_valid(table[ORDER])).select([c.KEY, ORDER, _VALUE])
    best = folding.group_by(c.KEY, use_threads=False).aggregate([(ORDER, "max")])
    winners = folding.join(
        best, keys=[c.KEY, ORDER], right_keys=[c.KEY, f"{ORDER}_max"], join_type="inner"
    )
    return (
        winners[c.KEY].to_pylist(),
        winners[ORDER].to_pylist(),
        winners[_VALUE].to_pylist(),
    )


def _send_dead_letters(deliveries: _Deliveries, topic: str, table: pa.Table) -> int:
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


def _apply_latest(
    target: FoldTarget, batch_id: int, winners: list[tuple[str, tuple[str, bytes | None]]]
) -> Iterator[tuple[str, bytes | None]]:
    """``FCALL`` the winners in chunks; each key with its state after the call."""
    from redis.cluster import RedisCluster

    client = client_for(target.redis)
    prefix = len(entity_key(target.map_name, "").encode())
    stream = changes_key(target.map_name).encode()
    fixed = [
        b"",
        b"" if target.ttl_ms is None else str(target.ttl_ms).encode(),
        str(batch_id).encode(),
        str(target.changes_max_len).encode(),
        str(prefix).encode(),
    ]
    if isinstance(client, RedisCluster):
        groups: dict[Any, list[tuple[str, tuple[str, bytes | None]]]] = {}
        for item in winners:
            node = client.get_node_from_key(  # type: ignore[no-untyped-call]
                entity_key(target.map_name, item[0])
            )
            groups.setdefault(node.name, []).append(item)
        for items in groups.values():
            node = client.get_node_from_key(  # type: ignore[no-untyped-call]
                entity_key(target.map_name, items[0][0])
            )
            for start in range(0, len(items), CHUNK):
                chunk = items[start : start + CHUNK]
                answers = _fcall(target, chunk, fixed, node)
                yield from _states(chunk, answers)
                _append_changes(client, stream, target, batch_id, chunk, answers)
        return
    for start in range(0, len(winners), CHUNK):
        chunk = winners[start : start + CHUNK]
        yield from _states(chunk, _fcall(target, chunk, [stream, *fixed[1:]], None))


def _fcall(
    target: FoldTarget,
    chunk: list[tuple[str, tuple[str, bytes | None]]],
    fixed: list[bytes],
    node: Any,
) -> list[Any]:
    from redis.exceptions import ResponseError

    args: list[Any] = list(fixed)
    for key, (order, value) in chunk:
        entity = entity_key(target.map_name, key).encode()
        args += [entity, order_key(target.map_name, key), order.encode()]
        args.append(b"" if value is None else value)
    command = ("FCALL", LATEST, 1, args[len(fixed)], *args)
    options = {} if node is None else {"target_nodes": node}
    client = client_for(target.redis)
    try:
        return list(client.execute_command(*command, **options))  # type: ignore[no-untyped-call]
    except ResponseError as exc:
        # A server restarted empty has lost the library with the data: load it again.
        if "Function not found" not in str(exc):
            raise
        load_library(target.redis)
        return list(client.execute_command(*command, **options))  # type: ignore[no-untyped-call]


def _states(
    chunk: list[tuple[str, tuple[str, bytes | None]]], answers: list[Any]
) -> Iterator[tuple[str, bytes | None]]:
    for (key, (_, value)), answer in zip(chunk, answers, strict=True):
        yield key, (value if answer == 1 else answer)


def _append_changes(
    client: Any,
    stream: bytes,
    target: FoldTarget,
    batch_id: int,
    chunk: list[tuple[str, tuple[str, bytes | None]]],
    answers: list[Any],
) -> None:
    """A cluster's change entries for the keys a chunk applied, in one transaction."""
    applied = [(k, v) for (k, (_, v)), a in zip(chunk, answers, strict=True) if a == 1]
    if not applied:
        return
    with client.pipeline(transaction=True) as pipe:
        for key, value in applied:
            entry = {"key": key, "op": "delete" if value is None else "upsert"}
            entry["batch_id"] = str(batch_id)
            pipe.xadd(stream, entry, maxlen=target.changes_max_len, approximate=True)
        pipe.execute()


def _apply_partition(
    target: FoldTarget, batch_id: int, app_id: str, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """Executor side of ``apply_batches``: one row of counts per partition."""
    import pyarrow as pa

    # A large batch's task: a producer of its own costs little against its records.
    done = apply_batches(target, batch_id, app_id, batches, _new_producer(target))
    yield pa.RecordBatch.from_pydict(
        {"keys": [done.keys], "dead_letters": [done.dead_letters]},
        schema=pa.schema([("keys", pa.int64()), ("dead_letters", pa.int64())]),
    )


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
        if fold.mode not in REDIS_FOLD_MODES:
            raise ConfigError("", [f"fold.mode: {fold.mode} is not folded in Redis"])
        self.target = target
        self.fold = fold
        self.fail_on_error = fail_on_error
        self.typer = typer
        self.spread_keys = spread_keys
        self._producer: Producer | None = None
        self._columns: list[Column] | None = None

    def close(self) -> None:
        """Release the driver's producer once the query has stopped."""
        if self._producer is not None:
            self._producer.flush(30)
            self._producer = None

    def events(self, records: DataFrame) -> DataFrame:
        """Every record with ``__entity`` (null for a delete or a record that failed) and
        ``__order`` (null for a record that failed): the map's query computes them in its
        plan, so each batch comes with them."""
        from pyspark.sql import functions as F

        from materializer.pipeline.dead_letter import fail_on_error

        if self.fail_on_error:
            records = fail_on_error(records)
        folds = F.col(c.ERROR_STAGE).isNull()
        entity = F.struct(*[F.col(c.quote(f)) for f in c.entity_fields(records.columns)])
        order = order_column(records, self.fold.event_time)
        return records.select(
            "*",
            F.when(folds & ~F.col(c.DELETED), entity).alias(c.ENTITY),
            F.when(folds, order).alias(ORDER),
        )

    def entity_type(self, records: DataFrame) -> StructType:
        """The entity's struct (a schemaless map's: its document); checks the fold's config."""
        from pyspark.sql.types import StructType

        entity = self.events(records).schema[c.ENTITY].dataType
        if not isinstance(entity, StructType):
            raise TypeError(f"the fold's entity must be a struct, got {entity.simpleString()}")
        return entity

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
                entity_json(F.col(c.ENTITY)).cast("binary").alias(_VALUE),
                F.when(failed, key).alias(_LETTER_KEY),
                F.when(failed, value).alias(_LETTER_VALUE),
                # As JSON text: an Arrow column of nested headers costs the whole batch
                # several times more to hand over than flat ones, even when all null.
                F.when(failed, F.to_json(headers)).alias(_LETTER_HEADERS),
            ]
        return events.select(*self._columns)

    def apply(self, events: DataFrame, batch_id: int, app_id: str, rows: int | None) -> Applied:
        """Apply one batch of ``events``: on the driver when it has at most ``DRIVER_ROWS``."""
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        columns = self.arrow_columns(events)
        if rows is not None and rows <= DRIVER_ROWS:
            if self._producer is None:
                self._producer = _new_producer(self.target)
            batches = columns.toArrow().to_batches()
            return apply_batches(self.target, batch_id, app_id, batches, self._producer)
        if self.spread_keys:
            # Two tasks applying one key would race to the changelog: the Delta table
            # could keep the older state. One task per key keeps its records in order.
            columns = columns.repartition(F.col(c.KEY))
        counts = columns.mapInArrow(
            functools.partial(_apply_partition, self.target, batch_id, app_id),
            T.StructType(
                [T.StructField("keys", T.LongType()), T.StructField("dead_letters", T.LongType())]
            ),
        ).collect()
        total = Applied()
        for row in counts:
            total += Applied(int(row["keys"]), int(row["dead_letters"]))
        return total


class RedisFoldSink(Sink):
    """The fold of a map folded in Redis, first among its query's sinks (``RedisFold``).

    Its rows out are the keys the batch touched; later sinks (the watermark,
    the group offsets) see the batch once it is applied.
    """

    name = "fold"

    def __init__(
        self, fold: RedisFold, end_offsets: Callable[[int], dict[str, dict[int, int]]]
    ) -> None:
        self.fold = fold
        self._end_offsets = end_offsets
        self._last: Applied | None = None

    def write(self, batch: Batch) -> None:
        """Apply the batch's records (``Batch.records``)."""
        if batch.records is None:
            raise ValueError("the fold in Redis needs the batch's records")
        rows = records_in(self._end_offsets, batch.batch_id)
        self._last = self.fold.apply(batch.records, batch.batch_id, batch.app_id, rows)

    def rows_out(self) -> int | None:
        """Keys the last batch touched."""
        return None if self._last is None else self._last.keys

    def close(self) -> None:
        """Release the fold's producer."""
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


def producer_settings(
    bootstrap: str, properties: Mapping[str, str], max_record_bytes: int
) -> tuple[tuple[str, str], ...]:
    """librdkafka settings for a map's own records: idempotent, and partitioned by key as
    Kafka's Java clients do (``murmur2``), so a key stays in the partition it always had."""
    settings = {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": "true",
        "acks": "all",
        "partitioner": "murmur2_random",
        "message.max.bytes": str(max_record_bytes),
        "linger.ms": "5",
        **properties,
    }
    return tuple(sorted(settings.items()))
