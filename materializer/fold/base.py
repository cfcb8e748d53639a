"""A map's fold in two halves: what Spark computes per record, what is applied per key.

Spark decodes, transforms and keys each micro-batch without any state of its
own. Each record leaves it as an *event*: its key, its *order* (text whose
byte order is the order the fold applies events in) and its *payload* (text;
null for a delete), with an optional mode-specific ``aux`` text. The fold's
state lives in Redis beside each entity (``materializer.redis.sink``):

- ``latest`` keeps the winning order only. A record applies when its order is
  greater than the stored one, which Redis compares itself, so each key sends
  one record per batch (its greatest) and no state crosses back.
- ``merge`` and ``aggregate`` keep a state per key (JSON). A ``KeyFolder``
  folds a key's events of the batch into the state read from Redis, and
  Redis stores the new state and entity together if the state is still the
  one read.

The modes' semantics are in their own modules (``latest``, ``merge``, ``aggregate``);
``modes`` picks a map's.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Protocol

from materializer import record_columns as c
from materializer.config import FoldConfig
from materializer.encoding import entity_json
from materializer.errors import ConfigError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType, StructType

Event = tuple[str, bytes | None, str | None]
"""One record of a key as the fold applies it: order, payload (None: a delete), aux."""


class KeyFolder(Protocol):
    """Folds one key's events of a batch into its state; runs on the driver or an executor.

    Must pickle (it travels to the executors) and be deterministic: the same
    state and events give the same bytes, so a replayed batch is recognised.
    """

    def __call__(self, state: bytes | None, events: list[Event]) -> tuple[bytes, bytes | None]:
        """The key's state after ``events`` (in order) and its entity JSON (None: deleted).

        A state equal to the one given means the events change nothing (they
        were applied before): the caller then writes nothing.
        """
        ...

    def seed(self, entity: bytes) -> bytes:
        """A state for an entity Redis holds without one: restored by ``rehydrate`` after
        Redis lost its data, or written by an earlier version. The entity's values count
        as folded before any event to come, so the next event builds on them."""
        ...


class FoldMode(ABC):
    """One fold mode's halves. What the modes share is here: the entity is the record's
    fields, ordered by event time or position, sent as its JSON; each mode says what it
    folds in Python (``folder``) and overrides what it computes differently."""

    batch_in_order = False
    """Whether the order has the micro-batch's timestamp in it (``with_batch_time``)."""

    def __init__(self, fold: FoldConfig) -> None:
        self.fold = fold

    def entity(self, records: DataFrame) -> Column:
        """The record's entity fields as a struct (the payload before it becomes text)."""
        from pyspark.sql import functions as F

        return F.struct(*[F.col(c.quote(f)) for f in c.entity_fields(records.columns)])

    def entity_type(self, records: DataFrame) -> StructType:
        """The entity's struct type: the Delta table's columns and the changelog's schema."""
        from pyspark.sql.types import StructType

        entity = records.select(self.entity(records)).schema[0].dataType
        if not isinstance(entity, StructType):
            raise TypeError(f"the fold's entity must be a struct, got {entity.simpleString()}")
        return entity

    def order(self, records: DataFrame) -> Column:
        """The event-time field if declared, then partition and offset (``order_column``)."""
        return order_column(records, self.fold.event_time)

    def payload(self, entity: Column) -> Column:
        """The record as text, from ``entity`` (null for a delete): the entity's JSON."""
        return entity_json(entity)

    def shared(self, records: DataFrame) -> tuple[DataFrame, list[str]]:
        """``records`` with the columns this mode's expressions read more than once, and
        their names (dropped once the mode's columns are computed). Spark computes an
        expression once per use within one projection; a column of the projection before
        it is computed once per record."""
        return records, []

    def aux(self, records: DataFrame) -> Column | None:
        """A mode's extra text per record, or None when it needs none."""
        return None

    @abstractmethod
    def folder(self, records: DataFrame) -> KeyFolder | None:
        """How a key's events fold into its state in Python; None: Redis orders them."""


POSITION_WIDTH = 29
"""The characters of a record's position at the end of its order: ``position``."""


