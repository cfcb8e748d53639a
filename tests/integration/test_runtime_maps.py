"""Maps created, changed and deleted at runtime against a real ``materializer run``, through
the query services (HTTP and gRPC) and ``materializer maps``: only the map that changed
moves, the others fold on, equal to their reference. A run folds the maps its catalog
holds when it starts; a purge leaves nothing of the map on the broker."""

from __future__ import annotations

import asyncio
import getpass
import random
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import orjson
import redis
import yaml

from materializer.config import AppConfig, parse_config
from materializer.contract.redis_layout import status_key
from materializer.contract.status import MapReport
from materializer.testing import produce
from materializer.testing.process import ManagedProcess
from materializer.testing.reference import fold_latest, fold_merge
from materializer.testing.waiting import eventually, wait_until
from materializer.v1 import admin_service_pb2 as pb
from tests.helpers.admin import call
from tests.helpers.broker import consumer_groups, partitions, topic_config, topics
from tests.helpers.query_redis import Front, front
from tests.helpers.slices import FIELDS, SCHEMA, delta_map_rs, redis_map, slice_config


def section(*topics: str, **extra: Any) -> dict[str, Any]:
    return {"source": {"topics": list(topics), "schema": SCHEMA}, "key": "id", **extra}


def events(prefix: str, n: int, keys: int, seed: int) -> list[tuple[bytes, bytes | None]]:
    rng = random.Random(seed)
    out: list[tuple[bytes, bytes | None]] = []
    for i in range(n):
        key = f"{prefix}{rng.randrange(keys)}"
        out.append((key.encode(), orjson.dumps({"id": key, "name": prefix, "age": i})))
    return out


class Stream:
    """Events produced to a topic on a thread until stopped, and their reference fold."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self._bootstrap, self._topic = bootstrap, topic
        self._stop = threading.Event()
        self._events: list[tuple[int, int, bytes, bytes | None]] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        round_ = 0
        while not self._stop.is_set():
            batch = events("s", 20, 40, round_)
            positions = produce(self._bootstrap, self._topic, batch)
            self._events += [(p, o, k, v) for (p, o), (k, v) in zip(positions, batch, strict=True)]
            round_ += 1
            self._stop.wait(0.1)

    def __enter__(self) -> Stream:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def reference(self) -> dict[str, Any]:
        return fold_latest(self._events, "id", FIELDS)


def catalog_config(
    tmp: Path, kafka: str, redis_url: str, topic: str, name: str
) -> tuple[Path, AppConfig]:
    """A one-map file with a catalog topic of the test's own, written where a run reads it."""
    doc = slice_config(tmp, kafka, redis_url, topic, map_name=name)
    doc["catalog"] = {"topic": f"maps-{uuid.uuid4().hex[:10]}", "poll_interval": "200 ms"}
    config_file = tmp / "maps.yaml"
    config_file.write_text(yaml.safe_dump(doc))
    return config_file, parse_config(doc)


def start_run(config_file: Path) -> ManagedProcess:
    """``materializer run`` on ``config_file``, its log beside it."""
    args = [sys.executable, "-m", "materializer", "run", "-c", str(config_file)]
    return ManagedProcess(args, config_file.parent / "run.log")


def run_with_front(
    config_file: Path, cfg: AppConfig, body: Callable[[Front, ManagedProcess], Awaitable[None]]
) -> str:
    """``materializer run`` on ``config_file`` while ``body`` talks to a query service's HTTP
    front, then stopped with SIGTERM, which it must end cleanly; its log."""
    proc = start_run(config_file)
    try:

        async def main() -> None:
            async with front(cfg) as f:
                await body(f, proc)

        asyncio.run(main())
        proc.proc.send_signal(signal.SIGTERM)
        proc.proc.wait(150)
    finally:
        proc.stop()
    log = proc.log_path.read_text()
    assert proc.proc.returncode == 0, log[-3000:]
    return log


