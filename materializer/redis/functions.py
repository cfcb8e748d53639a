"""The Redis Functions library the fold calls, and what calling it takes: loading it on
every master, routing a call to the master holding its keys, and the target a map's
calls write to.

One library holds every function (``materializer_<name>_v<n>``), written in parts:
``text.lua`` (byte order, and JSON read keeping each value's text), ``merge.lua`` and
``aggregate.lua`` (the folds the real-time path applies), ``index.lua`` (the entries of a
map's indexes, kept with each write) and ``functions.lua`` (the functions),
loaded with ``FUNCTION LOAD REPLACE`` on every master before a map folds, and
again by a call that finds it gone. A function that writes first checks the
map's marker: a server restarted empty answers ``MATERIALIZER_LOST`` instead of
writing onto a copy that is no longer whole (``CopyLost``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, TypeVar

from materializer.clients.redis import chunks_by_master as chunks
from materializer.clients.redis import client_for, masters, on, where
from materializer.config import RedisConfig
from materializer.contract.redis_layout import (
    INDEX_READ_FUNCTION,
    READ_FUNCTION,
    entity_key,
)
from materializer.errors import MaterializerError
from materializer.fold.base import KeyFolder

LIBRARY = "materializer"
LATEST = "materializer_latest_v5"
READ = READ_FUNCTION
INDEX_READ = INDEX_READ_FUNCTION
PUT = "materializer_put_v5"
NEXT_EPOCH = "materializer_next_epoch_v4"
RAISE_EPOCH = "materializer_raise_epoch_v4"
LEGACY = (
    "materializer_latest_v3",
    "materializer_put_v3",
    "materializer_live_v5",
    "materializer_fill_v3",
    "materializer_latest_v4",
    "materializer_put_v4",
    "materializer_live_v6",
    "materializer_expire_v3",
)
"""The writing functions of earlier releases, with their arguments (v3: no owner, no
epoch; v4, live v6, expire v3: the same as now, which keep indexes only here): kept so
that their workers and this release's run side by side in a rolling upgrade. An earlier
library loaded over this one lacks this release's names, so its calls find no function
and load this library again, rather than run code that leaves the indexes behind."""
LIVE = "materializer_live_v7"
"""The real-time path's writing function: ``latest`` applied, ``merge`` and ``aggregate``
folded, idempotent by source position, the watermark's offsets moved in the same call
(``materializer.live``)."""
TRUNCATE = "materializer_truncate_v1"
"""The real-time path's truncate of a map (``redis.truncate``): every entity deleted and
the position moved past it, in one call."""
FILL = "materializer_fill_v4"
INDEX_BUILD = "materializer_index_build_v1"
"""Adds entities' entries to an index declared while the map runs, and marks it built
(``materializer.redis.indexes``)."""
EXPIRE = "materializer_expire_v4"

LOST = "MATERIALIZER_LOST"
"""The error the writing functions answer on a server without the map's marker."""

FENCED = "MATERIALIZER_FENCED"
"""The error the writing functions answer a writer whose epoch a newer owner's exceeds."""

FIXED_ARGS = 10

PARTS = ("text.lua", "merge.lua", "aggregate.lua", "index.lua", "functions.lua")
"""The library's Lua, beside this module, in the order its parts are joined: each part's
local functions are seen by the parts after it."""

SOURCE = f"#!lua name={LIBRARY}\n" + "\n".join(
    (resources.files(__package__) / part).read_text(encoding="utf-8") for part in PARTS
)
"""The library: every function it registers is named above, which
``tests/unit/test_redis_functions.py`` checks."""

CHUNK = 1000
"""Keys per ``FCALL``: enough to amortise the round trip, few enough not to hold up
Redis's other clients for long."""


def load_library(config: RedisConfig) -> None:
    """``FUNCTION LOAD REPLACE`` on every master, so the fold can ``FCALL`` at once."""
    client = client_for(config)
    for node in masters(client).values():
        client.execute_command("FUNCTION LOAD", "REPLACE", SOURCE, **on(node))  # type: ignore[no-untyped-call]


