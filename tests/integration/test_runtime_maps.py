"""Maps created, changed and deleted at runtime against a real ``materializer run`` and query
services: only the map that changed moves, the others fold on, equal to their reference."""

from __future__ import annotations

import asyncio
import random
import signal
import sys
import threading
import uuid
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import orjson
import redis
import yaml

from materializer.config import parse_config
from materializer.testing import produce
from materializer.testing.process import ManagedProcess
from materializer.testing.reference import fold_latest, fold_merge
from materializer.testing.waiting import eventually, wait_until
from tests.helpers.query_redis import Front, front
from tests.helpers.slices import FIELDS, SCHEMA, delta_map_rs, redis_map, slice_config, watermark


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


def positions_of(
    bootstrap: str, topic: str, records: list[tuple[bytes, bytes | None]]
) -> list[Any]:
    positions = produce(bootstrap, topic, records)
    return [(p, o, k, v) for (p, o), (k, v) in zip(positions, records, strict=True)]


def test_a_map_created_changed_and_deleted_moves_alone_while_another_folds_a_live_stream(
    kafka_bootstrap, redis_url, redis_client: redis.Redis, new_topic, tmp_path: Path
):
    steady_topic, first, second = new_topic(2), new_topic(1), new_topic(1)
    steady = f"steady{uuid.uuid4().hex[:6]}"
    added = f"added{uuid.uuid4().hex[:6]}"
    doc = slice_config(tmp_path, kafka_bootstrap, redis_url, steady_topic, map_name=steady)
    doc["catalog"] = {"topic": f"maps-{uuid.uuid4().hex[:10]}", "poll_interval": "200 ms"}
    config_file = tmp_path / "maps.yaml"
    config_file.write_text(yaml.safe_dump(doc))
    cfg = parse_config(doc)
    early = positions_of(kafka_bootstrap, first, events("a", 60, 15, 1))
    later = positions_of(kafka_bootstrap, second, events("b", 40, 10, 2))

    args = [sys.executable, "-m", "materializer", "run", "-c", str(config_file)]
    proc = ManagedProcess(args, tmp_path / "run.log")
    try:
        wait_until(
            "the file's map to fold",
            lambda: watermark(redis_client, steady) is not None,
            alive=proc.alive,
        )
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

                    # Both replicas serve it, neither restarted.
                    await eventually(
                        "the replica to serve the new map", lambda: served(other, "a1", 200)
                    )
                    assert await served(one, "a1", 200)

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

                    deleted = await one.json("DELETE", f"/v1/maps/{added}?purge=true")
                    assert deleted["version"] == 3
                    purged = "\n".join(deleted["purged"])
                    assert "Redis keys" in purged and f"warehouse/{added}" in purged, purged
                    assert f"{added}.changelog" in purged and f"materializer.{added}" in purged
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
    doc = slice_config(tmp_path, kafka_bootstrap, redis_url, new_topic(1), map_name="other" + name)
    doc["catalog"] = {"topic": f"maps-{uuid.uuid4().hex[:10]}", "poll_interval": "200 ms"}
    config_file = tmp_path / "maps.yaml"
    config_file.write_text(yaml.safe_dump(doc))
    cfg = parse_config(doc)
    # Partial updates: as latest each event replaces the entity, merged they add up.
    records = [
        (
            f"k{i % 5}".encode(),
            orjson.dumps({"id": f"k{i % 5}", **({"name": f"n{i}"} if i % 2 else {"age": i})}),
        )
        for i in range(50)
    ]
    stamped = positions_of(kafka_bootstrap, topic, records)

    args = [sys.executable, "-m", "materializer", "run", "-c", str(config_file)]
    proc = ManagedProcess(args, tmp_path / "run.log")
    try:

        async def body() -> None:
            async with front(cfg) as f:
                await f.json(
                    "POST", "/v1/maps", status=201, json={"name": name, "config": section(topic)}
                )
                latest = fold_latest(stamped, "id", FIELDS)
                await asyncio.to_thread(
                    wait_until,
                    "the map to fold as latest",
                    lambda: redis_map(redis_client, name) == latest,
                    alive=proc.alive,
                )
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

        asyncio.run(body())
        proc.proc.send_signal(signal.SIGTERM)
        proc.proc.wait(150)
    finally:
        proc.stop()
    log = proc.log_path.read_text()
    assert proc.proc.returncode == 0, log[-3000:]
    assert f"map {name}: rebuilding definition 2 into generation 1" in log
    assert f"map {name}: readers moved to definition 2" in log
    assert redis_client.get(f"{name}:__definition__") == b"2"