def position() -> Column:
    """Partition and offset as fixed-width digits: their text order is Kafka's order."""
    from pyspark.sql import functions as F

    return F.format_string("%010d%019d", F.col(c.PARTITION), F.col(c.OFFSET))


def with_batch_time(orders: pa.ChunkedArray, timestamp_ms: int) -> pa.ChunkedArray:
    """``orders`` with the micro-batch's timestamp (20 digits) put between the event time
    and the position, for a mode whose order has the batch in it (``batch_in_order``).

    Put in here, on the batch's rows as Arrow, not by Spark: Spark puts a streaming
    batch's ``current_timestamp()`` into the plan as a literal after optimising it, and
    the query's generated code, which inlines the literal, changes with every batch;
    compiling it again each batch kept the JVM's compilers busy on the fold's cores
    (docs/decisions/0016-merge-batch-time-from-the-offsets-log.md). The timestamp is
    the one Spark keeps in the batch's offsets log, so a replay of the batch puts in the
    same one.
    """
    import pyarrow.compute as pc

    event_time = pc.utf8_slice_codeunits(orders, 0, -POSITION_WIDTH)
    place = pc.utf8_slice_codeunits(orders, -POSITION_WIDTH)
    return pc.binary_join_element_wise(event_time, f"{timestamp_ms:020d}", place, "")


def order_column(records: DataFrame, event_time: str | None = None) -> Column:
    """The record's order as text whose byte order is the fold's order.

    Partition and offset as fixed-width digits; an event time before them,
    null lowest, then integers, dates and timestamps as 20 digits of their
    value shifted to be positive, or a string as it is, ended by a zero byte
    so that a string sorts before its extensions. A mode whose order has the
    batch in it gets the batch's timestamp put in later (``with_batch_time``).
    """
    from pyspark.sql import functions as F

    parts = [position()]
    if event_time is not None:
        column = event_time_column(records, event_time)
        value = F.col(c.quote(column))
        sortable = F.concat(F.lit("1"), _sortable(value, records.schema[column].dataType))
        parts[:0] = [F.when(value.isNull(), F.lit("0")).otherwise(sortable), F.lit("\x00")]
    return parts[0] if len(parts) == 1 else F.concat(*parts)


def event_time_column(records: DataFrame, event_time: str) -> str:
    """The column ``fold.event_time`` names: a field, or a time of Debezium's envelope
    (``ts_ms``, ``source.ts_ms``: ``record_columns.ENVELOPE_TIMES``)."""
    envelope = c.ENVELOPE_TIMES.get(event_time)
    if envelope is not None and envelope in records.columns:
        if event_time in records.columns:
            raise ConfigError(
                "",
                [
                    f"fold.event_time: {event_time} is both a column of the row and the "
                    "change event's time: rename the column with a transform"
                ],
            )
        return envelope
    if event_time not in records.columns or c.is_internal(event_time):
        known = ", ".join(c.entity_fields(records.columns))
        raise ConfigError("", [f"fold.event_time: no field {event_time!r} ({known})"])
    return event_time


def orders_are_digits(records: DataFrame, event_time: str | None = None) -> bool:
    """Whether ``order_column``'s orders are digits and zero bytes only: without an event
    time, or with one that is not a string. The Redis Functions compare such orders as they
    are (``digits_after``), without the byte-by-byte search a string needs."""
    from pyspark.sql import types as T

    if event_time is None:
        return True
    column = event_time_column(records, event_time)
    return not isinstance(records.schema[column].dataType, T.StringType)


def _sortable(value: Column, dtype: DataType) -> Column:
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if isinstance(dtype, T.StringType):
        return value
    if isinstance(dtype, T.IntegralType):
        number = value.cast("long")
    elif isinstance(dtype, T.DateType):
        number = F.unix_date(value).cast("long")
    elif isinstance(dtype, T.TimestampType | T.TimestampNTZType):
        number = F.unix_micros(value.cast("timestamp"))
    else:
        raise ConfigError(
            "",
            [
                "fold.event_time: events are ordered by integers, dates, timestamps or "
                f"strings; this field is {dtype.simpleString()}"
            ],
        )
    shift = F.lit("9223372036854775808").cast("decimal(20,0)")
    return F.lpad((number.cast("decimal(20,0)") + shift).cast("string"), 20, "0")
