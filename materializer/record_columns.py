"""Names of the internal columns that flow between the pipeline's stages and into the sinks.

Records keep the entity's fields as top-level columns, so that transforms and
SQL conditions name fields as users write them; everything the pipeline adds
starts with ``__``. The fold's output (one row per key per batch) carries
``KEY``, ``DELETED`` and ``ENTITY`` (a struct of the entity's fields).
"""

from __future__ import annotations

from materializer.config import INTERNAL_PREFIX

# The table's own columns are part of the contract with the query service.
from materializer.contract.table_layout import TABLE_KEY as TABLE_KEY
from materializer.contract.table_layout import TABLE_UPDATED_AT as TABLE_UPDATED_AT

PREFIX = INTERNAL_PREFIX

# Spark's kafka source columns, renamed on read.
KAFKA_KEY = "__kafka_key"
VALUE = "__value"
HEADERS = "__headers"
TOPIC = "__topic"
PARTITION = "__partition"
OFFSET = "__offset"
TIMESTAMP = "__timestamp"
SOURCE_COLUMNS = {
    "key": KAFKA_KEY,
    "value": VALUE,
    "headers": HEADERS,
    "topic": TOPIC,
    "partition": PARTITION,
    "offset": OFFSET,
    "timestamp": TIMESTAMP,
}

VALUE_KEY = "__value_key"
"""The record key as the map reads it where it is not the raw Kafka key: set by a
``value_to_key`` transform, or Debezium's key struct as text; ``__kafka_key`` keeps the
original."""

# Debezium's change events (``source.envelope: debezium``): what the envelope says beside
# the row, for the fold, the transforms and the change stream.
OP = "__op"
"""The event's ``op``: ``c`` create, ``r`` snapshot read, ``u`` update, ``d`` delete,
``t`` truncate."""
BEFORE = "__before"
"""The row before the change (a struct of the row's fields), as Debezium sends it."""
TS_MS = "__ts_ms"
"""When Debezium processed the event (its ``ts_ms``), epoch milliseconds."""
SOURCE_TS_MS = "__source_ts_ms"
"""When the database made the change (``source.ts_ms``), epoch milliseconds."""
ENVELOPE_TIMES = {"ts_ms": TS_MS, "source.ts_ms": SOURCE_TS_MS}
"""The envelope's times ``fold.event_time`` may name, and the columns that hold them."""
TRUNCATE_KEY = "__truncate__"
"""The key of a truncate (Debezium's ``op: t``): not an entity's, the mark that every entity
of the map is deleted at the record's order (``redis.truncate``); no record may have it."""
UNAVAILABLE = "__unavailable"
"""The fields Debezium could not send (a TOASTed value the change left alone): they keep
the value the entity has; with this column, every other field of the record is set, null
included."""

KEY = "__key"
"""The entity key as a string: the Redis key suffix and the Delta merge key."""
DELETED = "__deleted"
ENTITY = "__entity"
ERROR_STAGE = "__error_stage"
ERROR_MESSAGE = "__error_message"


def is_internal(name: str) -> bool:
    """Whether a column is the pipeline's own rather than an entity field."""
    return name.startswith(PREFIX)


def quote(name: str) -> str:
    """A column name as a backquoted SQL identifier, so dots and spaces stay part of it."""
    return "`" + name.replace("`", "``") + "`"


def entity_fields(columns: list[str]) -> list[str]:
    """The entity's fields among a frame's columns: every column that is not the pipeline's own."""
    return [n for n in columns if not is_internal(n)]
