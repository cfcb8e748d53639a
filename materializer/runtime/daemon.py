"""Work the run does beside its supervisor's loop, a round every interval on a daemon thread
of its own: the catch-up figures, the state sizes, the history. A Kafka or Redis that does
not answer delays that work, never the loop that obeys operators and watches the maps."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod


class DaemonLoop(ABC):
    """Rounds of work on a daemon thread until ``stop``; ``_run`` is the thread's body, and
    waits on ``_stop`` between rounds (``_interval`` seconds)."""

    def __init__(self, name: str, interval_s: float) -> None:
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        """Start the rounds (the class says when the first one comes)."""
        self._thread.start()

    def stop(self) -> None:
        """Stop after the round under way."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    @abstractmethod
    def _run(self) -> None:
        """The rounds, until ``_stop`` is set."""
