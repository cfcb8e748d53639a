"""Stop signals, to the driver or to its JVM, routed to one stop that drains.

A terminal's Ctrl-C or its closing (SIGHUP) and systemd's default
``KillMode=control-group`` signal every process of the run, the JVM that
PySpark starts included. Two handlers stand in the way of a drain, and both
are replaced here once the session runs:

- the JVM's SIGTERM and SIGHUP handlers run its shutdown hooks, and Spark's
  stops the SparkContext while the driver is still draining, so the Delta
  tables miss the last batches. They become one that asks the driver to stop,
  so the JVM keeps serving until the drain is done and ``SparkSession.stop``
  ends it. (PySpark starts the JVM ignoring SIGINT already.)
- PySpark's SIGINT handler in the driver cancels every running job and
  raises ``KeyboardInterrupt``: a batch is cut short and the run fails. It
  becomes the same stop as SIGTERM; so does SIGHUP, whose default would end
  the driver at once.

If the driver dies, the JVM still goes: PySpark's gateway exits when its
stdin, the driver's pipe, closes.

Until the session has started the JVM's own handler stands, so a SIGTERM in
the first seconds of a run stops it without a drain; there is nothing to
drain yet.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_HUP_IGNORED = signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
"""Whether the process started ignoring SIGHUP (``nohup``): read when the command line
imports this module, before any handler is installed. The JVM, started later, inherits
the ignore as well."""
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT) + (() if _HUP_IGNORED else (signal.SIGHUP,))
"""The signals that stop a run with a drain, wherever they arrive; a run started under
``nohup`` goes on ignoring SIGHUP, as it asked."""
ROUTED = ("TERM",) + (() if _HUP_IGNORED else ("HUP",))
"""The JVM's signals routed; SIGINT needs none, the JVM ignores it from the start."""


class _StopHandler:
    """A ``sun.misc.SignalHandler`` implemented in Python: the JVM calls it through py4j's
    callback server, on a thread of its own."""

    def __init__(self, on_signal: Callable[[str], None]) -> None:
        self._on_signal = on_signal

    def handle(self, sig: Any) -> None:
        """The JVM received ``sig``."""
        self._on_signal(f"SIG{sig.getName()} to the JVM")

    class Java:
        implements = ["sun.misc.SignalHandler"]


def route_stop_signals(spark: SparkSession, on_signal: Callable[[str], None]) -> None:
    """From now on, SIGTERM, SIGINT or SIGHUP to the driver, or SIGTERM or SIGHUP to the
    session's JVM, calls ``on_signal`` with the signal's name and stops nothing itself.
    Call it from the main thread, after the session has started (PySpark installs its
    SIGINT handler then)."""
    from pyspark.java_gateway import ensure_callback_server_started

    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda n, _: on_signal(f"{signal.Signals(n).name} to the driver"))

    gateway = spark.sparkContext._gateway
    jvm = spark.sparkContext._jvm
    if gateway is None or jvm is None:
        raise RuntimeError("the Spark session has no JVM to route signals from")
    ensure_callback_server_started(gateway)  # type: ignore[no-untyped-call]
    handler = _StopHandler(on_signal)
    for name in ROUTED:
        jvm.sun.misc.Signal.handle(jvm.sun.misc.Signal(name), handler)
    # The JVM holds the handler only through py4j: keep the Python side alive with the gateway.
    gateway._materializer_stop_handler = handler
