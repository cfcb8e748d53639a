"""Maps managed at runtime, through ``materializer run`` and ``query-service serve`` as users
run them: how soon a map created through the HTTP front shows its first entity, and
whether the map already running stays fresh while others are created, changed and deleted.

One ``materializer run`` with one map from its file (the live map: JSON with a
schema, ``--keys`` keys, 4 partitions, dead letters on, folded by ``--mode``,
every cadence at its default) and a catalog topic of its own, polled every
200 ms; one ``query-service serve`` on the same file, its HTTP front on. Once
the live map holds every key, in Redis and in Delta, a producer thread feeds
it at ``--rate`` until the end, and one event in ``--sample-every`` is
followed until Redis shows it (produce to visible). The first
``--warmup-seconds`` are not measured (150 by default: the driver's JVM still
compiles Spark's code on the cores the batches need; see ``live.py``).

Then a ``quiet`` window of ``--window-seconds`` with no change, the
baseline, and ``--rounds`` rounds, each with a map of a new name over a
topic of its own that already holds ``--new-events`` events over
``--new-keys`` keys:

- ``create``: ``POST /v1/maps``; from just before the request until Redis
  shows any entity of the new map (the ``runtime_maps_first_entity`` line);
- ``change``: ``PUT /v1/maps/<map>/config`` with ``history: true`` added (a
  compatible change: only that map's queries restart);
- ``delete``: ``DELETE /v1/maps/<map>?purge=true``.

Each phase is a window of ``--window-seconds`` from its request; a
``runtime_maps_freshness`` line per phase gives the live map's freshness of
the events produced in its windows, over all rounds.

    .venv/bin/python bench/runtime_maps.py [--rounds 3] [--rate 5000] [--window-seconds 30]
"""

from __future__ import annotations

import argparse
import contextlib
import random
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import orjson
import redis
from confluent_kafka import Producer
from freshness import Follower, produce_at_rate
from harness import PARTITIONS, emit, produce_bulk, services, setup_line
from live import catch_up, map_section, nearest_rank, wait_for, write_config
from query_services import key_of, start_query_service

from materializer.contract.redis_layout import entity_key
from materializer.testing import create_topic, free_port
from materializer.testing.process import ManagedProcess
from query_service.event_loop import EventLoop

FIRST_ENTITY_GOAL_S = 10
FRESHNESS_GOAL_P99_MS = 1000
SEQ0 = 10_000_000
"""Above every ``seq`` of the backlog, so a sample is visible only once its own event is."""
CHUNK_SECONDS = 5.0
"""The feed's stretches of ``produce_at_rate``: how soon it stops once asked."""
PHASES = ("quiet", "create", "change", "delete")


class Feed:
    """``rate`` events/s into the live map's topic on a thread until ``stop``; one in
    ``sample_every`` handed to the follower, and when it was sent kept by its ``seq``."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        rate: int,
        keys: int,
        sample_every: int,
        follower: Follower,
    ) -> None:
        self.bootstrap, self.topic, self.rate, self.keys = bootstrap, topic, rate, keys
        self.sample_every, self.follower = sample_every, follower
        self.sent_at: dict[int, float] = {}
        self.sent = 0
        self.seconds = 0.0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="feed", daemon=True)

    def _sampled(self, key: bytes, seq: int, sent_at: float) -> None:
        if seq % self.sample_every == 0:
            self.sent_at[seq] = sent_at
            self.follower.samples.put((key, seq, sent_at))

    def _run(self) -> None:
        prod = Producer(
            {"bootstrap.servers": self.bootstrap, "linger.ms": 5, "enable.idempotence": True}
        )
        rng = random.Random(self.rate)
        started = time.perf_counter()
        try:
            while not self._stop.is_set():
                first = SEQ0 + self.sent
                produce_at_rate(
                    prod, self.topic, self.rate, CHUNK_SECONDS, self.keys, first, self._sampled, rng
                )
                self.sent += int(self.rate * CHUNK_SECONDS)
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.error = exc
        self.seconds = time.perf_counter() - started

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop after the current stretch; raise what stopped the thread early, if anything."""
        self._stop.set()
        self._thread.join()
        if self.error is not None:
            raise RuntimeError(f"the feed failed: {self.error!r}") from self.error

    def achieved(self) -> int:
        return round(self.sent / self.seconds) if self.seconds else 0


