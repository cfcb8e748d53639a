"""The columns a batch hands to the fold in Redis, as Arrow: the record's key, order,
payload and auxiliary value, its Kafka timestamp, and a failed record's dead letter.

Spark computes them in the JVM (``RedisFold.arrow_columns``); ``apply`` reads them on the
driver or an executor. Their names are the agreement between the two.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from materializer import record_columns as c

if TYPE_CHECKING:
    import pyarrow as pa


ORDER = "__order"
VALUE = "__value"
AUX = "__aux"
TIMESTAMP_US = "__timestamp_us"
"""The record's Kafka timestamp in microseconds: the batch's newest folded one is its age."""
LETTER_KEY, LETTER_VALUE, LETTER_HEADERS = "__dl_key", "__dl_value", "__dl_headers"
"""A failed record's key, value and headers (its own, then the error's, as a JSON array of
``{"key": ..., "value": <base64>}``); null for the others."""


def arrow_schema() -> pa.Schema:
    """The columns ``RedisFold.arrow_columns`` hands over (a batch with none has no schema)."""
    import pyarrow as pa

    return pa.schema(
        [
            (c.KEY, pa.string()),
            (ORDER, pa.string()),
            (VALUE, pa.binary()),
            (AUX, pa.string()),
            (TIMESTAMP_US, pa.int64()),
            (LETTER_KEY, pa.binary()),
            (LETTER_VALUE, pa.binary()),
            (LETTER_HEADERS, pa.string()),
        ]
    )
