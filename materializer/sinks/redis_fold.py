"""The fold applied where the map lives: Redis Functions, as Hazelcast applies an entry
processor to an IMap entry.

A map runs one streaming query. Spark reads, decodes, transforms and keys
each micro-batch without any state of its own (``materializer.pipeline.fold``
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
``state_key``. Python reads states and entities (one ``FCALL_RO`` a chunk),
folds each key's events into its state (``KeyFolder``), and writes the states
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
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from materializer.config import FoldConfig, KafkaConfig, RedisConfig
from materializer.errors import MaterializerError
from materializer.kafka_clients import librdkafka
from materializer.layout import (
    EXPIRE_OP,
    READ_FUNCTION,
    changes_key,
    entity_key,
    expiry_index_key,
)
from materializer.pipeline import columns as c
from materializer.pipeline.dead_letter import dead_letter_columns
from materializer.pipeline.fold import Event, FoldMode, KeyFolder, fold_mode
from materializer.redis_client import markers, per_master, where
from materializer.sinks.base import Batch, Sink
from materializer.sinks.changelog import APP_HEADER, BATCH_HEADER
from materializer.sinks.expiry import ExpirySweeper, index_expiring, sweep_expired
from materializer.sinks.redis import client_for

if TYPE_CHECKING:
    from collections.abc import Callable

    import pyarrow as pa
    from confluent_kafka import Producer
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructType

    from materializer.pipeline.formats.batch_typing import EntityTyper

LIBRARY = "materializer"
LATEST = "materializer_latest_v3"
READ = READ_FUNCTION
PUT = "materializer_put_v3"
FILL = "materializer_fill_v3"
EXPIRE = "materializer_expire_v3"

LOST = "MATERIALIZER_LOST"
"""The error the writing functions answer on a server without the map's marker."""

FIXED_ARGS = 8