async def created_and_folded(
    f: Front,
    proc: ManagedProcess,
    client: redis.Redis,
    name: str,
    config: dict[str, Any],
    reference: dict[str, Any],
) -> None:
    """``POST /v1/maps`` of ``name``, then until the run folded it to ``reference``."""
    await f.json("POST", "/v1/maps", status=201, json={"name": name, "config": config})
    await asyncio.to_thread(
        wait_until,
        f"map {name} to fold",
        lambda: redis_map(client, name) == reference,
        alive=proc.alive,
    )


def positions_of(
    bootstrap: str, topic: str, records: list[tuple[bytes, bytes | None]]
) -> list[Any]:
    positions = produce(bootstrap, topic, records)
    return [(p, o, k, v) for (p, o), (k, v) in zip(positions, records, strict=True)]


def fold_starts(proc: ManagedProcess, name: str) -> int:
    """How many times the run has started the map's fold query so far (its log says each)."""
    return proc.log().count(f"query={name}.fold started ")


def test_a_map_created_changed_and_deleted_moves_alone_while_another_folds_a_live_stream(
    kafka_bootstrap, redis_url, redis_client: redis.Redis, new_topic, tmp_path: Path
):
    steady_topic, first, second = new_topic(2), new_topic(1), new_topic(1)
    steady = f"steady{uuid.uuid4().hex[:6]}"
    added = f"added{uuid.uuid4().hex[:6]}"
    config_file, cfg = catalog_config(tmp_path, kafka_bootstrap, redis_url, steady_topic, steady)
    early = positions_of(kafka_bootstrap, first, events("a", 60, 15, 1))
    later = positions_of(kafka_bootstrap, second, events("b", 40, 10, 2))

    proc = start_run(config_file)
    try:
        wait_until(
            "the file's map to run past its opening",
            lambda: f"map {steady} running" in proc.log(),
            alive=proc.alive,
        )
        steady_starts = fold_starts(proc, steady)
        assert steady_starts > 0, proc.tail()
        with Stream(kafka_bootstrap, steady_topic) as stream:

            async def body() -> None:
                async with AsyncExitStack() as stack:
                    one: Front = await stack.enter_async_context(front(cfg))
                    other: Front = await stack.enter_async_context(front(cfg))  # a replica
                    created = await one.json(
                        "POST",
                        "/v1/maps",
                        status=201,
                        json={"name": added, "config": section(first)},
                    )
                    assert created["version"] == 1

                    def folded(reference: dict[str, Any]) -> bool:
                        return redis_map(redis_client, added) == reference

                    await asyncio.to_thread(
                        wait_until,
                        "the new map to fold its topic",
                        lambda: folded(fold_latest(early, "id", FIELDS)),
                        alive=proc.alive,
                    )

                    async def served(f: Front, key: str, status: int) -> bool:
                        async with f.http.get(f"{f.base}/v1/maps/{added}/entities/{key}") as r:
                            return r.status == status

                    # Both replicas serve it, neither restarted; nor was the live map.
                    await eventually(
                        "the replica to serve the new map", lambda: served(other, "a1", 200)
                    )
                    assert await served(one, "a1", 200)
                    assert fold_starts(proc, steady) == steady_starts

                    # A change: one more topic. Only its queries restart.
                    changed = await one.json(
                        "PUT", f"/v1/maps/{added}/config", json=section(first, second)
                    )
                    assert changed["version"] == 2
                    await asyncio.to_thread(
                        wait_until,
                        "the changed map to fold both topics",
                        lambda: folded(fold_latest(early + later, "id", FIELDS)),
                        alive=proc.alive,
                    )
                    assert fold_starts(proc, steady) == steady_starts
                    # What the purge is to remove exists on the broker by now.
                    changelog, group = f"{added}.changelog", f"materializer.{added}"
                    await asyncio.to_thread(
                        wait_until,
                        "the new map's changelog topic and consumer group",
                        lambda: (
                            changelog in topics(kafka_bootstrap)
                            and group in consumer_groups(kafka_bootstrap)
                        ),
                    )

                    deleted = await one.json("DELETE", f"/v1/maps/{added}?purge=true")
                    assert deleted["version"] == 3
                    purged = "\n".join(deleted["purged"])
                    assert "Redis keys" in purged and f"warehouse/{added}" in purged, purged
                    assert changelog in purged and group in purged, purged
                    await asyncio.to_thread(
                        wait_until,
                        "the broker to drop the changelog topic and the consumer group",
                        lambda: (
                            changelog not in topics(kafka_bootstrap)
                            and group not in consumer_groups(kafka_bootstrap)
                        ),
                    )
                    assert not list(redis_client.scan_iter(match=f"{added}*"))
                    assert not (tmp_path / "warehouse" / added).exists()
                    assert not (tmp_path / "checkpoints" / added).exists()
                    await eventually(
                        "the replica to forget the map", lambda: served(other, "a1", 404)
                    )
                    assert await served(one, "a1", 404)

                    # A map the checks let through but that cannot start (its schema file is
                    # not on the run's machine) fails alone; the run and the others go on.
                    absent = str(tmp_path / "absent.avsc")
                    source = {"topics": [first], "format": "avro", "schema_file": absent}
                    broken = {"name": f"{added}x", "config": {"source": source, "key": "id"}}
                    await one.json("POST", "/v1/maps", status=201, json=broken)

                    async def failed() -> bool:
                        status = await one.json("GET", f"/v1/maps/{added}x/status")
                        said = status["state"], status["error"]
                        return said[0] == "FAILED" and "absent.avsc" in said[1]

                    await eventually("the broken map to be reported failed", failed, timeout=60)
                    assert proc.alive()
                    await one.json("DELETE", f"/v1/maps/{added}x")

                    async def dropped() -> bool:  # a failed map still held fails the run's exit
                        return f"map {added}x deleted by anonymous" in proc.log()

                    await eventually("the run to drop the deleted map", dropped, timeout=60)
                    assert fold_starts(proc, steady) == steady_starts

            asyncio.run(body())
        reference = stream.reference()
        wait_until(
            "the live map to fold the whole stream",
            lambda: redis_map(redis_client, steady) == reference,
            alive=proc.alive,
        )
        proc.proc.send_signal(signal.SIGTERM)
        proc.proc.wait(150)
    finally:
        proc.stop()
    log = proc.log_path.read_text()
    assert proc.proc.returncode == 0, log[-3000:]
    assert delta_map_rs(tmp_path / "warehouse" / steady) == reference
    # The live map's queries started once and never stopped until the end.
    assert log.count(f"map {steady} running") == 1, log[-3000:]
    assert log.count(f"map {steady} stopped") == 1
    assert f"map {added} created by anonymous (version 1)" in log
    assert f"map {added} changed by anonymous (version 2): restarting its queries" in log
    assert f"map {added} deleted by anonymous: its queries stopped" in log
    assert "Traceback" not in log, log[-3000:]


