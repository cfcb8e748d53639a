"""Crash drills: kill the whole run at a chosen point, to prove recovery.

``MATERIALIZER_CRASH_AFTER=<sink>:<n>`` (``redis:3``, say) makes the process
kill its own process group with SIGKILL right after the named sink wrote the
n-th batch this process projected — the moment a crash is most harmful, with
one store holding the batch and the other not. Operators use it to rehearse
recovery; the crash tests use it to hit that window for certain.

The sinks, in the order a fold batch meets them: ``fold`` (Redis holds the
batch; its changelog and dead letters are sent), ``history``, ``redis`` (the
watermark), ``group_offsets``; the Delta query's: ``delta``, ``retention``.
"""

from __future__ import annotations

import os
import signal

CRASH_ENV = "MATERIALIZER_CRASH_AFTER"


class CrashDrill:
    """Counts batches and pulls the plug where the environment says."""

    def __init__(self, spec: str | None = None) -> None:
        spec = os.environ.get(CRASH_ENV, "") if spec is None else spec
        self.sink, _, count = spec.partition(":")
        self.after = int(count) if count.isdigit() else 0
        self._seen = 0

    def batch_started(self) -> None:
        """Called once per projected batch."""
        self._seen += 1

    def sink_written(self, sink: str) -> None:
        """Called after each sink; kills the process group at the drill's point."""
        if self.after and sink == self.sink and self._seen == self.after:
            os.killpg(os.getpgid(0), signal.SIGKILL)
