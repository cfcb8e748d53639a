"""How far each running map is behind its source logs, and how fast it gains on them.

Spark's progress cannot tell: without ``spark.max_offsets_per_trigger`` a batch
reads up to the latest offset it saw when it was planned, so its end offset
equals its latest offset however far the log moved on meanwhile. So the run
asks Kafka itself, about once a second, for the log ends of every running
map's source partitions (one ``ListOffsets`` call for all the maps), and sets
them against each map's watermark (``<map>:__meta__``): the position lookups
answer with, so "records left" is what a read-your-writes caller still waits
for. Over a sliding window of about half a minute per partition:

- records left: the log end minus the watermark;
- catch-up rate: records per second the watermark advanced;
- input rate: records per second the log grew (what producers add);
- ETA: ``left / (catch-up rate - input rate)`` when the map gains on its log,
  unknown when it does not.

The figures go into the map's report (``MapReport``), so ``materializer
status``, ``GetStatus``, the HTTP status and the metrics show the same ones;
a map with more records left than its ``catch_up.ready_lag`` reports
``catching_up``. The tracker runs on a daemon thread of its own: a Kafka or
Redis that does not answer delays the figures, never the supervisor's loop.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaException

from materializer.clients.kafka_offsets import (
    KafkaOffsetsError,
    admin_client,
    offsets_of,
    partition_ids,
)
from materializer.clients.redis import TRANSIENT_ERRORS, client_for
from materializer.config import KafkaConfig, RedisConfig
from materializer.contract.redis_layout import meta_key
from materializer.contract.status import PartitionCatchUp
from materializer.contract.watermark import Watermark
from materializer.runtime.daemon import DaemonLoop

log = logging.getLogger(__name__)

INTERVAL_SECONDS = 1.0
"""How often the log ends are asked for."""
WINDOW_SECONDS = 30.0
"""The span the rates are measured over: long enough to average out micro-batches (a
watermark moves in steps), short enough to follow a change of pace within a minute."""
METADATA_SECONDS = 30.0
"""How often the followed topics' partitions are asked again (a topic may grow some)."""

TopicPartition = tuple[str, int]


def eta_seconds(left: int, rate: float, input_rate: float) -> float:
    """Seconds until ``left`` records are folded at ``rate`` while the log grows at
    ``input_rate``: 0 with nothing left; -1 (unknown) when ``left`` is, or when the map does
    not gain on its log."""
    if left < 0:
        return -1.0
    if left == 0:
        return 0.0
    gain = rate - input_rate
    return round(left / gain, 1) if gain > 0 else -1.0


@dataclass(frozen=True)
class Sample:
    """One look at a partition: when (``time.monotonic()`` seconds), where the map's
    watermark stood, and the log end."""

    at: float
    position: int
    end: int


class PartitionWindow:
    """The samples of one partition over the last ``window_s`` seconds."""

    def __init__(self, window_s: float = WINDOW_SECONDS) -> None:
        self._window = window_s
        self._samples: deque[Sample] = deque()

    def add(self, sample: Sample) -> None:
        """Take a sample; one whose watermark or log end went back (offsets reset, a rebuilt
        copy, a topic made again) starts the window afresh: earlier samples say nothing of
        the pace now."""
        if self._samples:
            last = self._samples[-1]
            if sample.position < last.position or sample.end < last.end:
                self._samples.clear()
        self._samples.append(sample)
        # Keep the newest sample at or before the window's start: the rates span it whole.
        while len(self._samples) >= 2 and self._samples[1].at <= sample.at - self._window:
            self._samples.popleft()

    @property
    def left(self) -> int:
        """Records left at the last sample; -1 before the first."""
        if not self._samples:
            return -1
        last = self._samples[-1]
        return max(0, last.end - last.position)

    def rates(self) -> tuple[float, float]:
        """(catch-up rate, input rate) in records per second over the window; zeros until
        two samples span some time."""
        if len(self._samples) < 2:
            return 0.0, 0.0
        first, last = self._samples[0], self._samples[-1]
        span = last.at - first.at
        if span <= 0:
            return 0.0, 0.0
        return (
            round((last.position - first.position) / span, 3),
            round((last.end - first.end) / span, 3),
        )


