"""The session's listeners of streaming query events, fed each batch's progress as one
JSON document.

PySpark's own listener bridge turns every progress event into Python field by field,
one py4j round trip each (the sources, the sink, every metrics map, the observed
rows, each wrapped in its exception translation), and again for each listener
registered. In a live ``materializer run`` that took a large share of the driver's
Python time, on the gateway and the GIL that the fold's batches need. Here an event
crosses once: ``progress().json()``, one call, parsed with orjson and handed to every
listener as the dict Spark documents (``StreamingQueryProgress.json``).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

Progress = dict[str, Any]
"""One batch's progress as Spark reports it in JSON: ``name``, ``batchId``,
``numInputRows``, ``batchDuration``, ``timestamp``, ``sources`` (each with its
``endOffset`` and ``latestOffset``), ``observedMetrics`` (name → metric → value)."""


class QueryListener(ABC):
    """What a listener of the session's queries hears; called on Spark's listener thread."""

    def started(self, name: str | None, query_id: str) -> None:  # noqa: B027 - optional
        """A query started (or restarted from its checkpoint)."""

    @abstractmethod
    def progress(self, progress: Progress) -> None:
        """A batch committed."""

    def terminated(self, query_id: str, error: str | None) -> None:  # noqa: B027 - optional
        """A query stopped; ``error`` is Spark's text when it failed."""


class _Bridge:
    """The Java side's ``PythonStreamingQueryListener``, calling every listener in turn.

    A listener that raises is logged and the others still hear the event: the bus
    would otherwise drop it for all of them."""

    def __init__(self, listeners: Sequence[QueryListener]) -> None:
        self.listeners = list(listeners)

    def _each(self, call: Callable[[QueryListener], None]) -> None:
        for listener in self.listeners:
            try:
                call(listener)
            except Exception:
                log.exception("listener %s failed", type(listener).__name__)

    def onQueryStarted(self, jevent: Any) -> None:  # noqa: N802 - Spark's interface
        name, query_id = jevent.name(), str(jevent.id().toString())
        self._each(lambda listener: listener.started(name, query_id))

    def onQueryProgress(self, jevent: Any) -> None:  # noqa: N802
        progress = orjson.loads(jevent.progress().json())
        self._each(lambda listener: listener.progress(progress))

    def onQueryIdle(self, jevent: Any) -> None:  # noqa: N802
        """Nothing to tell: an idle query is caught up."""

    def onQueryTerminated(self, jevent: Any) -> None:  # noqa: N802
        query_id = str(jevent.id().toString())
        exception = jevent.exception()
        error = str(exception.get()) if exception.isDefined() else None
        self._each(lambda listener: listener.terminated(query_id, error))

    class Java:
        implements = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]


def listen(spark: SparkSession, *listeners: QueryListener) -> Callable[[], None]:
    """Register ``listeners`` on the session's query bus, after those already there (the bus
    calls them in that order); the answer unregisters them."""
    from pyspark.java_gateway import ensure_callback_server_started

    context = spark.sparkContext
    gateway, jvm = context._gateway, context._jvm
    assert gateway is not None and jvm is not None
    ensure_callback_server_started(gateway)  # type: ignore[no-untyped-call]
    wrapper = jvm.org.apache.spark.sql.streaming.PythonStreamingQueryListenerWrapper(
        _Bridge(listeners)
    )
    manager = spark.streams._jsqm
    manager.addListener(wrapper)
    return lambda: manager.removeListener(wrapper)
