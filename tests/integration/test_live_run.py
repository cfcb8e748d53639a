"""The real-time path through ``materializer run``, as users start it: maps with
``spark.path: realtime`` (one of each fold mode) open and catch up in micro-batches, then
fold in a shared real-time query (all in one, or each in its own with
``spark.live_maps_per_query: 1``). A kill -9 of the whole process group mid-stream, a
pause and a resume (a switch back to micro-batches and forth again) while records stream
in, a map whose Redis copy is lost meanwhile (the others fold on; the lost map, an
``aggregate`` one, seeds its states from the restored entities), and a stop by a signal to
the whole process group (a terminal's Ctrl-C, or its closing) leave Redis, the changelog,
the dead letters and the Delta tables equal to the plain-Python reference, with nothing
folded twice. In a query of its own, another map's query never starts again meanwhile."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
import pytest
import redis
from deltalake import DeltaTable

from materializer.config import load_config
from materializer.config.names import changelog_topic, dead_letter_topic
from materializer.contract.redis_layout import meta_key
from materializer.contract.table_marks import table_watermark
from materializer.contract.watermark import Watermark
from materializer.live.positions import committed, live_group
from materializer.testing import Producing
from materializer.testing.process import ManagedProcess
from materializer.testing.reference import Event
from materializer.testing.waiting import wait_until
from tests.helpers.indexes import mismatched, ready
from tests.helpers.slices import delta_map_rs, read_committed, redis_map
from tests.integration.test_live_path import (
    MODES,
    failing,
    indexed,
    live_maps,
    records,
    reference,
)

pytestmark = pytest.mark.integration

STARTED = re.compile(r"real-time query live-[\d.]+ started in [\d.]+ s for \d+ maps: (.*)")


class Streams:
    """The records produced to each map's topic, and where each partition ends."""

    def __init__(self, bootstrap: str, topics: dict[str, str]) -> None:
        self.bootstrap = bootstrap
        self.topics = topics
        self.rng = random.Random(7)
        self.produced: dict[str, list[Event]] = {name: [] for name in topics}
        self.ends: dict[str, dict[int, int]] = {name: {} for name in topics}
        self.next_seq = 0
        # One producer for every round: a producer of its own per call takes half a second
        # to start, which made a stream's rounds a second and a half apart.
        self.producer = Producing(bootstrap)
        self.lock = threading.Lock()
        self.streaming: list[Streaming] = []

    def round(self, n: int) -> None:
        with self.lock:
            for (name, topic), mode in zip(self.topics.items(), MODES, strict=True):
                batch = records(self.rng, n, self.next_seq, mode)
                for (partition, offset), (key, value) in zip(
                    self.producer.send(topic, batch), batch, strict=True
                ):
                    self.produced[name].append((partition, offset, key, value))
                    self.ends[name][partition] = max(self.ends[name].get(partition, 0), offset + 1)
            self.next_seq += n

    def stream(self, rounds: int, n: int) -> Streaming:
        """Rounds of ``n`` records a map, one every 100 ms, on a thread: at least
        ``rounds`` of them, and on until its ``join``, so that they stream in all the
        while whatever the test does meanwhile takes."""
        streaming = Streaming(self, rounds, n)
        self.streaming.append(streaming)
        return streaming

    def stop(self) -> None:
        """Every stream stopped (a test that failed midway leaves none running)."""
        for streaming in self.streaming:
            streaming.stopped.set()
        for streaming in self.streaming:
            streaming.thread.join()


class Streaming:
    """``Streams.stream``'s thread."""

    def __init__(self, streams: Streams, rounds: int, n: int) -> None:
        self.stopped = threading.Event()
        self.error: BaseException | None = None

        def run() -> None:
            try:
                done = 0
                while done < rounds or not self.stopped.is_set():
                    streams.round(n)
                    done += 1
                    time.sleep(0.1)
            except BaseException as exc:
                self.error = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self) -> None:
        """Stopped after its rounds, once every record of it is in Kafka."""
        self.stopped.set()
        self.thread.join()
        if self.error is not None:
            raise self.error


