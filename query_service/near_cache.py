"""The near cache: an in-process LRU of a map's entities in front of Redis.

Like Hazelcast's near cache, it is off by default and on for the maps listed
under ``query.near_cache``. It must never make an answer staler than the
watermark that comes with it:

- each entry keeps the watermark it was read under, and a hit answers with
  that watermark, not the map's current one;
- a lookup whose ``freshness.min_offsets`` an entry's watermark does not
  cover goes to Redis (and refreshes the entry);
- one task per cached map follows ``<map>:__changes__`` and drops every key a
  change names. Its position is fixed before anything is cached, so every
  change written after a fill is seen. A fill that overlaps an invalidation is
  not kept, since it may hold the value the change replaced;
- when the follower cannot vouch for the cache (changes trimmed before it
  read them, a store error), the whole cache is dropped and nothing is cached
  until it follows the stream again.

Absent keys are cached too: the materializer appends a change for every key
it writes, creations included, so a negative entry is invalidated like any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence

from prometheus_client import Counter

from materializer.config import NearCacheConfig
from materializer.contract.watermark import Watermark
from materializer.v1 import common_pb2 as common
from query_service.change_stream import ChangeCursor
from query_service.errors import OutOfRange, StoreUnavailable
from query_service.freshness import covers
from query_service.stores.base import BatchLookup, Lookup, MapStore

log = logging.getLogger(__name__)

LOOKUPS = Counter(
    "materializer_query_near_cache_lookups_total",
    "Keys looked up in a map's near cache, by map and result (hit or miss).",
    ["map", "result"],
)
FOLLOW_BATCH = 1000
"""Changes read per round trip by a follower."""
START_SECONDS = 5.0
"""``start`` waits this long at most for the followers' first attempt."""
RETRY_SECONDS = (0.1, 5.0)
"""A follower's first and longest pause after a store error."""


class NearCache:
    """One map's LRU of lookups (entity or absence, with the watermark each was read under).

    Used from one event loop only; its methods never await, so each is atomic
    with respect to the follower and the lookups.
    """

    def __init__(self, map_name: str, max_entries: int) -> None:
        self.map_name = map_name
        self._max = max_entries
        self._entries: OrderedDict[str, Lookup] = OrderedDict()
        self._epoch = 0
        self._live = False
        self._hits = LOOKUPS.labels(map_name, "hit")
        self._misses = LOOKUPS.labels(map_name, "miss")

    def lookup_many(
        self, keys: Sequence[str], wanted: Sequence[common.PartitionOffset]
    ) -> list[Lookup | None]:
        """The cached lookup of each key, ``None`` for a miss (also when not fresh enough)."""
        found: list[Lookup | None] = []
        for key in keys:
            entry = self._entries.get(key) if self._live else None
            if entry is not None and wanted and not covers(entry.watermark, wanted):
                entry = None
            if entry is not None:
                self._entries.move_to_end(key)
            found.append(entry)
        hits = sum(entry is not None for entry in found)
        self._hits.inc(hits)
        self._misses.inc(len(found) - hits)
        return found

    def begin_fill(self) -> int | None:
        """A token to pass to ``fill`` after reading the store; ``None`` while not live."""
        return self._epoch if self._live else None

    def fill(
        self,
        token: int | None,
        entities: Iterable[tuple[str, bytes | None]],
        mark: Watermark | None,
    ) -> None:
        """Keep what was read under ``token`` unless the cache changed since it was taken."""
        if token is None or token != self._epoch:
            return
        for key, entity in entities:
            self._entries[key] = Lookup(entity=entity, watermark=mark)
            self._entries.move_to_end(key)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)

    def invalidate(self, keys: Iterable[str]) -> None:
        """Drop these keys, and any fill in flight.

        Every fill in flight, not only those of these keys: a fill takes one
        round trip and invalidations come once per micro-batch, so little is
        lost, and no per-key bookkeeping can go wrong.
        """
        for key in keys:
            self._entries.pop(key, None)
        self._epoch += 1

    def clear(self, *, live: bool) -> None:
        """Drop everything and any fill in flight; ``live`` says whether to cache from now on."""
        self._entries.clear()
        self._epoch += 1
        self._live = live


def oldest(marks: Iterable[Watermark | None]) -> Watermark | None:
    """The watermark that is a lower bound for all: ``None`` (no batch yet) before any batch.

    A map's watermarks only move forward, so the one with the smallest offsets
    (then batch id) was written first.
    """
    return min(
        marks,
        key=lambda m: (-1, 0) if m is None else (sum(_all_offsets(m)), m.batch_id),
    )


