"""One Redis server or a Redis Cluster, behind the same few calls.

With ``redis.cluster: true`` the URL names any node of a Redis Cluster and the
client finds the others. The layout keeps its key names on a cluster: every
``<map>:<key>`` hashes to a slot of its own, so a map spreads over all the
masters, while each bookkeeping key (``__meta__``, ``__changes__``, ...) sits
in one slot. Two habits of a single server do not hold there, and the code
that reads or writes maps goes through this module for both:

- ``MGET`` takes keys of one slot only: a pipeline queues one ``GET`` per key
  instead (``queue_gets``), and a plain read splits by slot (``get_many``);
- a ``MULTI`` touches one slot only: no transaction here spans two keys of a
  map (the watermark is one transaction on ``__meta__``, a cluster's change
  entries one on ``__changes__``).

This module is the one place that tests which of the two a client speaks to
(``is_cluster``) and that routes by master: the masters, the master of a key,
chunks of keys per master, the options that send a command to one of them.
Where the two must behave differently (a cluster appends change entries after
a call, reads states with the read function, writes in bulk through a
pipeline), the caller asks ``is_cluster`` and says why there.
"""

from __future__ import annotations

import binascii
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeAlias, TypeVar

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterPipeline as AsyncClusterPipeline
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import ClusterPipeline, RedisCluster
from redis.utils import HIREDIS_AVAILABLE
from typing_extensions import TypeIs

from materializer.config import RedisConfig

Client: TypeAlias = "redis.Redis | RedisCluster"

TRANSIENT_ERRORS: tuple[type[redis.RedisError], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
)
"""Redis answering nothing for a while: a server restarting, a cluster down or moving slots.
Worth waiting out or retrying; anything else is an answer."""
AsyncClient: TypeAlias = "aioredis.Redis | AsyncRedisCluster"


def connect(config: RedisConfig, **options: Any) -> Client:
    """A client for the configured server or cluster; connects lazily (a cluster at once)."""
    if config.cluster:
        return RedisCluster.from_url(config.url, **options)
    return redis.Redis.from_url(config.url, **options)


_clients: dict[RedisConfig, Client] = {}


def client_for(config: RedisConfig) -> Client:
    """The process's one client (and connection pool) for a server or cluster, reused across
    batches and calls: a client per call would open a connection per call."""
    client = _clients.get(config)
    if client is None:
        client = connect(config)
        _clients[config] = client
    return client


def connect_async(config: RedisConfig, **options: Any) -> AsyncClient:
    """The asyncio client for the configured server or cluster; connects on first use.

    Its connections pack commands with hiredis, as redis-py's blocking client
    does: the asyncio client packs them in Python, which costs a large ``MGET``
    several times what hiredis does, more than Redis takes to answer it.
    """
    if config.cluster:
        cluster = AsyncRedisCluster.from_url(config.url, **options)
        manager = cluster.nodes_manager
        kwargs = manager.connection_kwargs
        kwargs["connection_class"] = _hiredis_packing(kwargs["connection_class"])
        for node in manager.startup_nodes.values():  # no connection made yet
            node.connection_class = _hiredis_packing(node.connection_class)
        return cluster
    client = aioredis.Redis.from_url(config.url, **options)
    pool = client.connection_pool
    pool.connection_class = _hiredis_packing(pool.connection_class)
    return client


_PACKER = redis.connection.HiredisRespSerializer() if HIREDIS_AVAILABLE else None


_PACKING: dict[type[Any], type[Any]] = {}


def _hiredis_packing(connection_class: type[Any]) -> type[Any]:
    """``connection_class`` packing its commands with hiredis, when it is installed."""
    if _PACKER is None or connection_class in _PACKING.values():
        return connection_class
    if connection_class not in _PACKING:

        def pack_command(_self: Any, *args: Any) -> list[bytes]:
            return _PACKER.pack(*args)  # type: ignore[no-any-return]

        name = connection_class.__name__
        _PACKING[connection_class] = type(name, (connection_class,), {"pack_command": pack_command})
    return _PACKING[connection_class]


def is_cluster(client: Client | AsyncClient) -> TypeIs[RedisCluster | AsyncRedisCluster]:
    """Whether a client speaks to a Redis Cluster rather than one server."""
    return isinstance(client, RedisCluster | AsyncRedisCluster)


def masters(client: Client) -> dict[str, Any]:
    """Each master by node name, with the node a command is sent to (``on``); the one
    server is ``{"": None}``."""
    if not is_cluster(client):
        return {"": None}
    return {node.name: node for node in client.get_primaries()}  # type: ignore[no-untyped-call]


def master_of(client: Client, key: str | bytes) -> str:
    """The name of the master holding ``key`` (``""``: the one server), as ``masters``
    names it."""
    if not is_cluster(client):
        return ""
    return str(client.get_node_from_key(key).name)  # type: ignore[no-untyped-call]


def on(node: Any) -> dict[str, Any]:
    """The options of ``execute_command`` that send a command to ``node`` (None: the one
    server, where no option is needed)."""
    return {} if node is None else {"target_nodes": node}


_T = TypeVar("_T")


