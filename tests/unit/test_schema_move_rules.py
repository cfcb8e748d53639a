"""What counts as a registry subject's version adding fields (``formats.schema_moves``):
paths of the fields added at every depth, and whether a version only adds fields at the
top, every other kept as it was."""

from __future__ import annotations

from pyspark.sql.types import (
    ArrayType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from materializer.source.formats.schema_moves import added_fields, only_adds

TEXT, INT = StringType(), IntegerType()


def struct(*fields: tuple[str, DataType], nullable: bool = True) -> StructType:
    return StructType([StructField(name, kind, nullable) for name, kind in fields])


def user(
    *more: tuple[str, DataType],
    age: DataType = INT,
    address: StructType | None = None,
    sku: tuple[tuple[str, DataType], ...] = (),
    tag: tuple[tuple[str, DataType], ...] = (),
) -> StructType:
    return struct(
        ("id", TEXT),
        ("age", age),
        ("address", address or struct(("city", TEXT))),
        ("orders", ArrayType(struct(("sku", TEXT), *sku))),
        ("tags", MapType(TEXT, struct(("n", INT), *tag))),
        *more,
    )


USER = user()


def test_added_fields_are_named_by_their_path_at_every_depth():
    wider = user(
        ("note", TEXT),
        address=struct(("city", TEXT), ("zip", TEXT)),
        sku=(("qty", INT),),
        tag=(("m", INT),),
    )
    assert added_fields(USER, wider) == ["address.zip", "orders.qty", "tags.m", "note"]
    # Only a field at the top can become a column of its own: inside a struct it would
    # change the type of one the table has.
    assert not only_adds(USER, wider)
    assert only_adds(USER, user(("note", TEXT)))


def test_the_same_fields_add_nothing():
    assert added_fields(USER, USER) == []
    assert only_adds(USER, USER)


def test_a_dropped_or_retyped_field_is_not_only_an_addition():
    dropped = StructType([f for f in user(("note", TEXT)).fields if f.name != "age"])
    assert added_fields(USER, dropped) == ["note"]
    assert not only_adds(USER, dropped)
    retyped = user(("note", TEXT), age=LongType())
    assert not only_adds(USER, retyped)
    nested = user(address=struct(("town", TEXT)))
    assert added_fields(USER, nested) == ["address.town"]
    assert not only_adds(USER, nested)


def test_nullability_does_not_count():
    strict = struct(("id", TEXT), ("age", INT), nullable=False)
    loose = struct(("id", TEXT), ("age", INT), ("note", TEXT))
    assert only_adds(strict, loose)
    assert only_adds(loose, struct(("id", TEXT), ("age", INT), ("note", TEXT), nullable=False))
