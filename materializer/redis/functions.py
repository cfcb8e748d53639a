"""The Redis Functions library the fold calls, and what calling it takes: loading it on
every master, routing a call to the master holding its keys, the key that keeps each
entity's fold state, and the producer that sends what a call changed.

One library (``SOURCE``, Lua) holds every function (``materializer_<name>_v3``),
loaded with ``FUNCTION LOAD REPLACE`` on every master before a map folds, and
again by a call that finds it gone. A function that writes first checks the
map's marker: a server restarted empty answers ``MATERIALIZER_LOST`` instead of
writing onto a copy that is no longer whole (``CopyLost``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from materializer.clients.redis import by_master, where
from materializer.config import RedisConfig
from materializer.contract.redis_layout import (
    EXPIRE_OP,
    READ_FUNCTION,
    entity_key,
)
from materializer.errors import MaterializerError
from materializer.fold.base import KeyFolder
from materializer.redis.watermark import client_for

if TYPE_CHECKING:
    from confluent_kafka import Producer


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
    (``materializer.restore.automatic``).
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


def new_producer(target: FoldTarget) -> Producer:
    """A producer of the changelog and dead-letter records, with the map's Kafka settings."""
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


_T = TypeVar("_T")


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
    keys = [entity_key(map_name, key).encode() for key, _ in items]
    for node, indexes in by_master(client, keys).values():
        group = [items[i] for i in indexes]
        for start in range(0, len(group), CHUNK):
            yield node, group[start : start + CHUNK]


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