@dataclass(frozen=True)
class MapCatchUp:
    """One map's figures at one look, and whether it counts as catching up."""

    records_left: int
    """-1: unknown (a partition whose position cannot be told yet)."""
    catch_up_rate: float
    input_rate: float
    eta_seconds: float
    partitions: tuple[PartitionCatchUp, ...]
    catching_up: bool


UNKNOWN = MapCatchUp(-1, 0.0, 0.0, -1.0, (), False)


class MapWindows:
    """The windows of one map's partitions, and whether the map is catching up.

    The state turns on fresh measurements only: a map enters ``catching_up`` once
    it has more than ``ready_lag`` records left, leaves it once at or below, and a
    look that cannot tell (Kafka or Redis away) leaves it as it was, so a map never
    flaps for want of figures.
    """

    def __init__(self, window_s: float = WINDOW_SECONDS) -> None:
        self._window = window_s
        self._windows: dict[TopicPartition, PartitionWindow] = {}
        self.catching_up = False

    def add(
        self,
        at: float,
        positions: Mapping[TopicPartition, int | None],
        ends: Mapping[TopicPartition, int],
        ready_lag: int,
    ) -> MapCatchUp:
        """One look: per partition of ``ends``, its watermark (``None``: not known yet) and
        log end at ``at``; the map's figures now."""
        rows = []
        for tp in sorted(ends):
            position = positions.get(tp)
            if position is None:
                self._windows.pop(tp, None)
                rows.append(PartitionCatchUp(tp[0], tp[1], -1, 0.0, 0.0, -1.0))
                continue
            window = self._windows.setdefault(tp, PartitionWindow(self._window))
            window.add(Sample(at, position, ends[tp]))
            rate, input_rate = window.rates()
            left = window.left
            eta = eta_seconds(left, rate, input_rate)
            rows.append(PartitionCatchUp(tp[0], tp[1], left, rate, input_rate, eta))
        for gone in set(self._windows) - set(ends):
            del self._windows[gone]
        known = bool(rows) and all(r.records_left >= 0 for r in rows)
        left = sum(r.records_left for r in rows) if known else -1
        rate = round(sum(r.catch_up_rate for r in rows), 3)
        input_rate = round(sum(r.input_rate for r in rows), 3)
        if known:
            self.catching_up = left > ready_lag
        return MapCatchUp(
            records_left=left,
            catch_up_rate=rate,
            input_rate=input_rate,
            eta_seconds=eta_seconds(left, rate, input_rate),
            partitions=tuple(rows),
            catching_up=self.catching_up,
        )


@dataclass(frozen=True)
class Followed:
    """A running map as the tracker follows it."""

    physical: str
    """Where its data lives (``physical_name``): whose watermark to read."""
    topics: tuple[str, ...]
    ready_lag: int
    from_latest: bool
    """``source.starting_offsets: latest``: before its first batch, where its fold starts is
    not known (the log end when it started), so its records left are unknown until then."""


