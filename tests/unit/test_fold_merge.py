"""The merge fold's Python side: patches folded into per-leaf state, checked against RFC 7386
applied in event order (``json_merge_patch``, the tests' own reference)."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    DecimalType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from materializer.fold.base import Event, with_batch_time
from materializer.fold.merge import MergeFolder, fields_of
from materializer.testing.reference import json_merge_patch
from tests.helpers.merge_patches import ADDRESS, as_spark_hands_it

SCHEMA = StructType(
    [
        StructField("name", StringType()),
        StructField("n", LongType()),
        StructField("tags", ArrayType(StringType())),
        ADDRESS,
    ]
)
FOLDER = MergeFolder(fields_of(SCHEMA), exact=False)
# Depth first, as Spark numbers the explicit nulls: name, n, tags, address, city, geo, lat.
NUMBER = {("name",): 0, ("n",): 1, ("tags",): 2, ("address",): 3, ("address", "city"): 4}
NUMBER |= {("address", "geo"): 5, ("address", "geo", "lat"): 6}


def as_event(order: int, patch: dict[str, Any] | None) -> Event:
    """A patch as Spark hands it over: the JSON without nulls, the explicit nulls numbered."""
    return (f"{order:06d}", *as_spark_hands_it(patch, NUMBER))


def reference(events: list[tuple[int, dict[str, Any] | None]]) -> dict[str, Any] | None:
    entity: Any = None
    deleted = True
    for _, patch in sorted(events, key=lambda e: e[0]):
        if patch is None:
            entity, deleted = None, True
            continue
        entity = json_merge_patch({} if entity is None else entity, patch)
        deleted = False
    return None if deleted else entity


PATCHES: list[dict[str, Any] | None] = [
    {"name": "a", "n": 1},
    {"tags": ["x"], "address": {"city": "Oslo"}},
    {"address": {"geo": {"lat": "1"}}},
    {"address": None},
    {"address": {"city": None, "geo": {"lat": "2"}}},
    {"name": None, "n": 2},
    None,
    {"tags": None},
    {"address": {"geo": None}},
    {"name": "b", "tags": ["y", "z"]},
]


def test_any_split_into_batches_in_any_order_folds_as_the_patches_in_order():
    rng = random.Random(7)
    for _ in range(300):
        events = [(i, rng.choice(PATCHES)) for i in range(rng.randrange(1, 9))]
        shuffled = events[:]
        rng.shuffle(shuffled)
        state: bytes | None = None
        entity: bytes | None = None
        cut = rng.randrange(len(shuffled) + 1)
        for batch in (shuffled[:cut], shuffled[cut:]):
            if batch:
                state, entity = FOLDER(state, [as_event(o, p) for o, p in batch])
        expected = reference(events)
        assert (None if entity is None else orjson.loads(entity)) == expected, events


def test_a_replayed_batch_gives_the_same_state():
    batch = [as_event(1, {"name": "a", "address": {"city": "Oslo"}}), as_event(2, {"n": 3})]
    state, entity = FOLDER(None, batch)
    assert FOLDER(state, batch) == (state, entity)


def test_what_a_removal_hides_leaves_the_state():
    state, _ = FOLDER(None, [as_event(1, {"name": "a", "address": {"city": "Oslo"}})])
    state, entity = FOLDER(state, [as_event(2, {"address": None})])
    assert entity == b'{"name":"a"}'
    assert set(orjson.loads(state)["l"]) == {'["name"]'}
    state, entity = FOLDER(state, [as_event(3, None)])
    assert entity is None
    assert orjson.loads(state) == {"d": "000003", "e": "000002"}
    # An older event than the delete stays hidden; a newer one starts again.
    state, entity = FOLDER(state, [as_event(0, {"n": 9})])
    assert entity is None
    _, entity = FOLDER(state, [as_event(4, {"n": 9})])
    assert entity == b'{"n":9}'


def test_decimals_keep_every_digit():
    schema = StructType([StructField("d", DecimalType(38, 18))])
    folder = MergeFolder(fields_of(schema), exact=True)
    text = b'{"d":12345678901234567890.123456789012345678}'
    state, entity = folder(None, [("1", text, "")])
    assert entity == text
    _, entity = folder(state, [("2", b'{"e":1}', "")])
    assert entity == text


def test_an_entity_without_a_state_is_its_own_seed():
    entity = {"name": "a", "tags": ["x"], "address": {"city": "Oslo", "geo": {"lat": "1"}}}
    seeded = FOLDER.seed(orjson.dumps(entity))
    for patch in PATCHES:
        _, got = FOLDER(seeded, [as_event(1, patch)])
        expected = None if patch is None else json_merge_patch(entity, patch)
        assert (None if got is None else orjson.loads(got)) == expected, patch


def test_the_batch_time_goes_between_the_event_time_and_the_position():
    place = f"{3:010d}{42:019d}"
    orders = pa.chunked_array([[place, "1é2026\x00" + place], ["0\x00" + place]])
    batch = f"{1795663113920:020d}"
    assert with_batch_time(orders, 1795663113920).to_pylist() == [
        batch + place,
        "1é2026\x00" + batch + place,
        "0\x00" + batch + place,
    ]
