"""The broker goes away and comes back under a live ``materializer run``: restarted (same
port, same data), or stalled by SIGSTOP and let go by SIGCONT.

Nobody steps in: the run must keep going (or start its queries again by
itself), catch up, and have folded every event exactly once into Redis and
Delta, as an aggregate's counts and sums against a plain-Python fold show. On the
real-time path (which folds ``latest`` maps) the map must fold on there, or go back
to micro-batches and come back, never fail.
"""

from __future__ import annotations

import random
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
import yaml

from materializer.contract.redis_layout import meta_key, status_key
from materializer.contract.status import MapReport
from materializer.live.positions import live_group
from materializer.testing import KafkaBroker, create_topic, produce
from materializer.testing.process import ManagedProcess
from materializer.testing.reference import fold_aggregate, fold_latest
from materializer.testing.waiting import wait_until
from tests.helpers.slices import FIELDS, delta_map_rs, group_offsets, redis_map, slice_config

AGGREGATES = {"events": {"fn": "count"}, "age_total": {"fn": "sum", "field": "age"}}
REFERENCE = {name: (a["fn"], a.get("field")) for name, a in AGGREGATES.items()}

STALL_SECONDS = 15.0
"""Longer than the group offsets' commit timeout and a client's request timeouts, shorter
than a producer's delivery timeout: requests time out and connections are made again."""


class LiveRun:
    """One map folding an aggregate of a fresh topic in a ``materializer run``, and every
    event produced to that topic so far. The map's name is new too: the tests share one
    Redis."""

    def __init__(
        self,
        broker: KafkaBroker,
        redis_url: str,
        client: redis.Redis,
        tmp_path: Path,
        path: str = "microbatch",
    ) -> None:
        self.name = f"outage{uuid.uuid4().hex[:8]}"
        self.broker = broker
        self.bootstrap = broker.bootstrap_servers
        self.topic = create_topic(self.bootstrap, 2)
        self.client = client
        self.tmp_path = tmp_path
        self.path = path
        fold = {"mode": "aggregate", "aggregates": AGGREGATES}
        if path == "realtime":
            fold = {"mode": "latest"}
        doc = slice_config(
            tmp_path, self.bootstrap, redis_url, self.topic, map_name=self.name, fold=fold
        )
        doc["spark"]["path"] = path
        if path == "realtime":  # room for the real-time query's tasks beside the cores' worth
            doc["spark"]["master"] = "local[*]"
        config_file = tmp_path / "maps.yaml"
        config_file.write_text(yaml.safe_dump(doc))
        self.rng = random.Random(3)
        self.produced: list[tuple[int, int, bytes, bytes]] = []
        args = [sys.executable, "-m", "materializer", "run", "-c", str(config_file)]
        self.proc = ManagedProcess(args, tmp_path / "run.log")

    def send(self, n: int) -> None:
        """Produce ``n`` events (50 keys), waiting until the broker has them all."""
        records = []
        for _ in range(n):
            key = f"k{self.rng.randrange(50)}"
            value = orjson.dumps({"id": key, "age": self.rng.randrange(90)})
            records.append((key.encode(), value))
        positions = produce(self.bootstrap, self.topic, records)
        self.produced.extend(
            (p, o, k, v) for (p, o), (k, v) in zip(positions, records, strict=True)
        )

    def stall(self, events: int) -> None:
        """Stop the broker (SIGSTOP) for ``STALL_SECONDS`` while ``events`` are produced,
        then let it go (SIGCONT): the producer delivers them once it answers again."""
        with ThreadPoolExecutor(1) as pool:
            self.broker.pause()
            try:
                during = pool.submit(self.send, events)
                time.sleep(STALL_SECONDS)
            finally:
                self.broker.resume()
            during.result()

    def settled(self) -> bool:
        """Whether the run's last batch is wholly done: its consumer group, written last (or
        on the real-time path, committed with the changelog), holds the end offsets of every
        event produced."""
        ends: dict[int, int] = {}
        for partition, offset, _, _ in self.produced:
            ends[partition] = max(ends.get(partition, 0), offset + 1)
        groups = [f"materializer.{self.name}"]
        if self.path == "realtime":
            groups.append(live_group(self.name))
        return any(
            group_offsets(self.bootstrap, group, self.topic) == {self.topic: ends}
            for group in groups
        )

    def reference(self) -> dict[str, Any]:
        """The plain-Python fold of every event produced."""
        if self.path == "realtime":
            return fold_latest(self.produced, "id", FIELDS)
        return fold_aggregate(self.produced, "id", REFERENCE)

    def folded(self) -> bool:
        """Whether Redis holds the fold of every event produced, each once."""
        return redis_map(self.client, self.name) == self.reference()

    def on_the_real_time_path(self) -> bool:
        """Whether the map folds on the real-time path, as its status says."""
        report = MapReport.from_hash(self.client.hgetall(status_key(self.name)))
        return report is not None and report.fold_path == "realtime"

    def live_if_realtime(self) -> None:
        """On the real-time path, wait until the map folds there and records it folded show
        (the outage then meets the path's writers)."""
        if self.path == "realtime":
            wait_until("the map on the real-time path", self.on_the_real_time_path, 300)
            self.send(20)
            wait_until("its records in Redis", self.folded)
            assert self.client.hget(meta_key(self.name), "app_id") == b"live"

    def check_every_event_folded_once(self) -> None:
        """Redis and Delta catch up with the reference fold; the run still runs the map (on
        the real-time path again, if that is its path)."""
        wait_until("every event in Redis, once", self.folded, timeout=300)
        reference = self.reference()
        table = self.tmp_path / "warehouse" / self.name
        # The table is made by the Delta query, which starts after the map's opening batch.
        wait_until(
            "every event in Delta, once",
            lambda: delta_map_rs(table) == reference,
            retry_errors=True,
        )
        assert self.proc.alive(), self.proc.tail()
        report = MapReport.from_hash(self.client.hgetall(status_key(self.name)))
        assert report is not None and report.state == "running", self.proc.tail()
        if self.path == "realtime":
            self.live_if_realtime()


@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", ["microbatch", "realtime"])
def test_a_broker_restarted_under_a_live_run_loses_and_repeats_nothing(
    redis_url, redis_client, tmp_path: Path, path: str
):
    with KafkaBroker(workdir=tmp_path / "kafka") as broker:
        run = LiveRun(broker, redis_url, redis_client, tmp_path, path)
        try:
            run.send(200)
            wait_until("the first events in Redis", run.folded)
            run.live_if_realtime()
            broker.restart()
            run.send(200)
            run.check_every_event_folded_once()
        finally:
            run.proc.stop()


@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", ["microbatch", "realtime"])
def test_a_broker_stalled_under_a_live_run_loses_and_repeats_nothing(
    redis_url, redis_client, tmp_path: Path, path: str
):
    with KafkaBroker(workdir=tmp_path / "kafka") as broker:
        run = LiveRun(broker, redis_url, redis_client, tmp_path, path)
        try:
            run.send(200)
            wait_until("the first events in Redis", run.folded)
            run.live_if_realtime()
            # Most often the first batch is still on its way: its changelog and its consumer
            # group's first commit (a client not connected yet) meet a broker that does not
            # answer.
            run.stall(100)
            wait_until("the batches so far wholly done", run.settled)
            # A batch on its way when the broker stops answering, from connected clients.
            run.send(100)
            run.stall(200)
            run.send(200)
            run.check_every_event_folded_once()
        finally:
            broker.resume()  # a test that failed while the broker was stopped
            run.proc.stop()
