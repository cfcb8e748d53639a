"""A map's history as ``materializer run`` keeps it: a real run folds a backlog (on the
executors) and then live records (on the driver, or on the real-time path's writers),
samples the map every second into ``<map>:__history__``, and exports every folded
record's freshness as a Prometheus histogram. The stream stays within its cap, and a full
day of samples costs what docs/operations.md says. Nothing here asserts how long anything took.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import orjson
import pytest
import redis.asyncio as aioredis
import yaml
from prometheus_client.parser import text_string_to_metric_families

from materializer.config import RedisConfig
from materializer.contract.history import HistorySample, read_history, read_history_async
from materializer.contract.redis_layout import history_key
from materializer.contract.status import MapReport
from materializer.runtime.history import HistoryRecorder, Intervals
from materializer.testing import free_port, produce
from materializer.testing.process import ManagedProcess
from materializer.testing.waiting import wait_until
from tests.helpers.slices import end_offsets, slice_config, watermark

BACKLOG = 25_000
"""More than a batch applied on the driver takes: the first batches run on the executors."""
KEYS = 300
UNDECODABLE = 5
NODE_ENTRIES = 100
"""Redis's ``stream-node-max-entries``: ``MAXLEN ~`` trims whole nodes, so up to this many
entries beyond the cap stay."""


def _record(i: int) -> tuple[bytes, bytes]:
    key = f"k{i % KEYS}"
    return key.encode(), orjson.dumps({"id": key, "name": f"v{i}", "age": i % 90})


class _Producing:
    """Live records, a few at a time, until stopped: input the run can measure."""

    def __init__(self, bootstrap: str, topic: str, start: int) -> None:
        self.positions: list[tuple[int, int]] = []
        self.produced = 0
        self._args = (bootstrap, topic, start)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        bootstrap, topic, start = self._args
        while not self._stop.is_set():
            batch = [_record(start + self.produced + j) for j in range(40)]
            self.positions += produce(bootstrap, topic, batch)
            self.produced += len(batch)
            self._stop.wait(0.1)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)


def _scrape(port: int, name: str) -> dict[tuple[str, str | None], float]:
    url = f"http://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as answer:  # noqa: S310 - loopback
        text = answer.read().decode()
    return {
        (s.name, s.labels.get("le")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.labels.get("map") == name
    }


@pytest.mark.timeout(600)
@pytest.mark.parametrize("path", ["microbatch", "realtime"])
def test_a_run_keeps_each_maps_history_and_measures_every_records_freshness(
    kafka_bootstrap, redis_url, redis_client, new_topic, tmp_path: Path, path: str
):
    topic = new_topic(2)
    backlog = [_record(i) for i in range(BACKLOG)]
    backlog += [(f"x{i}".encode(), b"{not json") for i in range(UNDECODABLE)]
    positions = produce(kafka_bootstrap, topic, backlog)
    name = f"hist{uuid.uuid4().hex[:8]}"
    metrics_port = free_port()
    doc = slice_config(tmp_path, kafka_bootstrap, redis_url, topic, map_name=name)
    doc["spark"]["path"] = path
    if path == "realtime":  # room for the real-time query's tasks beside the cores' worth
        doc["spark"]["master"] = "local[*]"
    doc["metrics"] = {
        "host": "127.0.0.1",
        "port": metrics_port,
        "state_interval": "1 s",
        # Long enough that nothing is trimmed while the test runs: every sample stays.
        "history": {"interval": "1 s", "retention": "10 minutes"},
    }
    config_file = tmp_path / "maps.yaml"
    config_file.write_text(yaml.safe_dump(doc))
    args = [sys.executable, "-m", "materializer", "run", "-c", str(config_file)]
    proc = ManagedProcess(args, tmp_path / "run.log")
    history: list[HistorySample] = []

    def sampled(condition) -> bool:  # type: ignore[no-untyped-def]
        assert proc.alive(), proc.log()[-3000:]
        history[:] = read_history(redis_client, name)
        return any(condition(s) for s in history)

    producing = None
    try:
        wait_until("the backlog folded", lambda: sampled(lambda s: s.fold_rate > 0), 300)
        producing = _Producing(kafka_bootstrap, topic, BACKLOG)
        # A real-time map folds without batches once it joins, which may come before the
        # first sample of live input: its batches are the backlog's (asserted below).
        batched = path == "microbatch"
        wait_until(
            "a sample of live input folded",
            lambda: sampled(
                lambda s: s.input_rate > 0 and s.fold_rate > 0 and (s.batch_ms > 0 or not batched)
            ),
            120,
        )
        if path == "realtime":  # records folded by the real-time path's writers too
            wait_until(
                "the real-time path to fold",
                lambda: (w := watermark(redis_client, name)) is not None and w.app_id == "live",
                300,
            )
        # Undecodable live records: dead letters the live side counts.
        positions += produce(
            kafka_bootstrap, topic, [(f"y{i}".encode(), b"[1") for i in range(UNDECODABLE)]
        )
        producing.stop()
        ends = end_offsets(positions + producing.positions)
        wait_until(
            "every record folded",
            lambda: (
                (w := watermark(redis_client, name)) is not None and w.offsets.get(topic) == ends
            ),
        )
        folded = BACKLOG + producing.produced

        def caught_up(s: HistorySample) -> bool:
            return s.lag_records == 0 and s.lag_ms == 0 and s.state_keys == KEYS

        wait_until("a sample with nothing left and every key counted", lambda: sampled(caught_up))
        wait_until(
            "every dead letter in a sample",
            lambda: sampled(bool) and sum(s.dead_letters for s in history) == 2 * UNDECODABLE,
        )
        # The real-time path's writers add their counts every 250 ms and the run takes
        # them every loop: the last ones may land after the watermark and the samples.
        count = ("materializer_event_freshness_seconds_count", None)
        wait_until(
            "every folded record in the histogram",
            lambda: _scrape(metrics_port, name).get(count, 0) >= folded,
        )
        metrics = _scrape(metrics_port, name)
    except Exception:
        print(proc.log()[-6000:], file=sys.stderr)
        raise
    finally:
        if producing is not None:
            producing.stop()
        proc.stop()

    # Samples come oldest first, one a second, each as the run saw the map then.
    assert [s.at_ms for s in history] == sorted({s.at_ms for s in history})
    assert {s.state for s in history} <= {"running", "catching_up"}
    assert redis_client.xlen(history_key(name)) == len(history) <= 600 + NODE_ENTRIES
    for s in history:
        assert s.batches >= 0 and s.dead_letters >= 0
        if s.freshness_max_ms >= 0:  # the interval folded records
            assert 0 <= s.freshness_p50_ms <= s.freshness_p99_ms <= s.freshness_max_ms
            assert s.fold_rate > 0
        else:
            assert s.freshness_p50_ms == s.freshness_p99_ms == -1 and s.fold_rate == 0
        if s.batches:
            assert s.batch_ms >= max(s.add_batch_ms, 0)
        assert s.delta_lag_ms >= -1 and s.state_keys in (-1, *range(KEYS + 1))
    assert any(s.delta_lag_ms >= 0 for s in history)  # the Delta query reported batches
    assert any(s.batch_ms > 0 for s in history)  # and the fold, catching up in micro-batches
    # Every folded record counted once in the histogram, whichever side applied it.
    assert metrics[("materializer_event_freshness_seconds_count", None)] == folded
    assert metrics[("materializer_event_freshness_seconds_bucket", "+Inf")] == folded
    assert metrics[("materializer_event_freshness_seconds_sum", None)] > 0
    assert metrics[("materializer_freshness_seconds", None)] >= 0  # the gauge stays


def test_the_history_stays_within_its_cap_and_a_day_of_it_costs_what_the_docs_say(
    redis_url, redis_client
):
    """The recorder as the run drives it, without Spark: a day of 5-second samples of a busy
    map, then a history capped at 5 samples."""
    day = 17_280
    name, small = f"h{uuid.uuid4().hex[:8]}", f"h{uuid.uuid4().hex[:8]}"
    intervals = Intervals()
    config = RedisConfig(url=redis_url)
    busy = MapReport(
        "running", records_left=1_200, input_rate=5_012.3, catch_up_rate=5_020.0,
        eta_seconds=150.0, state_keys=100_412, state_bytes=24_117_248,
    )  # fmt: skip
    recorder = HistoryRecorder(config, intervals, 5.0, day)
    recorder.reported({name: busy})
    now_us = time.time_ns() // 1000
    for i in range(day + 3 * NODE_ENTRIES):
        intervals.fold_applied(name, now_us, i % 3, None)
        intervals.fold_batch(name, {"triggerExecution": 300 + i % 500, "addBatch": 250 + i % 400})
        intervals.delta_batch(name, int(time.time() * 1000), 0)
        recorder.record()
    length = redis_client.xlen(history_key(name))
    assert day <= length <= day + NODE_ENTRIES
    per_sample = redis_client.memory_usage(history_key(name), samples=0) / length
    assert per_sample < 120  # docs/operations.md#history: about 90 to 110 bytes
    print(f"history: {length} samples, {per_sample:.1f} bytes each")

    capped = HistoryRecorder(config, intervals, 1.0, 5)
    capped.reported({small: MapReport("paused")})
    for _ in range(3 * NODE_ENTRIES):
        capped.record()
    assert 5 <= redis_client.xlen(history_key(small)) <= 5 + NODE_ENTRIES

    # The readers: oldest first, from a time on, at most ``count``.
    everything = read_history(redis_client, small)
    assert [s.state for s in everything] == ["paused"] * len(everything)
    since = everything[-3].at_ms
    tail = read_history(redis_client, small, since_ms=since)
    assert tail[0].at_ms >= since and tail == [s for s in everything if s.at_ms >= since]
    assert read_history(redis_client, small, since, 2) == tail[:2]
    assert read_history(redis_client, "no-such-map") == []

    async def read_async() -> list[HistorySample]:
        client = aioredis.Redis.from_url(redis_url)
        try:
            return await read_history_async(client, small, since, 2)
        finally:
            await client.aclose()

    assert asyncio.run(read_async()) == tail[:2]
    redis_client.delete(history_key(name), history_key(small))
