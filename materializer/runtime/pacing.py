"""A map catching up beside live ones slows itself while their batches run long.

On a machine of few cores a backlog's batches take every core they can: a live
map's batch then waits behind them, and its freshness with it. So a map that
starts far behind while other maps of its run fold live (``catch_up`` in its
config) folds small batches in a scheduler pool below theirs
(``projector.CATCH_UP_POOL``), and its ``CatchUpPace`` rests before each batch
while the live maps' batches run longer than ``SLOW_MS``: a rest of a share of
its own last batch's time (a duty cycle), the share doubling (up to
``MAX_SHARE``) while any live batch of the last ``WINDOW_SECONDS`` ran long, and
halving once they all ran quick for a window. Each change of pace is logged, and
``paced_seconds`` is exported as a metric.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)

SLOW_MS = 500
"""A live map's batch slower than this (half of its freshness goal of a second) slows the
catch-up down."""
QUICK_MS = 250
"""Live batches all quicker than this for a window let the catch-up speed up again."""
WINDOW_SECONDS = 5.0
"""The live batches a change of pace is judged on: a change acts within a few batches."""
FIRST_SHARE = 0.5
"""The first rest: half of the catch-up's own last batch time (two thirds of the cores'
time left to it)."""
MAX_SHARE = 8.0
MAX_REST_SECONDS = 10.0


class CatchUpPace:
    """How long a catching-up map's fold rests before each batch; set from the run's loop,
    read by the fold's query thread."""

    def __init__(self, map_name: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.map_name = map_name
        self._clock = clock
        self._share = 0.0
        self._changed = clock()
        self._live: deque[tuple[float, int]] = deque()
        self._batch_started: float | None = None
        self._last_batch_s = 0.0
        self._lock = threading.Lock()

    @property
    def share(self) -> float:
        """The rest before each batch as a share of the last batch's time (0: full pace)."""
        with self._lock:
            return self._share

    @property
    def paced_seconds(self) -> float:
        """The rest before its next batch (0: full pace)."""
        with self._lock:
            return min(MAX_REST_SECONDS, self._share * self._last_batch_s)

    def __call__(self) -> None:
        """Before a batch: rest as long as the live maps need."""
        now = self._clock()
        with self._lock:
            if self._batch_started is not None:
                self._last_batch_s = now - self._batch_started
        rest = self.paced_seconds
        if rest > 0:
            time.sleep(rest)
        with self._lock:
            self._batch_started = self._clock()

    def follow(self, live_batch_ms: Iterable[int]) -> None:
        """Take in the live maps' last batch durations; change pace when they say so."""
        now = self._clock()
        with self._lock:
            self._live.append((now, max(live_batch_ms, default=0)))
            while self._live and now - self._live[0][0] > WINDOW_SECONDS:
                self._live.popleft()
            slowest = max(ms for _, ms in self._live)
            before = self._share
            settled = now - self._changed >= WINDOW_SECONDS
            if slowest > SLOW_MS and (before == 0 or settled):
                self._share = min(MAX_SHARE, max(FIRST_SHARE, before * 2))
            elif slowest < QUICK_MS and before > 0 and settled:
                self._share = before / 2 if before / 2 >= FIRST_SHARE else 0.0
            after = self._share
            if after != before:
                self._changed = now
        if after > 0 and before == 0:
            log.warning(
                "map %s: catching up slowed down, resting %.0f%% of its batch time before each "
                "batch: the live maps' batches take up to %d ms",
                self.map_name,
                after * 100,
                slowest,
            )
        elif after == 0 and before > 0:
            log.info("map %s: catching up at full pace again", self.map_name)
