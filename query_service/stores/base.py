"""The boundary between the RPC handlers and where map data lives."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from materializer.contract.watermark import Watermark


class Lookup(NamedTuple):
    """One entity and the watermark of its map, read together."""

    entity: bytes | None
    """The entity as compact UTF-8 JSON, exactly as stored; ``None`` when absent."""
    watermark: Watermark | None
    """The map's watermark; ``None`` when the map has no batch yet."""


class BatchLookup(NamedTuple):
    """Entities of one map, in the order of the keys asked for, and its watermark."""

    entities: list[bytes | None]
    watermark: Watermark | None


class Change(NamedTuple):
    """One entry of a map's change stream ``<map>:__changes__``."""

    change_id: str
    """The stream entry id, ``<milliseconds>-<sequence>``; ids increase."""
    key: str
    deleted: bool
    """``op`` is ``delete`` or ``expire``; otherwise ``upsert``."""
    batch_id: int
    """-1 for an expiry."""
    expired: bool = False
    """``op`` is ``expire``: the map's ``ttl.redis`` ran out (``deleted`` too)."""


class ChangeRead(NamedTuple):
    """Changes read strictly after a position, and the stream's bounds read with them.

    The bounds come from the same atomic read as the changes, so a reader can
    tell whether anything between its position and ``changes[0]`` was trimmed
    away: if its position is older than ``first_id``, it may have been.
    """

    changes: list[Change]
    first_id: str | None
    """The oldest retained entry; ``None`` when the stream is empty or absent."""
    last_id: str | None
    """The newest entry; ``None`` when the stream is empty or absent."""
    generation: int = 0
    """The generation of the map's data read; a rebuild starts a new stream with a new one."""


class MapStore(ABC):
    """Read-only access to materialized maps, shared by every RPC of a process.

    Implementations are safe for concurrent use by many tasks on one event
    loop and hold their connections for the life of the process: create one
    per server, never one per request. Map names reaching a store are already
    validated against the configuration; keys are non-empty strings.

    Errors: a backend that cannot be reached raises
    ``query_service.errors.StoreUnavailable``; anything else is a bug or a
    broken layout and surfaces as ``INTERNAL``.

    Change streams are an optional ability: a store without one raises
    ``NotImplementedError`` from ``last_change_id``, ``read_changes`` and
    ``wait_for_changes``.
    """

    @abstractmethod
    async def get(self, map_name: str, key: str) -> bytes | None:
        """The entity stored under ``key``, or ``None`` if there is none."""

    @abstractmethod
    async def watermark(self, map_name: str) -> Watermark | None:
        """The watermark of the last batch written, or ``None`` before the first."""

    @abstractmethod
    async def get_with_watermark(self, map_name: str, key: str) -> Lookup:
        """Entity and watermark in one round trip, the watermark read first.

        Reading the watermark first makes it a lower bound: the materializer
        writes a batch's entities no later than its watermark, so the entity
        returned reflects at least that batch (possibly a newer one). A caller
        waiting for its own write to land can trust a watermark that covers it.
        """

    @abstractmethod
    async def get_many(self, map_name: str, keys: Sequence[str]) -> BatchLookup:
        """Many entities of one map and its watermark in one round trip (watermark first)."""

    @abstractmethod
    async def get_across(self, keys_by_map: Mapping[str, Sequence[str]]) -> dict[str, BatchLookup]:
        """Entities of several maps in one round trip: one watermark read and one ``MGET``
        per map, all pipelined. The enrichment join's batched lookup."""

    async def generation(self, map_name: str) -> int:
        """The generation of the map's data lookups read now (0 for a store without rebuilds)."""
        return 0

    async def last_change_id(self, map_name: str) -> str | None:
        """The id of the map's newest change, or ``None`` when its stream is empty or absent."""
        raise NotImplementedError(f"{type(self).__name__} has no change stream")

    async def read_changes(self, map_name: str, after: str, count: int) -> ChangeRead:
        """At most ``count`` changes with ids greater than ``after``, oldest first, at once.

        Never blocks: with nothing newer, ``changes`` is empty. Changes and
        bounds are read atomically (see ``ChangeRead``).
        """
        raise NotImplementedError(f"{type(self).__name__} has no change stream")

    async def wait_for_changes(self, map_name: str, after: str, timeout: float) -> None:
        """Return once a change newer than ``after`` exists, or after about ``timeout`` seconds.

        Returning says nothing about what exists: callers read again, then
        wait again if there was nothing. Waiting readers must not take the
        connections lookups need. Cancellation ends the wait at once.
        """
        raise NotImplementedError(f"{type(self).__name__} has no change stream")

    @abstractmethod
    async def close(self) -> None:
        """Release connections; the store must not be used afterwards."""
