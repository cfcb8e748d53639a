"""A worker group of real ``materializer run`` processes sharing maps: a worker killed with
``kill -9``, one that joins and one that leaves, one paused past its session and fenced,
on one Redis server or a cluster with checkpoints in an object store. Every map ends
equal to its plain-Python reference, in Redis, in Delta and in its changelog read as
committed; an aggregate map counts each event, so an event folded twice shows."""

from __future__ import annotations

import asyncio
import copy
import os
import random
import re
import signal
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import orjson
import pytest
import redis
import yaml
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
from redis.cluster import RedisCluster as ClusterClient

from materializer.config import AppConfig, parse_config
from materializer.group.fencing import take_over
from materializer.redis.functions import FENCED, LATEST, LIVE, PUT
from materializer.testing import free_port, produce
from materializer.testing.group import running_workers
from materializer.testing.object_store import S3Server
from materializer.testing.process import ManagedProcess
from materializer.testing.redis import RedisCluster
from materializer.testing.reference import fold_aggregate, fold_latest
from materializer.testing.waiting import wait_until
from tests.helpers.held_writes import HeldWrites
from tests.helpers.query_redis import front
from tests.helpers.slices import (
    FIELDS,
    GROUP_AGGREGATES,
    SCHEMA,
    delta_map_rs,
    group_config,
    redis_map,
)

REFERENCE = {name: (a["fn"], a.get("field")) for name, a in GROUP_AGGREGATES.items()}


class Stream:
    """Events produced to each topic on a thread until stopped, remembered for the reference."""

    def __init__(self, bootstrap: str, topics: list[str], seed: int = 1) -> None:
        self._bootstrap, self._topics = bootstrap, topics
        self._rng = random.Random(seed)
        self._stop = threading.Event()
        self.events: dict[str, list[tuple[int, int, bytes, bytes | None]]] = {t: [] for t in topics}
        self._round = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def burst(self, n: int = 20) -> None:
        """``n`` events to each topic."""
        for topic in self._topics:
            batch = []
            for _ in range(n):
                key = f"k{self._rng.randrange(50)}"
                age = self._round * 1000 + len(batch)
                batch.append((key.encode(), orjson.dumps({"id": key, "name": topic, "age": age})))
            positions = produce(self._bootstrap, topic, batch)
            self.events[topic] += [
                (p, o, k, v) for (p, o), (k, v) in zip(positions, batch, strict=True)
            ]
        self._round += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            self.burst()
            self._stop.wait(0.2)

    def __enter__(self) -> Stream:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def reference(name: str, events: list[tuple[int, int, bytes, bytes | None]]) -> dict[str, Any]:
    if name.endswith("agg"):
        return fold_aggregate(events, "id", REFERENCE)
    return fold_latest(events, "id", FIELDS)


def changelog(bootstrap: str, topic: str) -> dict[str, Any]:
    """The changelog read as committed, each key's last record (a tombstone drops it)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=30)
        state: dict[str, Any] = {}
        for partition in metadata.topics[topic].partitions:
            consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
            while True:
                msg = consumer.poll(10)
                assert msg is not None, f"{topic}[{partition}]: no end of partition"
                if msg.error() is not None:
                    assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                    break
                key = msg.key().decode()
                if msg.value() is None:
                    state.pop(key, None)
                else:
                    state[key] = orjson.loads(msg.value())
        return state
    finally:
        consumer.close()


class Group:
    """Worker processes of one group, by name."""

    def __init__(self, tmp: Path, config_file: Path) -> None:
        self._tmp, self._config_file = tmp, config_file
        self.workers: dict[str, ManagedProcess] = {}

    def start(
        self, name: str, metrics_port: int = 0, config_file: Path | None = None
    ) -> ManagedProcess:
        """Start worker ``name``, with the group's config file or one of its own."""
        config = self._config_file if config_file is None else config_file
        args = [sys.executable, "-m", "materializer", "run", "-c", str(config)]
        args += ["--metrics-port", str(metrics_port)]
        env = {**os.environ, "MATERIALIZER_WORKER_ID": name}
        self.workers[name] = ManagedProcess(args, self._tmp / f"{name}.log", env=env)
        return self.workers[name]

    def alive(self) -> bool:
        return all(w.alive() for w in self.workers.values())

    def logs(self) -> str:
        return "\n".join(f"--- {n}\n{w.tail(30)}" for n, w in self.workers.items())

    def stop(self) -> None:
        for worker in self.workers.values():
            worker.stop()

    def wait(self, what: str, condition: Callable[[], bool], timeout: float = 240) -> None:
        """``wait_until`` with every worker's log tail in its error."""
        try:
            wait_until(what, condition, timeout=timeout)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n{self.logs()}") from None


