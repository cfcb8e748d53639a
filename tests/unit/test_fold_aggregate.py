"""The aggregate fold's executor side, fed as PySpark's applyInPandasWithState feeds it."""

from __future__ import annotations

from typing import Any

import orjson
import pandas as pd
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout
from pyspark.sql.types import Row, StringType, StructField, StructType

from materializer.pipeline.fold_aggregate import AggregateFold

STATE_SCHEMA = StructType([StructField("aggregates", StringType())])


def group_state(saved: str | None) -> GroupState:
    """The state a batch starts from, as the worker builds it from the JVM's."""
    return GroupState(
        optionalValue=None if saved is None else Row(saved),
        batchProcessingTimeMs=0,
        eventTimeWatermarkMs=-1,
        timeoutConf=GroupStateTimeout.NoTimeout,
        hasTimedOut=False,
        watermarkPresent=False,
        defined=saved is not None,
        updated=False,
        removed=False,
        timeoutTimestamp=-1,
        keyAsUnsafe=b"",
        valueSchema=STATE_SCHEMA,
    )


def event(partition: int, offset: int, *inputs: str | None, delete: bool = False) -> str:
    return orjson.dumps(
        [f"{partition:010d}{offset:019d}", "1" if delete else None, *inputs]
    ).decode()


def chunk(*events: str) -> pd.DataFrame:
    return pd.DataFrame({"__key": ["k"] * len(events), "__in": list(events)})


class Run:
    """One key through successive batches; ``batch`` returns the key's result, decoded."""

    def __init__(self, specs: list[tuple[str, str, int]]) -> None:
        self.fold = AggregateFold(specs)
        self.saved: str | None = None

    def batch(self, *chunks: pd.DataFrame) -> list[Any] | None:
        state = group_state(self.saved)
        rows = list(self.fold(("k",), iter(chunks), state))
        assert len(rows) == 1
        assert list(rows[0].columns) == ["__key", "__out"]
        key, out = rows[0].iloc[0]
        assert key == "k"
        self.saved = state.getOption[0] if state.exists else None
        assert self.saved == out
        return None if out is None else orjson.loads(out)


def test_events_fold_in_partition_offset_order_across_chunks():
    run = Run([("count", "count", -1), ("first", "json", 2), ("last", "json", 2)])
    late, early = chunk(event(1, 5, "c"), event(0, 9, "b")), chunk(event(0, 3, "a"))
    assert run.batch(late, early) == [3, "3", "a", "c"]
    assert run.batch(chunk(event(1, 6, None))) == [4, "4", "a", None]


def test_a_delete_resets_and_a_later_event_starts_afresh():
    run = Run([("count", "count", -1), ("sum", "int", 2), ("first", "json", 3)])
    assert run.batch(chunk(event(0, 0, "5", "x"), event(0, 1, "6", "y"))) == [
        2,
        "2",
        "11",
        "x",
    ]
    restarted = chunk(event(0, 2, "1", "z", delete=True), event(0, 3, None, "w"))
    assert run.batch(restarted) == [1, "1", None, "w"]
    assert run.batch(chunk(event(0, 4, "7", "v", delete=True))) is None
    assert run.saved is None
    assert run.batch(chunk(event(0, 5, "8", "u"))) == [1, "1", "8", "u"]


def test_counts_of_a_field_count_its_non_null_values():
    run = Run([("count", "count", 2)])
    assert run.batch(chunk(event(0, 0, "1"), event(0, 1, None), event(0, 2, "1"))) == [3, "2"]


def test_doubles_sum_as_a_left_fold_and_nan_is_the_greatest():
    run = Run([("sum", "float", 2), ("min", "float", 2), ("max", "float", 2)])
    # 1e16 + 1 rounds back to 1e16 at each step, as Spark's running sum does.
    assert run.batch(chunk(event(0, 0, "1.0E16"), event(0, 1, "1.0"), event(0, 2, "1.0"))) == [
        3,
        "1e+16",
        "1.0",
        "1e+16",
    ]
    assert run.batch(chunk(event(0, 3, "NaN"), event(0, 4, "-Infinity"))) == [
        5,
        "NaN",
        "-Infinity",
        "NaN",
    ]


def test_min_and_max_keep_the_earliest_of_equal_values():
    run = Run([("min", "float", 2), ("max", "float", 2)])
    assert run.batch(chunk(event(0, 0, "0.0"), event(0, 1, "-0.0"))) == [2, "0.0", "0.0"]


def test_integer_sums_stay_exact_beyond_the_long_range():
    run = Run([("sum", "int", 2)])
    big = str(2**63 - 1)
    assert run.batch(chunk(event(0, 0, big), event(0, 1, "1"))) == [2, str(2**63)]
    assert run.batch(chunk(event(0, 2, "-2"))) == [3, str(2**63 - 2)]


def test_decimals_dates_and_strings_keep_their_text():
    run = Run([("sum", "decimal", 2), ("max", "day", 3), ("min", "str", 4)])
    first = chunk(event(0, 0, "0.10", "-3", "b"), event(0, 1, "12345678901234567890.25", "7", "a"))
    assert run.batch(first) == [2, "12345678901234567890.35", "7", "a"]
