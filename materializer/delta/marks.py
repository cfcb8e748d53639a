"""Which source offsets a Delta batch's MERGE reflects, recorded in its commit.

The Delta query merges the changelog, not the sources, so it learns the
source offsets from the fold's table marks in Redis
(``contract.table_marks.TableMark``): the newest mark whose changelog ends
the batch has reached (its own end offsets, from its checkpoint) names a
watermark every record of which the table now holds. When none qualifies
(the batch merged only part of a fold batch, or Redis does not answer) the
commit carries the last watermark recorded, read back from the table's newest
commits after a restart: under-claiming is safe, over-claiming never happens. Every
commit records how far it merged the changelog (``delta.positions``), with or without
a watermark.

A fold batch's changelog goes out before its watermark and mark are
committed, so a Delta batch planned in between finds the changelog past
every mark; it waits for that mark a little (``MARK_WAIT_SECONDS``), since in
a quiet spell no later Delta batch would record it. Readers of the table who
can reach Redis close the rest of that gap themselves from the commit's
``changelog`` (``contract.table_marks``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import redis

from materializer.clients.redis import Client, client_for
from materializer.config import RedisConfig
from materializer.contract.redis_layout import table_marks_key
from materializer.contract.table_marks import TableMark, encode
from materializer.delta.positions import MergedPositions

if TYPE_CHECKING:
    from materializer.contract.watermark import Watermark

log = logging.getLogger(__name__)

FIRST_READ = 16
"""Marks read first, newest first; each further read takes 8 times more."""
MARK_WAIT_SECONDS = 0.5
"""How long a batch that merged changelog records past every mark waits for the mark of
the fold batch that sent them."""
MARK_POLL_SECONDS = 0.02


class SourceOffsets:
    """The ``userMetadata`` of each Delta batch's commit (driver side; one per Delta query).

    ``end_offsets``: the Delta query's batch end offsets (``Checkpoint.end_offsets``).
    ``merged``: the table's merged position, which holds the last mark recorded too.
    ``mark_wait``: how long a batch past every mark waits for one (None:
    ``MARK_WAIT_SECONDS``).
    """

    def __init__(
        self,
        redis: RedisConfig,
        physical: str,
        end_offsets: Callable[[int], dict[str, dict[int, int]]],
        merged: MergedPositions,
        mark_wait: float | None = None,
    ) -> None:
        self._mark_wait = mark_wait
        self._redis = redis
        self._key = table_marks_key(physical)
        self.changelog = merged.changelog
        self._end_offsets = end_offsets
        self._merged = merged
        self._last: Watermark | None = None
        self._last_id: bytes | None = None
        """The stream id of the mark ``_last`` came from; None after a restart."""
        self._read_back = False

    def user_metadata(self, batch_id: int) -> str | None:
        """JSON for the commit of ``batch_id`` (``contract.table_marks.encode``): the
        changelog position it reaches, and the watermark once one is known."""
        reached = self._merged.reached(self._end_offsets(batch_id).get(self.changelog, {}))
        return encode(self._watermark(reached), {self.changelog: reached})

    def mark_only(self, batch_id: int) -> str | None:
        """JSON for a commit of ``batch_id`` that merges nothing, when a mark newer than the
        last one recorded is reached; None when none is. The last mark of a map that stopped
        comes after its last changes, so no MERGE may ever record it: a commit of its own
        does (a stop's drain, the first batch of a map's query after it leaves the real-time
        path)."""
        reached = self._merged.reached(self._end_offsets(batch_id).get(self.changelog, {}))
        self._read_recorded()
        recorded = self._last
        watermark = self._watermark(reached)
        if watermark is None or watermark == recorded:
            return None
        return encode(watermark, {self.changelog: reached})

    def _read_recorded(self) -> None:
        """The last watermark recorded, read back from the table once after a start."""
        if not self._read_back:
            recorded = self._merged.recorded()
            self._last = None if recorded is None else recorded.watermark
            self._read_back = True

    def _watermark(self, reached: dict[int, int]) -> Watermark | None:
        self._read_recorded()
        wait = MARK_WAIT_SECONDS if self._mark_wait is None else self._mark_wait
        deadline = time.monotonic() + wait
        try:
            while True:
                found, past = self._newest_reached(reached)
                if found is not None:
                    self._last_id, mark = found
                    self._last = mark.watermark
                if not past or time.monotonic() > deadline:
                    break
                time.sleep(MARK_POLL_SECONDS)
        except (redis.RedisError, ValueError) as exc:  # a mark is an extra: the MERGE goes on
            log.warning("%r: table marks not read, the last one carried (%s)", self._key, exc)
        return self._last

    def _newest_reached(
        self, reached: dict[int, int]
    ) -> tuple[tuple[bytes, TableMark] | None, bool]:
        """The newest mark (id, mark) newer than the last recorded one that ``reached``
        reaches, or None; and whether ``reached`` goes past every mark (a fold batch's
        changelog ahead of its mark)."""
        client = client_for(self._redis)
        low = "-" if self._last_id is None else b"(" + self._last_id
        high: bytes | str = "+"
        count = FIRST_READ
        newest: TableMark | None = None
        while True:
            entries: Any = client.xrevrange(self._key, max=high, min=low, count=count)
            for entry_id, fields in entries:
                mark = TableMark.from_entry(fields)
                if mark is None:
                    continue
                if newest is None:
                    newest = mark
                if mark.reached_by(reached):
                    return (bytes(entry_id), mark), _past(reached, newest)
            if len(entries) < count:
                break
            high = b"(" + bytes(entries[-1][0])
            count *= 8
        if newest is None and self._last_id is not None:
            newest = self._newest_any(client)
        return None, newest is not None and _past(reached, newest)

    def _newest_any(self, client: Client) -> TableMark | None:
        entries: Any = client.xrevrange(self._key, count=1)
        return TableMark.from_entry(entries[0][1]) if entries else None


def _past(reached: dict[int, int], mark: TableMark) -> bool:
    """Whether ``reached`` goes past ``mark``'s changelog ends in some partition."""
    return any(end > mark.changelog.get(p, 0) for p, end in reached.items())
