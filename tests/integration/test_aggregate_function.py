"""The Redis Functions' aggregate fold (``aggregate.lua``), which the real-time path applies,
against the Python fold of the micro-batch path (``AggregateFolder``): the same entity and
the same state for every kind of aggregate, over values a double cannot hold (longs past
2^53, sums that leave the long range and come back, decimals of 38 digits), NaN and the
infinities, dates and timestamps before and after the epoch; either fold going on from
what the other left, as a map that moves between the paths does; a replay folding
nothing twice; and an entity restored without its state seeding one."""

from __future__ import annotations

import json
import math
import random
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import orjson
import pytest
import redis

from materializer.fold.aggregate import AggregateFolder, Spec
from tests.helpers.live_function import ENTITY, LiveFunction

SPECS = [
    Spec("events", "count", "count", -1),
    Spec("named", "count", "count", 0),
    Spec("total", "sum", "int", 1),
    Spec("low", "min", "int", 1),
    Spec("high", "max", "int", 1),
    Spec("fsum", "sum", "float", 2),
    Spec("fmin", "min", "float", 2),
    Spec("fmax", "max", "float", 2),
    Spec("dsum", "sum", "decimal", 3, 21),
    Spec("dmax", "max", "decimal", 3),
    Spec("small", "sum", "decimal", 3, 2),
    Spec("fraction", "sum", "decimal", 3, 0),
    Spec("first_name", "min", "str", 4),
    Spec("last_name", "max", "str", 4),
    Spec("any", "max", "bool", 5),
    Spec("since", "min", "day", 6),
    Spec("seen", "max", "micros", 7),
    Spec("opening", "first", "json", 8),
    Spec("closing", "last", "json", 8),
]
FOLDER = AggregateFolder(SPECS)
FLOATS = {i for i, s in enumerate(SPECS) if s.kind == "float"}

LONGS = ["9223372036854775807", "-9223372036854775808", "9007199254740993", "1", "-42", "0"]
DOUBLES = ["0.1", "1.0E16", "-0.0", "0.0", "NaN", "Infinity", "-Infinity", "3.5", "1.0E-7"]
DECIMALS = ["12345678901234567890.123456789012345678", "-0.000000000000000001", "99.5"]
DECIMALS += ["-99.500000000000000000", "0", "0.25"]
NAMES = ["ann", "Zoë", "zed", "", "名前", 'a"b']
DATES = [date(1969, 12, 31), date(2026, 11, 30), date(1900, 2, 28), date(2000, 2, 29)]
TIMES = [
    datetime(2026, 11, 30, 7, 5, 5, 123456, tzinfo=UTC),
    datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    datetime(1970, 1, 1, tzinfo=UTC),
    datetime(2199, 5, 6, 1, 2, 3, 4, tzinfo=UTC),
    datetime(2026, 1, 1, 3, 0, tzinfo=timezone(timedelta(hours=5, minutes=30))),
    datetime(1960, 7, 1, 20, 15, 30, 5, tzinfo=timezone(timedelta(hours=-8))),
]
OBJECTS = [{"a": 1}, {"b": [1, 2.5, "x"]}, None, {"big": 12345678901234567890}]
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def encoded_time(value: date | datetime) -> str:
    """A date or timestamp as Spark encodes it for the fold: its number, a space, its JSON."""
    if isinstance(value, datetime):
        number = (value - EPOCH) // timedelta(microseconds=1)
        shown = value.isoformat(timespec="microseconds").replace("+00:00", "Z")
    else:
        number = (value - date(1970, 1, 1)).days
        shown = value.isoformat()
    return f'{number} {{"v":"{shown}"}}'


def random_inputs(rng: random.Random) -> bytes | None:
    """One event's inputs as Spark hands them over (a JSON array of text), or a delete."""
    if rng.random() < 0.08:
        return None

    def maybe(value: str) -> str | None:
        return None if rng.random() < 0.15 else value

    obj = rng.choice(OBJECTS)
    inputs = [
        maybe("1"),
        maybe(rng.choice(LONGS)),
        maybe(rng.choice(DOUBLES)),
        maybe(rng.choice(DECIMALS)),
        maybe(rng.choice(NAMES)),
        maybe(rng.choice(["true", "false"])),
        maybe(encoded_time(rng.choice(DATES))),
        maybe(encoded_time(rng.choice(TIMES))),
        "{}" if obj is None else '{"v":' + json.dumps(obj, separators=(",", ":")) + "}",
    ]
    return orjson.dumps(inputs)


def shown(text: bytes | None) -> Any:
    """An entity's JSON with numbers compared by value, a double's text however written."""
    return None if text is None else json.loads(text, parse_float=Decimal)


def state_values(text: bytes | None) -> Any:
    """A state with each double's text read as the double (NaN as itself)."""
    if text is None:
        return None
    state = orjson.loads(text)
    values = state.get("v")
    if values is not None:
        state["v"] = [
            ("nan" if math.isnan(float(v)) else float(v)) if i in FLOATS and v is not None else v
            for i, v in enumerate(values)
        ]
    return state


