"""Work the run does beside its supervisor's loop, a round every interval on a daemon thread
of its own: the catch-up figures, the state sizes, the history. A Kafka or Redis that does
not answer delays that work, never the loop that obeys operators and watches the maps."""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from typing import ClassVar

log = logging.getLogger(__name__)


class DaemonLoop(ABC):
    """Rounds of ``round`` on a daemon thread, every ``interval_s`` until ``stop``.

    A round that fails on one of ``transient`` (a service away) is logged once as
    ``failing`` and again as ``recovered`` when a round succeeds; any other error is
    logged with its trace and the rounds go on: a bug in a figure must not freeze
    the figures of every later round, nor end the run.
    """

    transient: ClassVar[tuple[type[Exception], ...]] = ()
    """Errors of a service that does not answer: expected, logged once until it answers."""
    failing: ClassVar[str] = "rounds failing"
    """What a failed round costs, as the warning says it (``: <error>`` follows)."""
    recovered: ClassVar[str] = "rounds succeed again"

    def __init__(self, name: str, interval_s: float, *, first_at_once: bool = True) -> None:
        """``first_at_once``: the first round as soon as the thread starts (else one
        interval later)."""
        self._interval = interval_s
        self._first_at_once = first_at_once
        self._failing = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        """Start the rounds."""
        self._thread.start()

    def stop(self) -> None:
        """Stop after the round under way."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    @property
    def stopping(self) -> bool:
        """Whether ``stop`` was asked: a long round ends early on it."""
        return self._stop.is_set()

    @abstractmethod
    def round(self) -> None:
        """One round of the work (on the daemon thread)."""

    def _run(self) -> None:
        if not self._first_at_once and self._stop.wait(self._interval):
            return
        while not self._stop.is_set():
            try:
                self.round()
                if self._failing:
                    log.info("%s", self.recovered)
                self._failing = False
            except self.transient as exc:
                if not self._failing:
                    log.warning("%s: %s", self.failing, exc)
                self._failing = True
            except Exception as exc:  # noqa: BLE001 - a bug in one round must not end the rounds
                log.exception("%s: %s", self.failing, exc)
            if self._stop.wait(self._interval):
                return
