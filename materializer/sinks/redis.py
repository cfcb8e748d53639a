"""The Redis map: ``<map>:<key>`` per entity, then the batch watermark.

Entity writes run on the executors, one pipelined round trip per chunk of a
partition, so the driver never collects the batch. They write final state
(SET or DEL), so replaying a batch rewrites the same values. The watermark
goes last, after every entity of the batch is in place.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import redis

from materializer.layout import Watermark, entity_key, meta_key
from materializer.pipeline import columns as c
from materializer.sinks.base import Batch, Sink

if TYPE_CHECKING:
    from collections.abc import Callable

CHUNK = 2000
_clients: dict[str, redis.Redis] = {}


def client_for(url: str) -> redis.Redis:
    """One client (and connection pool) per process and URL, reused across batches."""
    client = _clients.get(url)
    if client is None:
        client = redis.Redis.from_url(url)
        _clients[url] = client
    return client


def write_partition(url: str, map_name: str, rows: Iterable[Any]) -> None:
    """Executor side: SET or DEL each row's key, pipelined in chunks (not atomic, final-state)."""
    pipe = client_for(url).pipeline(transaction=False)
    pending = 0
    for row in rows:
        key = entity_key(map_name, row[0])
        if row[1]:
            pipe.delete(key)
        else:
            pipe.set(key, row[2])
        pending += 1
        if pending >= CHUNK:
            pipe.execute()
            pending = 0
    if pending:
        pipe.execute()


class RedisSink(Sink):
    """Entities on the executors, then ``<map>:__meta__`` from the driver."""

    def __init__(
        self,
        url: str,
        map_name: str,
        end_offsets: Callable[[int], dict[str, dict[int, int]]],
    ) -> None:
        self.url = url
        self.map_name = map_name
        self._end_offsets = end_offsets

    def write(self, batch: Batch) -> None:
        """Write the batch's entities, then its watermark."""
        from pyspark.sql import functions as F

        rows = batch.rows.select(c.KEY, c.DELETED, F.to_json(c.ENTITY))
        rows.foreachPartition(functools.partial(write_partition, self.url, self.map_name))
        watermark = Watermark(
            batch_id=batch.batch_id,
            offsets=self._end_offsets(batch.batch_id),
            updated_at_ms=int(time.time() * 1000),
        )
        fields: dict[Any, Any] = dict(watermark.to_hash())
        client_for(self.url).hset(meta_key(self.map_name), mapping=fields)
