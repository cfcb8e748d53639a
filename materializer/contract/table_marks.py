"""Which source offsets a map's Delta table reflects: the table marks in Redis and its commits.

The fold appends a *table mark* (``TableMark``) beside each watermark it commits, to
the capped stream ``redis_layout.table_marks_key``: the watermark, and where the
changelog ended after its batch. The Delta query, which merges the changelog, learns
from those marks which source offsets its next commit reflects (``materializer.delta.marks``).

The table is fed from the changelog by a query of its own and trails the
Redis copy; without this a reader of version V could not tell which source
records V holds. Each MERGE the materializer commits carries, in the commit's
``userMetadata`` (``commitInfo.userMetadata`` in the Delta log, the
``userMetadata`` column of Spark's ``DESCRIBE HISTORY``, the ``userMetadata``
key of delta-rs's ``DeltaTable.history()``), JSON of the form::

    {"changelog": {"orders.changelog": {"0": 5210, "1": 4980}},
     "format": 1,
     "watermark": {"app_id": "...", "batch_id": 41,
                   "offsets": {"orders": {"0": 1200, "1": 987}},
                   "updated_at_ms": 1767225600000}}

``watermark`` (absent while the map's marks are unknown: a new table whose marks are not
in Redis) is the Redis copy's watermark (``watermark.Watermark``) of
a fold batch whose changelog records all precede the commit: every source
record below those next offsets is in the version. It may under-claim (the
version can hold later records too), never over-claim. ``batch_id`` and
``app_id`` are the fold's, not the Delta query's. ``changelog`` is how far
the version has merged the changelog (next offsets): a reader that sees a
newer table mark in Redis (``TableMark``) reached by it may take that
mark's watermark for the version, which the commit could not know when it
was made. Every MERGE records ``changelog``: it is also where the next writer of the
table starts (``table_positions``), whichever query that is (the map's own Delta query or
the one the real-time path's maps share), and below which it merges nothing again.

Commits the materializer makes without a MERGE (retention DELETEs, added
columns) and other writers' commits (OPTIMIZE, VACUUM) carry none: such a
version reflects what the newest earlier commit with one says
(``table_watermark``).

Stdlib, orjson and deltalake only: the query service reads it, the materializer
writes it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from materializer.contract.redis_layout import text_fields
from materializer.contract.watermark import Watermark

if TYPE_CHECKING:
    from deltalake import DeltaTable

FORMAT = 1
"""The ``format`` this module writes; a reader ignores marks of a format it does not know."""

WALK_BACK_COMMITS = 256
"""How many commits, the snapshot's own included, ``table_watermark`` looks through for
one with a mark: retention DELETEs and maintenance are rare beside MERGEs, so a longer run
of commits without one means the table's writer records none."""
FIRST_SLICE = 1
"""Commits read first: the snapshot's own, which nearly always has the mark."""
SLICE_GROWTH = 8


@dataclass(frozen=True)
class TableMark:
    """A committed watermark and where the changelog ended after its batch.

    The map's Delta table follows the changelog, not the sources: once the
    table has merged the changelog up to ``changelog`` (each partition's next
    offset at least as far), it holds every record the watermark covers, and
    its commits can say so (``encode``). Each partition's offset is at or
    past the end of every changelog record of this batch and the ones before;
    it may be further (never nearer): a mark's table waits the longer, never
    claims too much.
    """

    watermark: Watermark
    changelog: dict[int, int]
    """Per changelog partition, a next offset past the batch's last record (all partitions)."""

    def to_entry(self) -> dict[str, str]:
        """The fields of one ``table_marks_key`` entry: the watermark's, and ``changelog``."""
        ends = {str(p): o for p, o in sorted(self.changelog.items())}
        return {**self.watermark.to_hash(), "changelog": orjson.dumps(ends).decode()}

    @classmethod
    def from_entry(cls, raw: Mapping[Any, Any]) -> TableMark | None:
        """Parse one entry (bytes or text); ``None`` for one without a watermark."""
        watermark = Watermark.from_hash(raw)
        if watermark is None:
            return None
        ends = orjson.loads(text_fields(raw).get("changelog", "{}"))
        return cls(watermark, {int(p): int(o) for p, o in ends.items()})

    def reached_by(self, changelog: Mapping[int, int]) -> bool:
        """Whether a reader of the changelog that reached ``changelog`` (next offsets per
        partition) has read every record of this mark's batch and the ones before."""
        return all(changelog.get(p, 0) >= end for p, end in self.changelog.items())


@dataclass(frozen=True)
class CommitMark:
    """What one commit's ``userMetadata`` records."""

    watermark: Watermark | None
    """Source offsets the version reflects; None while none is known."""
    changelog: dict[str, dict[int, int]] = field(default_factory=dict)
    """How far the version has merged the changelog (next offsets); empty: not recorded."""


