"""The maps' Delta tables read with delta-rs and its embedded DataFusion (no JVM).

Not a ``MapStore``: a table is versioned and queried with SQL, which the
key-value lookups of ``stores.base`` do not model. Every method here blocks
(it reads the transaction log and Parquet files): call it from a worker
thread (``asyncio.to_thread``), never on the event loop. A ``DeltaTable`` is
a snapshot of one version and may be used from one thread after another.

Errors: a map without a table is ``TableNotFound`` (NOT_FOUND); a version
that does not exist or is no longer retained is ``OutOfRange``; a SQL filter
the engine refuses or fails on (a type mismatch, a division by zero) is
``InvalidArgument``; storage that cannot be read is ``StoreUnavailable``.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any, NamedTuple

import grpc
import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder
from deltalake.exceptions import DeltaError, TableNotFoundError
from deltalake.schema import PrimitiveType

from materializer.catalog.live import LiveMaps, as_live
from materializer.clients.object_store import delta_rs_location
from materializer.config import AppConfig
from materializer.contract.redis_layout import physical_name
from materializer.contract.table_layout import table_meta, table_path
from query_service.errors import InvalidArgument, OutOfRange, QueryServiceError, StoreUnavailable
from query_service.filters.columns import Columns

TABLE = "map_table"
"""The name a table is registered under for one query; filters cannot name tables at all."""

_BACKTRACE = re.compile(r"\n\s*(?:0: |Stack backtrace:)")
_STORAGE_MARKERS = ("object store", "object at location", "os error", "io error", "failed to fetch")
"""Words of delta-rs / DataFusion messages about storage rather than about the query."""


class TableNotFound(QueryServiceError):
    """A declared map whose Delta table has not been created yet (no batch reached it)."""

    code = grpc.StatusCode.NOT_FOUND


class Commit(NamedTuple):
    """One version of a table and when it was committed (milliseconds since the epoch)."""

    version: int
    timestamp_ms: int


class DeltaTables:
    """Opens the tables under ``delta.root`` and runs SQL over one snapshot at a time."""

    def __init__(self, config: AppConfig | LiveMaps) -> None:
        self._live = as_live(config)

    @property
    def _config(self) -> AppConfig:
        return self._live.config

    def path(self, map_name: str, generation: int = 0) -> str:
        """Where the map's table of that generation lives (the pipeline's ``table_path``)."""
        return table_path(self._config, physical_name(map_name, generation))

    def topics(self, map_name: str) -> Collection[str]:
        """The map's source topics, as its definition in force says now."""
        return self._live.topics()[map_name]

    def meta_columns(self, map_name: str) -> tuple[str, ...]:
        """The map's table columns that are not entity fields (``_key``, ``_updated_at``)."""
        return table_meta(self._config.map(map_name))

    def open(self, map_name: str, version: int | None = None, generation: int = 0) -> DeltaTable:
        """The table of the map's ``generation`` at ``version``, or at its latest version.

        A version beyond the latest, or whose log the table no longer retains,
        is ``OutOfRange``; the latest version is named in the message. Each
        generation (a rebuild makes a new one) is a table of its own, with
        versions of its own.
        """
        path = self.path(map_name, generation)
        try:
            uri, options = delta_rs_location(self._config, path)
            return DeltaTable(uri, version=version, storage_options=options)
        except TableNotFoundError:
            # Also what delta-rs raises for a version whose log was cleaned up.
            if version is None:
                raise TableNotFound(
                    f"map {map_name!r} has no Delta table yet at {path} "
                    "(it is created when the first batch reaches it)"
                ) from None
        except (DeltaError, OSError) as exc:
            if version is None:
                raise unreadable(map_name, exc) from None
        # The log cannot produce that version: the latest tells "not yet" from "no longer".
        latest = self.open(map_name, generation=generation).version()
        if version > latest:
            raise version_not_yet(map_name, version, latest)
        raise version_not_retained(map_name, version)

    def select(self, map_name: str, table: DeltaTable, query: str) -> pa.Table:
        """Run ``query`` (SQL naming the table as ``TABLE``) over the snapshot ``table``.

        The whole result is read into memory: callers bound it with ``LIMIT``.
        """
        try:
            reader = QueryBuilder().register(TABLE, table).execute(query)
        except DeltaError as exc:  # planning: the filter does not fit the table's types
            raise InvalidArgument(
                f"the filter does not apply to the table of map {map_name!r}: {_text(exc)}"
            ) from None
        try:
            return pa.RecordBatchReader.from_stream(reader).read_all()
        except (pa.ArrowException, DeltaError, OSError) as exc:
            text = _text(exc)
            if any(marker in text.lower() for marker in _STORAGE_MARKERS):
                raise unreadable(map_name, exc) from None
            raise InvalidArgument(
                f"the filter failed on the rows of map {map_name!r}: {text}"
            ) from None

    def columns(self, map_name: str, table: DeltaTable) -> Columns:
        """The columns of the snapshot ``table``, for checking a request against them."""
        fields = table.schema().fields
        nested = frozenset(f.name for f in fields if not isinstance(f.type, PrimitiveType))
        return Columns(map_name, tuple(f.name for f in fields), nested)

    def commits(self, table: DeltaTable, limit: int | None) -> list[Commit]:
        """The newest ``limit`` commits (all with ``None``), newest first.

        The time is the commit's in-commit timestamp when the table records
        one, else the writer's commit time.
        """
        return [Commit(c["version"], _commit_ms(c)) for c in table.history(limit)]


def version_not_yet(map_name: str, version: int, latest: int) -> OutOfRange:
    """A version the table has not reached."""
    return OutOfRange(
        f"version {version}: the table of map {map_name!r} has no such version yet "
        f"(latest: {latest})"
    )


def version_not_retained(map_name: str, version: int) -> OutOfRange:
    """A version whose log the table has cleaned up."""
    return OutOfRange(f"version {version}: the table of map {map_name!r} no longer retains it")


def unreadable(map_name: str, exc: BaseException) -> StoreUnavailable:
    """Storage under a table that cannot be read now."""
    return StoreUnavailable(f"cannot read the Delta table of map {map_name!r}: {_text(exc)}")


def _commit_ms(commit: dict[str, Any]) -> int:
    return int(commit.get("inCommitTimestamp") or commit["timestamp"])


def _text(exc: BaseException) -> str:
    """An engine message on one line, without the Rust backtrace ``RUST_BACKTRACE`` appends.

    DataFusion's messages span several lines ("... caused by ..."); the
    backtrace's frames start at a line ``0: ...``.
    """
    message = _BACKTRACE.split(str(exc), maxsplit=1)[0]
    return " ".join(message.split())
