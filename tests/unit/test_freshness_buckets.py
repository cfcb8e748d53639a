"""A fold batch's freshness as bucket counts: quantiles read off them against numpy's exact
ones, sums of parts against the whole, and the Prometheus histogram they feed."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from materializer.runtime.freshness import BOUNDS_US, PROMETHEUS_BUCKETS_S, Freshness, add
from materializer.runtime.metrics import BatchMetrics

LANDED_US = 1_800_000_000_000_000


def stamps(ages_ms: np.ndarray) -> np.ndarray:
    """Kafka timestamps (µs) of records that were ``ages_ms`` old when they landed."""
    return LANDED_US - np.round(ages_ms * 1000).astype(np.int64)


@pytest.mark.parametrize(
    "ages_ms",
    [
        np.random.default_rng(1).lognormal(5, 1.5, 50_000),  # a live map: ms to seconds
        np.random.default_rng(2).uniform(0, 3_600_000, 20_000),  # a backlog: up to an hour
        np.random.default_rng(3).exponential(3, 5_000),  # mostly under a few ms
        np.random.default_rng(4).uniform(12_000, 12_900, 15_000),  # a backlog read at once
        np.array([42.0]),
    ],
    ids=["live", "backlog", "fast", "narrow", "one"],
)
def test_quantiles_are_within_a_bucket_of_the_exact_ones(ages_ms: np.ndarray) -> None:
    f = Freshness.of(stamps(ages_ms), LANDED_US)
    assert f is not None
    assert f.count == len(ages_ms)
    exact_us = LANDED_US - stamps(ages_ms)
    assert f.max_us == exact_us.max() and f.sum_us == exact_us.sum()
    for q in (0.5, 0.9, 0.99):
        exact = float(np.quantile(exact_us, q)) / 1000
        # One bucket is 2**(1/8) wide (9 %); below 1 ms it is the first bucket, [0, 1 ms].
        assert abs(f.quantile_ms(q) - exact) <= max(0.0905 * exact, 1.0), q
    p50, p99 = f.quantile_ms(0.5), f.quantile_ms(0.99)
    assert 0 <= p50 <= p99 <= f.max_us / 1000
    assert f.quantile_ms(1.0) == f.max_us / 1000


def test_parts_add_up_to_the_whole_as_executor_tasks_do() -> None:
    ages = np.random.default_rng(4).lognormal(6, 2, 10_000)
    whole = Freshness.of(stamps(ages), LANDED_US)
    parts = [Freshness.of(stamps(chunk), LANDED_US) for chunk in np.array_split(ages, 7)]
    total = None
    for part in parts:
        total = add(total, part)
    assert total == whole
    # Through an executor's row of counts and back.
    assert whole is not None
    assert Freshness.from_row(*whole.to_row()) == whole
    assert Freshness.from_row(None, None, None) is None


def test_no_records_and_a_clock_ahead() -> None:
    assert Freshness.of(np.array([], dtype=np.int64), LANDED_US) is None
    # A producer whose clock runs ahead of this machine's: its records count as 0 old.
    ahead = Freshness.of(np.array([LANDED_US + 5_000, LANDED_US]), LANDED_US)
    assert ahead is not None
    assert (ahead.count, ahead.max_us, ahead.sum_us, ahead.quantile_ms(0.99)) == (2, 0, 0, 0.0)
    # Older than the last bound (about 25 days): counted, and its quantile is the maximum.
    ancient = Freshness.of(np.array([LANDED_US - int(BOUNDS_US[-1]) - 10**9]), LANDED_US)
    assert ancient is not None and ancient.counts[-1] == 1
    assert ancient.quantile_ms(0.5) == ancient.max_us / 1000


def test_the_prometheus_histogram_counts_every_record_in_its_bucket() -> None:
    ages = np.concatenate(
        [
            np.random.default_rng(5).lognormal(4, 2, 3_000),
            np.array([b * 1000 for b in PROMETHEUS_BUCKETS_S]),  # on each bound: le counts it
        ]
    )
    batches = np.array_split(ages, 3)
    metrics = BatchMetrics()
    for batch in batches:
        metrics.fold_applied("users", None, 0, Freshness.of(stamps(batch), LANDED_US))
    text = generate_latest(metrics.registry).decode()
    name = "materializer_event_freshness_seconds"
    [family] = [f for f in text_string_to_metric_families(text) if f.name == name]
    samples = {(s.name, s.labels.get("le")): s.value for s in family.samples}
    ages_us = LANDED_US - stamps(ages)
    for bound in PROMETHEUS_BUCKETS_S:
        expected = int((ages_us <= round(bound * 1_000_000)).sum())
        assert samples[(f"{name}_bucket", repr(bound))] == expected
    assert samples[(f"{name}_bucket", "+Inf")] == len(ages)
    assert samples[(f"{name}_count", None)] == len(ages)
    assert samples[(f"{name}_sum", None)] == pytest.approx(ages_us.sum() / 1e6)