def encode(
    watermark: Watermark | None, changelog: Mapping[str, Mapping[int, int]] | None = None
) -> str:
    """The ``userMetadata`` of a commit that reflects ``watermark`` (None: not known) and has
    merged ``changelog``: compact JSON, keys sorted."""
    doc: dict[str, Any] = {"format": FORMAT}
    if watermark is not None:
        doc["watermark"] = {
            "batch_id": watermark.batch_id,
            "offsets": _offsets_json(watermark.offsets),
            "updated_at_ms": watermark.updated_at_ms,
            "app_id": watermark.app_id,
        }
    if changelog:
        doc["changelog"] = _offsets_json(changelog)
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)


def decode(user_metadata: object) -> CommitMark | None:
    """What a commit's ``userMetadata`` records; ``None`` for nothing, for another writer's
    metadata, or for a format this version does not know."""
    if not isinstance(user_metadata, str):
        return None
    try:
        doc = json.loads(user_metadata)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        return None
    mark = doc.get("watermark")
    if not isinstance(mark, dict) and "changelog" not in doc:
        return None
    try:
        watermark = None
        if mark is not None:
            watermark = Watermark(
                batch_id=int(mark["batch_id"]),
                offsets=_offsets(mark["offsets"]),
                updated_at_ms=int(mark.get("updated_at_ms", 0)),
                app_id=str(mark.get("app_id", "")),
            )
        return CommitMark(watermark, _offsets(doc.get("changelog", {})))
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def _offsets_json(offsets: Mapping[str, Mapping[int, int]]) -> dict[str, dict[str, int]]:
    return {
        topic: {str(p): int(o) for p, o in sorted(parts.items())}
        for topic, parts in sorted(offsets.items())
    }


def _offsets(doc: Any) -> dict[str, dict[int, int]]:
    return {str(topic): {int(p): int(o) for p, o in parts.items()} for topic, parts in doc.items()}


def table_watermark(table: DeltaTable) -> Watermark | None:
    """The source offsets the snapshot ``table`` reflects (``table_mark``'s watermark)."""
    mark = table_mark(table)
    return None if mark is None else mark.watermark


def table_positions(table: DeltaTable, changelog: str) -> dict[int, int]:
    """How far the snapshot ``table`` has merged ``changelog`` (next offset per partition;
    empty when no commit records it): where its next writer starts."""
    mark = table_mark(table)
    return {} if mark is None else dict(mark.changelog.get(changelog, {}))


def table_mark(table: DeltaTable) -> CommitMark | None:
    """What the snapshot ``table`` reflects: its version's mark, else the newest earlier
    commit's within ``WALK_BACK_COMMITS``; ``None`` when none has one.

    Blocking (reads the log's commit files; one small read when the version is
    a MERGE). Reads the commit files themselves rather than
    ``DeltaTable.history()``: delta-rs 1.6 lists a snapshot's history from the
    newest commit in storage and numbers it down from the snapshot's version,
    so a commit landing meanwhile would lend its offsets to an older version.
    A commit file the log no longer retains ends the walk.
    """
    version = table.version()
    oldest = max(0, version - WALK_BACK_COMMITS + 1)
    reader = _CommitReader(table)
    size = FIRST_SLICE
    newest = version
    while newest >= oldest:
        versions = list(range(newest, max(oldest, newest - size + 1) - 1, -1))
        for info in reader.commit_infos(versions):
            if info is _MISSING:
                return None
            mark = decode(info.get("userMetadata")) if isinstance(info, dict) else None
            if mark is not None:
                return mark
        newest = versions[-1] - 1
        size *= SLICE_GROWTH
    return None


_MISSING: Any = object()


class _CommitReader:
    """Reads ``commitInfo`` actions straight from a table's ``_delta_log``."""

    def __init__(self, table: DeltaTable) -> None:
        from deltalake.fs import DeltaStorageHandler

        # The table's own object store and options, as delta-rs opens its data files.
        self._store = DeltaStorageHandler.from_table(table._table, table._storage_options)

    def commit_infos(self, versions: list[int]) -> list[dict[str, Any] | Any]:
        """Each version's ``commitInfo`` (``{}`` if it has none), in order; ``_MISSING``
        for a commit file that is gone. A slice of more than one is read in parallel."""
        if len(versions) == 1:
            return [self._commit_info(versions[0])]
        with ThreadPoolExecutor(max_workers=min(8, len(versions))) as pool:
            return list(pool.map(self._commit_info, versions))

    def _commit_info(self, version: int) -> dict[str, Any] | Any:
        path = f"_delta_log/{version:020d}.json"
        try:
            stream = self._store.open_input_stream(path)
        except FileNotFoundError:
            return _MISSING
        with stream:
            # Writers put commitInfo first (the protocol requires it with in-commit
            # timestamps); the rest of a large commit is read only when it is not.
            for line in _lines(stream):
                if '"commitInfo"' not in line:
                    continue
                action = json.loads(line)
                if "commitInfo" in action:
                    info = action["commitInfo"]
                    return info if isinstance(info, dict) else {}
        return {}


def _lines(stream: Any, chunk: int = 64 * 1024) -> Any:
    """The text lines of a binary stream, read ``chunk`` bytes at a time."""
    rest = b""
    while True:
        data = stream.read(chunk)
        if not data:
            break
        rest += data
        *whole, rest = rest.split(b"\n")
        for line in whole:
            yield line.decode()
    if rest.strip():
        yield rest.decode()