def _all_offsets(mark: Watermark) -> Iterable[int]:
    return (offset for partitions in mark.offsets.values() for offset in partitions.values())


class NearCaches:
    """The near caches of one process and their followers; lookups go through here.

    Maps without a near cache read the store directly. ``start`` and
    ``close`` belong to the server's life: start before serving, close after
    the server stopped and before the store is closed.
    """

    def __init__(self, store: MapStore, maps: Mapping[str, NearCacheConfig]) -> None:
        self._store = store
        self._caches = {name: NearCache(name, c.max_entries) for name, c in maps.items()}
        self._followers: list[asyncio.Task[None]] = []

    async def start(self, timeout: float = START_SECONDS) -> None:
        """Follow every cached map; return once each follower made its first attempt.

        A follower that cannot reach Redis keeps trying in the background; its
        map is read from Redis meanwhile.
        """
        attempts = []
        for cache in self._caches.values():
            attempted = asyncio.Event()
            attempts.append(attempted)
            self._followers.append(
                asyncio.create_task(
                    self._follow(cache, attempted), name=f"near-cache-{cache.map_name}"
                )
            )
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await asyncio.gather(*(a.wait() for a in attempts))

    async def close(self) -> None:
        """Stop the followers."""
        for task in self._followers:
            task.cancel()
        await asyncio.gather(*self._followers, return_exceptions=True)
        self._followers.clear()

    async def get(
        self, map_name: str, key: str, wanted: Sequence[common.PartitionOffset]
    ) -> Lookup:
        """``MapStore.get_with_watermark`` through the map's near cache."""
        cache = self._caches.get(map_name)
        if cache is None:
            return await self._store.get_with_watermark(map_name, key)
        hit = cache.lookup_many([key], wanted)[0]
        if hit is not None:
            return hit
        token = cache.begin_fill()
        lookup = await self._store.get_with_watermark(map_name, key)
        cache.fill(token, [(key, lookup.entity)], lookup.watermark)
        return lookup

    async def get_many(
        self, map_name: str, keys: Sequence[str], wanted: Sequence[common.PartitionOffset]
    ) -> BatchLookup:
        """``MapStore.get_many`` through the map's near cache: misses in one round trip.

        The watermark is the oldest of those the answer's entries were read
        under, so it is a lower bound for every entry.
        """
        cache = self._caches.get(map_name)
        if cache is None:
            return await self._store.get_many(map_name, keys)
        found = cache.lookup_many(keys, wanted)
        misses = list(dict.fromkeys(k for k, hit in zip(keys, found, strict=True) if hit is None))
        marks = [hit.watermark for hit in found if hit is not None]
        read: dict[str, bytes | None] = {}
        if misses or not marks:
            token = cache.begin_fill()
            batch = await self._store.get_many(map_name, misses)
            read = dict(zip(misses, batch.entities, strict=True))
            cache.fill(token, read.items(), batch.watermark)
            marks.append(batch.watermark)
        return BatchLookup(
            entities=[
                read[k] if hit is None else hit.entity for k, hit in zip(keys, found, strict=True)
            ],
            watermark=oldest(marks),
        )

    async def _follow(self, cache: NearCache, attempted: asyncio.Event) -> None:
        """Invalidate ``cache`` from the map's changes until cancelled.

        Every failure drops the whole cache and starts over from the newest
        change, so no entry outlives a change the follower could not see.
        """
        pause = RETRY_SECONDS[0]
        task = asyncio.current_task()
        while True:
            if task is not None and task.cancelling():
                # A stop's cancellation the Redis client took for a lost connection
                # (``health.RedisHealth`` meets the same): end, or the stop waits forever.
                raise asyncio.CancelledError
            cursor = ChangeCursor(self._store, cache.map_name, batch=FOLLOW_BATCH)
            try:
                await cursor.open("")
                cache.clear(live=True)
                attempted.set()
                pause = RETRY_SECONDS[0]
                while True:
                    cache.invalidate(change.key for change in await cursor.next())
            except OutOfRange as exc:
                log.warning("near cache of %s dropped: %s", cache.map_name, exc)
                cache.clear(live=False)
            except Exception as exc:
                # A background task has nobody to raise to: log, drop, and keep trying,
                # so the cache is never served while nobody follows the changes.
                unexpected = not isinstance(exc, StoreUnavailable)
                log.warning(
                    "near cache of %s dropped, retrying: %s",
                    cache.map_name,
                    exc,
                    exc_info=unexpected,
                )
                cache.clear(live=False)
                attempted.set()
                await asyncio.sleep(pause)
                pause = min(pause * 2, RETRY_SECONDS[1])
