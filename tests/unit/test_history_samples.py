"""A map's history samples: written and read back as Redis returns them, built from an
interval's batches and the run's report, and the config that turns them on."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest

from materializer.config import parse_config
from materializer.contract.history import FIELDS, HistorySample, parse_history
from materializer.contract.status import MapReport
from materializer.errors import ConfigError
from materializer.runtime.freshness import Freshness
from materializer.runtime.history import Interval, Intervals, sample_of

NOW_MS = int(time.time() * 1000)
"""Now: the fold's changes are stamped with this machine's clock."""


def test_a_sample_reads_back_from_bytes_or_text_entries() -> None:
    sample = HistorySample(
        NOW_MS, "catching_up", input_rate=0.25, fold_rate=6120.5, batches=3, batch_ms=2210,
        add_batch_ms=2000, get_batch_ms=1, latest_offset_ms=12, query_planning_ms=40,
        wal_commit_ms=30, commit_offsets_ms=25, freshness_p50_ms=90_000, freshness_p99_ms=95_000,
        freshness_max_ms=96_001, lag_records=182_400, lag_ms=95_500, dead_letters=4,
        state_keys=100_412, state_bytes=24_117_248, delta_lag_ms=1500, delta_lag_records=0,
        catch_up_rate=6120.5, eta_seconds=35.7,
    )  # fmt: skip
    fields = sample.to_fields()
    as_bytes = {k.encode(): v.encode() for k, v in fields.items()}
    entry_id = f"{NOW_MS}-0"
    back = parse_history([(entry_id.encode(), as_bytes), (entry_id, fields)])
    # Rates from 100 up are whole records a second; below, tenths.
    expected = dataclasses.replace(sample, input_rate=0.2, fold_rate=6120.0, catch_up_rate=6120.0)
    assert back == [expected, expected]


def test_unknowns_are_empty_and_read_back_as_unknown() -> None:
    sample = HistorySample(NOW_MS, "paused")
    fields = sample.to_fields()
    assert list(fields) == list(FIELDS)
    assert {k for k, v in fields.items() if v not in ("", "0")} == {"state"}
    assert HistorySample.from_entry(f"{NOW_MS}-3", fields) == sample
    nan = dataclasses.replace(sample, eta_seconds=float("nan"), input_rate=float("inf"))
    assert HistorySample.from_entry(f"{NOW_MS}-0", nan.to_fields()) == sample


def test_entries_of_other_versions_read_what_they_share() -> None:
    # A writer that lacks fields: they are unknown; one with fields this reader does not
    # know: they are ignored.
    sample = HistorySample.from_entry(
        b"1700-0", {b"state": b"running", b"fold_rate": b"12", b"new_figure": b"7"}
    )
    assert sample == HistorySample(1700, "running", fold_rate=12.0)


def report(**figures: object) -> MapReport:
    base: dict[str, object] = {
        "state": "running",
        "records_left": 0,
        "input_rate": 50.0,
        "catch_up_rate": 50.0,
        "eta_seconds": 0.0,
        "state_keys": 10,
        "state_bytes": 2048,
    }
    return MapReport(**(base | figures))  # type: ignore[arg-type]


def freshness(*ages_ms: float) -> Freshness:
    landed_us = NOW_MS * 1000
    f = Freshness.of(landed_us - np.array(ages_ms) * 1000, landed_us)
    assert f is not None
    return f


def test_a_sample_of_an_interval_and_a_report() -> None:
    intervals = Intervals()
    intervals.fold_applied("m", (NOW_MS - 2_000) * 1000, 1, freshness(100, 200, 300))
    intervals.fold_applied("m", (NOW_MS - 1_000) * 1000, 0, freshness(50))
    intervals.fold_applied("m", None, 2, None)  # a batch of dead letters only
    intervals.fold_batch("m", {"triggerExecution": 300, "addBatch": 250, "walCommit": 20})
    intervals.fold_batch("m", {"triggerExecution": 900, "addBatch": 800, "getBatch": 3})
    intervals.fold_batch("m", {"triggerExecution": 100, "addBatch": 80})
    intervals.delta_batch("m", started_ms=NOW_MS - 60_000, behind=12)
    interval = intervals.take("m")

    s = sample_of(report(), interval, elapsed_s=2.0, now_ms=NOW_MS)
    assert (s.at_ms, s.state, s.batches, s.dead_letters) == (NOW_MS, "running", 3, 3)
    assert s.fold_rate == 2.0  # four records folded in two seconds
    # The longest batch and its own phases; a phase Spark did not report is unknown.
    assert (s.batch_ms, s.add_batch_ms, s.get_batch_ms, s.wal_commit_ms) == (900, 800, 3, -1)
    assert 0 <= s.freshness_p50_ms <= s.freshness_p99_ms <= s.freshness_max_ms == 300
    assert (s.lag_records, s.lag_ms) == (0, 0)  # nothing left
    assert (s.input_rate, s.catch_up_rate, s.eta_seconds) == (50.0, 50.0, 0.0)
    assert (s.state_keys, s.state_bytes) == (10, 2048)
    # The fold's last changes landed after the Delta batch began: the table trails.
    assert s.delta_lag_ms > 0 and s.delta_lag_records == 12

    # The next interval starts empty but keeps the levels.
    behind = report(records_left=500, eta_seconds=-1.0)
    s = sample_of(behind, intervals.take("m"), elapsed_s=2.0, now_ms=NOW_MS + 5_000)
    assert (s.batches, s.dead_letters, s.fold_rate, s.batch_ms) == (0, 0, 0.0, -1)
    assert (s.freshness_p50_ms, s.freshness_p99_ms, s.freshness_max_ms) == (-1, -1, -1)
    assert (s.lag_records, s.lag_ms, s.eta_seconds) == (500, 6_000, -1.0)
    assert s.delta_lag_records == 12

    # A Delta batch that began after the fold's last changes: the table holds them.
    intervals.delta_batch("m", started_ms=NOW_MS + 10**7, behind=0)
    s = sample_of(report(), intervals.take("m"), elapsed_s=2.0, now_ms=NOW_MS + 10_000)
    assert (s.delta_lag_ms, s.delta_lag_records) == (0, 0)


def test_unmeasured_figures_are_unknown() -> None:
    s = sample_of(report(records_left=-1), Interval(), elapsed_s=0.0, now_ms=NOW_MS)
    assert (s.input_rate, s.catch_up_rate, s.fold_rate) == (-1.0, -1.0, -1.0)
    assert (s.lag_records, s.lag_ms, s.delta_lag_ms, s.delta_lag_records) == (-1, -1, -1, -1)


@pytest.mark.parametrize(
    ("history", "problem"),
    [
        ({"interval": "500 ms"}, "metrics.history.interval: must be 0 (no history) or at least"),
        ({"interval": "10 s", "retention": "5 s"}, "metrics.history.retention: must be at least"),
        ({"interval": 1, "retention": "30 d"}, "2592000 samples per map, more than 1000000"),
        ({"retention": 0}, "metrics.history.retention"),
        ({"interval": "soon"}, "metrics.history.interval"),
    ],
)
def test_history_config_problems_name_their_key(history: dict[str, object], problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"metrics": {"history": history}})
    assert problem in str(caught.value)


def test_history_config_defaults_and_off() -> None:
    on = parse_config({}).metrics.history
    assert (on.interval.total_seconds(), on.retention.total_seconds(), on.max_len) == (
        5,
        86_400,
        17_280,
    )
    assert parse_config({"metrics": {"history": {"interval": 0}}}).metrics.history.max_len == 0
    short = parse_config({"metrics": {"history": {"interval": "2 s", "retention": "5 s"}}})
    assert short.metrics.history.max_len == 3
