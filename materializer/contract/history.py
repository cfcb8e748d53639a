"""A map's figures over time: the samples of ``<map>:__history__``, and how to read them.

``materializer run`` appends one sample per map it runs every
``metrics.history.interval`` (5 s by default) to the capped stream
``<map>:__history__`` (``redis_layout.history_key``), keeping about
``metrics.history.retention`` of them (24 h); docs/redis-layout.md lists the
fields and docs/operations.md what one costs. The console draws its charts from
them.

A sample's time is its entry id's milliseconds (Redis's clock when it was
appended), so ``since_ms`` is an id to start from. Every entry has every field,
in one order: Redis then stores the field names once per node of the stream,
and each entry costs its values only. A field this version does not know is
ignored, and one it knows that an entry lacks (a writer of another version)
takes its "unknown" default, so readers and writers of neighbouring versions
read each other's samples.

Unknown figures are ``-1`` in a sample (the rates too, where the run has not
measured them; a map that folded nothing in an interval has ``-1`` freshness),
written as an empty value, which Redis stores in fewer bytes than ``-1``.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from materializer.contract.redis_layout import history_key, text_fields

if TYPE_CHECKING:
    from materializer.clients.redis import AsyncClient, Client


PHASES = (
    ("add_batch_ms", "addBatch"),
    ("get_batch_ms", "getBatch"),
    ("latest_offset_ms", "latestOffset"),
    ("query_planning_ms", "queryPlanning"),
    ("wal_commit_ms", "walCommit"),
    ("commit_offsets_ms", "commitOffsets"),
)
"""A sample's batch phases and the ``durationMs`` entries of Spark's progress they come
from; the whole batch (``triggerExecution``) is ``batch_ms``."""


@dataclass(frozen=True)
class HistorySample:
    """One map's figures at one moment: rates, batches and freshness over the interval
    that ended then, and levels (lag, state size, catch-up) as last measured."""

    at_ms: int
    """When the sample was taken: UTC epoch milliseconds (the entry id's)."""
    state: str
    """The map's reported state (``running``, ``catching_up``, ``paused``, ...)."""
    input_rate: float = -1.0
    """Records per second the map's source partitions grew, over about 30 s."""
    fold_rate: float = -1.0
    """Records per second folded over the interval (dead letters not counted)."""
    batches: int = 0
    """Fold batches that committed in the interval."""
    batch_ms: int = -1
    """The longest of them, trigger to commit (Spark's ``triggerExecution``); -1: none."""
    add_batch_ms: int = -1
    """That batch's phases, from Spark's progress (``PHASES``): -1 where it gave none."""
    get_batch_ms: int = -1
    latest_offset_ms: int = -1
    query_planning_ms: int = -1
    wal_commit_ms: int = -1
    commit_offsets_ms: int = -1
    freshness_p50_ms: int = -1
    """Median age of the records folded in the interval, from their Kafka timestamps to
    when Redis held them (within 9 %, read off a histogram)."""
    freshness_p99_ms: int = -1
    freshness_max_ms: int = -1
    """The oldest of them, exactly."""
    lag_records: int = -1
    """Records in the source partitions beyond the map's watermark (its records left)."""
    lag_ms: int = -1
    """How far behind its sources the map is in time: 0 with nothing left, else how old
    the newest record it folded is now, which no unfolded record exceeds when producers'
    timestamps grow with the offsets (an estimate from the freshness, not a read of the
    oldest unfolded record)."""
    dead_letters: int = 0
    """Records sent to the dead-letter topic in the interval."""
    state_keys: int = -1
    """The fold's state keys, as last counted (every ``metrics.state_interval``)."""
    state_bytes: int = -1
    """Their Redis memory, estimated from a sample of them."""
    delta_lag_ms: int = -1
    """How much older the Delta table's content is than Redis's: from the start of the
    Delta query's last batch to the last fold batch that sent changes, 0 when that
    batch came after; -1 before the Delta query's first batch."""
    delta_lag_records: int = -1
    """Changelog records the Delta query's last batch left for its next ones
    (``delta.max_changes_per_batch``)."""
    catch_up_rate: float = -1.0
    """Records per second the watermark advanced, over about 30 s."""
    eta_seconds: float = -1.0
    """When the map should have caught up at those rates; 0: nothing left; -1: unknown."""

    def to_fields(self) -> dict[str, str]:
        """The entry's fields (all but ``at_ms``, which is its id), always all, in order."""
        return {name: _text(getattr(self, name)) for name in FIELDS}

    @classmethod
    def from_entry(cls, entry_id: bytes | str, fields: Mapping[Any, Any]) -> HistorySample:
        """Parse one ``XRANGE`` entry, its fields as bytes or text."""
        text = text_fields(fields)
        values: dict[str, Any] = {}
        for name, kind in _KINDS.items():
            raw = text.get(name)
            if raw:
                values[name] = kind(raw) if kind is str else kind(float(raw))
        at = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
        return cls(at_ms=int(at.split("-", 1)[0]), **values)


_KINDS: dict[str, type] = {
    f.name: typing.get_type_hints(HistorySample)[f.name]
    for f in dataclasses.fields(HistorySample)
    if f.name != "at_ms"
}
FIELDS: tuple[str, ...] = tuple(_KINDS)
"""The fields of an entry, in the order written."""


def _text(value: Any) -> str:
    """A value as the entry holds it. Whole numbers are written without a decimal point,
    so Redis stores them as integers (a byte or a few each); other numbers are rounded to
    whole ones from 100 up, to tenths below; an unknown one (-1) is empty."""
    if value == -1 or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    if isinstance(value, float):
        rounded = round(value) if abs(value) >= 100 else round(value, 1)
        return str(int(rounded)) if rounded == int(rounded) else repr(rounded)
    return str(value)


def parse_history(entries: Iterable[Sequence[Any]]) -> list[HistorySample]:
    """Samples from ``XRANGE`` (or reversed ``XREVRANGE``) entries, ``(id, fields)`` each,
    as a blocking or an asyncio client returns them."""
    return [HistorySample.from_entry(entry_id, fields) for entry_id, fields in entries]


def read_history(
    client: Client, map_name: str, since_ms: int = 0, count: int | None = None
) -> list[HistorySample]:
    """The map's samples taken at or after ``since_ms`` (UTC epoch milliseconds), oldest
    first; at most ``count`` of them (the oldest ones), all with None.

    An unknown map, or one whose history is off, has none.
    """
    return parse_history(client.xrange(history_key(map_name), min=since_ms, count=count) or [])


async def read_history_async(
    client: AsyncClient, map_name: str, since_ms: int = 0, count: int | None = None
) -> list[HistorySample]:
    """``read_history`` for an asyncio client (the query service's)."""
    entries = await client.xrange(history_key(map_name), min=since_ms, count=count)
    return parse_history(entries or [])
