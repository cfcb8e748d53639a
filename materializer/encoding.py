"""The entity's wire form: compact JSON, the same in Redis and in the changelog topic.

One encoding everywhere means a lookup, a change-stream consumer and the Delta
table (which reads the changelog back with the entity's schema) agree to the
microsecond: the options below round-trip every Spark value through JSON
(``to_json`` alone would cut timestamps to milliseconds).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import Column
    from pyspark.sql.types import StructType

JSON_OPTIONS = {
    "timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX",
    "timestampNTZFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSS",
    "ignoreNullFields": "true",
}
"""``to_json`` / ``from_json`` options that round-trip every value (microseconds included)."""


def entity_json(entity: Column) -> Column:
    """The entity struct as compact JSON (null fields left out)."""
    from pyspark.sql import functions as F

    return F.to_json(entity, JSON_OPTIONS)


def entity_from_json(text: Column, schema: StructType) -> Column:
    """JSON written by ``entity_json`` back into the entity struct."""
    from pyspark.sql import functions as F

    return F.from_json(text, schema, JSON_OPTIONS)
