"""How far a map's Delta table has merged its changelog, and where its next writer starts.

A table has one writer at a time: the map's own Delta query, or the query the real-time
path's maps share (``live.delta``). Every MERGE records the changelog position it reached
in its commit (``contract.table_marks``), so whichever writer starts next takes it from the
table rather than from a checkpoint that may stand behind it: the map's own checkpoint
stays where the map joined the real-time path, and the shared query's is new at each start.

No writer starts below the recorded position (``resume_at``): the changelog is the map's
history, and a replay of it from behind the table would set keys back to older values
until it caught up. Delta's transaction ids cannot prevent that, since they only know the
batches of one checkpoint.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import orjson

from materializer.checkpoints.files import CheckpointFiles
from materializer.contract.table_marks import CommitMark, table_mark

EARLIEST = -2
"""Spark's ``startingOffsets`` JSON for a partition's first offset."""

log = logging.getLogger(__name__)


class MergedPositions:
    """The table's merged changelog position for one writer (driver side): read from the
    table's newest commits at the writer's first batch, then advanced by its own commits
    (no other writer commits to the table meanwhile).

    ``location``: the table's URI and delta-rs storage options.
    """

    def __init__(self, location: tuple[str, dict[str, str] | None], changelog: str) -> None:
        self._location = location
        self.changelog = changelog
        self._recorded: CommitMark | None = None
        self._floor: dict[int, int] | None = None

    def recorded(self) -> CommitMark | None:
        """What the table's newest commits record, as read at the first call (blocking)."""
        self.floor()
        return self._recorded

    def floor(self) -> dict[int, int]:
        """Per changelog partition, the next offset the table has not merged (empty: none
        recorded, a new table or one no MERGE of this version wrote)."""
        if self._floor is None:
            from deltalake import DeltaTable
            from deltalake.exceptions import TableNotFoundError

            uri, options = self._location
            try:
                self._recorded = table_mark(DeltaTable(uri, storage_options=options))
            except TableNotFoundError:
                self._recorded = None
            found = None if self._recorded is None else self._recorded.changelog
            self._floor = dict((found or {}).get(self.changelog, {}))
        return self._floor

    def reached(self, batch_end: dict[int, int]) -> dict[int, int]:
        """The position a commit of a batch ending at ``batch_end`` records: never behind
        the table's (a writer started behind it merged nothing below it)."""
        floor = self.floor()
        merged = {p: max(o, floor.get(p, 0)) for p, o in batch_end.items()}
        merged.update({p: o for p, o in floor.items() if p not in merged})
        self._floor = merged
        return merged


def resume_at(
    merged: MergedPositions, checkpoint: CheckpointFiles, partitions: list[int]
) -> dict[int, int]:
    """Where a writer takes the changelog up, per partition of ``partitions`` (the changelog's,
    each named, as Spark's ``startingOffsets`` JSON must): the further of the table's merged
    position and the position of the map's own Delta ``checkpoint`` (a batch it committed
    merged everything below its end, or had nothing to merge); ``EARLIEST`` where neither
    has one."""
    return _furthest(merged.floor(), _own(merged, checkpoint), partitions)


def starting_offsets(
    merged: MergedPositions,
    checkpoint: CheckpointFiles,
    partitions: Callable[[], dict[str, list[int]]],
) -> str | None:
    """Where the map's own Delta query on ``checkpoint`` starts, as Spark's
    ``startingOffsets`` JSON, when the table has merged past the checkpoint's position in
    some partition (another writer followed the changelog meanwhile); None: where the
    checkpoint says (or, new, at the earliest). ``partitions`` asks Kafka for the
    changelog's."""
    floor, own = merged.floor(), _own(merged, checkpoint)
    if not any(offset > own.get(p, -1) for p, offset in floor.items()):
        return None
    log.info(
        "%s: the table has merged past its Delta checkpoint; the query starts where the "
        "table stands",
        merged.changelog,
    )
    start = _furthest(floor, own, partitions().get(merged.changelog, []))
    return orjson.dumps({merged.changelog: {str(p): o for p, o in start.items()}}).decode()


def _own(merged: MergedPositions, checkpoint: CheckpointFiles) -> dict[int, int]:
    """The changelog position of the map's own Delta checkpoint (read once: a file listing)."""
    return (checkpoint.position() or {}).get(merged.changelog, {})


def _furthest(floor: dict[int, int], own: dict[int, int], partitions: list[int]) -> dict[int, int]:
    every = sorted(set(partitions) | set(floor) | set(own))
    return {p: max(floor.get(p, EARLIEST), own.get(p, EARLIEST)) for p in every}
