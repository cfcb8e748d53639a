"""A map's entity keys as Redis holds them: scanned a page at a time, bookkeeping keys left
out; what a restore, a verify and an index build read the map by."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from materializer.clients.redis import Client, get_many
from materializer.contract.redis_layout import RESERVED_KEYS

SCAN_COUNT = 5000
KEYS_PER_READ = 2000


def chunked(keys: Iterable[bytes], size: int) -> Iterator[list[bytes]]:
    """``keys`` in lists of at most ``size``."""
    chunk: list[bytes] = []
    for key in keys:
        chunk.append(key)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def match_pattern(prefix: str) -> str:
    """A SCAN pattern for keys starting with ``prefix`` (its glob characters escaped)."""
    escaped = "".join(f"\\{ch}" if ch in "*?[]\\" else ch for ch in prefix)
    return f"{escaped}*"


def entity_keys(client: Client, physical: str) -> Iterator[list[bytes]]:
    """The map's entity keys (``<physical>:<key>``, bookkeeping keys left out), a page at a time.

    ``SCAN`` over every master of a cluster, one after the other."""
    prefix = f"{physical}:".encode()
    reserved = {prefix + name.encode() for name in RESERVED_KEYS}
    found = client.scan_iter(match=match_pattern(f"{physical}:"), count=SCAN_COUNT)
    yield from chunked((k for k in found if isinstance(k, bytes) and k not in reserved), SCAN_COUNT)


def entity_values(client: Client, physical: str) -> Iterator[tuple[list[bytes], list[Any]]]:
    """Each page of ``entity_keys`` with its values (``None`` for a key gone in between)."""
    for keys in entity_keys(client, physical):
        for start in range(0, len(keys), KEYS_PER_READ):
            chunk = keys[start : start + KEYS_PER_READ]
            yield chunk, get_many(client, chunk)
