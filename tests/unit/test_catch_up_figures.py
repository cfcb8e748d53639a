"""The catch-up arithmetic: records left, rates over a sliding window, the ETA, when a map
counts as catching up, and how viewers and metrics show the figures (no services needed)."""

from __future__ import annotations

import pytest

from materializer.config import parse_config
from materializer.contract.status import (
    IN_HAND,
    MapReport,
    PartitionCatchUp,
    effective_state,
    live_report,
    map_view,
    partition_lags,
)
from materializer.contract.watermark import Watermark
from materializer.errors import ConfigError
from materializer.runtime.catch_up import (
    UNKNOWN,
    MapWindows,
    PartitionWindow,
    Sample,
    eta_seconds,
)
from materializer.runtime.metrics import BatchMetrics


def test_eta_is_left_over_the_gain_and_unknown_when_the_map_does_not_gain():
    assert eta_seconds(1000, 150.0, 50.0) == 10.0
    assert eta_seconds(0, 0.0, 0.0) == 0.0  # nothing left: done, whatever the rates
    assert eta_seconds(0, 10.0, 90.0) == 0.0
    assert eta_seconds(1000, 50.0, 50.0) == -1.0  # as fast as the log grows: never
    assert eta_seconds(1000, 10.0, 90.0) == -1.0  # losing ground
    assert eta_seconds(1000, 0.0, 0.0) == -1.0  # not folding
    assert eta_seconds(-1, 100.0, 0.0) == -1.0  # left unknown


def test_rates_span_the_window_and_records_left_are_those_of_the_last_sample():
    window = PartitionWindow(window_s=30.0)
    assert window.left == -1 and window.rates() == (0.0, 0.0)
    window.add(Sample(at=100.0, position=0, end=10_000))
    assert window.left == 10_000
    assert window.rates() == (0.0, 0.0)  # one sample spans no time
    for second in range(1, 61):  # 200 records/s folded, 100 records/s produced
        window.add(Sample(at=100.0 + second, position=200 * second, end=10_000 + 100 * second))
    assert window.left == 10_000 + 100 * 60 - 200 * 60
    assert window.rates() == (200.0, 100.0)


def test_a_burst_leaves_the_window_once_it_is_older_than_the_window():
    window = PartitionWindow(window_s=10.0)
    window.add(Sample(0.0, 0, 0))
    window.add(Sample(1.0, 5_000, 5_000))  # one large batch
    for second in range(2, 11):
        window.add(Sample(float(second), 5_000, 5_000))
    assert window.rates() == (500.0, 500.0)  # the burst, over the ten seconds since 0.0
    window.add(Sample(11.0, 5_000, 5_000))
    assert window.rates() == (0.0, 0.0)  # the ten seconds since 1.0: the burst is out


def test_a_watermark_or_log_end_that_goes_back_starts_the_window_afresh():
    window = PartitionWindow(window_s=30.0)
    window.add(Sample(0.0, 1_000, 2_000))
    window.add(Sample(1.0, 1_500, 2_000))
    window.add(Sample(2.0, 200, 2_000))  # offsets reset, or a rebuilt copy
    assert window.rates() == (0.0, 0.0)
    window.add(Sample(3.0, 400, 2_000))
    assert window.rates() == (200.0, 0.0)
    window.add(Sample(4.0, 400, 10))  # the topic made again
    assert (window.left, window.rates()) == (0, (0.0, 0.0))


