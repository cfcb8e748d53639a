"""Produce-to-visible freshness: events fed at a steady rate, followed until Redis shows them.

Apart from ``harness.py`` because only the freshness benchmarks (``pipeline.py``,
``live.py``) follow events; the others import the shared harness without it.
"""

from __future__ import annotations

import collections
import contextlib
import queue
import random
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson
import redis
from confluent_kafka import Producer
from harness import PARTITIONS, batch_profile, event, map_config

from materializer import job
from materializer.contract.redis_layout import entity_key
from materializer.testing import create_topic


class Follower:
    """Follows sampled events until Redis shows them: ``seq`` at least theirs under their key.

    Oldest first: while the oldest sample is not visible, one GET every 5 ms;
    once it is, the waiting samples are checked in chunks of 256 until one is not.
    """

    def __init__(
        self, redis_url: str, map_name: str, map_of: Callable[[bytes], str] | None = None
    ) -> None:
        """``map_of``: the map a sampled key is in, where the events feed several."""
        self.client = redis.Redis.from_url(redis_url)
        self.map_name = map_name
        self.map_of = map_of or (lambda _: map_name)
        self.samples: queue.SimpleQueue[tuple[bytes, int, float]] = queue.SimpleQueue()
        self.waiting: collections.deque[tuple[bytes, int, float]] = collections.deque()
        self.latencies: list[float] = []
        self.sequences: list[int] = []
        """Each latency's event ``seq``, in the same order."""
        self.visible_at: dict[tuple[bytes, int], float] = {}
        """When each sample (key, seq) was first seen visible."""
        self.producing = True
        self.deadline = float("inf")
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _visible(self, items: list[tuple[bytes, int, float]]) -> list[bool]:
        raw = self.client.mget([entity_key(self.map_of(k), k.decode()) for k, _, _ in items])
        return [
            r is not None and orjson.loads(r)["seq"] >= seq
            for r, (_, seq, _) in zip(raw, items, strict=True)
        ]

    def _drain_queue(self) -> None:
        with contextlib.suppress(queue.Empty):
            while True:
                self.waiting.append(self.samples.get_nowait())

    def _run(self) -> None:
        while time.perf_counter() < self.deadline:
            self._drain_queue()
            if not self.waiting:
                if not self.producing:
                    return
                time.sleep(0.005)
                continue
            if not self._visible([self.waiting[0]])[0]:
                time.sleep(0.005)
                continue
            while self.waiting:
                chunk = [self.waiting.popleft() for _ in range(min(256, len(self.waiting)))]
                seen = self._visible(chunk)
                now = time.perf_counter()
                for (key, seq, sent), ok in zip(chunk, seen, strict=True):
                    if ok:
                        self.latencies.append(now - sent)
                        self.sequences.append(seq)
                        self.visible_at[(key, seq)] = now
                late = [item for item, ok in zip(chunk, seen, strict=True) if not ok]
                if late:
                    self.waiting.extendleft(reversed(late))
                    break

    def finish(self, drain_seconds: float) -> int:
        """Stop after everything is seen or ``drain_seconds``; how many were never seen."""
        self.producing = False
        self.deadline = time.perf_counter() + drain_seconds
        self.thread.join(drain_seconds + 30)
        self._drain_queue()
        self.client.close()
        return len(self.waiting)


def freshness(
    bootstrap: str,
    redis_url: str,
    spark: Any,
    work: Path,
    master: str,
    rate: int,
    seconds: float,
    keys: int,
    sample_every: int,
    name: str = "fresh",
    fold: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Produce at ``rate`` into a live, caught-up map; produce-to-visible latencies.

    The entity must carry the event's ``seq`` (for ``aggregate``, declare
    ``last`` of ``seq``): a sample is visible once its key shows its seq or later.
    """
    topic = create_topic(bootstrap, PARTITIONS)
    cfg = map_config(bootstrap, redis_url, work, master, topic, name, fold)
    queries = job.start_map(spark, cfg, name)
    try:
        prod = Producer(
            {
                "bootstrap.servers": bootstrap,
                "linger.ms": 5,
                "compression.type": "lz4",
                "enable.idempotence": True,
            }
        )
        rng = random.Random(7)
        # Warm up: the first batch of a new query carries its start-up cost (table creation).
        for i in range(100):
            k, v = event(0, i, rng)
            prod.produce(topic, key=k, value=v)
        prod.flush(10)
        queries.process_all_available()

        follower = Follower(redis_url, name)
        follower.thread.start()

        def sampled(key: bytes, seq: int, sent_at: float) -> None:
            if seq % sample_every == 0:
                follower.samples.put((key, seq, sent_at))

        achieved = produce_at_rate(prod, topic, rate, seconds, keys, 0, sampled, rng)
        sent = int(rate * seconds)
        unresolved = follower.finish(drain_seconds=120)
        # Redis is written before Delta in each batch: let the last MERGE finish, so the
        # profile covers every batch and stopping interrupts nothing.
        queries.process_all_available()
        profile = batch_profile(queries.fold)
    finally:
        queries.stop()
    return {
        "offered_events_per_s": rate,
        "achieved_events_per_s": achieved,
        "seconds": seconds,
        "events": sent,
        "sample_every": sample_every,
        **latency_fields(follower.latencies),
        "unresolved": unresolved,
        "target_p99_ms": 1000,
    }, profile


def latency_fields(latencies: Sequence[float]) -> dict[str, Any]:
    """A line's samples and their percentiles in milliseconds, from latencies in seconds."""
    ms = sorted(x * 1000 for x in latencies)
    q = statistics.quantiles(ms, n=100) if len(ms) >= 2 else [float("nan")] * 99
    return {
        "samples": len(ms),
        "p50_ms": round(q[49], 1),
        "p90_ms": round(q[89], 1),
        "p99_ms": round(q[98], 1),
        "max_ms": round(ms[-1], 1) if ms else None,
    }


def produce_at_rate(
    prod: Producer,
    topic: str | Sequence[str],
    rate: int,
    seconds: float,
    keys: int,
    first_seq: int,
    on_sent: Any,
    rng: random.Random,
    encode: Callable[[int, int, random.Random], tuple[bytes, bytes]] = event,
) -> int:
    """Events ``first_seq + 1 ...`` at a steady ``rate`` for ``seconds``, each handed to
    ``on_sent(key, seq, sent_at)``; the rate achieved. Over several topics, a key's events
    all go to one of them (``topic_of``). ``encode(seq, key index, rng)`` makes each one
    (``harness.event``'s JSON by default)."""
    topics = [topic] if isinstance(topic, str) else list(topic)
    total = int(rate * seconds)
    started = time.perf_counter()
    sent = 0
    while sent < total:
        due = min(total, int(rate * (time.perf_counter() - started)))
        while sent < due:
            seq = first_seq + sent + 1
            index = rng.randrange(keys)
            k, v = encode(seq, index, rng)
            while True:
                try:
                    prod.produce(topics[topic_of(index, len(topics))], key=k, value=v)
                    break
                except BufferError:
                    prod.poll(0.01)
            on_sent(k, seq, time.perf_counter())
            sent += 1
        prod.poll(0)
        time.sleep(0.001)
    achieved = round(sent / (time.perf_counter() - started))
    prod.flush(30)
    return achieved


def topic_of(key_index: int, topics: int) -> int:
    """The topic (of ``topics``) a key's events go to: each map of a run of several reads
    one, and folds the keys its topic gets."""
    return key_index % topics