def test_a_change_the_state_cannot_follow_is_rebuilt_while_lookups_go_on(
    kafka_bootstrap, redis_url, redis_client: redis.Redis, new_topic, tmp_path: Path
):
    topic = new_topic(1)
    name = f"reb{uuid.uuid4().hex[:6]}"
    other = "other" + name
    config_file, cfg = catalog_config(tmp_path, kafka_bootstrap, redis_url, new_topic(1), other)
    # Partial updates: as latest each event replaces the entity, merged they add up.
    records = [
        (
            f"k{i % 5}".encode(),
            orjson.dumps({"id": f"k{i % 5}", **({"name": f"n{i}"} if i % 2 else {"age": i})}),
        )
        for i in range(50)
    ]
    stamped = positions_of(kafka_bootstrap, topic, records)

    async def body(f: Front, proc: ManagedProcess) -> None:
        latest = fold_latest(stamped, "id", FIELDS)
        await created_and_folded(f, proc, redis_client, name, section(topic), latest)
        merged = section(topic, fold={"mode": "merge"})
        refused = await f.json("PUT", f"/v1/maps/{name}/config", status=400, json=merged)
        assert "fold.mode" in refused["error"]["message"]
        answer = await f.json("PUT", f"/v1/maps/{name}/config?rebuild=true", json=merged)
        assert answer["rebuilding"] is True
        reference = fold_merge(stamped, "id", FIELDS)
        answers: list[dict[str, Any]] = []
        while True:  # lookups answer throughout: the old copy until the switch
            got = await f.json("GET", f"/v1/maps/{name}/entities/k1")
            answers.append(got["entity"])
            if got["entity"] == reference["k1"]:
                break
            assert got["entity"] == latest["k1"], got
            assert proc.alive()
            await asyncio.sleep(0.2)
        await asyncio.to_thread(
            wait_until,
            "the rebuilt copy to hold the merged state",
            lambda: redis_map(redis_client, f"{name}~1") == reference,
        )
        assert answers[0] == latest["k1"]

    log = run_with_front(config_file, cfg, body)
    assert f"map {name}: rebuilding definition 2 into generation 1" in log
    assert f"map {name}: readers moved to definition 2" in log
    assert redis_client.get(f"{name}:__definition__") == b"2"