@pytest.fixture()
def fold_in_redis(redis_client: redis.Redis) -> LiveFunction:
    return LiveFunction(redis_client, orjson.dumps({"aggregate": FOLDER.lua_spec()}))


def order(partition: int, offset: int) -> str:
    return f"{partition:010d}{offset:019d}"


def test_the_function_folds_every_aggregate_as_the_python_fold(
    fold_in_redis: LiveFunction,
) -> None:
    rng = random.Random(21)
    for round_ in range(150):
        fold_in_redis.reset()
        python_state: bytes | None = None
        for offset in range(rng.randrange(1, 12)):
            inputs = random_inputs(rng)
            answer = fold_in_redis(order(0, offset), inputs, "t", offset=offset)
            python_state, python_entity = FOLDER(python_state, [(order(0, offset), inputs, "t")])
            assert shown(answer) == shown(python_entity), (round_, offset, inputs)
            assert shown(fold_in_redis.entity()) == shown(python_entity)
            assert state_values(fold_in_redis.state()) == state_values(python_state), round_


def test_either_fold_goes_on_from_the_others_state_and_a_replay_folds_nothing(
    fold_in_redis: LiveFunction,
) -> None:
    rng = random.Random(22)
    for round_ in range(150):
        fold_in_redis.reset()
        python_state: bytes | None = None
        python_entity: bytes | None = None
        events = [(order(0, o), random_inputs(rng), "t") for o in range(rng.randrange(1, 12))]
        for offset, event in enumerate(events):
            python_state, python_entity = FOLDER(python_state, [event])
            if rng.random() < 0.5:
                fold_in_redis(*event, offset=offset)
            else:
                state, entity = FOLDER(fold_in_redis.state(), [event])
                fold_in_redis.put(state, entity)
        assert shown(fold_in_redis.entity()) == shown(python_entity), round_
        # The micro-batch path replays a batch: its own offsets in the state skip it.
        before = fold_in_redis.state()
        state, entity = FOLDER(before, events[-3:])
        assert state == before and entity is None


def test_an_entity_without_a_state_is_its_own_seed(fold_in_redis: LiveFunction) -> None:
    rng = random.Random(23)
    for round_ in range(100):
        fold_in_redis.reset()
        python_state: bytes | None = None
        python_entity: bytes | None = None
        for offset in range(rng.randrange(1, 6)):
            event = (order(0, offset), random_inputs(rng), "t")
            python_state, python_entity = FOLDER(python_state, [event])
        if python_entity is None:
            continue
        fold_in_redis.client.set(ENTITY, python_entity)  # restored without its state
        event = (order(1, 0), random_inputs(rng), "t")
        answer = fold_in_redis(*event, partition=1, offset=0)
        state, expected = FOLDER(FOLDER.seed(python_entity), [event])
        assert shown(answer) == shown(expected), (round_, python_entity, event)
        assert state_values(fold_in_redis.state()) == state_values(state), round_


def test_a_record_the_state_has_folded_changes_nothing(fold_in_redis: LiveFunction) -> None:
    """A record at or below its partition's offset in the state was folded before (by
    either path): the function leaves the key as it is, whatever its watermark says."""
    rng = random.Random(24)
    events = [(order(0, o), random_inputs(rng) or b"[]", "t") for o in range(6)]
    state, entity = FOLDER(None, events)
    fold_in_redis.put(state, entity)
    for offset in (3, 5):
        answer = fold_in_redis(*events[offset], offset=offset)
        assert answer == fold_in_redis.entity() == entity
        assert fold_in_redis.state() == state


def test_a_restored_entity_seeds_from_the_values_as_a_restore_writes_them(
    fold_in_redis: LiveFunction,
) -> None:
    """A restore writes each decimal as Python writes it (``0E-18`` for a zero of scale
    18), each double as its shortest text, each timestamp in UTC with ``Z``."""
    restored = {
        "events": 3,
        "dsum": "0E-18",
        "dmax": "1.23E-7",
        "fsum": "1.0E7",
        "seen": "2026-11-30T07:05:05.123456Z",
        "since": "1969-12-31",
    }
    text = ",".join(
        f'"{k}":"{v}"' if k in ("seen", "since") else f'"{k}":{v}' for k, v in restored.items()
    )
    entity = ("{" + text + "}").encode()
    for inputs in (
        [None] * 9,
        ["1", "5", "2.5", "-0.000000001", "x", "true"]
        + [encoded_time(DATES[0]), encoded_time(TIMES[1]), "{}"],
    ):
        fold_in_redis.reset()
        fold_in_redis.client.set(ENTITY, entity)
        event = (order(0, 0), orjson.dumps(inputs), "t")
        answer = fold_in_redis(*event, offset=0)
        state, expected = FOLDER(FOLDER.seed(entity), [event])
        assert shown(answer) == shown(expected), inputs
        assert state_values(fold_in_redis.state()) == state_values(state), inputs