SOURCE = f"""#!lua name={LIBRARY}
-- Materializer's fold functions. Loaded with FUNCTION LOAD REPLACE at every start.
--
-- KEYS[1] is one entity key of the call, which routes it to its master on a cluster;
-- every key a call touches comes in ARGV, and lives on that master (the flag below).
-- The writing functions' ARGV start with the change stream ('' for none), PX
-- milliseconds or '', batch id, stream MAXLEN, the entity keys' prefix length, the
-- map's marker on this server, how long a deleted entity's state stays (PX ms) and the
-- map's expiry index on this server ('' without a TTL).

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

-- Whether this server holds the map's copy whole: a server restarted empty (or replaced)
-- has no marker, and nothing may be folded onto it before the copy is restored.
local function whole(args)
  return redis.call('EXISTS', args[6]) == 1
end

-- The server's clock in epoch milliseconds: the clock its key expiries follow.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function lost()
  return redis.error_reply('{LOST} this server has no marker of the map: its copy is lost')
end

-- Sets the entity (value '' deletes it) and its state, and appends its change entry.
-- A deleted entity's state stays for the map's deleted_retention (or its TTL if shorter):
-- long enough that a replay cannot bring the entity back, short enough that churn does
-- not grow the map; the entity's next write takes the expiry off. An expiring entity is
-- (re)scored in the expiry index, a deleted one leaves it.
local function write(args, entity, state_key, state, value)
  local stream, ttl, batch, maxlen = args[1], args[2], args[3], args[4]
  local key = string.sub(entity, tonumber(args[5]) + 1)
  local op = 'upsert'
  local px = ttl
  if value == '' then
    redis.call('DEL', entity)
    op = 'delete'
    if ttl == '' or tonumber(args[7]) < tonumber(ttl) then px = args[7] end
    if args[8] ~= '' then redis.call('ZREM', args[8], key) end
  elseif ttl == '' then
    redis.call('SET', entity, value)
  else
    redis.call('SET', entity, value, 'PX', ttl)
    if args[8] ~= '' then redis.call('ZADD', args[8], now_ms() + tonumber(ttl), key) end
  end
  if px == '' then
    redis.call('SET', state_key, state)
  else
    redis.call('SET', state_key, state, 'PX', px)
  end
  if stream ~= '' then
    redis.call('XADD', stream, 'MAXLEN', '~', maxlen, '*', 'key', key, 'op', op, 'batch_id', batch)
  end
end

-- ARGV after the eight: per record its entity key, state key, order and value ('' deletes).
-- Applies a record whose order is greater than the stored one. Returns per record 1
-- when applied, else the entity's current value (false: none).
local function latest(keys, args)
  if not whole(args) then return lost() end
  local out = {{}}
  for i = 0, (#args - 8) / 4 - 1 do
    local entity, state_key = args[9 + 4 * i], args[10 + 4 * i]
    local order, value = args[11 + 4 * i], args[12 + 4 * i]
    local current = redis.call('GET', state_key)
    if (not current) or after(order, current) then
      write(args, entity, state_key, order, value)
      out[i + 1] = 1
    else
      out[i + 1] = redis.call('GET', entity)
    end
  end
  return out
end

-- ARGV: state key, entity key, per key. Returns both values per key (false: none).
local function read(keys, args)
  local out = {{}}
  for i = 1, #args do out[i] = redis.call('GET', args[i]) end
  return out
end

-- ARGV after the eight: per key its entity key, state key, the state its fold read ('' for
-- none), the new state and value ('' removes the entity). Writes a key only if its state
-- is still the one its fold read. Returns per key 1 when written, 0 when its state had
-- changed.
local function put(keys, args)
  if not whole(args) then return lost() end
  local out = {{}}
  for i = 0, (#args - 8) / 5 - 1 do
    local entity, state_key = args[9 + 5 * i], args[10 + 5 * i]
    if (redis.call('GET', state_key) or '') ~= args[11 + 5 * i] then
      out[i + 1] = 0
    else
      write(args, entity, state_key, args[12 + 5 * i], args[13 + 5 * i])
      out[i + 1] = 1
    end
  end
  return out
end

-- ARGV: per key its entity key, state key, value and PX milliseconds ('' for none).
-- Restores an entity this server lost: written only where neither it nor its state is
-- (a key the fold wrote since, or deleted, keeps what the fold made of it). Returns how
-- many were written.
local function fill(keys, args)
  local written = 0
  for i = 0, #args / 4 - 1 do
    local entity, state_key = args[1 + 4 * i], args[2 + 4 * i]
    if redis.call('EXISTS', entity, state_key) == 0 then
      if args[4 + 4 * i] == '' then
        redis.call('SET', entity, args[3 + 4 * i])
      else
        redis.call('SET', entity, args[3 + 4 * i], 'PX', args[4 + 4 * i])
      end
      written = written + 1
    end
  end
  return written
end

-- ARGV: the change stream ('' for none), its MAXLEN, the entity keys' prefix, the map's
-- marker, expiry index and expired set on this server, and how many keys at most.
-- Moves keys whose expiry is due and whose entity Redis has expired from the index to
-- the expired set, with an 'expire' change entry each; a key written since (a later
-- PTTL) is scored again. Returns the keys it found expired.
local function expire(keys, args)
  if redis.call('EXISTS', args[4]) == 0 then return lost() end
  local now = now_ms()
  local out = {{}}
  local due = redis.call('ZRANGE', args[5], '-inf', now, 'BYSCORE', 'LIMIT', 0, args[7])
  for _, key in ipairs(due) do
    local left = redis.call('PTTL', args[3] .. key)
    if left > 0 then
      redis.call('ZADD', args[5], now + left, key)
    else
      redis.call('ZREM', args[5], key)
      if left == -2 then
        redis.call('SADD', args[6], key)
        if args[1] ~= '' then
          redis.call('XADD', args[1], 'MAXLEN', '~', args[2], '*',
            'key', key, 'op', '{EXPIRE_OP}', 'batch_id', '-1')
        end
        out[#out + 1] = key
      end
    end
  end
  return out
end

redis.register_function{{function_name='{LATEST}', callback=latest,
  flags={{'allow-cross-slot-keys'}}}}
redis.register_function{{function_name='{READ}', callback=read,
  flags={{'no-writes', 'allow-cross-slot-keys'}}}}
redis.register_function{{function_name='{PUT}', callback=put,
  flags={{'allow-cross-slot-keys'}}}}
redis.register_function{{function_name='{FILL}', callback=fill,
  flags={{'allow-cross-slot-keys'}}}}
redis.register_function{{function_name='{EXPIRE}', callback=expire,
  flags={{'allow-cross-slot-keys'}}}}
"""  # noqa: S608 - Lua, not SQL

CHUNK = 1000
"""Keys per ``FCALL``: enough to amortise the round trip, few enough not to hold up
Redis's other clients for long."""

DRIVER_ROWS = 10_000
"""Batches of up to this many records are applied on the driver, larger ones on the
executors: a Python worker per partition costs ~0.1 s a task, the driver ~46 µs a record
(``bench/fold_spike.py``, docs/fold-design.md)."""