@pytest.fixture
def group_of(tmp_path: Path) -> Iterator[Callable[[dict[str, Any]], Group]]:
    made: list[Group] = []

    def make(doc: dict[str, Any]) -> Group:
        config_file = tmp_path / "maps.yaml"
        config_file.write_text(yaml.safe_dump(doc))
        made.append(Group(tmp_path, config_file))
        return made[-1]

    yield make
    for group in made:
        group.stop()


def assert_equal_to_reference(
    client: Any, cfg: AppConfig, stream: Stream, topics: dict[str, str], bootstrap: str
) -> None:
    for name, topic in topics.items():
        expected = reference(name, stream.events[topic])
        wait_until(
            f"map {name} to equal its reference in Redis",
            lambda name=name, expected=expected: redis_map(client, name) == expected,
            timeout=120,
        )
        wait_until(
            f"map {name} to equal its reference in Delta",
            lambda name=name, expected=expected: (
                delta_map_rs(Path(cfg.delta.root) / name) == expected
            ),
            timeout=120,
        )
        assert changelog(bootstrap, cfg.maps[name].changelog.topic) == expected, name


@pytest.mark.timeout(900)
def test_two_workers_share_four_maps_through_a_kill_a_join_and_a_graceful_leave(
    kafka_bootstrap, redis_url, redis_client: redis.Redis, new_topic, tmp_path: Path, group_of
):
    tag = uuid.uuid4().hex[:6]
    topics = {f"{n}{tag}": new_topic(2) for n in ("a", "b", "c_agg", "d_agg")}
    names = list(topics)
    doc = group_config(tmp_path, kafka_bootstrap, redis_url, topics, f"workers-{tag}")
    cfg = parse_config(doc)
    group = group_of(doc)
    with Stream(kafka_bootstrap, list(topics.values())) as stream:
        group.start("w1")
        port = free_port()
        group.start("w2", metrics_port=port)

        def shared() -> bool:
            owners = running_workers(redis_client, names)
            return len(owners) == 4 and sorted(owners.values()).count("w1") == 2

        group.wait("both workers to run two maps each", shared)

        group.workers["w1"].kill()  # kill -9 of its whole process group
        group.wait(
            "w2 to run every map",
            lambda: (
                set(running_workers(redis_client, names).values()) == {"w2"}
                and len(running_workers(redis_client, names)) == 4
            ),
        )
        group.start("w3")
        group.wait(
            "w3 to take a fair share",
            lambda: (
                sorted(running_workers(redis_client, names).values()) == ["w2", "w2", "w3", "w3"]
            ),
        )
        group.workers["w3"].stop()  # SIGTERM: it ends its batches and leaves the group
        assert group.workers["w3"].proc.returncode == 0, group.workers["w3"].tail()
        group.wait(
            "w2 to run every map again",
            lambda: list(running_workers(redis_client, names).values()) == ["w2"] * 4,
        )
    stream.burst()
    assert_equal_to_reference(redis_client, cfg, stream, topics, kafka_bootstrap)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
        metrics = page.read().decode()
    for name in names:
        assert f'materializer_worker_map{{map="{name}",worker="w2"}} 1.0' in metrics
    # The leaver drained, then left; the stayer logged what moved to it and why.
    w3 = group.workers["w3"].log()
    assert w3.index("stopped") < w3.index("left group"), w3
    assert "assigned to this worker" in group.workers["w2"].log()


@pytest.mark.timeout(900)
def test_a_whole_group_stopped_at_once_leaves_every_delta_table_equal_to_redis(
    kafka_bootstrap, redis_url, redis_client: redis.Redis, new_topic, tmp_path: Path, group_of
):
    """Both workers get SIGTERM together, as a rollout's scale-to-zero sends it: no next owner
    comes, so each worker must bring its maps' tables up to Redis before it leaves. The
    tables' own trigger (ten minutes) would not have run again since their first batch."""
    tag = uuid.uuid4().hex[:6]
    topics = {f"{n}{tag}": new_topic(2) for n in ("a", "b", "c_agg", "d_agg")}
    names = list(topics)
    doc = group_config(tmp_path, kafka_bootstrap, redis_url, topics, f"workers-{tag}")
    doc["delta"]["trigger_interval"] = "10 minutes"
    cfg = parse_config(doc)
    group = group_of(doc)
    with Stream(kafka_bootstrap, list(topics.values())) as stream:
        group.start("w1")
        group.start("w2")
        group.wait(
            "both workers to run two maps each",
            lambda: (
                sorted(running_workers(redis_client, names).values()) == ["w1", "w1"] + ["w2", "w2"]
            ),
        )
        stream.burst()
    for name, topic in topics.items():
        expected = reference(name, stream.events[topic])
        group.wait(
            f"map {name} to equal its reference in Redis",
            lambda name=name, expected=expected: redis_map(redis_client, name) == expected,
        )
    workers = list(group.workers.values())
    for worker in workers:  # at once: neither has left when the other is told
        worker.proc.send_signal(signal.SIGTERM)
    for worker in workers:
        worker.proc.wait(120)
        assert worker.proc.returncode == 0, worker.tail()
    for name, topic in topics.items():
        expected = reference(name, stream.events[topic])
        assert redis_map(redis_client, name) == expected, name
        assert delta_map_rs(Path(cfg.delta.root) / name) == expected, name
        assert changelog(kafka_bootstrap, cfg.maps[name].changelog.topic) == expected, name
    for worker in workers:  # each drained its own maps, then left
        log = worker.log()
        assert log.index("stopped") < log.index("left group"), log


