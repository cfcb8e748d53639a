"""A map's indexes in Redis: declared on every master, built from the entities there, dropped.

The fold's functions keep the entries of every index a server lists
(``redis_layout.index_fields_key``) with each entity they write, in the same call
(``index.lua``). So an index declared while the map runs is kept from its declaration
on, and what it lacks is the entities written before: a build reads those, a chunk at a
time, and adds each one's entry as Redis holds it at that moment. A write that comes
between changes the entity and its entry together, and the build's entry is the value
it reads, so the index ends equal to the entities whatever the order. Only then is the
field marked ready on that master, and only a ready field answers a read.

Entries live on the master that holds their entity (tagged as the map's marker is,
``contract.markers``), so a write touches one server and a read asks every master. A
master's slots are recorded with its fields: slots moved by a reshard take their
entities away from (or bring them to) a master's entries, and such a master's indexes
are built again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from materializer.clients.redis import (
    Client,
    chunks_by_master,
    client_for,
    masters,
    on,
    per_master,
)
from materializer.config import AppConfig, IndexConfig
from materializer.contract.index_entries import IndexState, parse_states, slots_of
from materializer.contract.markers import markers, tags
from materializer.contract.redis_layout import (
    entity_key,
    index_fields_key,
    index_key,
    indexed_key,
    physical_name,
)
from materializer.redis.functions import CHUNK, INDEX_BUILD
from materializer.redis.map_keys import entity_keys

log = logging.getLogger(__name__)


def declared_states(client: Client, physical: str) -> dict[str, dict[str, IndexState]]:
    """Each master's indexed fields and their states, by node name."""
    nodes = masters(client)
    out: dict[str, dict[str, IndexState]] = {}
    for name, key in per_master(client, physical, index_fields_key).items():
        raw = client.execute_command("HGETALL", key, **on(nodes[name]))  # type: ignore[no-untyped-call]
        out[name] = parse_states(raw)
    return out


def declare(
    client: Client, physical: str, indexes: list[IndexConfig], expiring: bool = False
) -> list[str]:
    """Make every master list exactly ``indexes``: drop the others (their entries go), add
    the new ones unbuilt, and start again on a master whose slots moved. Returns the
    fields some master has yet to build.

    ``expiring``: the map has ``ttl.redis``. Its record of what each entity is indexed
    under may then name entities Redis expired since, whose entries no build can find:
    so any change of its fields starts every index again, record and all."""
    wanted = {index.field: index.kind for index in indexes}
    slots = slots_of(client)
    nodes = masters(client)
    where = tags(client, physical)
    unbuilt: set[str] = set()
    for name, states in declared_states(client, physical).items():
        node = nodes[name]
        tag = where[name]
        fields_key = index_fields_key(physical, tag)
        anew = any(
            state.slots != slots[name] or state.expiring != expiring for state in states.values()
        )
        anew = anew or (expiring and bool(states) and set(states) != set(wanted))
        gone = [f for f in states if f not in wanted or anew]
        if gone:
            # The fields first: from then on no write keeps their entries.
            client.execute_command("HDEL", fields_key, *gone, **on(node))  # type: ignore[no-untyped-call]
            sets = [index_key(physical, f, tag) for f in gone]
            client.execute_command("UNLINK", *sets, **on(node))  # type: ignore[no-untyped-call]
        if states and (anew or not wanted):  # a map that never had indexes: nothing to do
            client.execute_command("UNLINK", indexed_key(physical, tag), **on(node))  # type: ignore[no-untyped-call]
        for field, kind in wanted.items():
            state = states.get(field)
            if state is None or anew:
                state = IndexState(kind, False, slots[name], _now_ms(), expiring)
            elif state.kind != kind:
                state = replace(state, kind=kind)
            else:
                if not state.ready:
                    unbuilt.add(field)
                continue
            client.execute_command("HSET", fields_key, field, state.dumps(), **on(node))  # type: ignore[no-untyped-call]
            if not state.ready:
                unbuilt.add(field)
    return sorted(unbuilt)


