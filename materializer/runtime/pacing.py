"""A map catching up beside live ones slows itself while their batches run long.

On a machine of few cores a backlog's batches take every core they can: a live
map's batch then waits behind them, and its freshness with it. So a map that
starts far behind while other maps of its run fold live (``catch_up`` in its
config) folds small batches in a scheduler pool below theirs
(``projector.CATCH_UP_POOL``), and its ``CatchUpPace`` waits before each batch
for as long as the live maps' last batches ran longer than ``SLOW_MS``: the
wait doubles while they do, halves once they are quick again. Each change of
pace is logged, and ``paced_seconds`` is exported as a metric.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable

log = logging.getLogger(__name__)

SLOW_MS = 500
"""A live map's batch slower than this (half of its freshness goal of a second) slows the
catch-up down."""
QUICK_MS = 250
"""Live batches all quicker than this let the catch-up speed up again."""
FIRST_WAIT_SECONDS = 0.25
MAX_WAIT_SECONDS = 8.0


class CatchUpPace:
    """How long a catching-up map's fold waits before each batch; set from the run's loop,
    read by the fold's query thread."""

    def __init__(self, map_name: str) -> None:
        self.map_name = map_name
        self._wait = 0.0
        self._lock = threading.Lock()

    @property
    def paced_seconds(self) -> float:
        """The wait before each of its batches now (0: full pace)."""
        with self._lock:
            return self._wait

    def __call__(self) -> None:
        """Before a batch: wait as long as the live maps need."""
        wait = self.paced_seconds
        if wait > 0:
            time.sleep(wait)

    def follow(self, live_batch_ms: Iterable[int]) -> None:
        """Set the wait from the live maps' last batch durations."""
        slowest = max(live_batch_ms, default=0)
        with self._lock:
            before = self._wait
            if slowest > SLOW_MS:
                self._wait = min(MAX_WAIT_SECONDS, max(FIRST_WAIT_SECONDS, before * 2))
            elif slowest < QUICK_MS and before > 0:
                self._wait = before / 2 if before / 2 >= FIRST_WAIT_SECONDS else 0.0
            after = self._wait
        if after > 0 and before == 0:
            log.warning(
                "map %s: catching up slowed down, %.2f s between its batches: the live maps' "
                "batches take up to %d ms",
                self.map_name,
                after,
                slowest,
            )
        elif after == 0 and before > 0:
            log.info("map %s: catching up at full pace again", self.map_name)