@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", ["microbatch", "realtime"])
def test_a_worker_paused_past_its_session_is_fenced_and_writes_nothing_more(
    kafka_bootstrap,
    redis_url,
    redis_client: redis.Redis,
    new_topic,
    tmp_path: Path,
    group_of,
    path: str,
):
    """The paused worker's write in flight is its micro-batch fold's, or, on the real-time
    path, its real-time query's (the JVM's writer, calling the same functions)."""
    tag = uuid.uuid4().hex[:6]
    topics = {f"{n}{tag}": new_topic(2) for n in ("p", "q_agg")}
    names = list(topics)
    doc = group_config(tmp_path, kafka_bootstrap, redis_url, topics, f"fenced-{tag}")
    if path == "realtime":
        # Two task slots beyond the cores: room for a map's two partitions.
        doc["spark"].update(path="realtime", master="local[4]")
    cfg = parse_config(doc)
    group = group_of(doc)
    server = urlsplit(redis_url)
    assert server.hostname is not None and server.port is not None
    with HeldWrites((server.hostname, server.port)) as writes:
        # w1 reaches Redis through the proxy, which can hold the write it has in flight.
        own = copy.deepcopy(doc)
        own["redis"]["url"] = urlunsplit(server._replace(netloc=f"127.0.0.1:{writes.port}"))
        w1_config = tmp_path / "w1.yaml"
        w1_config.write_text(yaml.safe_dump(own))
        stream = Stream(kafka_bootstrap, list(topics.values()))  # bursts by hand, no thread
        w1 = group.start("w1", config_file=w1_config)
        group.start("w2")
        group.wait(
            "each worker to run one map",
            lambda: sorted(running_workers(redis_client, names).values()) == ["w1", "w2"],
        )
        lost = next(n for n, w in running_workers(redis_client, names).items() if w == "w1")
        claims = re.findall(rf"map {lost} taken over by worker w1 \(epoch (\d+)\)", w1.log())
        assert claims, w1.tail()
        epoch = int(claims[-1])  # its last claim: the group may have moved the map before
        if path == "realtime":
            stream.burst()  # a batch that shows the map caught up: it joins the path
            group.wait(
                "w1 to fold its map on the real-time path",
                lambda: (
                    re.search(rf"real-time query \S+ started .*: .*\b{lost}\b", w1.log())
                    is not None
                ),
            )

        # w1 pauses in the middle of a batch of its map, its write not yet sent.
        function = LIVE if path == "realtime" else PUT if lost.endswith("agg") else LATEST
        writes.arm(b"FCALL\r\n$%d\r\n%s\r\n" % (len(function), function.encode()))
        stream.burst()
        group.wait("w1 to send its next write of the map", writes.held.is_set)
        w1.pause()  # SIGSTOP to its process group: driver, JVM, workers
        group.wait(
            "w2 to take over the paused worker's map",
            lambda: running_workers(redis_client, names) == dict.fromkeys(names, "w2"),
        )
        stream.burst()  # folded by w2 while w1 sleeps on its batch
        expected = reference(lost, stream.events[topics[lost]])
        group.wait("w2 to fold the map", lambda: redis_map(redis_client, lost) == expected)

        # The late write reaches Redis after w2's claim: the fold's function refuses it.
        writes.release()
        wait_until("Redis to answer the late write", lambda: FENCED.encode() in writes.replies)
        refusal = bytes(writes.replies).decode()
        assert refusal.startswith(f"-{FENCED} epoch {epoch} is no longer"), refusal
        assert redis_map(redis_client, lost) == expected

        w1.resume()
        if path == "microbatch":
            # Woken, w1 reads the refusal: the map's batch fails on it, and its log says why.
            fence = (
                f"map {lost}: fenced: another worker took the map over "
                f"(this worker's epoch {epoch} is older than the owner's"
            )
            group.wait("w1 to log the fence", lambda: fence in w1.log())
        else:
            # The refusal fails the real-time query as w1's group session, long over, ends:
            # whichever w1 sees first, it stops the map's queries and says so.
            stopped = f"map {lost}: .*; its queries stopped, the worker goes on with its others"
            group.wait("w1 to stop the map", lambda: re.search(stopped, w1.log()) is not None)
        # It goes on: back in the group, it takes a fair share again.
        group.wait(
            "w1 to run a map again",
            lambda: sorted(running_workers(redis_client, names).values()) == ["w1", "w2"],
        )
        assert w1.alive(), w1.tail()
        stream.burst()
        assert_equal_to_reference(redis_client, cfg, stream, topics, kafka_bootstrap)
        group.stop()  # before the proxy goes


