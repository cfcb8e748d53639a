"""GetAsOf: which table version a request means, and the entity it held.

A version is taken as asked if the table has it. A point in time means the
newest version committed at or before it, found in the table's commit
history (newest first, read in growing slices so a recent time costs a few
commits, not the whole log). Both are ``OutOfRange`` when the table cannot
answer: a version not written yet or no longer retained, a time before the
oldest retained commit. Blocking: runs on a worker thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from deltalake import DeltaTable

from materializer.contract.entity_json import encode_rows
from materializer.contract.table_layout import TABLE_KEY
from query_service.errors import OutOfRange
from query_service.filters import sql
from query_service.stores.delta import (
    TABLE,
    Commit,
    DeltaTables,
    version_not_retained,
    version_not_yet,
)

FIRST_HISTORY_SLICE = 64
"""Commits read first when looking for a time; each further slice is 8 times larger."""


@dataclass(frozen=True)
class AsOf:
    """One key's entity at one commit; ``entity`` is ``None`` where the key had none."""

    commit: Commit
    entity: bytes | None
    snapshot: DeltaTable
    """The table at ``commit``'s version."""


def entity_as_of(
    tables: DeltaTables,
    map_name: str,
    key: str,
    *,
    version: int | None,
    at_ns: int | None,
    generation: int = 0,
) -> AsOf:
    """The entity under ``key`` at ``version``, or at the newest commit at or before ``at_ns``,
    in the table of the map's ``generation``."""
    latest = tables.open(map_name, generation=generation)
    if version is not None:
        commit = _commit_of(tables, map_name, latest, version)
    elif at_ns is not None:
        commit = _commit_at(tables, map_name, latest, at_ns)
    else:
        raise ValueError("entity_as_of needs a version or a time")
    snapshot = (
        latest
        if commit.version == latest.version()
        else tables.open(map_name, commit.version, generation)
    )
    key_is = f"{sql.identifier(TABLE_KEY)} = {sql.string(key)}"
    query = sql.select(None, TABLE, [key_is], limit=1)
    rows = encode_rows(
        tables.select(map_name, snapshot, query), TABLE_KEY, tables.meta_columns(map_name)
    )
    return AsOf(commit, rows[0][1] if rows else None, snapshot)


def _commit_of(tables: DeltaTables, map_name: str, latest: DeltaTable, version: int) -> Commit:
    newest = latest.version()
    if version > newest:
        raise version_not_yet(map_name, version, newest)
    for commit in tables.commits(latest, newest - version + 1):
        if commit.version == version:
            return commit
    raise version_not_retained(map_name, version)


def _commit_at(tables: DeltaTables, map_name: str, latest: DeltaTable, at_ns: int) -> Commit:
    limit = FIRST_HISTORY_SLICE
    while True:
        commits = tables.commits(latest, limit)
        for commit in commits:  # newest first
            if commit.timestamp_ms * 1_000_000 <= at_ns:
                return commit
        if len(commits) < limit:
            break
        limit *= 8
    oldest = f" ({_iso(commits[-1].timestamp_ms)})" if commits else ""
    raise OutOfRange(
        f"timestamp {_iso(at_ns // 1_000_000)}: before the oldest version the table of map "
        f"{map_name!r} retains{oldest}"
    )


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
