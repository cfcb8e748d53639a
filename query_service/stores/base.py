"""The boundary between the RPC handlers and where map data lives."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from materializer.layout import Watermark


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


class MapStore(ABC):
    """Read-only access to materialized maps, shared by every RPC of a process.

    Implementations are safe for concurrent use by many tasks on one event
    loop and hold their connections for the life of the process: create one
    per server, never one per request. Map names reaching a store are already
    validated against the configuration; keys are non-empty strings.

    Errors: a backend that cannot be reached raises
    ``query_service.errors.StoreUnavailable``; anything else is a bug or a
    broken layout and surfaces as ``INTERNAL``.
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

    @abstractmethod
    async def close(self) -> None:
        """Release connections; the store must not be used afterwards."""
