"""A map's indexes as Redis holds them, and what they should hold: each entity's entry in
plain Python (``contract.index_entries``), from the entities a reference fold made."""

from __future__ import annotations

from typing import Any

from materializer.clients.redis import Client, masters, on
from materializer.contract import index_entries
from materializer.contract.markers import tags
from materializer.contract.redis_layout import index_key
from materializer.redis.indexes import declared_states


def index_members(client: Client, name: str, field: str) -> set[bytes]:
    """Every entry of one index, over every master."""
    where = tags(client, name)
    found: set[bytes] = set()
    for node_name, node in masters(client).items():
        key = index_key(name, field, where[node_name])
        found |= set(client.execute_command("ZRANGE", key, "-", "+", "BYLEX", **on(node)))
    return found


def expected_members(entities: dict[str, dict[str, Any]], field: str) -> set[bytes]:
    """The reference: each entity's entry for ``field``, in plain Python."""
    return {
        index_entries.entry(e[field], k)
        for k, e in entities.items()
        if index_entries.indexable(e.get(field))
    }


def ready(client: Client, name: str, fields: list[str]) -> bool:
    """Whether every master lists exactly ``fields``, each built."""
    states = declared_states(client, name)
    return all(
        sorted(fields) == sorted(listed) and all(s.ready for s in listed.values())
        for listed in states.values()
    )


def mismatched(
    client: Client, name: str, entities: dict[str, dict[str, Any]], fields: list[str]
) -> list[str]:
    """The fields whose index differs from the reference (empty: all equal)."""
    return [f for f in fields if index_members(client, name, f) != expected_members(entities, f)]
