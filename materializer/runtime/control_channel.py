"""The materializer's side of the admin API: reports per map, and the requests it obeys.

The query service's AdminService writes ``<map>:__control__`` and reads
``<map>:__status__``; ``materializer run`` does the opposite, once per loop of
its supervisor (well under one trigger interval). Redis being down never stops
a map: the last known request stands and reports resume when Redis is back.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence

import redis

from materializer.clients.redis import connect
from materializer.config import RedisConfig
from materializer.contract.control import Control
from materializer.contract.redis_layout import (
    control_key,
    definition_key,
    generation_key,
    parse_generation,
    status_key,
)
from materializer.contract.status import MapReport

log = logging.getLogger(__name__)


class ControlChannel:
    """Reads every map's control hash and writes its report, one pipeline each way."""

    def __init__(self, config: RedisConfig, names: Sequence[str]) -> None:
        self._client = connect(config, socket_timeout=2.0, socket_connect_timeout=2.0)
        self.names = list(names)
        """The maps it reads and reports; the run changes them as maps come and go."""
        self._last: dict[str, Control] = {}
        self._warned = False

    def requests(self) -> dict[str, Control]:
        """Each map's current request; the last one known when Redis cannot be read."""
        try:
            pipe = self._client.pipeline(transaction=False)
            for name in self.names:
                pipe.hgetall(control_key(name))
            replies = pipe.execute()
        except redis.RedisError as exc:
            self._warn(exc)
            return {n: self._last.get(n, Control()) for n in self.names}
        self._warned = False
        self._last = {n: Control.from_hash(r) for n, r in zip(self.names, replies, strict=True)}
        return dict(self._last)

    def generation(self, name: str) -> int:
        """The generation of the map's data to run (a rebuild moves it); raises when unreadable.

        Unlike a request, this is never guessed: starting the wrong
        generation would fold into a copy readers no longer use.
        """
        return parse_generation(self._client.get(generation_key(name)))

    def definition(self, name: str) -> int:
        """The catalog version a rebuild last folded the map's readers' copy by (0: none)."""
        return parse_generation(self._client.get(definition_key(name)))

    def report(self, reports: dict[str, MapReport]) -> None:
        """Write each map's report (best effort: a missed report is only a stale status)."""
        now = int(time.time() * 1000)
        try:
            pipe = self._client.pipeline(transaction=False)
            for name, report in reports.items():
                stamped = dataclasses.replace(report, reported_at_ms=now)
                pipe.hset(status_key(name), mapping=stamped.to_hash())  # type: ignore[arg-type]
            pipe.execute()
        except redis.RedisError as exc:
            self._warn(exc)

    def _warn(self, exc: Exception) -> None:
        if not self._warned:
            log.warning("cannot reach Redis for map control and status: %s", exc)
            self._warned = True

    def close(self) -> None:
        """Release the connection."""
        self._client.close()
