"""Startup and shutdown steps printed as they happen: ``starting Kafka broker… ok (3.1 s)``.

A step is also where a Ctrl-C during startup takes effect: the signal only
sets a flag (so no service is left half-started by an exception in the middle
of its start), and the next step sees it and unwinds what was started.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from rich.console import Console
from rich.text import Text


class Interrupted(Exception):
    """Ctrl-C or SIGTERM arrived: stop starting things and unwind."""


class Steps:
    """Prints each step with its outcome and time; refuses to begin one once stop is asked.

    Printing never fails a step: with its output gone (a closed pipe) the demo
    must still stop what it started, so it goes on silently.
    """

    def __init__(self, console: Console, stop: threading.Event) -> None:
        self.console = console
        self.stop = stop

    def _print(self, text: Text, end: str = "\n") -> None:
        with suppress(OSError):
            self.console.print(text, end=end, soft_wrap=True)

    def say(self, text: str, style: str = "") -> None:
        """One line as is: no markup, no wrapping (log readers grep for it)."""
        self._print(Text(text, style=style))

    def check(self) -> None:
        """Raise ``Interrupted`` when a stop was asked."""
        if self.stop.is_set():
            raise Interrupted

    @contextmanager
    def step(self, text: str, *, interruptible: bool = True) -> Iterator[list[str]]:
        """``text…`` then ``ok (1.2 s)`` or ``failed``; the yielded list collects notes for ok.

        Shutdown steps pass ``interruptible=False``: they must run whatever was asked.
        """
        if interruptible:
            self.check()
        self._print(Text(f"{text}… "), end="")
        started = time.monotonic()
        notes: list[str] = []
        try:
            yield notes
        except Interrupted:
            self._print(Text("interrupted", style="yellow"))
            raise
        except BaseException:
            self._print(Text("failed", style="red"))
            raise
        elapsed = time.monotonic() - started
        self._print(Text(f"ok ({', '.join([f'{elapsed:.1f} s', *notes])})", style="green"))