def test_a_map_sums_its_partitions_and_catches_up_above_ready_lag_only():
    windows = MapWindows(window_s=30.0)
    tps = [("t", 0), ("t", 1)]

    def look(at: float, positions: list[int], ends: list[int]) -> object:
        return windows.add(
            at, dict(zip(tps, positions, strict=True)), dict(zip(tps, ends, strict=True)), 100
        )

    first = look(0.0, [0, 0], [600, 400])
    assert (first.records_left, first.catching_up, first.eta_seconds) == (1000, True, -1.0)
    second = look(2.0, [200, 100], [600, 500])
    assert second.records_left == 400 + 400
    assert (second.catch_up_rate, second.input_rate) == (150.0, 50.0)
    assert second.eta_seconds == 800 / 100
    rows = [(p.partition, p.records_left, p.catch_up_rate, p.input_rate) for p in second.partitions]
    assert rows == [(0, 400, 100.0, 0.0), (1, 400, 50.0, 50.0)]
    assert second.partitions[0].eta_seconds == 4.0
    assert second.partitions[1].eta_seconds == -1.0  # this partition does not gain
    # Exactly ready_lag left: ready again.
    assert look(3.0, [550, 450], [600, 500]).catching_up is False
    # Just above it: catching up again; at or below: ready.
    assert look(4.0, [550, 449], [600, 500]).catching_up is True
    assert look(5.0, [560, 460], [600, 500]).catching_up is False


def test_a_look_that_cannot_tell_leaves_the_state_as_it_was():
    windows = MapWindows()
    assert windows.add(0.0, {("t", 0): 0}, {("t", 0): 50_000}, 10).catching_up is True
    unknown = windows.add(1.0, {("t", 0): None}, {("t", 0): 50_000}, 10)
    assert unknown.records_left == -1 and unknown.eta_seconds == -1.0
    assert unknown.catching_up is True
    assert unknown.partitions == (PartitionCatchUp("t", 0, -1, 0.0, 0.0, -1.0),)
    assert windows.add(2.0, {}, {}, 10).catching_up is True  # no partitions known at all
    assert windows.add(3.0, {("t", 0): 50_000}, {("t", 0): 50_000}, 10).catching_up is False


def test_catching_up_is_a_live_state_held_by_a_materializer():
    assert "catching_up" in IN_HAND
    now = 1_000_000
    assert effective_state(MapReport("catching_up", reported_at_ms=now - 1000), now) == (
        "catching_up"
    )
    # A killed materializer cannot say it stopped: its old report is not believed.
    assert effective_state(MapReport("catching_up", reported_at_ms=now - 60_000), now) == (
        "stopped"
    )


def _report(state: str, at: int) -> MapReport:
    return MapReport(
        state,
        reported_at_ms=at,
        records_left=900,
        catch_up_rate=120.5,
        input_rate=20.5,
        eta_seconds=9.0,
        catch_up_partitions=(
            PartitionCatchUp("t", 0, 900, 120.5, 20.5, 9.0),
            PartitionCatchUp("t", 1, 0, 0.0, 0.0, 0.0),
        ),
    )


def test_viewers_show_the_runs_rates_and_eta_beside_the_records_left_they_measure():
    now = 1_000_000
    mark = Watermark(batch_id=3, offsets={"t": {0: 100, 1: 50}}, updated_at_ms=now - 500)
    view = map_view("m", ["t"], 0, _report("catching_up", now), mark, {"t": {0: 1000, 1: 50}}, now)
    doc = view.to_json()
    assert doc["state"] == "catching_up"
    assert (doc["records_left"], doc["total_lag"]) == (900, 900)
    assert (doc["catch_up_rate"], doc["input_rate"], doc["eta_seconds"]) == (120.5, 20.5, 9.0)
    assert [
        (p["partition"], p["records_left"], p["catch_up_rate"], p["input_rate"], p["eta_seconds"])
        for p in doc["partitions"]  # type: ignore[attr-defined]
    ] == [(0, 900, 120.5, 20.5, 9.0), (1, 0, 0.0, 0.0, 0.0)]

    # Kafka not answering, and a run gone silent: unknowns are null, its old rates are gone.
    silent = map_view("m", ["t"], 0, _report("catching_up", now - 60_000), mark, None, now)
    doc = silent.to_json()
    assert doc["state"] == "stopped"
    assert (doc["records_left"], doc["catch_up_rate"], doc["eta_seconds"]) == (None, 0.0, None)
    assert [(p["records_left"], p["eta_seconds"]) for p in doc["partitions"]] == [  # type: ignore[attr-defined]
        (None, None),
        (None, None),
    ]