ORDER = "__order"
_VALUE = "__value"
_AUX = "__aux"
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
            (_LETTER_KEY, pa.binary()),
            (_LETTER_VALUE, pa.binary()),
            (_LETTER_HEADERS, pa.string()),
        ]
    )


STATE_MARK = b"\x00o:"
"""Joins a map's physical name and the rest of a state key: no entity key holds it there."""


def state_key(map_name: str, key: str) -> bytes:
    """Where an entity's fold state is kept (``latest``: its winning order; the other modes:
    their state as JSON): ``<map>\\0o:`` and a hash tag of the entity key's slot, so the
    fold of one key touches one slot.

    An entity key without a hash tag hashes whole, so the state key tags it
    whole; one with a tag (``{...}`` in the key) keeps that tag. State keys
    never match ``<map>:*``, so scans of a map's entities never see them.
    """
    entity = entity_key(map_name, key).encode()
    start = entity.find(b"{")
    end = entity.find(b"}", start + 1) if start >= 0 else -1
    rest = key.encode() if start >= 0 and end > start + 1 else b"{" + entity + b"}"
    return map_name.encode() + STATE_MARK + rest


def state_keys_pattern(map_name: str) -> bytes:
    """A ``SCAN`` pattern for a map's state keys (map names hold no glob characters)."""
    return map_name.encode() + STATE_MARK + b"*"


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


class CopyLost(MaterializerError):
    """A Redis server holds no marker of the map: restarted empty, or replaced by an empty one.

    The fold stops before writing anything onto it; the run restores the
    copy from Delta and the changelog and starts the map again
    (``materializer.ops.restore``).
    """

    def __init__(self, map_name: str, server: str, node: Any = None) -> None:
        self.map_name = map_name
        on = f"Redis at {server}" if node is None else f"the Redis Cluster master {node.name}"
        super().__init__(
            f"map {map_name}: {on} has lost the map's copy (its marker is gone); "
            "the copy is restored from Delta and the changelog before the fold goes on"
        )


@dataclass(frozen=True)
class FoldTarget:
    """Where one map's batches go: what the applier needs on the driver or an executor."""

    redis: RedisConfig
    map_name: str
    """The physical name: the generation's keys."""
    changelog_topic: str
    producer: tuple[tuple[str, Any], ...] = field(repr=False)
    """librdkafka settings for the changelog and dead-letter records; they hold the Kafka
    credentials, so the repr leaves them out."""
    dead_letter_topic: str | None = None
    ttl_ms: int | None = None
    changes_max_len: int = 100_000
    deleted_retention_ms: int = 86_400_000
    """How long a deleted entity's fold state stays (``fold.deleted_retention``)."""
    folder: KeyFolder | None = None
    """How a key's events fold into its state; None: ``latest``, ordered by Redis."""


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


