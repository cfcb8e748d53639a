"""How large each map's fold state is: keys and bytes, for status and metrics.

The fold keeps one state key per entity it knows (``<map>\\0o:...``, see
``materializer.redis.sink``), live or deleted within
``fold.deleted_retention``. Whether that stays bounded under churn is what an
operator wants to see, so the run counts the keys with ``SCAN`` (every
master on a cluster) and estimates their memory from ``MEMORY USAGE`` of a
sample, as Redis itself estimates. A count walks the whole keyspace, so it
runs on a thread of its own every ``metrics.state_interval`` (a minute), never
in the supervisor's loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from materializer.clients.redis import TRANSIENT_ERRORS, Client, client_for
from materializer.config import RedisConfig
from materializer.contract.redis_layout import state_keys_pattern
from materializer.runtime.daemon import DaemonLoop

log = logging.getLogger(__name__)

SAMPLE_KEYS = 200
"""State keys whose ``MEMORY USAGE`` stands for all of them."""
SCAN_COUNT = 2000


@dataclass(frozen=True)
class StateSize:
    """A map's fold state: how many keys, and about how many bytes of Redis memory."""

    keys: int
    bytes: int


def measure(client: Client, physical: str) -> StateSize:
    """Count the map's state keys and estimate their memory."""
    keys = 0
    sample: list[bytes] = []
    for key in client.scan_iter(match=state_keys_pattern(physical), count=SCAN_COUNT):
        keys += 1
        if len(sample) < SAMPLE_KEYS:
            sample.append(key)
    if not sample:
        return StateSize(keys, 0)
    with client.pipeline(transaction=False) as pipe:
        for key in sample:
            pipe.memory_usage(key, samples=0)
        usages = [int(u) for u in pipe.execute() if u is not None]
    mean = sum(usages) / len(usages) if usages else 0.0
    return StateSize(keys, round(mean * keys))


class StateSizes(DaemonLoop):
    """Measures the maps ``physical()`` names every ``interval_s`` on a daemon thread, the
    first time as soon as it starts; the last measure of each is in ``latest``, and
    ``on_measure`` gets each one too."""

    transient = TRANSIENT_ERRORS
    failing = "state sizes not measured"
    while_away = "(they stay as last measured)"
    recovered = "state sizes measured again"

    def __init__(
        self,
        redis: RedisConfig,
        physical: Callable[[], dict[str, str]],
        on_measure: Callable[[str, StateSize], None],
        interval_s: float,
    ) -> None:
        super().__init__("state-sizes", interval_s)
        self.latest: dict[str, StateSize] = {}
        self._redis = redis
        self._physical = physical
        self._on_measure = on_measure

    def round(self) -> None:
        """Measure every map once; a map Redis does not answer for keeps its last measure."""
        client = client_for(self._redis)
        for name, physical in self._physical().items():
            if self.stopping:
                return
            try:
                size = measure(client, physical)
            except TRANSIENT_ERRORS as exc:
                log.debug("map %s: state not measured: %s", name, exc)
                continue
            self.latest[name] = size
            self._on_measure(name, size)
