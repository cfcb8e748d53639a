"""A map's index entries: how a field's value and an entity's key make one member of the
index's sorted set, in the fold's Redis Functions (``index.lua``) and in its readers.

Every entry has score 0, so Redis orders an index by its members' bytes
(``ZRANGE ... BYLEX``), and an entry is written so that byte order is the order of
values, then of keys:

- a boolean: ``b`` and one byte (0 false, 1 true), then the key;
- a number: ``n`` and eight bytes, the IEEE 754 double big-endian with its sign bit
  flipped if positive and every bit flipped if negative (so -0 and 0 are one), then the
  key;
- a string: ``s``, its UTF-8 with each zero byte written 0x00 0xFF, a zero byte, then
  the key (no UTF-8 byte is 0xFF, so where the value ends is never in doubt).

A missing field, a null, an object or a list has no entry. One value's entries are
the members from ``value_prefix(v)`` up to ``value_prefix(v) + b"\\xff"`` (exclusive):
equality and ``IN`` read such spans, ranges span from one value's prefix to another's.
Numbers are compared as doubles: a long past 2^53 or a decimal's last digits can share
an entry with a neighbour, so a reader checks the entities it reads against its
condition; an index narrows the keys, it never decides alone.

Each master lists the fields it indexes with their ``IndexState``: only a field ready on
every master, whose slots are still those it was built for, answers a read.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from dataclasses import dataclass
from typing import Any

from materializer.clients.redis import AsyncClient, Client, is_cluster

Scalar = bool | int | float | str

KINDS = ("hash", "sorted")
"""How an index is declared: ``hash`` answers equality and ``IN``; ``sorted`` ranges too.
Both are kept the same way (one ordered set of entries per server)."""

END = b"\xff"
"""Past every entry of a value's prefix: no key's UTF-8 starts with it."""


def ordered_number(x: float) -> bytes:
    """The eight bytes of a number whose byte order is its numeric order."""
    try:
        number = float(x) + 0.0  # + 0.0: -0.0 becomes 0.0
    except OverflowError:  # an integer past every double reads as infinity, as in Lua
        number = math.inf if x > 0 else -math.inf
    raw = bytearray(struct.pack(">d", number))
    if raw[0] >= 0x80:
        return bytes(255 - b for b in raw)
    raw[0] |= 0x80
    return bytes(raw)


def value_prefix(value: Scalar) -> bytes:
    """What every entry of ``value`` starts with, whatever its key."""
    if isinstance(value, bool):
        return b"b\x01" if value else b"b\x00"
    if isinstance(value, int | float):
        return b"n" + ordered_number(value)
    return b"s" + value.encode().replace(b"\x00", b"\x00\xff") + b"\x00"


def indexable(value: Any) -> bool:
    """Whether a field's value (as JSON decodes it) has an entry."""
    return isinstance(value, bool | int | float | str)


def entry(value: Scalar, key: str) -> bytes:
    """The member for an entity's ``key`` whose field holds ``value``."""
    return value_prefix(value) + key.encode()


def key_of(member: bytes) -> str:
    """The entity key an entry ends with."""
    kind = member[:1]
    if kind == b"b":
        return member[2:].decode()
    if kind == b"n":
        return member[9:].decode()
    at = 1
    while True:
        at = member.index(b"\x00", at)
        if member[at + 1 : at + 2] != b"\xff":
            return member[at + 1 :].decode()
        at += 2


def entries(entity: dict[str, Any], key: str, fields: list[str]) -> dict[str, bytes]:
    """An entity's entries by indexed field: what the fold keeps for it."""
    return {f: entry(entity[f], key) for f in fields if indexable(entity.get(f))}


@dataclass(frozen=True)
class IndexState:
    """What a master records of one indexed field (JSON in the fields' hash)."""

    kind: str
    ready: bool
    slots: str
    """The master's slots when its entries were built (``slots_of``)."""
    since_ms: int
    """When the field was declared there: a build marks ready only the declaration it built
    (a field dropped and declared again meanwhile lost the entries it made)."""
    expiring: bool = False
    """Whether the map had ``ttl.redis`` when declared: entries of entities written with a
    TTL are taken out by its sweep only, so a change of it starts the indexes again."""

    def dumps(self) -> str:
        """The state as the fields' hash holds it."""
        return json.dumps(
            {
                "kind": self.kind,
                "ready": self.ready,
                "slots": self.slots,
                "since_ms": self.since_ms,
                "expiring": self.expiring,
            }
        )

    @classmethod
    def loads(cls, raw: bytes | str) -> IndexState:
        """A state as the fields' hash holds it."""
        data = json.loads(raw)
        return cls(
            kind=str(data["kind"]),
            ready=bool(data["ready"]),
            slots=str(data["slots"]),
            since_ms=int(data["since_ms"]),
            expiring=bool(data.get("expiring", False)),
        )


def slots_of(client: Client | AsyncClient) -> dict[str, str]:
    """Each master's slots, as a digest (``""`` on one server, whose slots never move)."""
    if not is_cluster(client):
        return {"": ""}
    owned: dict[str, list[int]] = {}
    for slot, nodes in client.nodes_manager.slots_cache.items():
        owned.setdefault(nodes[0].name, []).append(slot)
    return {
        name: hashlib.sha256(",".join(map(str, sorted(slots))).encode()).hexdigest()[:16]
        for name, slots in owned.items()
    }


def raw_states(raw: Any) -> dict[str, bytes]:
    """A master's fields' hash as ``HGETALL`` answers it (a dict, or a flat list of field and
    value): field to its state's bytes, as the index read checks them."""
    pairs = raw.items() if isinstance(raw, dict) else zip(raw[::2], raw[1::2], strict=True)
    return {
        (f.decode() if isinstance(f, bytes) else f): (v if isinstance(v, bytes) else v.encode())
        for f, v in pairs
    }


def parse_states(raw: Any) -> dict[str, IndexState]:
    """A master's indexed fields, as ``HGETALL`` answers them, each with its state."""
    return {field: IndexState.loads(state) for field, state in raw_states(raw).items()}