class Front:
    """The query service's HTTP front, and the processes whose logs explain a failure."""

    def __init__(self, port: int, run: ManagedProcess, query: ManagedProcess) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.run, self.query = run, query

    def call(self, method: str, path: str, expect: int, body: Any = None) -> dict[str, Any]:
        """One request; its JSON answer, or ``RuntimeError`` with both processes' log tails."""
        request = urllib.request.Request(  # noqa: S310 - a local http URL
            self.base + path,
            data=None if body is None else orjson.dumps(body),
            method=method,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=120) as r:  # noqa: S310
                status, raw = r.status, r.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        if status != expect:
            raise RuntimeError(
                f"{method} {path}: {status}, expected {expect}: {raw[:2000]!r}\n"
                f"materializer run:\n{self.run.tail()}\nquery-service:\n{self.query.tail()}"
            )
        return orjson.loads(raw)  # type: ignore[no-any-return]


def entities_shown(client: redis.Redis, name: str, keys: int) -> int:
    """How many of the new map's keys Redis shows (one ``MGET``)."""
    return sum(
        v is not None for v in client.mget([entity_key(name, key_of(i)) for i in range(keys)])
    )


def until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.perf_counter()))


def round_of(
    front: Front, client: redis.Redis, work: Path, topic: str, args: argparse.Namespace
) -> tuple[dict[str, Any], dict[str, tuple[float, float]]]:
    """Create, change and delete one map over ``topic``; its figures (what Redis and the run's
    directory ``work`` still hold of it after the delete among them) and each phase's window."""
    name = f"rt{uuid.uuid4().hex[:8]}"
    section = map_section(topic, args.mode)
    windows: dict[str, tuple[float, float]] = {}
    figures: dict[str, Any] = {"map": name}

    started = time.perf_counter()
    front.call("POST", "/v1/maps", 201, {"name": name, "config": section})
    figures["post_ms"] = round((time.perf_counter() - started) * 1000, 1)
    windows["create"] = (started, started + args.window_seconds)
    wait_for(
        f"the first entity of {name}",
        lambda: entities_shown(client, name, args.new_keys) > 0,
        300,
        front.run,
        interval=0.01,
    )
    figures["first_entity_s"] = round(time.perf_counter() - started, 3)
    until(windows["create"][1])
    figures["entities_at_change"] = entities_shown(client, name, args.new_keys)

    started = time.perf_counter()
    front.call("PUT", f"/v1/maps/{name}/config", 200, {**section, "history": True})
    figures["put_ms"] = round((time.perf_counter() - started) * 1000, 1)
    windows["change"] = (started, started + args.window_seconds)
    until(windows["change"][1])

    started = time.perf_counter()
    deleted = front.call("DELETE", f"/v1/maps/{name}?purge=true", 200)
    figures["delete_ms"] = round((time.perf_counter() - started) * 1000, 1)
    figures["entities_after_delete"] = entities_shown(client, name, args.new_keys)
    figures["purged"] = len(deleted.get("purged", []))
    windows["delete"] = (started, started + args.window_seconds)
    until(windows["delete"][1])
    figures["entities_after_delete_window"] = entities_shown(client, name, args.new_keys)
    figures["left_on_disk"] = sorted(
        f"{root}/{path.name}"
        for root in ("warehouse", "checkpoints")
        for path in (work / root).glob(f"{name}*")
    )
    log = front.run.log()
    # The run says who made each change ("map X created by api-user (version 1)").
    figures["run_logged"] = {
        "created": re.search(rf"map {name} created by \S+ \(version 1\)", log) is not None,
        "changed": re.search(rf"map {name} changed by \S+ \(version 2\)", log) is not None,
        "deleted": f"map {name} deleted by " in log,
    }
    return figures, windows


