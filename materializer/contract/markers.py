"""The marker: a map's copy on a server is whole.

The materializer writes a map's marker on every master once its copy there is
complete, and checks it before each write; the query service reads a missing marker
under a running map as "being restored", never "not found". The key's format is in
``redis_layout.marker_key``; this module knows where each master's marker is.
"""

from __future__ import annotations

import time

from materializer.clients.redis import AsyncClient, Client, per_master
from materializer.contract.redis_layout import marker_key


def markers(client: Client | AsyncClient, map_name: str) -> dict[str, str]:
    """The map's marker key on each master, by node name (``""``: the one server).

    On a cluster each master's marker is tagged with the first slot it owns
    (``clients.redis.slot_tag``), from the client's slot map: a reshard that moves
    that slot names a new marker, which the materializer finds missing and
    repairs by restoring the keys that master lacks (none), then marking it.
    """
    return per_master(client, map_name, marker_key)


def tags(client: Client | AsyncClient, map_name: str) -> dict[str, str | None]:
    """The tag of the map's per-master keys on each master, by node name (None on one
    server): what the marker, the expiry index and the indexes of that master carry."""
    base = len(marker_key(map_name))
    return {
        name: None if len(key) == base else key[base + 1 : -1]
        for name, key in markers(client, map_name).items()
    }


def is_whole(client: Client, physical: str) -> bool:
    """Whether every master holds the map's marker."""
    keys = list(markers(client, physical).values())
    with client.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.exists(key)
        return all(pipe.execute())


def mark_whole(client: Client, physical: str) -> None:
    """Put the map's marker on every master: its copy there is whole."""
    stamp = str(int(time.time() * 1000))
    with client.pipeline(transaction=False) as pipe:
        for key in markers(client, physical).values():
            pipe.set(key, stamp)
        pipe.execute()
