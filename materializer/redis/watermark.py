"""The Redis map's bookkeeping: the change entries and the watermark of each batch.

The fold (``redis_fold``) puts a batch's entities in place, and on one server
their change entries in the same atomic call; the watermark goes last, after
every entity of the batch. ``write_partition`` writes entities as final state
(SET or DEL) for those who hold entities already folded, so writing them
twice writes the same values.

Why a replay is safe: each batch's watermark (and change entries written
here) carry the batch's id and its query's app id, and a step whose key
already holds that batch is skipped (``commit``).

With a TTL (``ttl.redis``), every SET also sets the key's expiry (``PX``): a key
not written again within it expires. Bookkeeping keys (``__meta__``, ...) never
expire.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from materializer.batch import Batch, Sink
from materializer.clients.redis import TRANSIENT_ERRORS, Client, connect
from materializer.config import RedisConfig
from materializer.contract.redis_layout import (
    Watermark,
    change_entry,
    changes_key,
    entity_key,
    meta_key,
)

if TYPE_CHECKING:
    from collections.abc import Callable

CHUNK = 2000
WATERMARK_WAIT_S = 120.0
"""How long a batch's watermark waits for a Redis that does not answer (``RedisSink.write``)."""
_clients: dict[RedisConfig, Client] = {}


def client_for(config: RedisConfig) -> Client:
    """One client (and connection pool) per process and server, reused across batches."""
    client = _clients.get(config)
    if client is None:
        client = connect(config)
        _clients[config] = client
    return client


def expiry_ms(ttl: timedelta | None) -> int | None:
    """A TTL as whole milliseconds for ``SET .. PX`` (rounded up: at least 1); None stays None."""
    return None if ttl is None else max(1, math.ceil(ttl / timedelta(milliseconds=1)))


def write_partition(
    config: RedisConfig, map_name: str, rows: Iterable[Any], ttl_ms: int | None = None
) -> None:
    """Executor side: SET or DEL each row's key, pipelined in chunks (not atomic, final-state).

    ``ttl_ms``: each SET also sets the key to expire that many milliseconds later.
    """
    pipe = client_for(config).pipeline(transaction=False)
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
    """``<map>:__meta__``, the batch's watermark, once the fold has put its entities and
    change entries in place (``redis_fold``)."""

    name = "redis"

    def __init__(
        self,
        config: RedisConfig,
        map_name: str,
        end_offsets: Callable[[int], dict[str, dict[int, int]]],
        changes_max_len: int = 100_000,
    ) -> None:
        self.config = config
        self.map_name = map_name
        self.changes_max_len = changes_max_len
        self._end_offsets = end_offsets

    def write(self, batch: Batch) -> None:
        """Commit the batch's watermark, waiting out a Redis that does not answer.

        By now the fold has sent the batch's changelog, so the batch must
        commit: failing it here would replay it onto a copy restored from
        that changelog, and an aggregate would count it twice. A server that
        restarted answers again within seconds (empty: the next batch then
        finds its marker gone and the copy is restored with this batch in
        it); only one that stays away longer than ``WATERMARK_WAIT_S`` fails
        the batch.
        """
        watermark = Watermark(
            batch_id=batch.batch_id,
            offsets=self._end_offsets(batch.batch_id),
            updated_at_ms=int(time.time() * 1000),
            app_id=batch.app_id,
        )
        deadline = time.monotonic() + WATERMARK_WAIT_S
        while True:
            try:
                self.commit(watermark, [])
                return
            except TRANSIENT_ERRORS:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def commit(self, watermark: Watermark, changes: list[tuple[str, bool]]) -> None:
        """The change entries, then the watermark, each once per (app id, batch id).

        The entity writes before them are final-state and may run twice; the
        change stream must not get a replayed batch's entries twice. Each step
        is a transaction on one key, so it works on a Redis Cluster too, where
        ``__changes__`` and ``__meta__`` sit in different slots. Each step
        skips a batch its key already holds: the stream knows it by the batch
        and app id on its last entry, the watermark by its own, so a crash
        between the two steps leaves nothing to do twice.
        """
        self.append_changes(watermark, changes)
        meta = meta_key(self.map_name)
        with client_for(self.config).pipeline(transaction=True) as pipe:
            pipe.watch(meta)
            if _holds(Watermark.from_hash(pipe.hgetall(meta)), watermark):
                return
            pipe.multi()
            fields: dict[Any, Any] = dict(watermark.to_hash())
            pipe.hset(meta, mapping=fields)
            pipe.execute()

    def append_changes(self, watermark: Watermark, changes: list[tuple[str, bool]]) -> None:
        """The batch's change entries, unless the stream's last entry closed this batch."""
        if not changes:
            return
        stream = changes_key(self.map_name)
        with client_for(self.config).pipeline(transaction=True) as pipe:
            pipe.watch(stream)
            newest: list[Any] = pipe.xrevrange(stream, count=1)  # type: ignore[assignment]
            if newest and _holds(last_batch(newest[0][1]), watermark):
                return
            pipe.multi()
            for i, (key, deleted) in enumerate(changes):
                entry: dict[Any, Any] = change_entry(key, deleted, watermark.batch_id)
                if i == len(changes) - 1:
                    entry["app_id"] = watermark.app_id
                pipe.xadd(stream, entry, maxlen=self.changes_max_len, approximate=True)
            pipe.execute()


def last_batch(fields: Mapping[Any, Any]) -> Watermark | None:
    """The batch a stream's last entry closed, from its ``batch_id`` and ``app_id``."""
    if b"app_id" not in fields:
        return None
    return Watermark(batch_id=int(fields[b"batch_id"]), app_id=fields[b"app_id"].decode())


def _holds(current: Watermark | None, batch: Watermark) -> bool:
    """Whether a key already reflects this batch: same app id, same or later batch id."""
    return (
        current is not None
        and current.app_id == batch.app_id
        and current.batch_id >= batch.batch_id
    )
