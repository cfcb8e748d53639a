"""The running queries of one map as one unit: started together, stopped in order (the
fold's batch finished first, then the Delta table takes in the changelog up to it), and
watched for the first failure."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from materializer.runtime.projector import Projector

if TYPE_CHECKING:
    from pyspark.sql.streaming.query import StreamingQuery


class FoldQuery(Protocol):
    """What a map's fold is to those who watch and stop it: its own micro-batch query, or
    its place in the run's real-time query (``run.shared_fold.SharedFold``)."""

    @property
    def name(self) -> str:
        """The query's name."""

    @property
    def isActive(self) -> bool:  # noqa: N802 - StreamingQuery's names
        """False once it failed or stopped."""

    @property
    def lastProgress(self) -> Any:  # noqa: N802
        """Its last batch's progress (None before the first)."""

    @property
    def status(self) -> dict[str, Any]:
        """Whether a batch is running, and why not."""

    def exception(self) -> Any:
        """Its failure, if it failed."""

    def stop(self) -> None:
        """Stop it."""

    def processAllAvailable(self) -> None:  # noqa: N802
        """Wait until it has taken in what its sources hold now."""


log = logging.getLogger(__name__)


FINISH_BATCH_TIMEOUT = 120.0


@dataclass
class QueryGroup:
    """The running queries of one map (its fold, then its Delta query) or of one enrichment,
    started, stopped and watched together.

    The Delta query comes first among the side queries: it takes what the fold wrote.
    """

    name: str
    fold: FoldQuery
    side: list[StreamingQuery] = field(default_factory=list)
    projectors: list[Projector] = field(default_factory=list)
    """Closed once the queries stop, releasing the clients their sinks keep."""
    catch_up: Callable[[], StreamingQuery] | None = None
    """Starts the Delta query once more, to take in everything the changelog holds and end
    (``availableNow``): what a stop runs after the fold has stopped."""
    opening: bool = False
    """The map's opening: its fold alone, for one small batch (``job.start_map``); once
    ``opened``, its owner stops it and starts the map's queries as usual."""

    def opened(self) -> bool:
        """Whether the opening's one trigger has run: its batch committed, or there was none
        to make (nothing in the topics past the checkpoint)."""
        if not self.opening or not self.fold.isActive:
            return False
        if self.fold.lastProgress is not None:
            return True
        status = self.fold.status
        return (
            not status["isTriggerActive"]
            and not status["isDataAvailable"]
            and (status["message"].startswith("Waiting"))
        )

    @property
    def queries(self) -> list[FoldQuery]:
        """The map's queries, fold first."""
        return [self.fold, *self.side]

    def process_all_available(self) -> None:
        """Block until everything in the topics right now is folded, dead-lettered, recorded."""
        for query in self.queries:
            query.processAllAvailable()

    def stop(self) -> None:
        """Stop the map's queries."""
        for query in self.queries:
            query.stop()
        self._close()

    def _close(self) -> None:
        for projector in self.projectors:
            projector.close()

    def stop_fold(self, deadline: float) -> None:
        """Stop the fold once its batch in flight is done (cut short only at ``deadline``,
        a ``time.monotonic()``)."""
        stop_after_batch(self.fold, deadline)

    def drain(self, deadline: float) -> bool:
        """After ``stop_fold``: stop the side queries after their batch, then let the Delta
        table take in the changelog up to the fold's last batch. False when ``deadline`` cut
        that short (the next start merges the rest).

        A stop ends here, so the table a data team reads holds what Redis
        holds, whatever the Delta query's trigger interval.
        """
        for query in self.side:
            _await_batch_end(query, deadline)
            query.stop()
        done = True
        if self.catch_up is not None:
            query = self.catch_up()
            try:
                left = max(0, math.ceil(deadline - time.monotonic()))
                done = bool(query.awaitTermination(left))
            except Exception as exc:  # noqa: BLE001 - the next start replays it; say why
                log.error("map %s: the Delta table's last catch-up failed: %s", self.name, exc)
                done = False
            if query.isActive:
                query.stop()
        self._close()
        return done

    def stop_after_batch(self, timeout: float = FINISH_BATCH_TIMEOUT) -> None:
        """Stop each query once its batch in flight is done (cut short only after ``timeout``).

        A batch cut short is replayed by the next start and changes nothing
        twice, but letting it finish keeps that replay from happening at all.
        The timeout bounds the whole stop, so a pause is obeyed within it
        however many queries the map has.
        """
        deadline = time.monotonic() + timeout
        for query in self.queries:
            _await_batch_end(query, deadline)
            query.stop()
        self._close()


def stop_after_batch(query: FoldQuery, deadline: float) -> None:
    """Stop ``query`` once its batch in flight is done (cut short only at ``deadline``)."""
    _await_batch_end(query, deadline)
    query.stop()


def _await_batch_end(query: FoldQuery, deadline: float) -> None:
    """Return once the query's batch in flight (if any) has committed, or at ``deadline``.

    Under a steady stream batches run back to back and an idle trigger is
    rarely seen between them; a new progress report marks the end of the
    batch that was running, so the stop that follows cuts short at most the
    batch after it, which the next start replays.
    """
    started = _last_batch_id(query)
    while query.isActive and time.monotonic() < deadline:
        if not query.status["isTriggerActive"] or _last_batch_id(query) != started:
            return
        time.sleep(0.05)


def _last_batch_id(query: FoldQuery) -> int | None:
    progress = query.lastProgress
    return None if progress is None else int(progress["batchId"])
