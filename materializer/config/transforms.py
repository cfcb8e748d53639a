"""Kafka Connect's single-message transforms as config models, one per ``type``."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    ConfigDict,
    Field,
    model_validator,
)

from materializer.config.base import _Model


class FilterTransform(_Model):
    """Keep records for which a Spark SQL condition holds."""

    type: Literal["filter"]
    condition: Annotated[str, Field(min_length=1)]


class RenameTransform(_Model):
    """Rename fields: ``{old: new}``."""

    type: Literal["rename"]
    fields: Annotated[dict[str, str], Field(min_length=1)]


class DropTransform(_Model):
    """Remove the listed fields."""

    type: Literal["drop"]
    fields: Annotated[list[str], Field(min_length=1)]


class KeepTransform(_Model):
    """Keep only the listed fields."""

    type: Literal["keep"]
    fields: Annotated[list[str], Field(min_length=1)]


class MaskTransform(_Model):
    """Replace values with the empty value of their type ("" , 0, false, empty array)."""

    type: Literal["mask"]
    fields: Annotated[list[str], Field(min_length=1)]


class CastTransform(_Model):
    """Cast fields to Spark SQL types: ``{field: type}``; a failed cast is a transform error."""

    type: Literal["cast"]
    fields: Annotated[dict[str, str], Field(min_length=1)]


class FlattenTransform(_Model):
    """Nested structs become top-level fields joined by ``delimiter``."""

    type: Literal["flatten"]
    delimiter: str = "."


class TimestampConvertTransform(_Model):
    """Convert a field between epoch milliseconds, formatted strings and timestamps."""

    type: Literal["timestamp_convert"]
    field: str
    target: Literal["timestamp", "string", "unix_millis", "date"] = "timestamp"
    format: str | None = None
    """A datetime pattern, used to parse strings and to format ``string`` targets."""


class ValueToKeyTransform(_Model):
    """The record key becomes the listed value field (or a JSON object of several)."""

    type: Literal["value_to_key"]
    fields: Annotated[list[str], Field(min_length=1)]


class ExtractFieldTransform(_Model):
    """The value becomes the fields of one struct field."""

    type: Literal["extract_field"]
    field: str


class InsertFieldTransform(_Model):
    """Add a field with a static value or the record's topic/partition/offset/timestamp."""

    type: Literal["insert_field"]
    field: str
    value: str | int | float | bool | None = None
    from_: Annotated[
        Literal["topic", "partition", "offset", "timestamp"] | None, Field(alias="from")
    ] = None

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @model_validator(mode="after")
    def _one_source(self) -> InsertFieldTransform:
        if (self.value is None) == (self.from_ is None):
            raise ValueError("give exactly one of value, from")
        return self


class ComputeTransform(_Model):
    """Set fields from Spark SQL expressions: ``{field: expression}``."""

    type: Literal["compute"]
    fields: Annotated[dict[str, str], Field(min_length=1)]


Transform = Annotated[
    FilterTransform
    | RenameTransform
    | DropTransform
    | KeepTransform
    | MaskTransform
    | CastTransform
    | FlattenTransform
    | TimestampConvertTransform
    | ValueToKeyTransform
    | ExtractFieldTransform
    | InsertFieldTransform
    | ComputeTransform,
    Field(discriminator="type"),
]


TRANSFORM_TYPES = frozenset(
    t.model_fields["type"].annotation.__args__[0]  # type: ignore[union-attr]
    for t in (
        FilterTransform,
        RenameTransform,
        DropTransform,
        KeepTransform,
        MaskTransform,
        CastTransform,
        FlattenTransform,
        TimestampConvertTransform,
        ValueToKeyTransform,
        ExtractFieldTransform,
        InsertFieldTransform,
        ComputeTransform,
    )
)
