"""A map rebuilt and another deleted while the others fold a live stream on the real-time
path, through ``materializer run`` and the query service's API, as users drive them: the
rebuilt map's new generation, and the maps left alone, end equal to the plain-Python
reference in Redis, the changelog and Delta; the deleted map, purged, leaves nothing in
Redis; the maps left alone never leave the path."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
import yaml

from materializer.config import load_config
from materializer.config.names import changelog_topic
from materializer.contract.redis_layout import meta_key, physical_name
from materializer.contract.watermark import Watermark
from materializer.testing import create_topic, produce
from materializer.testing.process import ManagedProcess
from materializer.testing.reference import fold_latest
from materializer.testing.waiting import eventually, wait_until
from tests.helpers.indexes import index_members, mismatched, ready
from tests.helpers.query_redis import front
from tests.helpers.slices import FIELDS, SCHEMA, delta_map_rs, read_committed, redis_map
from tests.integration.test_live_path import MODES, live_maps, reference
from tests.integration.test_live_run import STARTED, Streams

pytestmark = pytest.mark.integration


def test_a_map_rebuilt_and_another_deleted_while_the_others_fold_in_real_time(
    kafka_bootstrap: str, redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    names, topics, path = live_maps("lc", kafka_bootstrap, redis_url, tmp_path, {})
    doc = yaml.safe_load(path.read_text())
    doc["catalog"] = {"topic": f"maps-{uuid.uuid4().hex[:8]}", "poll_interval": "200 ms"}
    # A sample of each map's history every second: one of the purged map after its purge
    # would leave its history's key behind.
    doc["metrics"]["history"] = {"interval": "1 s"}
    path.write_text(yaml.safe_dump(doc))
    config = load_config(path)
    rebuilt, left_alone = names[0], names[1:]
    extra, extra_topic = f"lc_x_{uuid.uuid4().hex[:8]}", create_topic(kafka_bootstrap, 2)
    streams = Streams(kafka_bootstrap, topics)
    log = tmp_path / "run.log"
    args = [sys.executable, "-m", "materializer", "run", "-c", str(path)]

    def starts_of(name: str) -> int:
        """How many real-time queries started with the map in them."""
        found = STARTED.findall(log.read_text(errors="replace"))
        return sum(name in members.split(", ") for members in found)

    def members() -> set[str]:
        """The maps of the real-time queries started last (each query's last start)."""
        found: set[str] = set()
        for members in STARTED.findall(log.read_text(errors="replace")):
            found |= set(members.split(", "))
        return found

    streams.round(200)  # a backlog: each map opens and catches up in micro-batches first
    proc = ManagedProcess(args, log)
    try:
        wait_until("every map on the real-time path", lambda: members() >= set(names), 300)

        async def body() -> dict[str, Any]:
            async with front(config) as api:
                section = {"source": {"topics": [extra_topic], "schema": SCHEMA}, "key": "id"}
                await api.json(
                    "POST", "/v1/maps", status=201, json={"name": extra, "config": section}
                )
                events = [
                    (k.encode(), orjson.dumps({"id": k, "name": "x", "age": i}))
                    for i, k in enumerate(f"x{i % 7}" for i in range(30))
                ]
                produce(kafka_bootstrap, extra_topic, events)
                expected = fold_latest(
                    [(0, i, k, v) for i, (k, v) in enumerate(events)], "id", FIELDS
                )
                await asyncio.to_thread(
                    wait_until,
                    "the created map to fold its topic",
                    lambda: redis_map(redis_client, extra) == expected,
                    240,
                    proc.alive,
                )
                await asyncio.to_thread(
                    wait_until, "the created map on the path", lambda: extra in members(), 240
                )
                # Indexes declared while it folds on the path: built beside the fold, which
                # goes on (its real-time query never restarts); then one of them dropped.
                starts = starts_of(extra)
                for indexes in (["name", {"field": "age", "kind": "sorted"}], ["age"]):
                    fields = [i if isinstance(i, str) else i["field"] for i in indexes]
                    put = f"/v1/maps/{extra}/config"
                    await api.json("PUT", put, json={**section, "indexes": indexes})
                    await asyncio.to_thread(
                        wait_until,
                        f"the created map's indexes on {fields}",
                        lambda fields=fields: (
                            ready(redis_client, extra, fields)
                            and not mismatched(redis_client, extra, expected, fields)
                        ),
                        120,
                        proc.alive,
                    )
                assert index_members(redis_client, extra, "name") == set()
                assert starts_of(extra) == starts
                assert f"map {extra} changed by anonymous (version 3): its indexes" in (
                    log.read_text(errors="replace")
                )
                # Records stream in while one map is rebuilt and the created one deleted.
                streaming = streams.stream(150, 10)
                operations = f"/v1/maps/{rebuilt}/operations"
                await api.json("POST", operations, status=202, json={"kind": "rebuild"})
                deleted = await api.json("DELETE", f"/v1/maps/{extra}?purge=true")
                assert "Redis keys" in "\n".join(deleted["purged"]), deleted

                async def rebuild_ended() -> bool:
                    last = await api.json("GET", operations + "/last")
                    return last["state"] in ("DONE", "FAILED")

                await eventually("the rebuild to end", rebuild_ended, timeout=400, interval=0.5)
                await asyncio.to_thread(streaming.join)
                return await api.json("GET", operations + "/last")

        last = asyncio.run(body())
        assert last["state"] == "DONE", last
        generation = int(last["rebuild"]["generation"])
        assert generation == 1, last
        physical = {name: name for name in left_alone} | {
            rebuilt: physical_name(rebuilt, generation)
        }
        streams.round(20)

        def settled() -> bool:
            for name in names:
                mark = Watermark.from_hash(redis_client.hgetall(meta_key(physical[name])))
                reached = {} if mark is None else mark.offsets.get(topics[name], {})
                if any(reached.get(p, 0) < end for p, end in streams.ends[name].items()):
                    return False
            return True

        wait_until("every record folded", settled, 240, proc.alive)
        before_stop = log.read_text(errors="replace")
        os.killpg(proc.proc.pid, signal.SIGTERM)
        proc.proc.wait(150)
        assert proc.proc.returncode == 0, proc.tail(60)
    except BaseException:
        print(proc.tail(150), file=sys.stderr)
        raise
    finally:
        streams.stop()
        proc.stop()

    text = log.read_text(errors="replace")
    assert f"map {extra} deleted by anonymous: its queries stopped" in text
    assert not list(redis_client.scan_iter(match=f"{extra}*"))
    for name in left_alone:  # until the stop, which drains every map off the path
        assert f"map {name} left the real-time path" not in before_stop, name
    for name, mode in zip(names, MODES, strict=True):
        expected = reference(mode, streams.produced[name])
        assert redis_map(redis_client, physical[name]) == expected, name
        assert delta_map_rs(tmp_path / "warehouse" / physical[name]) == expected, name
        generation = 1 if name == rebuilt else 0
        last_state: dict[str, bytes | None] = {}
        for msg in read_committed(kafka_bootstrap, changelog_topic(config, name, generation)):
            last_state[msg.key().decode()] = msg.value()
        changelog = {k: orjson.loads(v) for k, v in last_state.items() if v is not None}
        assert changelog == expected, name
