"""Calling the real-time path's Redis Function (``materializer_live``) one record at a
time, as the JVM writer calls it, on a key of a map of its own: for tests of the folds
the function applies (``merge.lua``, ``aggregate.lua``) against the Python folds."""

from __future__ import annotations

import itertools
from typing import Any

import redis

from materializer.redis.functions import FIXED_ARGS, LIVE, SOURCE

MARKER, META, ENTITY, STATE = "t:marker", "t:meta", "t:e:k", "t:o:{t:e:k}"
"""The map's marker and watermark hash, and the one key's entity and state."""


class LiveFunction:
    """The function on one key, with ``spec`` as the map's fold; each call's record comes at
    the next offset of partition 0 of topic ``t`` unless told otherwise."""

    def __init__(self, client: redis.Redis, spec: bytes, *, digits: bool = False) -> None:
        self.client = client
        self.spec = spec
        self.digits = digits
        """Whether the tests give it orders of digits and zero bytes only."""
        self.offsets = itertools.count()
        client.execute_command("FUNCTION LOAD", "REPLACE", SOURCE)
        client.delete(MARKER, META, ENTITY, STATE)
        client.set(MARKER, "1")

    def __call__(
        self,
        order: str,
        payload: bytes | None,
        aux: str,
        partition: int = 0,
        offset: int | None = None,
    ) -> Any:
        """Fold one record (at ``offset`` when given); the function's answer for it."""
        fixed = ["", "", "1", "100", "0", MARKER, "86400000", "", "", ""]
        assert len(fixed) == FIXED_ARGS
        at = next(self.offsets) if offset is None else offset
        record = ["t", str(partition), str(at), ENTITY, STATE, order]
        record += [payload or b"", aux]
        [answer] = self.client.execute_command(
            "FCALL", LIVE, 1, ENTITY, *fixed, META, "app", self.spec, *record
        )
        return answer

    def reset(self) -> None:
        """A key never folded: no entity, no state, no position."""
        self.client.delete(ENTITY, STATE, META)

    def state(self) -> bytes | None:
        return self.client.get(STATE)

    def entity(self) -> bytes | None:
        return self.client.get(ENTITY)

    def put(self, state: bytes, entity: bytes | None) -> None:
        """A state and entity as the micro-batch path's fold writes them."""
        self.client.set(STATE, state)
        if entity is None:
            self.client.delete(ENTITY)
        else:
            self.client.set(ENTITY, entity)
