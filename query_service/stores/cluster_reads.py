"""Batch reads on a Redis Cluster: one read per master, sent to all at once.

On one server a batch of keys is one ``MGET``. A cluster takes no multi-key
command across slots, and redis-py's cluster pipeline, which routes each
``GET`` itself, spends most of a batch read in Python per command, far below
one server's rate (docs/decisions/0006-cluster-reads-through-the-read-function.md). Keys are
grouped here by the master that holds their slot, per the client's slot map,
and each group is one call of the materializer's read function on that master
(``FCALL_RO``: a function may read keys of several slots of its own node),
written on the master's pipelined connection (``lookup_connection``), or, where
the function is not loaded, one ordinary pipeline of ``GET``s.

A slot that moved meanwhile (a reshard, a failover) answers ``MOVED`` or
``ASK``: those keys are read again through the cluster client, which
follows the redirect and refreshes its slot map.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.exceptions import AskError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError

from materializer.clients.redis import by_master
from materializer.contract.redis_layout import READ_FUNCTION
from query_service.stores.lookup_connection import LookupConnection, settled


class MasterReads:
    """``GET`` of many keys of a cluster, one read per master."""

    def __init__(self, cluster: AsyncRedisCluster, timeout: float) -> None:
        self._cluster = cluster
        self._timeout = timeout
        self._clients: dict[str, aioredis.Redis] = {}
        self._lookups: dict[str, LookupConnection] = {}
        self._function = True
        """Whether the materializer's read function answers (one command per master)."""

    def _client(self, node: ClusterNode) -> aioredis.Redis:
        client = self._clients.get(node.name)
        if client is None:
            pool = aioredis.ConnectionPool(
                connection_class=node.connection_class, **node.connection_kwargs
            )
            client = self._clients[node.name] = aioredis.Redis(connection_pool=pool)
        return client

    def _lookup(self, node: ClusterNode) -> LookupConnection:
        """The master's pipelined connection (``lookup_connection``), for the function."""
        lookup = self._lookups.get(node.name)
        if lookup is None:
            pool = self._client(node).connection_pool
            lookup = self._lookups[node.name] = LookupConnection(pool, node.name, self._timeout)
        return lookup

    async def get(self, keys: Sequence[str]) -> list[Any]:
        """The values of ``keys`` (None where absent), in order."""
        # Encoded once: the slot is computed from the bytes, and the client sends them as
        # they are rather than encode each key again.
        raw = [key.encode() for key in keys]
        groups = list(by_master(self._cluster, raw).values())
        values: list[Any] = [None] * len(keys)
        moved: list[int] = []
        if self._function:
            groups = await self._call_function(groups, raw, values)

        async def read(node: ClusterNode, indexes: list[int]) -> None:
            async with self._client(node).pipeline(transaction=False) as pipe:
                for i in indexes:
                    pipe.get(raw[i])
                replies = await pipe.execute(raise_on_error=False)
            for i, reply in zip(indexes, replies, strict=True):
                if isinstance(reply, AskError):  # MovedError is one too
                    moved.append(i)
                elif isinstance(reply, ResponseError):
                    raise reply
                else:
                    values[i] = reply

        await asyncio.gather(*(read(node, indexes) for node, indexes in groups))
        if moved:
            again = await self._cluster.mget_nonatomic([keys[i] for i in moved])
            for i, value in zip(moved, again, strict=True):
                values[i] = value
        return values

    async def _call_function(
        self, groups: list[tuple[ClusterNode, list[int]]], raw: list[bytes], values: list[Any]
    ) -> list[tuple[ClusterNode, list[int]]]:
        """The read function on every master at once, its answers put in ``values``; the
        groups it could not read (not loaded yet, or a key whose slot left that master)
        are returned, for the pipeline of ``GET``s to say which, as are those of a master
        whose connection was lost."""
        # A connection lost before its call is written fails the call at once: that master's
        # keys go the pipeline's way, through redis-py's client and its retry.
        connections = [await self._lookup(node).connected() for node, _ in groups]
        sent = [
            connection.send(
                "FCALL_RO", READ_FUNCTION, 1, raw[indexes[0]], *(raw[i] for i in indexes)
            )
            for connection, (_, indexes) in zip(connections, groups, strict=True)
        ]
        left = []
        for group, reply in zip(groups, await settled(sent), strict=True):
            if isinstance(reply, ResponseError | RedisConnectionError):
                if "Function not found" in str(reply):
                    self._function = False
                left.append(group)
            elif isinstance(reply, Exception):
                raise reply
            else:  # the function's answer holds values only
                for i, value in zip(group[1], reply, strict=True):
                    values[i] = value
        return left

    async def close(self) -> None:
        """Close the masters' connections."""
        for lookup in self._lookups.values():
            lookup.close()
        self._lookups.clear()
        for client in self._clients.values():
            await client.aclose(close_connection_pool=True)
        self._clients.clear()