class Deliveries:
    """Produces records and fails loudly if any is not delivered by the flush."""

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self.errors: list[str] = []

    def _done(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self.errors.append(str(err))

    def send(self, topic: str, key: bytes | None, value: bytes | None, headers: Any) -> None:
        """Produce one record, waiting for room when the producer's queue is full."""
        while True:
            try:
                self.producer.produce(
                    topic, key=key, value=value, headers=headers, on_delivery=self._done
                )
                return
            except BufferError:
                self.producer.poll(0.05)

    def flush(self) -> None:
        """Wait for every record sent; raise if any was not delivered."""
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
        states = list(writer.fold(target.folder, _events(table)))
    keys = 0
    for key, state in states:
        deliveries.send(target.changelog_topic, key.encode(), state, headers)
        keys += 1
    deliveries.flush()
    return Applied(keys=keys, dead_letters=letters)


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


def _events(table: pa.Table) -> list[tuple[str, list[Event]]]:
    """Each key's events in order: sorted in Arrow, grouped in one pass."""
    import pyarrow.compute as pc

    folding = table.filter(pc.is_valid(table[ORDER]))
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


def chunks_by_master(
    client: Any, map_name: str, items: list[tuple[str, _T]]
) -> Iterator[tuple[Any, list[tuple[str, _T]]]]:
    """``items`` (keyed by entity key) in chunks of ``CHUNK``, each with the master holding
    its keys (None: one server)."""
    from redis.cluster import RedisCluster

    if not isinstance(client, RedisCluster):
        for start in range(0, len(items), CHUNK):
            yield None, items[start : start + CHUNK]
        return
    groups: dict[Any, list[tuple[str, _T]]] = {}
    nodes: dict[Any, Any] = {}
    for item in items:
        node = client.get_node_from_key(entity_key(map_name, item[0]))  # type: ignore[no-untyped-call]
        groups.setdefault(node.name, []).append(item)
        nodes[node.name] = node
    for name, group in groups.items():
        for start in range(0, len(group), CHUNK):
            yield nodes[name], group[start : start + CHUNK]


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


def call_function(
    client: Any, target: FoldTarget, function: str, route: bytes, args: list[bytes], node: Any
) -> list[Any]:
    """``FCALL`` ``function`` (``FCALL_RO`` for ``READ``) with ``route``, a key of the call
    on ``node`` (None: the one server), as its one key; loads the library again if the
    server lost it. A server without the map's marker raises ``CopyLost``."""
    from redis.exceptions import ResponseError

    command = ("FCALL_RO" if function == READ else "FCALL", function, 1, route)
    options = {} if node is None else {"target_nodes": node}
    for attempt in range(2):
        try:
            return list(client.execute_command(*command, *args, **options))
        except ResponseError as exc:
            if str(exc).startswith(LOST):
                raise CopyLost(target.map_name, where(client), node) from None
            # A server restarted empty has lost the library with the data: load it
            # again (the marker, lost too, then stops the write).
            if "Function not found" not in str(exc) or attempt:
                raise
            load_library(target.redis)
    raise AssertionError("unreachable")


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
                args: list[bytes] = []
                for key, _ in pending:
                    args += [state_key(name, key), entity_key(name, key).encode()]
                read = self.call(READ, args[1], args, node)
                writes: list[tuple[str, bytes | None]] = []
                put = self._fixed(node)
                retry = []
                for i, (key, events) in enumerate(pending):
                    before, current = read[2 * i], read[2 * i + 1]
                    start = before
                    if before is None and current is not None:
                        start = folder.seed(current)  # restored, or from an earlier version
                    state, value = folder(start, events)
                    if state == before:
                        yield key, current  # nothing new: applied before
                        continue
                    put += [entity_key(name, key).encode(), state_key(name, key)]
                    put += [before or b"", state, b"" if value is None else value]
                    writes.append((key, value))
                    retry.append((key, events))
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
        self.target = target
        self.mode: FoldMode = fold_mode(fold)
        self.fail_on_error = fail_on_error
        self.typer = typer
        self.spread_keys = spread_keys
        self._producer: Producer | None = None
        self._columns: list[Column] | None = None
        self._lock = threading.Lock()
        """Held by a batch and by an expiry sweep: their changelog records never interleave
        (``materializer.sinks.expiry``)."""

    def sweep(self) -> int:
        """Send the keys Redis expired to the change stream and the changelog (see
        ``materializer.sinks.expiry``); how many."""
        with self._lock:
            if self._producer is None:
                self._producer = _new_producer(self.target)
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

        from materializer.pipeline.dead_letter import fail_on_error

        if self.fail_on_error:
            records = fail_on_error(records)
        folds = F.col(c.ERROR_STAGE).isNull()
        aux = self.mode.aux(records)
        self.target = replace(self.target, folder=self.mode.folder(records))
        return records.select(
            "*",
            F.when(folds & ~F.col(c.DELETED), self.mode.entity(records)).alias(c.ENTITY),
            F.when(folds, self.mode.order(records)).alias(ORDER),
            (F.lit(None).cast("string") if aux is None else F.when(folds, aux)).alias(_AUX),
        )

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
                F.when(failed, key).alias(_LETTER_KEY),
                F.when(failed, value).alias(_LETTER_VALUE),
                # As JSON text: an Arrow column of nested headers costs the whole batch
                # several times more to hand over than flat ones, even when all null.
                F.when(failed, F.to_json(headers)).alias(_LETTER_HEADERS),
            ]
        return events.select(*self._columns)

    def apply(self, events: DataFrame, batch_id: int, app_id: str, rows: int | None) -> Applied:
        """Apply one batch of ``events``: on the driver when it has at most ``DRIVER_ROWS``."""
        with self._lock:
            return self._apply(events, batch_id, app_id, rows)

    def _apply(self, events: DataFrame, batch_id: int, app_id: str, rows: int | None) -> Applied:
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
        self._sweeper = (
            None if fold.target.ttl_ms is None else ExpirySweeper(fold.target.map_name, fold.sweep)
        )

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
