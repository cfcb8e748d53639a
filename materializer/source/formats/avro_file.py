"""Avro values (plain binary, no header) of one schema file, decoded in the JVM by ``from_avro``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from materializer import record_columns as c
from materializer.config import MapConfig
from materializer.errors import ConfigError
from materializer.source.formats.parsed import PARSED, spread_parsed
from materializer.source.record_errors import without_errors

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def avro_schema(map_config: MapConfig) -> str:
    """The Avro schema file's JSON text; a top-level record is required."""
    import orjson

    path = map_config.source.schema_file or ""
    try:
        text = Path(path).read_text()
        doc = orjson.loads(text)
    except OSError as exc:
        raise ConfigError("", [f"source.schema_file: cannot read {path}: {exc.strerror}"]) from None
    except orjson.JSONDecodeError as exc:
        raise ConfigError("", [f"source.schema_file: {path} is not JSON: {exc}"]) from None
    if not isinstance(doc, dict) or doc.get("type") != "record":
        raise ConfigError("", [f"source.schema_file: {path} must hold an Avro record schema"])
    return text


def decode_avro_file(raw: DataFrame, schema: str) -> DataFrame:
    """``from_avro`` in permissive mode: a value that does not decode is a decode error."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    df = without_errors(raw).withColumn(
        PARSED, from_avro(F.col(c.VALUE), schema, {"mode": "PERMISSIVE"})
    )
    bad = F.col(c.VALUE).isNotNull() & F.col(PARSED).isNull()
    return spread_parsed(df, bad, "value is not Avro of the declared schema")