@pytest.mark.timeout(900)
def test_a_group_on_a_redis_cluster_with_checkpoints_in_s3_runs_a_map_created_through_the_api_once(
    kafka_bootstrap, new_topic, tmp_path: Path, group_of
):
    tag = uuid.uuid4().hex[:6]
    steady, created = f"s{tag}", f"n{tag}"
    topics = {steady: new_topic(2), created: new_topic(2)}
    with RedisCluster(3) as cluster, S3Server(buckets=["lake"]) as s3:
        doc = group_config(
            tmp_path, kafka_bootstrap, cluster.url, {steady: topics[steady]}, f"cluster-{tag}"
        )
        doc["redis"]["cluster"] = True
        doc["spark"]["checkpoint_root"] = f"s3a://lake/checkpoints-{tag}"
        doc["object_store"] = s3.config()
        cfg = parse_config(doc)
        client = ClusterClient.from_url(cluster.url)
        group = group_of(doc)
        with Stream(kafka_bootstrap, list(topics.values())) as stream:
            group.start("w1")
            group.start("w2")
            group.wait("the file's map to run", lambda: steady in running_workers(client, [steady]))

            async def create() -> None:
                async with front(cfg) as api:
                    section = {
                        "source": {"topics": [topics[created]], "schema": SCHEMA},
                        "key": "id",
                        "changelog": {"topic": f"{created}.changelog"},
                    }
                    await api.json(
                        "POST", "/v1/maps", status=201, json={"name": created, "config": section}
                    )

            asyncio.run(create())
            names = [steady, created]
            group.wait(
                "each worker to run one map",
                lambda: sorted(running_workers(client, names).values()) == ["w1", "w2"],
            )
            started = [
                n for n, w in group.workers.items() if f"map {created} taken over" in w.log()
            ]
            assert len(started) == 1, group.logs()
            # Its worker is lost: the other takes it over from the checkpoints in S3.
            group.workers[started[0]].kill()
            survivor = "w2" if started[0] == "w1" else "w1"
            group.wait(
                "the survivor to run both maps",
                lambda: running_workers(client, names) == dict.fromkeys(names, survivor),
            )
        stream.burst()
        logs = {steady: cfg.maps[steady].changelog.topic, created: f"{created}.changelog"}
        for name in names:
            expected = reference(name, stream.events[topics[name]])
            group.wait(
                f"map {name} to equal its reference on the cluster",
                lambda name=name, expected=expected: redis_map(client, name) == expected,
            )
            assert changelog(kafka_bootstrap, str(logs[name])) == expected, name
        group.stop()  # before the cluster and the object store go


@pytest.mark.timeout(600)
def test_a_worker_whose_map_is_claimed_by_another_stops_writing_it_then_takes_it_back(
    kafka_bootstrap, redis_url, redis_client: redis.Redis, new_topic, tmp_path: Path, group_of
):
    tag = uuid.uuid4().hex[:6]
    topics = {f"c{tag}_agg": new_topic(2)}
    name = next(iter(topics))
    doc = group_config(tmp_path, kafka_bootstrap, redis_url, topics, f"claimed-{tag}")
    cfg = parse_config(doc)
    group = group_of(doc)
    with Stream(kafka_bootstrap, list(topics.values())) as stream:
        worker = group.start("w1")
        group.wait(
            "w1 to run the map", lambda: running_workers(redis_client, [name]) == {name: "w1"}
        )
        # Another claim of the map, as a worker the group gave it to would make: w1's
        # next write is refused by Redis, and w1 stops the map without a drain.
        take_over(cfg, name)
        group.wait("w1 to be fenced", lambda: f"map {name}: fenced" in worker.log())
        frozen = redis_map(redis_client, name)
        stream.burst()
        time.sleep(3)  # batches a writer not fenced would have folded by now
        assert redis_map(redis_client, name) == frozen
        # The group still gives w1 the map: once the claimer had time to learn it is not
        # the map's, w1 claims it anew and folds on from its checkpoint.
        group.wait(
            "w1 to take the map back",
            lambda: worker.log().count(f"map {name} taken over by worker w1") == 2,
        )
    stream.burst()
    assert_equal_to_reference(redis_client, cfg, stream, topics, kafka_bootstrap)