def freshness_lines(
    follower: Follower,
    feed: Feed,
    windows: list[tuple[str, float, float]],
    args: argparse.Namespace,
) -> None:
    """A line per phase: the live map's freshness of the samples sent in its windows."""
    late = [sent for _, _, sent in follower.waiting]
    seen = [
        (feed.sent_at[seq], latency)
        for seq, latency in zip(follower.sequences, follower.latencies, strict=True)
    ]
    for phase in PHASES:
        spans = [(start, end) for p, start, end in windows if p == phase]
        per_round = [
            sorted(s * 1000 for sent, s in seen if start <= sent < end) for start, end in spans
        ]
        ms = sorted(x for r in per_round for x in r)
        unresolved = sum(start <= sent < end for sent in late for start, end in spans)
        p99 = round(nearest_rank(ms, 99), 1) if ms else None
        emit(
            name="runtime_maps_freshness",
            phase=phase,
            mode=args.mode,
            rate=args.rate,
            achieved_events_per_s=feed.achieved(),
            windows=len(spans),
            window_s=args.window_seconds,
            samples=len(ms),
            unresolved=unresolved,
            p50_ms=round(nearest_rank(ms, 50), 1) if ms else None,
            p99_ms=p99,
            max_ms=round(ms[-1], 1) if ms else None,
            p99_ms_per_window=[round(nearest_rank(r, 99), 1) if r else None for r in per_round],
            goal_p99_ms=FRESHNESS_GOAL_P99_MS,
            met=p99 is not None and p99 <= FRESHNESS_GOAL_P99_MS and unresolved == 0,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mode", default="merge", help="the live map's fold mode")
    parser.add_argument("--rate", type=int, default=5000, help="the live map's events/s")
    parser.add_argument("--keys", type=int, default=100_000, help="the live map's keys")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window-seconds", type=float, default=30)
    parser.add_argument("--warmup-seconds", type=float, default=150)
    parser.add_argument("--new-events", type=int, default=2000, help="in each new map's topic")
    parser.add_argument("--new-keys", type=int, default=200, help="of each new map's events")
    parser.add_argument("--sample-every", type=int, default=10)
    parser.add_argument("--keep-logs", help="copy the run's and the query service's logs here")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="materializer-runtime-maps-"))
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, work, True)
        bootstrap, redis_url = stack.enter_context(services())
        setup_line("local[*]", 0, args.keys)
        client = redis.Redis.from_url(redis_url)
        stack.callback(client.close)
        topic = create_topic(bootstrap, PARTITIONS)
        produce_bulk(bootstrap, topic, args.keys, args.keys)  # the live map starts whole
        new_topics = [create_topic(bootstrap, PARTITIONS) for _ in range(args.rounds)]
        for new_topic in new_topics:
            produce_bulk(bootstrap, new_topic, args.new_events, args.new_keys)
        catalog = {"topic": f"maps-{uuid.uuid4().hex[:10]}", "poll_interval": "200 ms"}
        config = write_config(work, bootstrap, redis_url, topic, args.mode, catalog=catalog)
        if args.keep_logs:
            stack.callback(keep_logs, work, Path(args.keep_logs))
        started = time.perf_counter()
        run = ManagedProcess(
            [sys.executable, "-m", "materializer", "run", "-c", str(config)], work / "run.log"
        )
        stack.callback(run.stop)
        http_port = free_port()
        query = start_query_service(work, config, free_port(), http_port, EventLoop.UVLOOP)
        stack.callback(query.stop)
        front = Front(http_port, run, query)
        emit(
            name="runtime_maps_start",
            units="s",
            **catch_up(client, run, args.mode, work, args.keys, started),
        )

        follower = Follower(redis_url, args.mode)
        feed = Feed(bootstrap, topic, args.rate, args.keys, args.sample_every, follower)
        follower.thread.start()
        feed.start()
        windows: list[tuple[str, float, float]] = []
        rounds: list[dict[str, Any]] = []
        try:
            time.sleep(args.warmup_seconds)
            quiet = time.perf_counter()
            windows.append(("quiet", quiet, quiet + args.window_seconds))
            until(quiet + args.window_seconds)
            for new_topic in new_topics:
                figures, spans = round_of(front, client, work, new_topic, args)
                rounds.append(figures)
                windows += [(phase, start, end) for phase, (start, end) in spans.items()]
                emit(name="runtime_maps_round", round=len(rounds), **figures)
        except BaseException:
            with contextlib.suppress(RuntimeError):
                feed.stop()
            follower.finish(drain_seconds=0)
            raise
        feed.stop()
        follower.finish(drain_seconds=120)

        seconds = [r["first_entity_s"] for r in rounds]
        emit(
            name="runtime_maps_first_entity",
            units="s",
            new_events=args.new_events,
            new_keys=args.new_keys,
            seconds=seconds,
            min_s=min(seconds),
            median_s=round(statistics.median(seconds), 3),
            max_s=max(seconds),
            goal_s=FIRST_ENTITY_GOAL_S,
            met=max(seconds) <= FIRST_ENTITY_GOAL_S,
        )
        freshness_lines(follower, feed, windows, args)
        emit(
            name="runtime_maps_live_map_starts",
            units="count",
            # The live map's queries started once and never restarted for the others.
            starts=run.log().count(f"map {args.mode} running"),
        )


def keep_logs(work: Path, into: Path) -> None:
    into.mkdir(parents=True, exist_ok=True)
    for log in ("run.log", "query-service.log"):
        with contextlib.suppress(OSError):
            shutil.copy(work / log, into / log)


if __name__ == "__main__":
    main()
