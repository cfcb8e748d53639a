"""A map's watermark: the batch and source offsets its Redis copy reflects (``<map>:__meta__``).

The fold commits it after each batch's entities (``materializer.redis.watermark``), and
everything that answers "how fresh is this map" or "has my write arrived" reads it: the
query service's reads and waits, ``materializer status``, the table marks and the Delta
commits that carry one (``table_marks``). Both halves parse it here, so a writer and a
reader of different versions agree on its fields (docs/redis-layout.md, *The watermark
hash*); its key is ``redis_layout.meta_key``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from materializer.contract.redis_layout import text_fields

LIVE_APP = "live"
"""The app id the real-time writer puts in the watermark: the real-time path wrote it last,
and the map's position is the one committed to its group ``config.names.LIVE_GROUP``."""


@dataclass(frozen=True)
class Watermark:
    """How far a map has been materialized: the batch and source offsets it reflects."""

    batch_id: int
    offsets: dict[str, dict[int, int]] = field(default_factory=dict)
    updated_at_ms: int = 0
    app_id: str = ""
    """The writer's streaming query and map: tells a replayed batch from a new checkpoint's."""

    def to_hash(self) -> dict[str, str]:
        """The fields of ``<map>:__meta__``."""
        offsets = {t: {str(p): o for p, o in sorted(ps.items())} for t, ps in self.offsets.items()}
        return {
            "batch_id": str(self.batch_id),
            "offsets": orjson.dumps(offsets, option=orjson.OPT_SORT_KEYS).decode(),
            "updated_at_ms": str(self.updated_at_ms),
            "app_id": self.app_id,
        }

    @classmethod
    def from_hash(cls, raw: Mapping[Any, Any]) -> Watermark | None:
        """Parse ``HGETALL <map>:__meta__``; ``None`` when the map has no batch yet."""
        fields = text_fields(raw)
        if "batch_id" not in fields:
            return None
        offsets = orjson.loads(fields.get("offsets", "{}"))
        return cls(
            batch_id=int(fields["batch_id"]),
            offsets={t: {int(p): int(o) for p, o in ps.items()} for t, ps in offsets.items()},
            updated_at_ms=int(fields.get("updated_at_ms", "0")),
            app_id=fields.get("app_id", ""),
        )