def as_json(config: dict[str, Any]) -> str:
    return orjson.dumps(config).decode()


def state(client: redis.Redis, name: str) -> str | None:
    """The map's state as the run last reported it."""
    report = MapReport.from_hash(client.hgetall(status_key(name)))
    return None if report is None else report.state


def test_a_run_folds_the_maps_its_catalog_holds_and_follows_changes_over_grpc_and_the_cli(
    kafka_bootstrap, redis_url, redis_client: redis.Redis, new_topic, tmp_path: Path
):
    first, second, third = new_topic(1), new_topic(1), new_topic(1)
    tag = uuid.uuid4().hex[:6]
    filed, by_grpc, by_cli = f"filed{tag}", f"grpc{tag}", f"cli{tag}"
    config_file, cfg = catalog_config(tmp_path, kafka_bootstrap, redis_url, new_topic(1), filed)
    early = positions_of(kafka_bootstrap, first, events("g", 50, 12, 3))
    told = positions_of(kafka_bootstrap, second, events("c", 40, 10, 4))
    more = positions_of(kafka_bootstrap, third, events("m", 30, 8, 5))

    # Before any run: a map created over gRPC, in a catalog topic its first use made.
    create = pb.PutMapRequest(map=by_grpc, config_json=as_json(section(first)))
    made = call(cfg, "CreateMap", create)
    assert (made.map, made.version, made.origin, made.created) == (by_grpc, 1, "api", True)
    assert orjson.loads(made.config_json) == section(first)
    assert made.changed_by == "anonymous" and made.changed_at.seconds > 0
    # One partition keeps every change in order; compaction keeps each map's last one.
    assert partitions(kafka_bootstrap, cfg.catalog.topic) == 1
    assert topic_config(kafka_bootstrap, cfg.catalog.topic)["cleanup.policy"] == "compact"

    def cli(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "materializer", "maps", *args, "-c", str(config_file)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def apply(name: str, config: dict[str, Any]) -> str:
        document = tmp_path / f"{name}.yaml"
        document.write_text(yaml.safe_dump({"name": name, "config": config}))
        return cli("apply", "-f", str(document))

    def folds(name: str, events: list[Any]) -> None:
        expected = fold_latest(events, "id", FIELDS)
        wait_until(
            f"map {name} to fold its reference",
            lambda: redis_map(redis_client, name) == expected,
            alive=proc.alive,
        )

    proc = start_run(config_file)
    try:
        folds(by_grpc, early)  # the catalog's map, from the run's start

        assert f"map {by_cli} created (version 1)" in apply(by_cli, section(second))
        folds(by_cli, told)
        changed = apply(by_cli, section(second, third))
        assert f"map {by_cli} changed (version 2)" in changed
        folds(by_cli, told + more)

        put = pb.PutMapRequest(map=by_grpc, config_json=as_json(section(first, third)))
        changed_over_grpc = call(cfg, "PutMapConfig", put)
        assert (changed_over_grpc.version, changed_over_grpc.created) == (2, False)
        folds(by_grpc, early + more)

        deleted = call(cfg, "DeleteMap", pb.DeleteMapRequest(map=by_grpc))
        assert (deleted.version, list(deleted.purged)) == (3, [])
        assert f"map {by_cli} deleted (version 3)" in cli("delete", by_cli)
        for name in (by_grpc, by_cli):
            wait_until(
                f"the run to stop map {name}",
                lambda name=name: state(redis_client, name) == "stopped",
                alive=proc.alive,
            )
    finally:
        proc.stop()  # SIGTERM, as an orchestrator stops it
    log = proc.log_path.read_text()
    assert proc.proc.returncode == 0, log[-3000:]
    cli_user = f"by cli:{getpass.getuser()}@{socket.gethostname()}"
    assert f"map {by_cli} created {cli_user} (version 1)" in log
    assert f"map {by_cli} changed {cli_user} (version 2): restarting its queries" in log
    assert f"map {by_grpc} changed by anonymous (version 2): restarting its queries" in log
    assert f"map {by_grpc} deleted by anonymous: its queries stopped" in log
    assert f"map {by_cli} deleted {cli_user}: its queries stopped" in log
    # The file's map started with the run and never again.
    assert log.count(f"map {filed} running") == 1, log[-3000:]
    assert "Traceback" not in log, log[-3000:]


def test_an_added_nullable_field_applies_without_a_rebuild(
    kafka_bootstrap, redis_url, redis_client: redis.Redis, new_topic, tmp_path: Path
):
    """``PUT .../config`` adding a field to a JSON map's schema, without ``?rebuild=true``:
    the map's queries start again on it, nothing is folded again (one copy, the same
    definition's generation), the entities folded before read the field as null (it is
    not in them), later ones carry it, in Redis and as a new column of the table."""
    topic = new_topic(1)
    name = f"add{uuid.uuid4().hex[:6]}"
    config_file, cfg = catalog_config(
        tmp_path, kafka_bootstrap, redis_url, new_topic(1), "o" + name
    )
    before = positions_of(kafka_bootstrap, topic, events("a", 30, 5, 1))

    async def body(f: Front, proc: ManagedProcess) -> None:
        reference = fold_latest(before, "id", FIELDS)
        await created_and_folded(f, proc, redis_client, name, section(topic), reference)
        wider = section(topic)
        wider["source"]["schema"] = SCHEMA + ", note STRING"
        answer = await f.json("PUT", f"/v1/maps/{name}/config", json=wider)
        assert answer["rebuilding"] is False
        later = [
            (b"b1", orjson.dumps({"id": "b1", "name": "b", "age": 1, "note": "new"})),
            (b"a0", orjson.dumps({"id": "a0", "name": "a", "age": 2, "note": "also"})),
        ]
        after = positions_of(kafka_bootstrap, topic, later)
        expected = fold_latest(before + after, "id", [*FIELDS, "note"])
        await asyncio.to_thread(
            wait_until,
            "the new field in the entities",
            lambda: redis_map(redis_client, name) == expected,
            alive=proc.alive,
        )
        assert "note" not in expected["a1"] and expected["b1"]["note"] == "new"
        table = tmp_path / "warehouse" / name
        await asyncio.to_thread(
            wait_until,
            "the new column in the table",
            lambda: delta_map_rs(table) == expected,
            alive=proc.alive,
            retry_errors=True,
        )

    log = run_with_front(config_file, cfg, body)
    assert f"map {name} changed by" in log and "restarting its queries" in log
    assert "rebuilding definition" not in log
    assert not redis_client.exists(f"{name}~1:__meta__")
