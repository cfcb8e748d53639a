"""The aggregate fold's Python side: a key's events of a batch folded into its state."""

from __future__ import annotations

from typing import Any

import orjson

from materializer.fold.aggregate import AggregateFolder, Spec
from materializer.fold.base import Event


def event(partition: int, offset: int, *inputs: str | None, delete: bool = False) -> Event:
    """One record as Spark hands it over: its position, its inputs (None: a delete), topic."""
    payload = None if delete else orjson.dumps(list(inputs))
    return (f"{partition:010d}{offset:019d}", payload, "t")


class Run:
    """One key through successive batches; ``batch`` returns the entity's JSON, parsed."""

    def __init__(self, *specs: tuple[str, str, int]) -> None:
        self.fold = AggregateFolder(
            [
                Spec(f"a{i}", fn, kind, at, 28 if kind == "decimal" else None)
                for i, (fn, kind, at) in enumerate(specs)
            ]
        )
        self.state: bytes | None = None

    def batch(self, *events: Event) -> dict[str, Any] | None:
        """Fold ``events`` (sorted as the fold sorts them: by position)."""
        state, entity = self.fold(self.state, sorted(events))
        if state == self.state:
            return {"unchanged": True}
        self.state = state
        return None if entity is None else orjson.loads(entity)


def test_events_fold_in_partition_offset_order():
    run = Run(("count", "count", -1), ("first", "json", 0), ("last", "json", 0))
    got = run.batch(event(1, 5, '{"v":"c"}'), event(0, 9, '{"v":"b"}'), event(0, 3, '{"v":"a"}'))
    assert got == {"a0": 3, "a1": "a", "a2": "c"}
    assert run.batch(event(1, 6, "{}")) == {"a0": 4, "a1": "a"}


def test_a_replayed_batch_changes_nothing_and_later_events_still_fold():
    run = Run(("count", "count", -1), ("sum", "int", 0))
    batch = [event(0, 0, "5"), event(1, 0, "6")]
    assert run.batch(*batch) == {"a0": 2, "a1": 11}
    assert run.batch(*batch) == {"unchanged": True}
    # A batch that overlaps what was folded folds only what is new.
    assert run.batch(event(0, 0, "5"), event(0, 1, "7")) == {"a0": 3, "a1": 18}


def test_offsets_are_kept_per_topic_and_partition():
    fold = AggregateFolder([Spec("n", "count", "count", -1)])
    state, _ = fold(None, [("0" * 10 + f"{3:019d}", b"[]", "a")])
    state, entity = fold(state, [("0" * 10 + f"{3:019d}", b"[]", "b")])
    assert orjson.loads(entity or b"") == {"n": 2}


def test_a_delete_resets_and_a_later_event_starts_afresh():
    run = Run(("count", "count", -1), ("sum", "int", 0), ("first", "json", 1))
    assert run.batch(event(0, 0, "5", '{"v":"x"}'), event(0, 1, "6", '{"v":"y"}')) == {
        "a0": 2,
        "a1": 11,
        "a2": "x",
    }
    restarted = [event(0, 2, delete=True), event(0, 3, None, '{"v":"w"}')]
    assert run.batch(*restarted) == {"a0": 1, "a2": "w"}
    assert run.batch(event(0, 4, delete=True)) is None
    assert run.batch(event(0, 5, "8", '{"v":"u"}')) == {"a0": 1, "a1": 8, "a2": "u"}


def test_counts_of_a_field_count_its_non_null_values():
    run = Run(("count", "count", 0))
    assert run.batch(event(0, 0, "1"), event(0, 1, None), event(0, 2, "1")) == {"a0": 2}


def test_doubles_sum_as_a_left_fold_and_nan_is_the_greatest():
    run = Run(("sum", "float", 0), ("min", "float", 0), ("max", "float", 0))
    # 1e16 + 1 rounds back to 1e16 at each step, as Spark's running sum does.
    assert run.batch(event(0, 0, "1.0E16"), event(0, 1, "1.0"), event(0, 2, "1.0")) == {
        "a0": 1e16,
        "a1": 1.0,
        "a2": 1e16,
    }
    # Not-a-number and infinities are written as Spark writes them: as strings.
    assert run.batch(event(0, 3, "NaN"), event(0, 4, "-Infinity")) == {
        "a0": "NaN",
        "a1": "-Infinity",
        "a2": "NaN",
    }


def test_min_and_max_keep_the_earliest_of_equal_values():
    run = Run(("min", "float", 0), ("max", "float", 0))
    fold_state = run.batch(event(0, 0, "0.0"), event(0, 1, "-0.0"))
    assert fold_state == {"a0": 0.0, "a1": 0.0}
    assert orjson.loads(run.state or b"")["v"] == ["0.0", "0.0"]


def test_integer_sums_stay_exact_and_are_null_only_beyond_the_long_range():
    run = Run(("sum", "int", 0))
    big = str(2**63 - 1)
    assert run.batch(event(0, 0, big), event(0, 1, "1")) == {}
    assert run.batch(event(0, 2, "-2")) == {"a0": 2**63 - 2}


def test_decimals_dates_and_strings_keep_their_text():
    run = Run(("sum", "decimal", 0), ("max", "day", 1), ("min", "str", 2))
    got = run.batch(
        event(0, 0, "0.10", '-3 {"v":"1969-12-29"}', "b"),
        event(0, 1, "12345678901234567890.25", '7 {"v":"1970-01-08"}', "a"),
    )
    assert got == {"a0": 12345678901234567890.35, "a1": "1970-01-08", "a2": "a"}
    text = run.fold(None, [event(0, 0, "12345678901234567890.25", None, None)])[1]
    assert text == b'{"a0":12345678901234567890.25}'


def test_a_decimal_sum_beyond_its_precision_is_null():
    fold = AggregateFolder([Spec("s", "sum", "decimal", 0, 2)])
    state, entity = fold(None, [event(0, 0, "60.5"), event(0, 1, "50.25")])
    assert entity == b"{}"
    _, entity = fold(state, [event(0, 2, "-100.00")])
    assert entity == b'{"s":10.75}'


def test_an_entity_without_a_state_is_its_own_seed():
    fold = AggregateFolder(
        [
            Spec("n", "count", "count", -1),
            Spec("total", "sum", "decimal", 0, 28),
            Spec("big", "sum", "int", 1),
            Spec("mean", "sum", "float", 2),
            Spec("day", "max", "day", 3),
            Spec("at", "min", "micros", 4),
            Spec("first", "first", "json", 5),
            Spec("ok", "max", "bool", 6),
        ]
    )
    event_inputs = [
        "1.10",
        str(2**62),
        "NaN",
        '19358 {"v":"2023-01-01"}',
        '1000001 {"v":"1970-01-01T00:00:01.000001Z"}',
        '{"v":{"a":[1,2.50]}}',
        "true",
    ]
    state, entity = fold(None, [event(0, 0, *event_inputs)])
    seeded = fold.seed(entity or b"")
    assert orjson.loads(seeded)["v"] == orjson.loads(state)["v"]
    # The next event builds on the seed as it would on the state.
    later = [event(0, 1, "0.05", "1", "1.0", None, None, '{"v":3}', "false")]
    assert fold(seeded, later)[1] == fold(state, later)[1]
