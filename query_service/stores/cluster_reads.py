"""Batch reads on a Redis Cluster: one plain pipeline per master, sent to all at once.

On one server a batch of keys is one ``MGET``. A cluster takes no multi-key
command across slots, and redis-py's cluster pipeline, which routes each
``GET`` itself, spends most of a batch read in Python per command
(``bench/redis_cluster.py`` measured a tenth of one server's rate). Keys are
grouped here by the master that holds their slot, per the client's slot map,
and each group is one call of the materializer's read function on that master
(``FCALL_RO``: a function may read keys of several slots of its own node),
or, where the function is not loaded, one ordinary pipeline of ``GET``s.

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

from materializer.contract.redis_client import by_master
from materializer.contract.redis_layout import READ_FUNCTION


class MasterReads:
    """``GET`` of many keys of a cluster, a pipeline per master."""

    def __init__(self, cluster: AsyncRedisCluster) -> None:
        self._cluster = cluster
        self._clients: dict[str, aioredis.Redis] = {}
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

    async def get(self, keys: Sequence[str]) -> list[Any]:
        """The values of ``keys`` (None where absent), in order."""
        # Encoded once: the slot is computed from the bytes, and the client sends them as
        # they are rather than encode each key again.
        raw = [key.encode() for key in keys]
        groups = by_master(self._cluster, raw)
        values: list[Any] = [None] * len(keys)
        moved: list[int] = []

        async def read(node: ClusterNode, indexes: list[int]) -> None:
            group = [raw[i] for i in indexes]
            replies: list[Any] | None = None
            if self._function:
                try:
                    replies = await self._client(node).execute_command(  # type: ignore[no-untyped-call]
                        "FCALL_RO", READ_FUNCTION, 1, group[0], *group
                    )
                except ResponseError as exc:
                    # Not loaded yet (no materializer started on this cluster), or a key
                    # whose slot left this master: the pipeline of GETs says which.
                    if "Function not found" in str(exc):
                        self._function = False
            if replies is not None:  # the function's answer holds values only
                for i, reply in zip(indexes, replies, strict=True):
                    values[i] = reply
                return
            async with self._client(node).pipeline(transaction=False) as pipe:
                for key in group:
                    pipe.get(key)
                replies = await pipe.execute(raise_on_error=False)
            for i, reply in zip(indexes, replies, strict=True):
                if isinstance(reply, AskError):  # MovedError is one too
                    moved.append(i)
                elif isinstance(reply, ResponseError):
                    raise reply
                else:
                    values[i] = reply

        await asyncio.gather(*(read(node, indexes) for node, indexes in groups.values()))
        if moved:
            again = await self._cluster.mget_nonatomic([keys[i] for i in moved])
            for i, value in zip(moved, again, strict=True):
                values[i] = value
        return values

    async def close(self) -> None:
        """Close the masters' connections."""
        for client in self._clients.values():
            await client.aclose(close_connection_pool=True)
        self._clients.clear()