def build(
    client: Client,
    physical: str,
    field: str,
    expiring: bool,
    stop: threading.Event | None = None,
) -> int:
    """Add the entry of every entity the masters hold to ``field``'s index, then mark it
    ready where it is still declared. Returns how many entries were added. ``stop``: set,
    the build ends after the chunk in flight, its field left unbuilt."""
    marks = {name: key.encode() for name, key in markers(client, physical).items()}
    prefix = str(len(entity_key(physical, "").encode())).encode()
    flag = b"1" if expiring else b""
    states = declared_states(client, physical)
    added = 0
    for keys in entity_keys(client, physical):
        if stop is not None and stop.is_set():
            return added
        for node, chunk in chunks_by_master(client, keys, lambda key: key, CHUNK):
            mark = marks["" if node is None else node.name]
            args = [mark, prefix, flag, field.encode(), b"", b"", *chunk]
            call = ("FCALL", INDEX_BUILD, 1, chunk[0], *args)
            added += int(client.execute_command(*call, **on(node)))  # type: ignore[no-untyped-call]
    for name, node in masters(client).items():
        state = states.get(name, {}).get(field)
        if state is None or state.ready:
            continue  # dropped meanwhile, or a master new since: built at its next declare
        found, ready = state.dumps().encode(), replace(state, ready=True).dumps().encode()
        args = [marks[name], prefix, flag, field.encode(), found, ready]
        client.execute_command("FCALL", INDEX_BUILD, 1, marks[name], *args, **on(node))  # type: ignore[no-untyped-call]
    return added


def rebuild(client: Client, physical: str, indexes: list[IndexConfig], expiring: bool) -> None:
    """Drop the map's indexes and build them again from the entities: after its copy was
    written anew outside the fold (``rehydrate``), while the map is held still."""
    declare(client, physical, [])
    for field in declare(client, physical, indexes, expiring):
        build(client, physical, field, expiring)


class IndexBuilds:
    """The run's index builds: one thread builds the fields maps declared, one after the
    other, while their folds go on. A build cut short (the run stopped) is done again at
    the map's next start: its field is ready nowhere it was not finished."""

    def __init__(self, on_built: Callable[[str, str, int, float], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._queue: list[tuple[AppConfig, str, str, str]] = []
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()
        self._on_built = on_built

    def want(self, config: AppConfig, map_name: str, generation: int) -> list[str]:
        """Declare the map's indexes on every master and queue what is left to build;
        the fields queued."""
        physical = physical_name(map_name, generation)
        client = client_for(config.redis)
        map_config = config.map(map_name)
        expiring = map_config.ttl is not None and map_config.ttl.redis is not None
        unbuilt = declare(client, physical, map_config.indexes, expiring)
        with self._lock:
            # The build in flight (first) may find its field declared anew and leave it.
            queued = {(p, f) for _, _, p, f in self._queue[1:]}
            for field in unbuilt:
                if (physical, field) not in queued:
                    self._queue.append((config, map_name, physical, field))
            if self._queue and self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="materializer-index-builds", daemon=True
                )
                self._thread.start()
        return unbuilt

    def _run(self) -> None:
        while not self._stopped.is_set():
            with self._lock:
                if not self._queue:
                    self._thread = None  # under the lock: a want() after it starts another
                    return
                config, map_name, physical, field = self._queue[0]
            started = time.monotonic()
            try:
                ttl = config.map(map_name).ttl
                expiring = ttl is not None and ttl.redis is not None
                added = build(client_for(config.redis), physical, field, expiring, self._stopped)
            except Exception:  # noqa: BLE001 - Redis's: the map's next start builds it again
                log.exception("map %s: building the index on %s failed", map_name, field)
            else:
                seconds = time.monotonic() - started
                log.info(
                    "map %s: index on %s built: %d entries in %.1f s",
                    map_name, field, added, seconds,
                )  # fmt: skip
                if self._on_built is not None:
                    self._on_built(map_name, field, added, seconds)
            with self._lock:
                self._queue.pop(0)

    def close(self, timeout: float = 30.0) -> None:
        """Stop after the chunk in flight; wait for the thread."""
        self._stopped.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout)


def _now_ms() -> int:
    return int(time.time() * 1000)
