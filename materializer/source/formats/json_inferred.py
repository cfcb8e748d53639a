"""JSON values without a declared schema: each value kept whole as a VARIANT document.

A streaming query's columns are fixed when it starts, yet the fields of
schemaless JSON are only known as events arrive. So decoding keeps each value
as one ``VARIANT`` column, ``_document`` (a JSON object, else a decode error),
and the key field beside it as a string; the fold carries the document
unchanged, and ``materializer.fold.entity_types`` turns the documents into typed
fields once per micro-batch, where a new field can become a new column.

The ``latest`` fold works on the document as a whole. What needs fields
known before the fold cannot work and is refused when the map starts, each
problem naming its key: ``transforms``, ``fold.event_time``,
``fold.delete_when``, ``fold.mode: aggregate`` and ``fold.mode: merge`` (the
merge fold tracks each declared leaf in its state, and a document's leaves
are unknown when the query starts) all need ``source.schema``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from materializer import record_columns as c
from materializer.config import DOCUMENT, KAFKA_KEY, MapConfig, inferred_problems
from materializer.errors import ConfigError
from materializer.source.record_errors import with_error, without_errors

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


_PLAIN_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def field_path(name: str) -> str:
    """The variant path of a top-level member: ``$.id``, ``$['a b']`` or ``$["it's"]``."""
    if _PLAIN_NAME.match(name):
        return f"$.{name}"
    if "'" in name:
        return f'$["{name}"]'
    return f"$['{name}']"


def decode_inferred_json(raw: DataFrame, map_config: MapConfig) -> DataFrame:
    """``_document`` (VARIANT) and the key field (a string) per record; non-objects are errors."""
    from pyspark.sql import functions as F

    problems = inferred_problems(map_config)
    if problems:
        raise ConfigError("", problems)
    text = F.col(c.VALUE).cast("string")
    document = F.try_parse_json(text)
    is_object = F.startswith(F.ltrim(text, F.lit(" \t\r\n")), F.lit("{"))
    present = F.col(c.VALUE).isNotNull()
    df = without_errors(raw).withColumn(DOCUMENT, document)
    df = with_error(df, "decode", present & F.col(DOCUMENT).isNull(), F.lit("value is not JSON"))
    df = with_error(
        df, "decode", present & ~is_object, F.lit("value is JSON but not a JSON object")
    )
    df = df.withColumn(DOCUMENT, F.when(F.col(c.ERROR_STAGE).isNull(), F.col(DOCUMENT)))
    if map_config.key != KAFKA_KEY:
        key = F.try_variant_get(F.col(DOCUMENT), field_path(map_config.key), "string")
        df = df.withColumn(map_config.key, key)
    return df
