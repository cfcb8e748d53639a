"""Work the run does beside its supervisor's loop, a round every interval on a daemon thread
of its own: the catch-up figures, the state sizes, the history. A Kafka or Redis that does
not answer delays that work, never the loop that obeys operators and watches the maps."""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from typing import ClassVar


class DaemonLoop(ABC):
    """Rounds of ``round`` on a daemon thread, ``interval_s`` apart, until ``stop``.

    A round that fails on one of ``transient`` (a service away) is warned of once, as
    ``failing`` and ``while_away``, and ``recovered`` is said once a round succeeds
    again; any other error is logged with its trace as ``failing`` alone, and the rounds
    go on: a bug in one figure must not freeze every later one, nor end the run. The
    lines come from the logger of the subclass's module.
    """

    transient: ClassVar[tuple[type[Exception], ...]] = ()
    """Errors of a service that does not answer: expected, warned of once until it answers."""
    failing: ClassVar[str] = "a round failed"
    """What a failed round costs (``: <error>`` follows)."""
    while_away: ClassVar[str] = ""
    """What that means while the service is away, after ``failing`` in the warning."""
    recovered: ClassVar[str] = "rounds succeed again"

    def __init__(self, name: str, interval_s: float, *, first_at_once: bool = True) -> None:
        """``first_at_once``: the first round as soon as the thread starts (else one
        interval later)."""
        self._interval = interval_s
        self._first_at_once = first_at_once
        self._failing = False
        self._log = logging.getLogger(type(self).__module__)
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
                    self._log.info("%s", self.recovered)
                self._failing = False
            except self.transient as exc:
                if not self._failing:
                    away = f" {self.while_away}" if self.while_away else ""
                    self._log.warning("%s%s: %s", self.failing, away, exc)
                self._failing = True
            except Exception as exc:  # noqa: BLE001 - a bug in one round must not end the rounds
                self._log.exception("%s: %s", self.failing, exc)
            if self._stop.wait(self._interval):
                return