class Fenced(MaterializerError):
    """Another worker of the group owns the map now: a write carried an older epoch than the
    owner's (``contract.redis_layout.owner_key``), and Redis refused it.

    The map's queries on this worker stop; the worker goes on with its other maps.
    """

    def __init__(self, map_name: str, epoch: int | None) -> None:
        self.map_name = map_name
        why = (
            "the group no longer assigns it to this worker"
            if epoch is None
            else f"another worker took the map over (this worker's epoch {epoch} is older "
            "than the owner's, or a newer producer holds its transactional.id)"
        )
        super().__init__(f"map {map_name}: fenced: {why}; it writes nothing more for it")


class CopyLost(MaterializerError):
    """A Redis server holds no marker of the map: restarted empty, or replaced by an empty one.

    The fold stops before writing anything onto it; the run restores the
    copy from Delta and the changelog and starts the map again
    (``materializer.restore.automatic``).
    """

    def __init__(self, map_name: str, server: str, node: Any = None) -> None:
        self.map_name = map_name
        on = f"Redis at {server}" if node is None else f"the Redis Cluster master {node.name}"
        super().__init__(
            f"map {map_name}: {on} has lost the map's copy (its marker is gone); "
            "the copy is restored from Delta and the changelog before the fold goes on"
        )


@dataclass(frozen=True)
class FoldTarget:
    """Where one map's batches go: what the applier needs on the driver or an executor."""

    redis: RedisConfig
    map_name: str
    """The physical name: the generation's keys."""
    changelog_topic: str
    producer: tuple[tuple[str, Any], ...] = field(repr=False)
    """librdkafka settings for the changelog and dead-letter records; they hold the Kafka
    credentials, so the repr leaves them out."""
    dead_letter_topic: str | None = None
    ttl_ms: int | None = None
    changes_max_len: int = 100_000
    deleted_retention_ms: int = 86_400_000
    """How long a deleted entity's fold state stays (``fold.deleted_retention``)."""
    folder: KeyFolder | None = None
    """How a key's events fold into its state; None: ``latest``, ordered by Redis."""
    epoch: int | None = None
    """The owner's epoch its writes carry in a worker group (None: outside one)."""
    transactional_id: str | None = None
    """In a worker group, the prefix of the ``transactional.id`` of the map's producers:
    the new owner's producers fence the old owner's (``materializer.group.fencing``)."""


_T = TypeVar("_T")


def chunks_by_master(
    client: Any, map_name: str, items: list[tuple[str, _T]]
) -> Iterator[tuple[Any, list[tuple[str, _T]]]]:
    """``items`` (keyed by entity key) in chunks of ``CHUNK``, each with the master holding
    its keys (None: one server)."""
    return chunks(client, items, lambda item: entity_key(map_name, item[0]).encode(), CHUNK)


def call_function(
    client: Any, target: FoldTarget, function: str, route: bytes, args: list[bytes], node: Any
) -> list[Any]:
    """``FCALL`` ``function`` (``FCALL_RO`` for ``READ``) with ``route``, a key of the call
    on ``node`` (None: the one server), as its one key; loads the library again if the
    server lost it. A server without the map's marker raises ``CopyLost``."""
    from redis.exceptions import ResponseError

    command = ("FCALL_RO" if function == READ else "FCALL", function, 1, route)
    for attempt in range(2):
        try:
            return list(client.execute_command(*command, *args, **on(node)))
        except ResponseError as exc:
            if str(exc).startswith(LOST):
                raise CopyLost(target.map_name, where(client), node) from None
            if str(exc).startswith(FENCED):
                raise Fenced(target.map_name, target.epoch) from None
            # A server restarted empty has lost the library with the data: load it
            # again (the marker, lost too, then stops the write).
            if "Function not found" not in str(exc) or attempt:
                raise
            load_library(target.redis)
    raise AssertionError("unreachable")
