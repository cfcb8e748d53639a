"""Debezium's encodings of a row's values, read back into the map's declared types in the JVM.

Kafka Connect's JSON converter writes what JSON has no type for in a form of its own, and
the form depends on the connector's settings:

================================  =====================================================
declared type                     what Debezium writes
================================  =====================================================
``DECIMAL(p, s)``                 ``Decimal``: the unscaled value's two's-complement
                                  bytes, base64 (``decimal.handling.mode`` ``precise``,
                                  its default); ``VariableScaleDecimal`` (numeric without
                                  a precision): ``{"scale": n, "value": base64}``; a
                                  number (``double``) or its text (``string``)
``DATE``                          days since 1970-01-01 (``Date``)
``TIMESTAMP``, ``TIMESTAMP_NTZ``  milliseconds (``Timestamp``), microseconds
                                  (``MicroTimestamp``) or nanoseconds (``NanoTimestamp``)
                                  since 1970; ISO-8601 text with its offset
                                  (``ZonedTimestamp``, PostgreSQL's ``timestamptz``)
================================  =====================================================

With Connect's ``schema``/``payload`` wrapper each field's schema names its encoding
(``io.debezium.time.MicroTimestamp``) and a decimal's scale, and that is what is read.
Without it, the declared type and Debezium's defaults for PostgreSQL decide: an integer
timestamp is microseconds (``timestamp`` has six digits of seconds' fraction unless
declared with fewer), a decimal without a point is base64 bytes with the
declared scale. Every other type (text, JSON and UUID as text, integers, booleans,
binary as base64) is what Spark's JSON reader makes of it.

Everything here is Spark SQL, so a Debezium map folds on the real-time path too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import Column
    from pyspark.sql.types import DataType

MILLIS = ("io.debezium.time.Timestamp", "org.apache.kafka.connect.data.Timestamp")
MICROS = "io.debezium.time.MicroTimestamp"
NANOS = "io.debezium.time.NanoTimestamp"

UNAVAILABLE_VALUE = "__debezium_unavailable_value"
"""What Debezium sends for a TOASTed column a change did not touch (its
``unavailable.value.placeholder`` default): text as it is, binary as its bytes."""

MAX_DECIMAL_BYTES = 16
"""The longest unscaled value read: 16 bytes hold every DECIMAL(38, s) Spark can keep."""


@dataclass(frozen=True)
class WireField:
    """How one field of the row is read: ``wire`` the type Spark's JSON reader parses it as
    (text where Debezium's encoding needs reading), ``declared`` the map's."""

    name: str
    declared: DataType

    @property
    def converted(self) -> bool:
        """Whether the JSON holds it in an encoding of Debezium's (read as text first)."""
        from pyspark.sql import types as T

        return isinstance(
            self.declared, T.DecimalType | T.DateType | T.TimestampType | T.TimestampNTZType
        )

    @property
    def wire(self) -> DataType:
        """The type the JSON reader parses the field as."""
        from pyspark.sql import types as T

        return T.StringType() if self.converted else self.declared


ENCODING = "struct<field: string, type: string, name: string, parameters: map<string, string>>"
"""A field's schema in Connect's JSON wrapper, as much of it as ``read`` needs."""


def read(text: Column, field: WireField, encoding: Column) -> Column:
    """The declared value of ``field`` from its JSON ``text``; ``encoding`` is its schema in
    the wrapper (``ENCODING``), null without one. Null when the text does not read as the
    type (the decoder makes that a decode error)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    dtype = field.declared
    name = encoding.getField("name")
    if isinstance(dtype, T.DecimalType):
        return _decimal(text, dtype, encoding)
    if isinstance(dtype, T.DateType):
        days = F.date_from_unix_date(text.try_cast("int"))
        return F.when(_iso(text), text.try_cast("date")).otherwise(days)
    return _timestamp(text, name).try_cast(dtype)


def _iso(text: Column) -> Column:
    """Whether a date or time is ISO-8601 text rather than a number: it has a ``:`` or a
    ``-`` after its first character. Told apart before any cast: a cast that fails costs
    ten times one that does not, and an ISO timestamp tried as a number first was most of
    the decode's time."""
    from pyspark.sql import functions as F

    return text.contains(":") | (F.instr(F.substring(text, 2, 64), "-") > 0)


def _timestamp(text: Column, name: Column) -> Column:
    """An instant from epoch milliseconds, microseconds or nanoseconds (by ``name``; without
    one, microseconds), or from ISO-8601 text."""
    from pyspark.sql import functions as F

    number = text.try_cast("long")
    micros = (
        F.when(name.isin(*MILLIS), F.try_multiply(number, F.lit(1000)))
        .when(name == NANOS, F.floor(number.cast("decimal(20,0)") / 1000).cast("long"))
        .otherwise(number)
    )
    return F.when(_iso(text), text.try_cast("timestamp")).otherwise(F.timestamp_micros(micros))


def _decimal(text: Column, dtype: DataType, encoding: Column) -> Column:
    """A decimal from any of Debezium's encodings (the table in the module's text)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    assert isinstance(dtype, T.DecimalType)
    kind = encoding.getField("type")
    scale = encoding.getField("parameters").getItem("scale").try_cast("int")
    pointed = text.contains(".")
    variable = F.substring(F.ltrim(text), 1, 1) == "{"
    base64 = F.when(variable, F.get_json_object(text, "$.value")).otherwise(text)
    places = F.when(variable, F.get_json_object(text, "$.scale").try_cast("int")).otherwise(
        F.coalesce(scale, F.lit(dtype.scale))
    )
    from_bytes = _from_bytes(F.try_to_binary(base64, F.lit("base64")), places)
    # The wrapper says bytes or a number (``double``, ``string`` modes); without it, a
    # number has a point (a double's text always has one; base64 never does; text that is
    # no number does not cast, a decode error).
    as_number = ~variable & F.coalesce(kind != "bytes", pointed)
    return F.when(as_number, text).otherwise(from_bytes).try_cast(dtype)


UNSCALED = '{"type": "bytes", "logicalType": "decimal", "precision": 38, "scale": 0}'
"""An unscaled value as Avro's decimal holds it: the same two's-complement bytes."""


def _from_bytes(unscaled: Column, scale: Column) -> Column:
    """The decimal's text from its unscaled value's big-endian two's-complement bytes and
    its ``scale``: ``<unscaled>E-<scale>``, which a cast reads exactly.

    The bytes are what Avro's decimal logical type holds, so ``from_avro`` reads them
    (framed as Avro ``bytes``: their length, zigzag-encoded, in one byte up to
    ``MAX_DECIMAL_BYTES``): one expression, where arithmetic on their pieces made a plan
    too large to compile."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    framed = F.concat(F.unhex(F.lpad(F.hex(F.length(unscaled) * 2), 2, "0")), unscaled)
    value = from_avro(framed, UNSCALED, {"mode": "PERMISSIVE"})
    text = F.concat(value.cast("string"), F.lit("E-"), scale.cast("string"))
    # Past MAX_DECIMAL_BYTES a value has more than 38 digits, and its length more than the
    # one byte of Avro's framed here: null, a decode error.
    return F.when((F.length(unscaled) <= MAX_DECIMAL_BYTES) & (scale >= 0), text)
