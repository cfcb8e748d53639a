"""How fresh a fold batch's records were when Redis held them: the time from each record's
Kafka timestamp to the moment the batch's Redis writes landed, as a histogram.

A fold batch is applied on the driver (a small batch) or by several executor tasks
(a large one, docs/decisions/0002-small-batches-applied-on-the-driver.md), and the
history adds the batches of an interval together: quantiles of parts do not add up,
bucket counts do. So each place that applies records counts them into fixed buckets
with numpy on the Arrow column it already holds (no Python per record, no Spark job:
docs/decisions/0018-fold-metrics-counted-on-arrow-rows.md), and the quantiles are read
off the sum.

The buckets grow by ``2 ** (1/8)`` from 1 ms to about 25 days, so a quantile read off
them is within 9 % of the exact one above 1 ms; their bounds also hold every bound of
the Prometheus histogram ``materializer_event_freshness_seconds``, whose counts are
therefore exact sums of them. The maximum and the sum are kept exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import numpy.typing as npt

PROMETHEUS_BUCKETS_S = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0
)  # fmt: skip
"""The ``le`` bounds of ``materializer_event_freshness_seconds``: a live map's p99 sits in
the lower half, a backlog's records fill the upper one."""

_STEPS_PER_DOUBLING = 8
_DOUBLINGS = 31  # 1 ms * 2**31: about 25 days; older records count in the last bucket

BOUNDS_US: npt.NDArray[np.int64] = np.unique(
    np.concatenate(
        [
            np.round(1000 * 2 ** (np.arange(_STEPS_PER_DOUBLING * _DOUBLINGS + 1) / 8)),
            np.round(np.array(PROMETHEUS_BUCKETS_S) * 1_000_000),
        ]
    ).astype(np.int64)
)
"""Upper bounds of the buckets, in microseconds; bucket ``i`` holds ages in
``(BOUNDS_US[i-1], BOUNDS_US[i]]`` (bucket 0 from 0), and one more bucket past the last
bound holds the older ones."""

_PROMETHEUS_INDEX = np.searchsorted(BOUNDS_US, np.round(np.array(PROMETHEUS_BUCKETS_S) * 1e6))


@dataclass(frozen=True)
class Freshness:
    """Ages of records (Kafka timestamp to Redis write) counted into ``BOUNDS_US``'s buckets.

    Plain integers, so it pickles from an executor and travels in an Arrow row
    (``to_row``); two add up (``+``) to the freshness of both record sets.
    """

    counts: tuple[int, ...]
    """Records per bucket: ``len(BOUNDS_US) + 1`` of them."""
    sum_us: int
    max_us: int

    @classmethod
    def of(cls, timestamps_us: npt.ArrayLike, landed_us: int) -> Freshness | None:
        """The freshness of records with these Kafka timestamps (microseconds since the
        epoch, UTC) whose writes landed at ``landed_us``; None for no records.

        A record stamped after ``landed_us`` (a producer's clock ahead of this
        machine's) counts as 0 old.
        """
        stamps = np.asarray(timestamps_us, dtype=np.int64)
        if stamps.size == 0:
            return None
        ages = np.maximum(np.int64(landed_us) - stamps, 0)
        counts = np.bincount(np.searchsorted(BOUNDS_US, ages), minlength=len(BOUNDS_US) + 1)
        return cls(tuple(int(n) for n in counts), int(ages.sum()), int(ages.max()))

    def __add__(self, other: Freshness) -> Freshness:
        counts = tuple(a + b for a, b in zip(self.counts, other.counts, strict=True))
        return Freshness(counts, self.sum_us + other.sum_us, max(self.max_us, other.max_us))

    @property
    def count(self) -> int:
        """Records counted."""
        return sum(self.counts)

    def quantile_ms(self, q: float) -> float:
        """The age below which a share ``q`` (0 to 1) of the records fall, in milliseconds,
        interpolated within its bucket (the oldest bucket ends at the exact maximum)."""
        total = self.count
        if total == 0:
            return 0.0
        cumulative = np.cumsum(self.counts)
        rank = q * total
        i = int(np.searchsorted(cumulative, rank, side="left"))
        if i >= len(BOUNDS_US):  # older than the last bound: only the maximum is known
            return self.max_us / 1000
        lower = 0 if i == 0 else int(BOUNDS_US[i - 1])
        below = 0 if i == 0 else int(cumulative[i - 1])
        upper = min(int(BOUNDS_US[i]), self.max_us)
        share = (rank - below) / self.counts[i] if self.counts[i] else 1.0
        return max(0.0, min(lower + share * (upper - lower), self.max_us)) / 1000

    def prometheus_buckets(self) -> list[int]:
        """Cumulative counts at each of ``PROMETHEUS_BUCKETS_S``, then at ``+Inf``."""
        cumulative = np.cumsum(self.counts)
        return [*(int(cumulative[i]) for i in _PROMETHEUS_INDEX), int(cumulative[-1])]

    def to_row(self) -> tuple[list[int], int, int]:
        """``(counts, sum_us, max_us)``: the columns of an executor's row of counts."""
        return list(self.counts), self.sum_us, self.max_us

    @classmethod
    def from_row(
        cls, counts: Sequence[int] | None, sum_us: int | None, max_us: int | None
    ) -> Freshness | None:
        """``to_row``'s columns back; None where the task counted no records."""
        if not counts:
            return None
        return cls(tuple(int(n) for n in counts), int(sum_us or 0), int(max_us or 0))


def add(a: Freshness | None, b: Freshness | None) -> Freshness | None:
    """Two freshnesses together, either of which may be absent."""
    if a is None or b is None:
        return a if b is None else b
    return a + b
