"""A map's indexes read from Redis: which answer now, and their entries with the entities.

An index answers only where every master lists its field as built and still has the
slots it was built for (``index_entries.IndexState``): a master a reshard changed holds
entries of entities it no longer has, and lacks those it was given. What each master
lists is read at most once a second per map; a new index answers that much later.

Each master's entries and entities are read in one atomic call of the index read
function there (``FCALL_RO``), which first checks that the field is still in the state
the reader found it built: an index dropped or being built again meanwhile is
``IndexUnread``, never a partial answer. The masters' answers are merged in entry order.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from typing import Any

from redis.exceptions import ResponseError

from materializer.clients.redis import AsyncClient, is_cluster
from materializer.contract.index_entries import IndexState, raw_states, slots_of
from materializer.contract.markers import tags
from materializer.contract.redis_layout import (
    INDEX_READ_FUNCTION,
    entity_key,
    index_fields_key,
    index_key,
)
from query_service.indexes.plan import IndexScan
from query_service.stores.redis_errors import unavailable_on_connection_errors

READY_SECONDS = 1.0
"""How long what the masters list is taken as it was read."""

Entry = tuple[bytes, bytes | None]
"""An index entry and its entity's JSON (``None``: gone since, expired)."""


class IndexUnread(Exception):
    """An index could not be read as found built: dropped or built again since, the map's
    slots moved, or Redis refused the read. The query reads the table instead, or, when
    pages went out already, fails."""


class IndexReads:
    """Reads of the maps' indexes on one server or the masters of a cluster."""

    def __init__(self, client: AsyncClient, where: str) -> None:
        self._client = client
        self._where = where
        self._ready: dict[str, tuple[float, dict[str, str]]] = {}
        self._states: dict[tuple[str, str], dict[str, bytes]] = {}
        """Per map and field: each master's state of it as read (the read checks it)."""

    def _masters(self) -> dict[str, Any]:
        if not is_cluster(self._client):
            return {"": None}
        return {node.name: node for node in self._client.get_primaries()}

    async def _call(self, node: Any, *args: Any) -> Any:
        options = {} if node is None else {"target_nodes": node}
        return await self._client.execute_command(*args, **options)

    async def ready(self, physical: str) -> dict[str, str]:
        """The map's indexes that answer now: field to kind (``hash`` or ``sorted``)."""
        now = time.monotonic()
        kept = self._ready.get(physical)
        if kept is not None and now - kept[0] < READY_SECONDS:
            return kept[1]
        if is_cluster(self._client):  # its slot map is read at its first command
            async with unavailable_on_connection_errors(self._where):
                await self._client.initialize()
        masters, where = self._masters(), tags(self._client, physical)
        slots = slots_of(self._client)
        async with unavailable_on_connection_errors(self._where):
            replies = await asyncio.gather(
                *(
                    self._call(node, "HGETALL", index_fields_key(physical, where[name]))
                    for name, node in masters.items()
                )
            )
        answering: dict[str, str] | None = None
        raw: dict[str, dict[str, bytes]] = {}
        for name, reply in zip(masters, replies, strict=True):
            listed = raw_states(reply)
            states = {field: IndexState.loads(state) for field, state in listed.items()}
            for field, state in listed.items():
                raw.setdefault(field, {})[name] = state
            here = {
                field: state.kind
                for field, state in states.items()
                if state.ready and state.slots == slots.get(name)
            }
            answering = (
                here
                if answering is None
                else {f: k for f, k in answering.items() if here.get(f) == k}
            )
        found = answering or {}
        self._ready[physical] = (now, found)
        for field in found:
            self._states[(physical, field)] = raw[field]
        return found

    def forget(self, physical: str) -> None:
        """Read the map's indexes again at the next call (one changed under a read)."""
        self._ready.pop(physical, None)

    async def entries(
        self, physical: str, scan: IndexScan, after: bytes | None, count: int
    ) -> list[Entry]:
        """The first ``count`` entries of ``scan`` after ``after`` (None: from the start),
        over every master, in entry order, each with its entity."""
        spans: list[bytes] = []
        for start, end in scan.spans:
            if after is not None and after >= end:
                continue
            low = b"(" + after if after is not None and after >= start else b"[" + start
            spans += [low, b"(" + end]
        if not spans:
            return []
        masters, where = self._masters(), tags(self._client, physical)
        prefix = entity_key(physical, "").encode()
        states = self._states.get((physical, scan.field), {})
        if set(states) != set(masters):
            raise IndexUnread(f"the index on {scan.field} is not built on every master")
        try:
            async with unavailable_on_connection_errors(self._where):
                replies = await asyncio.gather(
                    *(
                        self._call(
                            node,
                            "FCALL_RO",
                            INDEX_READ_FUNCTION,
                            1,
                            index_key(physical, scan.field, where[name]),
                            prefix,
                            count,
                            index_fields_key(physical, where[name]),
                            scan.field,
                            states[name],
                            *spans,
                        )
                        for name, node in masters.items()
                    )
                )
        except ResponseError as exc:  # changed meanwhile, or a slot moved: not this index
            self.forget(physical)
            raise IndexUnread(str(exc)) from None
        found = [list(zip(reply[::2], reply[1::2], strict=True)) for reply in replies]
        return list(heapq.merge(*found, key=lambda entry: entry[0]))[:count]
