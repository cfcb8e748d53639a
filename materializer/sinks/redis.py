"""The Redis map: ``<map>:<key>`` per entity, then the watermark and change entries.

Entity writes run on the executors, one pipelined round trip per chunk of a
partition, so the driver never collects the batch. They write final state
(SET or DEL), so replaying a batch rewrites the same values. The watermark
goes last, after every entity of the batch is in place.

With a TTL (``ttl.redis``), every SET also sets the key's expiry (``PX``): a key
not written again within it expires. Bookkeeping keys (``__meta__``, ...) never
expire.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import redis

from materializer.layout import Watermark, change_entry, changes_key, entity_key, meta_key
from materializer.pipeline import columns as c
from materializer.sinks.base import Batch, Sink
from materializer.sinks.encoding import entity_json

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


def expiry_ms(ttl: timedelta | None) -> int | None:
    """A TTL as whole milliseconds for ``SET .. PX`` (rounded up: at least 1); None stays None."""
    return None if ttl is None else max(1, math.ceil(ttl / timedelta(milliseconds=1)))


def write_partition(
    url: str, map_name: str, rows: Iterable[Any], ttl_ms: int | None = None
) -> None:
    """Executor side: SET or DEL each row's key, pipelined in chunks (not atomic, final-state).

    ``ttl_ms``: each SET also sets the key to expire that many milliseconds later.
    """
    pipe = client_for(url).pipeline(transaction=False)
    pending = 0
    for row in rows:
        key = entity_key(map_name, row[0])
        if row[1]:
            pipe.delete(key)
        else:
            pipe.set(key, row[2], px=ttl_ms)
        pending += 1
        if pending >= CHUNK:
            pipe.execute()
            pending = 0
    if pending:
        pipe.execute()


class RedisSink(Sink):
    """Entities on the executors, then ``<map>:__meta__`` from the driver."""

    name = "redis"

    def __init__(
        self,
        url: str,
        map_name: str,
        end_offsets: Callable[[int], dict[str, dict[int, int]]],
        changes_max_len: int = 100_000,
        ttl_ms: int | None = None,
    ) -> None:
        self.url = url
        self.map_name = map_name
        self.changes_max_len = changes_max_len
        self.ttl_ms = ttl_ms
        self._end_offsets = end_offsets

    def write(self, batch: Batch) -> None:
        """Write the batch's entities, then its watermark and change entries together."""
        rows = batch.rows.select(c.KEY, c.DELETED, entity_json(batch.rows[c.ENTITY]))
        rows.foreachPartition(
            functools.partial(write_partition, self.url, self.map_name, ttl_ms=self.ttl_ms)
        )
        watermark = Watermark(
            batch_id=batch.batch_id,
            offsets=self._end_offsets(batch.batch_id),
            updated_at_ms=int(time.time() * 1000),
            app_id=batch.app_id,
        )
        changes = [(r[0], bool(r[1])) for r in batch.rows.select(c.KEY, c.DELETED).collect()]
        self.commit(watermark, changes)

    def commit(self, watermark: Watermark, changes: list[tuple[str, bool]]) -> None:
        """The watermark and the change entries in one MULTI, once per (app id, batch id).

        The entity writes before it are final-state and may run twice; the
        change stream must not get a replayed batch's entries twice, so a
        watermark already at this batch of this app id skips the commit.
        """
        meta, stream = meta_key(self.map_name), changes_key(self.map_name)
        with client_for(self.url).pipeline(transaction=True) as pipe:
            pipe.watch(meta)  # type: ignore[no-untyped-call]
            current = Watermark.from_hash(pipe.hgetall(meta))
            if (
                current is not None
                and current.app_id == watermark.app_id
                and current.batch_id >= watermark.batch_id
            ):
                return
            pipe.multi()
            fields: dict[Any, Any] = dict(watermark.to_hash())
            pipe.hset(meta, mapping=fields)
            for key, deleted in changes:
                entry: dict[Any, Any] = change_entry(key, deleted, watermark.batch_id)
                pipe.xadd(stream, entry, maxlen=self.changes_max_len, approximate=True)
            pipe.execute()
