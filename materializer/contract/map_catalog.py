"""The map catalog's records: the contract between whoever changes a map and every process
that runs or serves one.

Written down in docs/map-catalog.md and pinned by tests/unit/test_map_catalog.py.

Maps created through the API live in one compacted, single-partition Kafka topic
(``catalog.topic``), as Kafka Connect keeps connectors in ``config.storage.topic``:

- the record key is the map's name (UTF-8);
- a definition's value is compact JSON ``{"version": n, "config": {...}, "by": "...",
  "at_ms": n}``: ``config`` is the map's section of the configuration file as JSON,
  ``version`` counts the map's changes from 1, ``by`` names who made the change;
- a deletion is a tombstone (no value), so compaction forgets the map; its headers
  ``version``, ``by`` and ``at_ms`` say the same of the deletion;
- ``"rebuilt_at": n`` is the version of the map's last change its state could not follow
  (absent: none): its state must have been rebuilt by that version or a later one, and a
  materializer whose copy was folded by an earlier one (``<map>:__definition__`` in
  Redis) folds the definition into a new copy and moves readers there once caught up.

One partition keeps every change in the order it was made; the last record of a key
is the map's current definition.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

HEADERS = ("version", "by", "at_ms")
"""A tombstone's headers (a deletion has no value to carry them)."""


@dataclass(frozen=True)
class StoredMap:
    """One change to one map: its definition, or its deletion (``config is None``)."""

    name: str
    version: int
    config: dict[str, Any] | None
    by: str = ""
    at_ms: int = 0
    rebuilt_at: int = 0
    offset: int = field(default=-1, compare=False)
    """Where the record sits in the topic (``-1`` before it is written)."""

    @property
    def rebuild(self) -> bool:
        """This change is one the map's state could not follow."""
        return self.rebuilt_at == self.version > 0

    @property
    def deleted(self) -> bool:
        """A tombstone."""
        return self.config is None

    def key(self) -> bytes:
        """The record key."""
        return self.name.encode()

    def value(self) -> bytes | None:
        """The record value; ``None`` (a tombstone) for a deletion."""
        if self.config is None:
            return None
        body: dict[str, Any] = {
            "version": self.version,
            "config": self.config,
            "by": self.by,
            "at_ms": self.at_ms,
        }
        if self.rebuilt_at:
            body["rebuilt_at"] = self.rebuilt_at
        return orjson.dumps(body)

    def headers(self) -> list[tuple[str, bytes]]:
        """A tombstone's headers; a definition carries the same in its value."""
        if self.config is not None:
            return []
        return [("version", str(self.version).encode()), ("by", self.by.encode()),
                ("at_ms", str(self.at_ms).encode())]  # fmt: skip


def decode(
    key: bytes | None,
    value: bytes | None,
    headers: list[tuple[str, bytes]] | None = None,
    offset: int = -1,
) -> StoredMap | None:
    """A record read from the topic; ``None`` for one that is not a catalog record (no key,
    or a value that is not the JSON above), which readers skip."""
    if not key:
        return None
    name = key.decode(errors="replace")
    if value is None:
        meta = {k: v.decode(errors="replace") for k, v in headers or [] if k in HEADERS}
        return StoredMap(
            name,
            _int(meta.get("version")),
            None,
            meta.get("by", ""),
            _int(meta.get("at_ms")),
            offset=offset,
        )
    try:
        body = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(body, dict) or not isinstance(body.get("config"), dict):
        return None
    return StoredMap(
        name,
        _int(body.get("version")),
        body["config"],
        str(body.get("by", "")),
        _int(body.get("at_ms")),
        _int(body.get("rebuilt_at")),
        offset=offset,
    )


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0
