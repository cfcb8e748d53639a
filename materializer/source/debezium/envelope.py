"""What a Debezium change event means to the fold.

- ``op`` ``c``, ``r`` (a snapshot's read) and ``u``: the entity is ``after``;
- ``op`` ``d``: the key is deleted, through the fold's delete path (``latest`` and
  ``merge``; the changelog, the table and the change stream record it); the record's
  fields are ``before``'s, so a ``key:`` naming a primary-key column finds the key there;
- ``op`` ``t`` (a truncate): every entity the map holds is deleted (``redis.truncate``);
- the tombstone Debezium sends after a delete (the key, no value) is neither a second
  delete nor a dead letter: it is left out;
- a column Debezium could not send (a TOASTed value the change left alone) is null and
  listed in ``record_columns.UNAVAILABLE``: a ``merge`` fold keeps the value the entity
  has, a ``latest`` one has no value to keep (its entity is the row as sent).

Besides the row, each record carries ``op``, ``before``, ``ts_ms`` and ``source.ts_ms``
(``record_columns``) for transforms, ``fold.event_time`` (``ts_ms`` or ``source.ts_ms``)
and the key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from materializer import record_columns as c
from materializer.config import KAFKA_KEY, MapConfig
from materializer.source.debezium.keys import with_json_key
from materializer.source.debezium.ops import DELETE, TRUNCATE
from materializer.source.debezium.values_json import decode_debezium_json
from materializer.source.formats.json import json_schema

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def decode_debezium(raw: DataFrame, map_config: MapConfig) -> DataFrame:
    """Raw records as the rows their change events carry, keyed and marked deleted as the
    event says; tombstones left out."""
    from pyspark.sql import functions as F

    src = map_config.source
    if src.format == "avro":
        from materializer.source.debezium.values_avro import decode_debezium_avro

        decoded = decode_debezium_avro(raw, map_config)
    else:
        decoded = decode_debezium_json(
            raw, json_schema(map_config), wire_format=src.format == "json_schema"
        )
        if map_config.key == KAFKA_KEY:
            decoded = with_json_key(decoded)
    decoded = decoded.where(F.col(c.VALUE).isNotNull())
    return decoded.withColumn(c.DELETED, F.col(c.OP).isin(DELETE, TRUNCATE))
