"""Following a map's change stream forward without ever skipping changes silently.

``<map>:__changes__`` is capped (``maps.<map>.changes.max_len``): entries older
than the newest few are trimmed away. A reader that falls behind the trim, or
resumes from a position that was trimmed, has missed changes; it is told so
with ``OutOfRange`` instead of being handed what is left as if nothing were
missing. ``MapService.Watch`` and the near cache's invalidation both follow a
map with a ``ChangeCursor``.
"""

from __future__ import annotations

import asyncio
import re

from query_service.errors import InvalidArgument, OutOfRange
from query_service.stores.base import Change, ChangeRead, MapStore

StreamId = tuple[int, int]
"""A stream entry id ``<milliseconds>-<sequence>`` as numbers, so ids compare in order."""

ORIGIN: StreamId = (0, 0)
"""Before every entry: reading after it starts at the oldest retained one."""

WAIT_SECONDS = 2.0
"""How long one blocking wait lasts before the reader reads again (and so notices a
dead connection even when nothing changes)."""

# ASCII digits, as the OpenAPI document's pattern says: \d would take any script's digits.
_ID = re.compile(r"([0-9]{1,20})(?:-([0-9]{1,20}))?")
_MAX_PART = 2**64 - 1


def parse_change_id(text: str) -> StreamId:
    """``ms-seq`` (or ``ms``, meaning ``ms-0``) as numbers; ``ValueError`` if it is none."""
    match = _ID.fullmatch(text)
    if match is None:
        raise ValueError(text)
    ms, seq = int(match[1]), int(match[2] or 0)
    if ms > _MAX_PART or seq > _MAX_PART:
        raise ValueError(text)
    return ms, seq


def format_change_id(position: StreamId) -> str:
    """The id as Redis writes it."""
    return f"{position[0]}-{position[1]}"


def missed(map_name: str, position: StreamId, read: ChangeRead) -> str | None:
    """Why changes after ``position`` may have been lost, or ``None`` if none were.

    Trimming removes the oldest entries, so a position still inside the
    retained range ``[first, last]`` has lost nothing. A position older than
    the oldest retained entry has lost the entries between them, unless it was
    the very last one trimmed; that cannot be told apart, so it counts as
    missed. A position newer than the newest entry, or a stream that is gone,
    means the map's store was rebuilt. ``ORIGIN`` asks for what is retained
    and misses nothing by definition.
    """
    if position == ORIGIN:
        return None
    seen = format_change_id(position)
    if read.first_id is None or read.last_id is None:
        return f"map {map_name!r} has no changes retained, so those after {seen} are lost"
    if position > parse_change_id(read.last_id):
        return f"change {seen} is newer than map {map_name!r}'s newest change {read.last_id}"
    if position < parse_change_id(read.first_id):
        return (
            f"changes of map {map_name!r} after {seen} were trimmed "
            f"(oldest retained: {read.first_id}; maps.{map_name}.changes.max_len)"
        )
    return None


class ChangeCursor:
    """One reader's position in one map's change stream; reads strictly after it, in order.

    Not shared between tasks. Store errors (``StoreUnavailable``) propagate;
    the position stays where it was, so a caller may read again.
    """

    def __init__(
        self, store: MapStore, map_name: str, *, batch: int, wait_seconds: float = WAIT_SECONDS
    ) -> None:
        self._store = store
        self._map = map_name
        self._batch = batch
        self._wait = wait_seconds
        self._position = ORIGIN
        self._generation: int | None = None
        self._pending: list[Change] = []

    async def open(self, after: str) -> None:
        """Place the cursor: ``""`` after the newest change now, ``"0"`` before the oldest
        retained one, otherwise after the change id ``after``.

        A change id is checked at once with a first read, so one that was
        trimmed (or never existed) fails here with ``OutOfRange``, before the
        caller answers anything; a malformed one is ``InvalidArgument``.
        """
        if not after:
            self._generation = await self._store.generation(self._map)
            newest = await self._store.last_change_id(self._map)
            self._position = ORIGIN if newest is None else parse_change_id(newest)
            return
        try:
            self._position = parse_change_id(after)
        except ValueError:
            raise InvalidArgument(
                f"after_change_id: {after!r} is not a change id "
                '(a Change.change_id such as "1700000000000-0", "0", or empty)'
            ) from None
        self._pending = await self._read()

    async def next(self) -> list[Change]:
        """The next changes after the position (at least one), waiting as long as it takes.

        Raises ``OutOfRange`` when changes after the position were trimmed
        before this reader got to them.
        """
        while not self._pending:
            self._pending = await self._read()
            _raise_if_cancelled()
            if not self._pending:
                await self._store.wait_for_changes(
                    self._map, format_change_id(self._position), self._wait
                )
                _raise_if_cancelled()
        changes, self._pending = self._pending, []
        return changes

    async def _read(self) -> list[Change]:
        read = await self._store.read_changes(
            self._map, format_change_id(self._position), self._batch
        )
        if self._generation is None:
            self._generation = read.generation
        problem = missed(self._map, self._position, read)
        if read.generation != self._generation:
            problem = (
                f"map {self._map!r} was rebuilt (generation {read.generation}) and its changes "
                "start over"
            )
        if problem is not None:
            raise OutOfRange(f"{problem}: re-read the map, then watch from the newest change")
        if read.changes:
            self._position = parse_change_id(read.changes[-1].change_id)
        return read.changes


def _raise_if_cancelled() -> None:
    """End a follow loop whose cancellation a library lost.

    On Python 3.11, ``asyncio.wait_for`` (redis-py wraps every socket write in
    it when a socket timeout is set) swallows a cancellation that lands as
    the write completes. The task still counts the request, so a loop that
    checks it stops at its next turn instead of following a stream for a
    caller that has gone (a cancelled Watch, a closed near cache).
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