class CatchUpTracker(DaemonLoop):
    """Measures every map ``followed()`` names every ``interval_s`` on a daemon thread and
    hands each map's figures to ``on_measure`` (``None`` for a map no longer followed);
    the first measure as soon as it starts."""

    transient = (KafkaException, KafkaOffsetsError, *TRANSIENT_ERRORS)
    failing = "catch-up figures not measured"
    while_away = "(they stay as last measured)"
    recovered = "catch-up figures measured again"

    def __init__(
        self,
        kafka: KafkaConfig,
        redis: RedisConfig,
        followed: Callable[[], dict[str, Followed]],
        on_measure: Callable[[str, MapCatchUp | None], None],
        interval_s: float = INTERVAL_SECONDS,
        window_s: float = WINDOW_SECONDS,
    ) -> None:
        super().__init__("catch-up", interval_s)
        self._kafka = kafka
        self._redis = redis
        self._followed = followed
        self._on_measure = on_measure
        self._window = window_s
        self._maps: dict[str, tuple[str, MapWindows]] = {}
        self._admin: Any = None
        self._partitions: dict[str, list[int]] = {}
        self._asked: list[str] = []
        self._partitions_at = 0.0

    def round(self) -> None:
        """One measure (``measure``)."""
        self.measure()

    def measure(self) -> None:
        """One look at every followed map: one ``ListOffsets`` call for all of their
        partitions, one Redis round trip for all of their watermarks."""
        followed = self._followed()
        for name in list(self._maps):
            if name not in followed or self._maps[name][0] != followed[name].physical:
                del self._maps[name]  # paused, stopped, moved, or on a new copy of its data
                self._on_measure(name, None)
        if not followed:
            return
        topics = sorted({t for f in followed.values() for t in f.topics})
        partitions = self._topic_partitions(topics)
        admin = self._admin_client()
        ends = offsets_of(admin, partitions, "latest")
        marks = self._watermarks([f.physical for f in followed.values()])
        at = time.monotonic()
        positions: dict[str, dict[TopicPartition, int | None]] = {}
        unstarted: dict[str, set[TopicPartition]] = {}
        for (name, f), mark in zip(followed.items(), marks, strict=True):
            here = positions[name] = {}
            for topic in f.topics:
                done = mark.offsets.get(topic, {}) if mark is not None else {}
                for partition in partitions.get(topic, []):
                    here[(topic, partition)] = done.get(partition)
                    if partition not in done and not (mark is None and f.from_latest):
                        # No batch reached it yet: the fold starts at the log's start.
                        unstarted.setdefault(name, set()).add((topic, partition))
        if unstarted:
            wanted: dict[str, set[int]] = {}
            for topic, partition in set().union(*unstarted.values()):
                wanted.setdefault(topic, set()).add(partition)
            starts = offsets_of(admin, {t: sorted(ps) for t, ps in wanted.items()}, "earliest")
            for name, tps in unstarted.items():
                for topic, partition in tps:
                    start = starts.get(topic, {}).get(partition, -1)
                    positions[name][(topic, partition)] = start if start >= 0 else None
        for name, f in followed.items():
            if any(topic not in partitions for topic in f.topics):
                continue  # a topic Kafka cannot describe: nothing to set its figures against
            _, windows = self._maps.setdefault(name, (f.physical, MapWindows(self._window)))
            map_ends = {
                (topic, partition): ends[topic][partition]
                for topic in f.topics
                for partition in partitions.get(topic, [])
                if partition in ends.get(topic, {})
            }
            self._on_measure(name, windows.add(at, positions[name], map_ends, f.ready_lag))

    def _admin_client(self) -> Any:
        if self._admin is None:
            self._admin = admin_client(self._kafka)
        return self._admin

    def _topic_partitions(self, topics: list[str]) -> dict[str, list[int]]:
        """The topics' partitions, asked again every ``METADATA_SECONDS`` or when the topics
        followed change. A topic Kafka does not know is left out (its maps' figures stay as
        they were), so one map's missing topic leaves the others measured."""
        stale = time.monotonic() - self._partitions_at > METADATA_SECONDS
        if stale or self._asked != topics:
            known: dict[str, list[int]] = {}
            for topic in topics:
                try:
                    known.update(partition_ids(self._admin_client(), [topic]))
                except KafkaOffsetsError as exc:
                    log.debug("catch-up figures: %s", exc)
            self._partitions, self._asked = known, topics
            self._partitions_at = time.monotonic()
        return self._partitions

    def _watermarks(self, physical: list[str]) -> list[Watermark | None]:
        with client_for(self._redis).pipeline(transaction=False) as pipe:
            for name in physical:
                pipe.hgetall(meta_key(name))
            return [Watermark.from_hash(raw) for raw in pipe.execute()]
