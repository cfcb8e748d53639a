"""Read-your-writes: hold a lookup until its map's watermark covers given offsets.

Many calls may wait on one map at once; one poller per map reads the
watermark for all of them, and only while someone waits, so a thousand
waiting calls cost Redis one ``HGETALL`` per interval, not a thousand.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Collection, Mapping, Sequence

from materializer.contract.watermark import Watermark
from materializer.v1 import common_pb2 as common
from query_service.errors import DeadlineExceeded, InvalidArgument
from query_service.stores.base import MapStore

POLL_SECONDS = 0.01
MAX_WAIT_SECONDS = 60.0
"""A call without a deadline waits at most this long."""
MARGIN_SECONDS = 0.05
"""Give up this much before the deadline, so the caller reads our message, not gRPC's."""


def covers(watermark: Watermark | None, wanted: Sequence[common.PartitionOffset]) -> bool:
    """Whether every wanted partition's next offset has been reached."""
    if watermark is None:
        return not wanted
    return all(watermark.offsets.get(w.topic, {}).get(w.partition, 0) >= w.offset for w in wanted)


def check_positions(
    map_name: str, topics: Collection[str], wanted: Sequence[common.PartitionOffset]
) -> None:
    """A position in a topic the map does not read could never be reached."""
    for i, w in enumerate(wanted):
        if w.topic not in topics:
            raise InvalidArgument(
                f"freshness.min_offsets[{i}].topic: map {map_name!r} does not read "
                f"{w.topic!r} (it reads {', '.join(sorted(topics))})"
            )
        if w.partition < 0 or w.offset < 0:
            raise InvalidArgument(f"freshness.min_offsets[{i}]: partition and offset must be >= 0")


class FreshnessGate:
    """Waits for watermarks, one shared poller per map with waiters."""

    def __init__(self, store: MapStore, topics: Mapping[str, Collection[str]]) -> None:
        self._store = store
        self._topics = topics
        self._changed: dict[str, asyncio.Condition] = {}
        self._latest: dict[str, Watermark | None] = {}
        self._waiters: dict[str, int] = {}
        self._pollers: dict[str, asyncio.Task[None]] = {}

    async def wait(
        self,
        map_name: str,
        wanted: Sequence[common.PartitionOffset],
        time_remaining: float | None,
    ) -> None:
        """Return once the map covers ``wanted``; ``DeadlineExceeded`` before the deadline."""
        if not wanted:
            return
        check_positions(map_name, self._topics[map_name], wanted)
        if covers(await self._store.watermark(map_name), wanted):
            return
        budget = MAX_WAIT_SECONDS if time_remaining is None else time_remaining - MARGIN_SECONDS
        changed = self._changed.setdefault(map_name, asyncio.Condition())
        self._waiters[map_name] = self._waiters.get(map_name, 0) + 1
        if map_name not in self._pollers:
            self._pollers[map_name] = asyncio.create_task(self._poll(map_name))
        try:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for can lose the call's
            # cancellation when the condition is met in the same step.
            async with asyncio.timeout(max(budget, 0.0)), changed:
                await changed.wait_for(lambda: covers(self._latest.get(map_name), wanted))
        except TimeoutError:
            mark = self._latest.get(map_name)
            have = mark.offsets if mark else {}
            raise DeadlineExceeded(
                f"map {map_name!r} did not reach the requested offsets before the deadline "
                f"(it is at {have or 'no batch yet'})"
            ) from None
        finally:
            self._waiters[map_name] -= 1

    async def _poll(self, map_name: str) -> None:
        changed = self._changed[map_name]
        try:
            while self._waiters.get(map_name, 0) > 0:
                # A store error ends this round only; waiters give up at their deadline.
                with contextlib.suppress(Exception):
                    mark = await self._store.watermark(map_name)
                    if mark != self._latest.get(map_name):
                        self._latest[map_name] = mark
                        async with changed:
                            changed.notify_all()
                await asyncio.sleep(POLL_SECONDS)
        finally:
            del self._pollers[map_name]


def watermark_to_proto(watermark: Watermark) -> common.Watermark:
    """The wire form of a watermark: offsets ordered by topic, then partition.

    ``updated_at_ms`` of 0 means the writer recorded no time; ``updated_at``
    then stays unset rather than claiming 1970.
    """
    message = common.Watermark(
        batch_id=watermark.batch_id,
        offsets=[
            common.PartitionOffset(topic=topic, partition=partition, offset=offset)
            for topic, partitions in sorted(watermark.offsets.items())
            for partition, offset in sorted(partitions.items())
        ],
    )
    if watermark.updated_at_ms:
        message.updated_at.FromMilliseconds(watermark.updated_at_ms)
    return message