def test_a_paused_map_has_no_catch_up_figures_whatever_its_report_holds():
    report = _report("paused", 1000)
    assert live_report(report, "paused") is None
    rows = partition_lags(["t"], None, {"t": {0: 10}}, live_report(report, "paused"))
    assert [(r.lag, r.catch_up_rate, r.eta_seconds) for r in rows] == [(10, 0.0, -1.0)]


def test_ready_lag_defaults_and_must_not_be_negative():
    source = {"source": {"topics": ["t"], "schema": "id STRING"}, "key": "id"}
    assert parse_config({"maps": {"m": source}}).maps["m"].catch_up.ready_lag == 10_000
    doc = {**source, "catch_up": {"ready_lag": 0}}
    assert parse_config({"maps": {"m": doc}}).maps["m"].catch_up.ready_lag == 0
    with pytest.raises(ConfigError) as info:
        parse_config({"maps": {"m": {**source, "catch_up": {"ready_lag": -1}}}})
    assert info.value.problems == [
        "maps.m.catch_up.ready_lag: Input should be greater than or equal to 0"
    ]
    with pytest.raises(ConfigError) as info:
        parse_config({"maps": {"m": {**source, "catch_up": {"ready": 5}}}})
    assert info.value.problems == ["maps.m.catch_up.ready: unknown key"]


def test_metrics_follow_the_figures_and_go_with_the_map():
    metrics = BatchMetrics()
    windows = MapWindows()
    windows.add(0.0, {("t", 0): 0, ("t", 1): 0}, {("t", 0): 500, ("t", 1): 500}, 10)
    figures = windows.add(10.0, {("t", 0): 200, ("t", 1): 100}, {("t", 0): 600, ("t", 1): 600}, 10)
    metrics.catch_up("m", figures)

    def value(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, {"map": "m", **labels})

    assert value("materializer_records_left", topic="t", partition="0") == 400
    assert value("materializer_records_left", topic="t", partition="1") == 500
    assert value("materializer_catch_up_rate") == 30.0
    assert value("materializer_input_rate") == 20.0
    assert value("materializer_catch_up_eta_seconds") == 900 / 10
    assert value("materializer_catching_up") == 1
    metrics.catch_up("m", UNKNOWN)  # nothing measured: no partition series
    assert value("materializer_records_left", topic="t", partition="0") is None
    assert value("materializer_catch_up_eta_seconds") == -1
    metrics.catch_up("m", None)  # paused, stopped or moved: its series go
    assert value("materializer_catching_up") is None
    assert value("materializer_catch_up_rate") is None


def test_a_paced_catch_up_rests_longer_while_live_batches_run_long_and_less_after():
    from materializer.runtime.pacing import (
        FIRST_SHARE,
        MAX_SHARE,
        QUICK_MS,
        SLOW_MS,
        WINDOW_SECONDS,
        CatchUpPace,
    )

    now = [0.0]
    pace = CatchUpPace("m", clock=lambda: now[0])

    def turn(ms: list[int], seconds: float = 0.5) -> None:
        now[0] += seconds
        pace.follow(ms)

    turn([QUICK_MS - 1])
    assert pace.share == 0
    turn([10, SLOW_MS + 1])
    assert pace.share == FIRST_SHARE  # at once
    turn([SLOW_MS + 1])
    assert pace.share == FIRST_SHARE  # then at most once a window
    turn([SLOW_MS + 1], WINDOW_SECONDS)
    assert pace.share == 2 * FIRST_SHARE
    for _ in range(10):
        turn([SLOW_MS * 4], WINDOW_SECONDS)
    assert pace.share == MAX_SHARE
    turn([QUICK_MS - 1], WINDOW_SECONDS / 2)  # a slow batch is still in the window
    assert pace.share == MAX_SHARE
    for _ in range(10):
        turn([QUICK_MS - 1], WINDOW_SECONDS)
    assert pace.share == 0
    # The rest is a share of the catch-up's own last batch time.
    pace.follow([SLOW_MS + 1])
    pace()
    now[0] += 2.0
    pace()
    assert pace.paced_seconds == FIRST_SHARE * 2.0
