"""The Redis Functions' merge fold (``merge.lua``), which the real-time path applies, against
RFC 7386 applied in event order (the tests' reference) and against the Python fold of the
micro-batch path (``MergeFolder``): the same entity, the same state, and either one
folding on from what the other left, as a map that moves between the paths does."""

from __future__ import annotations

import json
import random
from decimal import Decimal
from typing import Any

import orjson
import pytest
import redis
from pyspark.sql.types import (
    ArrayType,
    DecimalType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from materializer.fold.merge import MergeFolder, fields_of
from materializer.testing.reference import json_merge_patch
from tests.helpers.live_function import ENTITY, STATE, LiveFunction
from tests.helpers.merge_patches import ADDRESS, as_spark_hands_it, dumps

SCHEMA = StructType(
    [
        StructField("name", StringType()),
        StructField("n", LongType()),
        StructField("d", DecimalType(38, 18)),
        StructField("tags", ArrayType(StringType())),
        ADDRESS,
    ]
)
FOLDER = MergeFolder(fields_of(SCHEMA), exact=True)
# Depth first, as Spark numbers the explicit nulls.
NUMBER = {("name",): 0, ("n",): 1, ("d",): 2, ("tags",): 3, ("address",): 4}
NUMBER |= {("address", "city"): 5, ("address", "geo"): 6, ("address", "geo", "lat"): 7}

NAMES = ["a", "b", 'qu"ote', "ünï\\code", "tab\there"]
NUMBERS = ["1", "-7", "9223372036854775807", "-9223372036854775808"]
DECIMALS = ["12345678901234567890.123456789012345678", "0.000000000000000001", "-3.5"]
DECIMALS += ["123456789012345678901234567890"]  # past what a 64-bit integer holds


def random_patch(rng: random.Random) -> dict[str, Any] | None:
    """A patch as JSON text would carry it: numbers as ``Decimal`` keep every digit."""
    if rng.random() < 0.1:
        return None

    def pick(choices: list[Any]) -> Any:
        return None if rng.random() < 0.2 else rng.choice(choices)

    patch: dict[str, Any] = {}
    for name, make in (
        ("name", lambda: pick(NAMES)),
        ("n", lambda: None if rng.random() < 0.2 else int(rng.choice(NUMBERS))),
        ("d", lambda: None if rng.random() < 0.2 else Decimal(rng.choice(DECIMALS))),
        ("tags", lambda: pick([["x"], ["y", "z"], []])),
        ("address", lambda: address(rng)),
    ):
        if rng.random() < 0.4:
            patch[name] = make()
    return patch


def address(rng: random.Random) -> dict[str, Any] | None:
    if rng.random() < 0.2:
        return None
    out: dict[str, Any] = {}
    if rng.random() < 0.5:
        out["city"] = rng.choice([None, "Oslo", "Zürich"])
    if rng.random() < 0.5:
        out["geo"] = rng.choice([None, {}, {"lat": "1"}, {"lat": None}])
    return out


def spark_event(patch: dict[str, Any] | None) -> tuple[bytes | None, str]:
    return as_spark_hands_it(patch, NUMBER)


def exact(text: bytes | None) -> Any:
    """JSON with every number as its text: equal values, digit for digit."""
    if text is None:
        return None
    return json.loads(text, parse_float=str, parse_int=str)


def reference(events: list[tuple[str, dict[str, Any] | None]]) -> Any:
    entity: Any = None
    for _, patch in sorted(events, key=lambda e: e[0].encode()):
        entity = None if patch is None else json_merge_patch(entity or {}, patch)
    return exact(dumps(entity)) if entity is not None else None


@pytest.fixture(params=[False, True], ids=["any orders", "digit orders"])
def fold_in_redis(redis_client: redis.Redis, request: pytest.FixtureRequest) -> LiveFunction:
    """The function with the map's spec: orders of any bytes (an event-time string), or of
    digits and zero bytes only, which it compares as they are."""
    digits = request.param
    spec = orjson.dumps({"merge": FOLDER.lua_spec(), "digits": digits})
    return LiveFunction(redis_client, spec, digits=digits)


def orders(rng: random.Random, n: int, digits: bool = False) -> list[str]:
    """Distinct orders with what an event time may hold: a zero byte, and unless ``digits``
    non-ASCII text and punctuation."""
    starts = ["", "0\x00", "1\x00"] if digits else ["", "1é", "0\x00", "1\x00z", "1-5\x00"]
    made = {rng.choice(starts) + f"{rng.randrange(10**6):06d}" for _ in range(n * 3)}
    return rng.sample(sorted(made), n)


def random_events(rng: random.Random, digits: bool) -> list[tuple[str, dict[str, Any] | None]]:
    """One to eight patches (or deletes) of a key, each at an order of its own."""
    return [(o, random_patch(rng)) for o in orders(rng, rng.randrange(1, 9), digits)]


def test_the_function_folds_as_the_patches_in_order_and_as_the_python_fold(
    fold_in_redis: LiveFunction, redis_client: redis.Redis
) -> None:
    rng = random.Random(11)
    for round_ in range(300):
        redis_client.delete(ENTITY, STATE)
        events = random_events(rng, fold_in_redis.digits)
        python_state: bytes | None = None
        python_entity: bytes | None = None
        for order, patch in events:
            payload, nulls = spark_event(patch)
            answer = fold_in_redis(order, payload, nulls)
            python_state, python_entity = FOLDER(python_state, [(order, payload, nulls)])
            assert exact(answer) == exact(python_entity), (round_, events)
            assert exact(redis_client.get(ENTITY)) == exact(python_entity)
            assert exact(redis_client.get(STATE)) == exact(python_state), (round_, events)
        assert exact(redis_client.get(ENTITY)) == reference(events), (round_, events)


def test_either_fold_goes_on_from_the_others_state(
    fold_in_redis: LiveFunction, redis_client: redis.Redis
) -> None:
    rng = random.Random(12)
    for round_ in range(200):
        redis_client.delete(ENTITY, STATE)
        events = random_events(rng, fold_in_redis.digits)
        for order, patch in events:
            payload, nulls = spark_event(patch)
            if rng.random() < 0.5:
                fold_in_redis(order, payload, nulls)
                continue
            state, entity = FOLDER(redis_client.get(STATE), [(order, payload, nulls)])
            redis_client.set(STATE, state)
            if entity is None:
                redis_client.delete(ENTITY)
            else:
                redis_client.set(ENTITY, entity)
        assert exact(redis_client.get(ENTITY)) == reference(events), (round_, events)


def test_an_entity_without_a_state_is_its_own_seed(
    fold_in_redis: LiveFunction, redis_client: redis.Redis
) -> None:
    entity = {"name": "a", "d": Decimal(DECIMALS[0]), "address": {"city": "Oslo"}}
    rng = random.Random(13)
    for _ in range(100):
        redis_client.delete(STATE)
        redis_client.set(ENTITY, dumps(entity))
        patch = random_patch(rng)
        payload, nulls = spark_event(patch)
        answer = fold_in_redis("1", payload, nulls)
        _, python_entity = FOLDER(FOLDER.seed(dumps(entity)), [("1", payload, nulls)])
        assert (
            exact(answer)
            == exact(python_entity)
            == (None if patch is None else exact(dumps(json_merge_patch(entity, patch))))
        )
