"""The Redis layout: the contract between the materializer and the query service.

Written down in docs/redis-layout.md and pinned by tests/unit/test_layout.py.

- ``<map>:<key>``     string, the entity as compact JSON (UTF-8);
- ``<map>:__meta__``  hash, the watermark of the last batch written:
  ``batch_id`` (decimal), ``offsets`` (JSON ``{"topic": {"partition": next_offset}}``),
  ``updated_at_ms`` (UTC epoch milliseconds).

Offsets in the watermark are *next* offsets (exclusive ends, as Kafka commits
them): a record at offset ``o`` is reflected once the watermark's offset for its
partition is greater than ``o``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson

META_SUFFIX = "__meta__"
CHANGES_SUFFIX = "__changes__"
RESERVED_KEYS = frozenset({META_SUFFIX, CHANGES_SUFFIX})
"""Entity keys that would collide with a map's own bookkeeping keys."""


def entity_key(map_name: str, key: str) -> str:
    """The Redis key that holds one entity."""
    return f"{map_name}:{key}"


def meta_key(map_name: str) -> str:
    """The Redis hash that holds a map's watermark."""
    return f"{map_name}:{META_SUFFIX}"


@dataclass(frozen=True)
class Watermark:
    """How far a map has been materialized: the batch and source offsets it reflects."""

    batch_id: int
    offsets: dict[str, dict[int, int]] = field(default_factory=dict)
    updated_at_ms: int = 0

    def to_hash(self) -> dict[str, str]:
        """The fields of ``<map>:__meta__``."""
        offsets = {t: {str(p): o for p, o in sorted(ps.items())} for t, ps in self.offsets.items()}
        return {
            "batch_id": str(self.batch_id),
            "offsets": orjson.dumps(offsets, option=orjson.OPT_SORT_KEYS).decode(),
            "updated_at_ms": str(self.updated_at_ms),
        }

    @classmethod
    def from_hash(cls, raw: dict[bytes, bytes] | dict[str, str]) -> Watermark | None:
        """Parse ``HGETALL <map>:__meta__``; ``None`` when the map has no batch yet."""
        fields = {
            (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
            for k, v in raw.items()
        }
        if "batch_id" not in fields:
            return None
        offsets = orjson.loads(fields.get("offsets", "{}"))
        return cls(
            batch_id=int(fields["batch_id"]),
            offsets={t: {int(p): int(o) for p, o in ps.items()} for t, ps in offsets.items()},
            updated_at_ms=int(fields.get("updated_at_ms", "0")),
        )