def test_realtime_maps_sharing_a_query_through_materializer_run_equal_the_reference(
    kafka_bootstrap: str, redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """All in one query, stopped by Ctrl-C (``test_live_own_queries`` runs each map in a
    query of its own, in a file of its own so that the suite's workers share the two)."""
    realtime_maps_equal_the_reference(
        kafka_bootstrap, redis_url, redis_client, tmp_path, 8, signal.SIGINT, kill=True
    )


def realtime_maps_equal_the_reference(
    kafka_bootstrap: str,
    redis_url: str,
    redis_client: redis.Redis,
    tmp_path: Path,
    per_query: int,
    stop: signal.Signals,
    *,
    kill: bool,
) -> None:
    """The scenario of the module's docstring; ``kill``: with its kill -9 and restart."""
    spark = {"path": "realtime", "live_maps_per_query": per_query}
    names, topics, path = live_maps("rt", kafka_bootstrap, redis_url, tmp_path, spark)
    config = load_config(path)
    streams = Streams(kafka_bootstrap, topics)
    log = tmp_path / "run.log"
    args = [sys.executable, "-m", "materializer", "run", "-c", str(path)]
    proc: ManagedProcess | None = None

    def starts(name: str) -> int:
        """How many times a real-time query started with the map in it."""
        found = STARTED.findall(log.read_text(errors="replace"))
        return sum(name in members.split(", ") for members in found)

    def live(name: str, joins: int) -> bool:
        """Whether a real-time query with the map in it started after its ``joins``-th
        join of the path (the map's micro-batch fold stops as it joins)."""
        joined = 0
        for line in log.read_text(errors="replace").splitlines():
            if f"map {name}: caught up, folds on the real-time path" in line:
                joined += 1
            elif (
                joined >= joins
                and (found := STARTED.search(line))
                and name in found.group(1).split(", ")
            ):
                return True
        return False

    def all_live(joins: int) -> bool:
        return all(live(name, joins) for name in names)

    def alive() -> bool:
        return proc is not None and proc.alive()

    def settled() -> bool:
        """Every record in Redis, and its changelog and dead letters committed: each map's
        watermark, and the real-time path's committed position, past the last record."""
        for name in names:
            watermark = Watermark.from_hash(redis_client.hgetall(meta_key(name)))
            ends = streams.ends[name]
            if watermark is None:
                return False
            reached = watermark.offsets.get(topics[name], {})
            if any(reached.get(p, 0) < end for p, end in ends.items()):
                return False
        return True

    def paths() -> dict[str, str]:
        """Each map's fold path, as ``materializer status --json`` says."""
        shown = subprocess.run(
            [sys.executable, "-m", "materializer", "status", "--json", "-c", str(path)],
            check=True,
            capture_output=True,
            timeout=120,
        )
        views = [orjson.loads(line) for line in shown.stdout.splitlines()]
        return {v["map"]: v["fold_path"] for v in views}

    def table_offsets(name: str) -> dict[int, int] | None:
        """The source offsets the map's Delta table's newest commit says it holds."""
        watermark = table_watermark(DeltaTable(str(tmp_path / "warehouse" / name)))
        return None if watermark is None else watermark.offsets.get(topics[name])

    def control(verb: str, name: str) -> None:
        subprocess.run(
            [sys.executable, "-m", "materializer", verb, "-c", str(path), name],
            check=True,
            capture_output=True,
            timeout=120,
        )

    streams.round(400)  # a backlog: each map opens and catches up in micro-batches first
    try:
        proc = ManagedProcess(args, log)
        wait_until("every map on the real-time path", lambda: all_live(1), 300, alive)
        wait_until("the status says so", lambda: paths() == {n: "realtime" for n in names}, 60)
        joins = 1
        if kill:  # records stream in while the whole process group is killed
            streaming = streams.stream(40, 10)
            time.sleep(0.3)
            proc.kill()
            streaming.join()
            streams.round(200)
            proc = ManagedProcess(args, log)  # the log goes on: more joins after the restart
            joins += 1
            wait_until("every map back on the path", lambda: all_live(joins), 300, alive)
        # A pause and a resume while records stream in: the map leaves the shared query,
        # stops, and starts again in micro-batches from where the real-time path left it,
        # then joins again; the other map folds on.
        streaming = streams.stream(60, 10)
        other = starts(names[1])
        control("pause", names[0])
        control("resume", names[0])
        streaming.join()
        joins += 1
        wait_until("the map on the path again", lambda: live(names[0], joins), 300, alive)
        # Redis loses the first map's copy (every key of it, as a server restarted empty
        # would) while records stream in: that map fails on the shared query and is
        # restored from its Delta table and changelog; the other folds on, never leaving.
        streaming = streams.stream(40, 10)
        time.sleep(0.5)
        # All at once, in one script, as a restart would: keys deleted one by one while the
        # fold writes would come back from an empty state before the marker goes.
        redis_client.eval(
            "for _, k in ipairs(redis.call('KEYS', ARGV[1])) do redis.call('DEL', k) end",
            0,
            f"{names[0]}*",
        )
        wait_until("the copy restored", lambda: "copy restored" in log.read_text(), 300, alive)
        streaming.join()
        joins += 1
        wait_until("the map live again", lambda: live(names[0], joins), 300, alive)
        assert f"map {names[1]} left" not in log.read_text()
        # The other map's query stopped for the first map's changes only when they shared it.
        if per_query == 1:
            assert starts(names[1]) == other
        else:
            assert starts(names[1]) > other
        streams.round(100)
        wait_until("every record folded", settled, 240, alive)
        # While the maps fold on the real-time path, their tables' commits come to say they
        # hold every record (the run's marks of the path's committed positions). A MERGE
        # records the newest mark that came before it, so a trickle of records keeps the
        # tables merging while the marks of every record so far arrive.
        held = {name: dict(streams.ends[name]) for name in names}

        def table_holds(name: str) -> bool:
            streams.round(1)
            offsets = table_offsets(name) or {}
            return all(offsets.get(p, 0) >= end for p, end in held[name].items())

        for name in names:
            wait_until(
                f"map {name}'s table to say it holds every record",
                lambda name=name: table_holds(name),
                120,
                alive,
                interval=0.5,
            )
        streaming = streams.stream(20, 10)
        time.sleep(0.2)
        before_stop = len(log.read_text(errors="replace"))
        os.killpg(proc.proc.pid, stop)  # mid-stream: a drain, then the end
        proc.proc.wait(150)
        assert proc.proc.returncode == 0, proc.tail(60)
        # The shared Delta query merged each map's changelog past the map's own Delta
        # checkpoint, which stood still while the map was on the path: the drain's own
        # query took up from where the table stood.
        drained = log.read_text(errors="replace")[before_stop:]
        for name in names:
            changelog = changelog_topic(config, name)
            assert f"{changelog}: the table has merged past its Delta checkpoint" in drained
        streaming.join()
    except BaseException:
        if proc is not None:
            print(proc.tail(120), file=sys.stderr)
        raise
    finally:
        streams.stop()
        if proc is not None:
            proc.stop()

    # The shared queries' checkpoints, named after their process, went with the stopped run;
    # the killed run's alone are left (its fold queries' and its Delta query's).
    left = sorted(p.name for p in (tmp_path / "checkpoints" / "__live__").iterdir())
    if kill:
        worker = left[0].rpartition(".")[0]
        queries = [f"{worker}.{i}" for i in range(1 if per_query > 1 else len(names))]
        assert left == [*queries, f"{worker}.delta"], left
    else:
        assert left == [], left
    for name, mode in zip(names, MODES, strict=True):
        topic = topics[name]
        # The run ended with its drain: the real-time path's committed position equals the
        # watermark (no transaction left open), and the Delta table holds what Redis holds.
        watermark = Watermark.from_hash(redis_client.hgetall(meta_key(name)))
        assert watermark is not None
        reached = watermark.offsets[topic]
        positions = committed(config.kafka, live_group(name), {topic: sorted(reached)})
        assert watermark.app_id == "live", name
        assert positions == {topic: reached}, name
        produced = [e for e in streams.produced[name] if e[1] < reached.get(e[0], 0)]
        expected = reference(mode, produced)
        assert redis_map(redis_client, name) == expected, name
        # Its indexes, kept by the fold (on both paths, through the kill and the restore,
        # built again where Redis lost them), hold each entity's entry and nothing else.
        assert ready(redis_client, name, indexed(mode)), name
        assert mismatched(redis_client, name, expected, indexed(mode)) == [], name
        assert delta_map_rs(tmp_path / "warehouse" / name) == expected, name
        assert table_offsets(name) == reached, name  # the last mark, once its writers stopped
        last: dict[str, bytes | None] = {}
        for msg in read_committed(kafka_bootstrap, changelog_topic(config, name, 0)):
            last[msg.key().decode()] = msg.value()
        assert {k: orjson.loads(v) for k, v in last.items() if v is not None} == expected
        # Every record that cannot be folded is a dead letter once: none lost, none twice.
        letters = read_committed(kafka_bootstrap, dead_letter_topic(config, name))
        sent = sorted((k, v) for _, _, k, v in produced if failing(v))
        assert sorted((m.key(), m.value()) for m in letters) == sent, name
