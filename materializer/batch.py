"""The contract every projection honours."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame


@dataclass(frozen=True)
class Batch:
    """One micro-batch of a query's rows (``__key``, ``__deleted``, ``__entity``, ...).

    ``app_id`` changes whenever the checkpoint does, so that a fresh checkpoint,
    whose batch ids restart at 0, is never mistaken for a replay.
    """

    rows: DataFrame
    batch_id: int
    app_id: str
    count: int | None = None
    """How many rows, when the projector counted them."""
    records: DataFrame | None = None
    """The batch's records as read, decoded and keyed, when the fold ran inside the batch
    (a map folded in Redis): the dead letters and the history come from them."""
    collected: pa.Table | None = None
    """``rows`` already collected on the driver, in the same Arrow columns (its entity a
    struct): a query that feeds many maps collects its batch for all of them in one job,
    and a sink that reads the rows in Arrow takes them from here, not from a job of its
    own (``live.delta``)."""


class Sink(ABC):
    """A store that the fold projects into.

    ``name`` identifies the sink in logs and crash drills. ``write`` runs on
    the Spark driver inside ``foreachBatch`` and must be
    idempotent: the same ``(app_id, batch_id)`` with the same rows, written
    again after a crash, leaves the store exactly as the first write did.
    """

    name: str

    @abstractmethod
    def write(self, batch: Batch) -> None:
        """Project the batch's rows."""

    def rows_out(self) -> int | None:
        """Rows the last ``write`` produced, for a sink that makes the batch's rows itself
        (the fold in Redis); None for the others, whose rows the projector counts."""
        return None

    def close(self) -> None:  # noqa: B027 - most sinks hold nothing to release
        """Release the clients the sink keeps across batches, once its query has stopped."""
