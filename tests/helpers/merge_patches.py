"""Merge patches as Spark hands them to the ``merge`` fold, for tests of the Python fold and
of the Redis Functions' one."""

from __future__ import annotations

from typing import Any

import orjson
from pyspark.sql.types import StringType, StructField, StructType

ADDRESS = StructField(
    "address",
    StructType(
        [
            StructField("city", StringType()),
            StructField("geo", StructType([StructField("lat", StringType())])),
        ]
    ),
)
"""A nested object of the tests' entities, with an object inside it."""


def dumps(value: Any) -> bytes:
    """JSON as Spark writes it, a ``Decimal`` with every digit."""
    return orjson.dumps(value, default=lambda d: orjson.Fragment(str(d)))


def as_spark_hands_it(
    patch: dict[str, Any] | None, numbers: dict[tuple[str, ...], int]
) -> tuple[bytes | None, str]:
    """The patch's payload (its JSON without nulls; None: a delete) and the depth-first
    ``numbers`` of the fields it sets to null, comma-separated (``MergeMode.aux``)."""
    if patch is None:
        return None, ""
    nulls: list[str] = []

    def strip(doc: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
        out = {}
        for k, v in doc.items():
            if v is None:
                nulls.append(str(numbers[(*path, k)]))
            elif isinstance(v, dict):
                out[k] = strip(v, (*path, k))
            else:
                out[k] = v
        return out

    return dumps(strip(patch, ())), ",".join(nulls)