def chunks_by_master(
    client: Client, items: Sequence[_T], key: Callable[[_T], bytes], size: int
) -> Iterator[tuple[Any, list[_T]]]:
    """``items`` in chunks of at most ``size``, each with the master holding every key of
    its items (None: the one server, where ``key`` is never called)."""
    if not is_cluster(client):
        for start in range(0, len(items), size):
            yield None, list(items[start : start + size])
        return
    for node, indexes in by_master(client, [key(item) for item in items]).values():
        group = [items[i] for i in indexes]
        for start in range(0, len(group), size):
            yield node, group[start : start + size]


def connection_options(client: AsyncClient) -> dict[str, Any]:
    """The options the client's connections are made with (timeouts, credentials)."""
    if is_cluster(client):
        return dict(client.connection_kwargs)
    return dict(client.connection_pool.connection_kwargs)


async def close_async(client: AsyncClient) -> None:
    """Close the client and every connection of its pools."""
    if is_cluster(client):
        await client.aclose()
    else:
        await client.aclose(close_connection_pool=True)


def queue_gets(pipe: Any, keys: Sequence[str]) -> Callable[[Iterator[Any]], list[Any]]:
    """Queue reads of ``keys`` on a pipeline; the result takes their values from its replies.

    One ``MGET`` on a single server; one ``GET`` per key on a cluster, where
    redis-py sends each to its slot's master (the pipeline still makes one
    round trip per master).
    """
    if not keys:
        return lambda _: []
    if isinstance(pipe, ClusterPipeline | AsyncClusterPipeline):
        for key in keys:
            pipe.get(key)
        return lambda replies: [next(replies) for _ in keys]
    pipe.mget(list(keys))
    return lambda replies: list(next(replies))


def get_many(client: Client, keys: Sequence[str | bytes]) -> list[Any]:
    """``MGET``, split by slot on a cluster (each slot's part is still atomic)."""
    if is_cluster(client):
        return list(client.mget_nonatomic(list(keys)))
    return list(client.mget(list(keys)))


async def get_many_async(client: AsyncClient, keys: Sequence[str | bytes]) -> list[Any]:
    """``get_many`` for the asyncio client."""
    if is_cluster(client):
        return list(await client.mget_nonatomic(list(keys)))
    return list(await client.mget(list(keys)))


def where(client: Client | AsyncClient) -> str:
    """Host and port (or socket path) of a client, for messages: never the URL, which may
    hold a password. A cluster client names the node it was given."""
    if is_cluster(client):
        node = client.get_default_node()
        return f"{node.host}:{node.port}" if node is not None else "the Redis Cluster"
    kwargs = client.connection_pool.connection_kwargs
    return str(kwargs.get("path") or f"{kwargs.get('host')}:{kwargs.get('port')}")


def per_master(
    client: Client | AsyncClient, map_name: str, name: Callable[[str, str | None], str]
) -> dict[str, str]:
    """A key of the map's on each master, by node name (``""``: the one server): ``name``
    of the map and, on a cluster, the tag of the first slot the master owns (as markers)."""
    if not is_cluster(client):
        return {"": name(map_name, None)}
    first: dict[str, int] = {}
    for slot, nodes in client.nodes_manager.slots_cache.items():
        owner = nodes[0].name
        if slot < first.get(owner, CLUSTER_SLOTS):
            first[owner] = slot
    return {owner: name(map_name, slot_tag(slot)) for owner, slot in first.items()}


def by_master(
    cluster: RedisCluster | AsyncRedisCluster, keys: Sequence[bytes]
) -> dict[str, tuple[Any, list[int]]]:
    """The positions of ``keys`` grouped by the master holding their slots (by node name,
    with the node), per the client's slot map. ``key_slot`` per key: the client's own
    lookup costs a batch read more than its Redis calls do."""
    slots = cluster.nodes_manager.slots_cache
    groups: dict[str, tuple[Any, list[int]]] = {}
    for i, key in enumerate(keys):
        nodes = slots.get(key_slot(key))
        if not nodes:
            raise redis.exceptions.SlotNotCoveredError(f"no master covers the slot of {key!r}")
        node = nodes[0]
        group = groups.get(node.name)
        if group is None:
            group = groups[node.name] = (node, [])
        group[1].append(i)
    return groups


CLUSTER_SLOTS = 16384


def key_slot(key: str | bytes) -> int:
    """A key's Redis Cluster hash slot: the CRC16 of its hash tag if it has one, else of
    the whole key (the cluster specification's rule). A plain key costs two C calls, far
    less than the client's own ``keyslot``, which a batch read pays per key."""
    raw = key.encode() if isinstance(key, str) else key
    start = raw.find(b"{")
    if start >= 0:
        end = raw.find(b"}", start + 1)
        if end > start + 1:
            raw = raw[start + 1 : end]
    return binascii.crc_hqx(raw, 0) % CLUSTER_SLOTS


@functools.cache
def slot_tag(slot: int) -> str:
    """The first decimal number whose CRC16 hash slot is ``slot``: a hash tag that puts a
    key on the master owning that slot."""
    n = 0
    while binascii.crc_hqx(str(n).encode(), 0) % CLUSTER_SLOTS != slot:
        n += 1
    return str(n)
