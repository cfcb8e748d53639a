"""A batch's calls to the Redis Functions: chunks of keys, each sent to the master holding
them; ``latest`` ordered in Redis, ``merge`` and ``aggregate`` folded here against the state
read and written only if it is still the one read; and ``fill``, the restore's writes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TypeVar, cast

from materializer.clients.redis import client_for, is_cluster, on, per_master
from materializer.config import RedisConfig
from materializer.contract.markers import markers
from materializer.contract.redis_layout import (
    change_entry,
    changes_key,
    entity_key,
    expiry_index_key,
    logical_name,
    owner_key,
    state_key,
)
from materializer.fold.base import Event, KeyFolder
from materializer.redis.expiry import index_expiring
from materializer.redis.functions import (
    FILL,
    FIXED_ARGS,
    LATEST,
    PUT,
    READ,
    FoldTarget,
    call_function,
    chunks_by_master,
)

_T = TypeVar("_T")

CONFLICT_ROUNDS = 10
"""How often a key is folded again because another writer changed its state first."""


def fill(
    config: RedisConfig, map_name: str, entities: list[tuple[str, tuple[bytes, int | None]]]
) -> int:
    """Write the entities (key, (JSON, PX milliseconds or None)) a server lost: each only
    where neither it nor its fold state is, with its index entries (``FILL``); how many
    were written."""
    client = client_for(config)
    marks = markers(client, map_name)
    prefix = str(len(entity_key(map_name, "").encode())).encode()
    written = 0
    for node, chunk in chunks_by_master(client, map_name, entities):
        args = [marks["" if node is None else node.name].encode(), prefix]
        for key, (value, px) in chunk:
            args += [entity_key(map_name, key).encode(), state_key(map_name, key), value]
            args.append(b"" if px is None else str(px).encode())
        written += int(client.execute_command("FCALL", FILL, 1, args[2], *args, **on(node)))  # type: ignore[no-untyped-call]
    expiring = [(key, px) for key, (_, px) in entities if px is not None]
    if expiring:
        keys, left = zip(*expiring, strict=True)
        index_expiring(client, map_name, list(keys), list(left))
    return written


class Writer:
    """A batch's calls to Redis: chunks of keys, each sent to the master holding them."""

    def __init__(self, target: FoldTarget, batch_id: int) -> None:
        self.target = target
        self.batch_id = batch_id
        self.client = client_for(target.redis)
        self.cluster = is_cluster(self.client)
        self.stream = changes_key(target.map_name).encode()
        prefix = len(entity_key(target.map_name, "").encode())
        # The writing functions' first arguments; a cluster appends changes itself.
        self.fixed = [
            b"" if self.cluster else self.stream,
            b"" if target.ttl_ms is None else str(target.ttl_ms).encode(),
            str(batch_id).encode(),
            str(target.changes_max_len).encode(),
            str(prefix).encode(),
        ]
        self.markers = markers(self.client, target.map_name)
        # Outside a worker group no write carries an epoch, and none is checked.
        self.owners = (
            {}
            if target.epoch is None
            else per_master(self.client, logical_name(target.map_name), owner_key)
        )
        self.epoch = b"" if target.epoch is None else str(target.epoch).encode()
        self.indexes = (
            {}
            if target.ttl_ms is None
            else per_master(self.client, target.map_name, expiry_index_key)
        )

    def fixed_args(self, node: Any = None) -> list[bytes]:
        """The writing functions' first arguments on ``node``: its marker, how long a
        deleted entity's state stays, its expiry index, the owner key and the epoch."""
        name = "" if node is None else node.name
        marker = self.markers[name].encode()
        index = self.indexes.get(name, "").encode()
        retention = str(self.target.deleted_retention_ms).encode()
        owner = self.owners.get(name, "").encode()
        return [*self.fixed, marker, retention, index, owner, self.epoch]

    def _chunks(self, items: list[tuple[str, _T]]) -> Iterator[tuple[Any, list[tuple[str, _T]]]]:
        return chunks_by_master(self.client, self.target.map_name, items)

    def call(self, function: str, route: bytes, args: list[bytes], node: Any) -> list[Any]:
        """``call_function`` on this batch's client."""
        return call_function(self.client, self.target, function, route, args, node)

    def latest(
        self, winners: list[tuple[str, tuple[str, bytes | None]]]
    ) -> Iterator[tuple[str, bytes | None]]:
        """Apply each key's winning record; each key with its state after the call."""
        name = self.target.map_name
        for node, chunk in self._chunks(winners):
            args = self.fixed_args(node)
            for key, (order, value) in chunk:
                args += [entity_key(name, key).encode(), state_key(name, key), order.encode()]
                args.append(b"" if value is None else value)
            answers = self.call(LATEST, args[FIXED_ARGS], args, node)
            states = [
                (key, value if answer == 1 else answer)
                for (key, (_, value)), answer in zip(chunk, answers, strict=True)
            ]
            applied = [kv for kv, answer in zip(states, answers, strict=True) if answer == 1]
            self._append_changes(applied)
            yield from states

    def fold(
        self, folder: KeyFolder, keyed: list[tuple[str, list[Event]]]
    ) -> Iterator[tuple[str, bytes | None]]:
        """Fold each key's events into its state read from Redis and write what changed."""
        name = self.target.map_name
        for node, chunk in self._chunks(keyed):
            pending = chunk
            for _ in range(CONFLICT_ROUNDS):
                read = self._read([key for key, _ in pending], node)
                writes: list[tuple[str, bytes | None]] = []
                put = self.fixed_args(node)
                retry = []
                unchanged = []
                for (key, events), (before, current) in zip(pending, read, strict=True):
                    start = before
                    if before is None and current is not None:
                        start = folder.seed(current)  # restored, or from an earlier version
                    state, value = folder(start, events)
                    if state == before:
                        unchanged.append((key, current))  # applied before
                        continue
                    put += [entity_key(name, key).encode(), state_key(name, key)]
                    put += [before or b"", state, b"" if value is None else value]
                    writes.append((key, value))
                    retry.append((key, events))
                # Their entities go to the changelog as Redis has them.
                yield from self._entities(unchanged)
                if not writes:
                    break
                answers = self.call(PUT, put[FIXED_ARGS], put, node)
                applied = [kv for kv, answer in zip(writes, answers, strict=True) if answer == 1]
                self._append_changes(applied)
                yield from applied
                pending = [kv for kv, answer in zip(retry, answers, strict=True) if answer != 1]
                if not pending:
                    break
            else:
                keys = ", ".join(key for key, _ in pending[:3])
                raise RuntimeError(
                    f"map {name}: another writer kept changing the fold state of {keys}"
                )

    def _read(self, keys: list[str], node: Any) -> list[tuple[bytes | None, bytes | None]]:
        """Each key's fold state, and its entity where the fold needs it to seed a state
        (a key without one); elsewhere the entity may be None and not read.

        On one server: an ``MGET`` of the states, then of the entities of the keys
        without one (a key's first event, or an entity restored without its state).
        An ``MGET`` of the states costs Redis and this process a fraction of what the read
        function's ``GET`` per key does
        (docs/decisions/0019-fold-reads-states-with-mget.md); the fold needs a key's entity
        only to seed its state, or to send it to the changelog when its events change
        nothing (a replay), and reads it then. On a cluster a chunk's keys span slots,
        which ``MGET`` refuses: the function reads states and entities together.
        """
        name = self.target.map_name
        if self.cluster:
            args: list[bytes] = []
            for key in keys:
                args += [state_key(name, key), entity_key(name, key).encode()]
            read = self.call(READ, args[1], args, node)
            return list(zip(read[::2], read[1::2], strict=True))
        # The client answers bytes: it never decodes responses.
        states = cast("list[bytes | None]", self.client.mget([state_key(name, k) for k in keys]))
        entities: list[bytes | None] = [None] * len(keys)
        missing = [i for i, state in enumerate(states) if state is None]
        if missing:
            wanted = [entity_key(name, keys[i]) for i in missing]
            found = cast("list[bytes | None]", self.client.mget(wanted))
            for i, entity in zip(missing, found, strict=True):
                entities[i] = entity
        return list(zip(states, entities, strict=True))

    def _entities(
        self, unchanged: list[tuple[str, bytes | None]]
    ) -> list[tuple[str, bytes | None]]:
        """The keys whose events changed their states in nothing (a replay), each with its
        entity as Redis holds it: on one server read now, since ``_read`` reads the
        entities of keys without a state only."""
        if self.cluster or not unchanged:
            return unchanged
        name = self.target.map_name
        wanted = [entity_key(name, key) for key, _ in unchanged]
        found = cast("list[bytes | None]", self.client.mget(wanted))
        return [(key, entity) for (key, _), entity in zip(unchanged, found, strict=True)]

    def _append_changes(self, applied: list[tuple[str, bytes | None]]) -> None:
        """A cluster's change entries for the keys a chunk applied, in one transaction (on one
        server the functions append them)."""
        if not self.cluster or not applied:
            return
        with self.client.pipeline(transaction=True) as pipe:
            for key, value in applied:
                entry: dict[Any, Any] = change_entry(key, value is None, self.batch_id)
                pipe.xadd(self.stream, entry, maxlen=self.target.changes_max_len, approximate=True)
            pipe.execute()
