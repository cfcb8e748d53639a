"""Tables and checkpoints in an S3 object store (S3Proxy's S3 API over a folder).

One map and its aggregate twin fold into ``s3a://lake/warehouse`` with their
checkpoints at ``s3a://lake/checkpoints``, through a crash; then the query service
reads the tables (Query, GetAsOf) and ``rehydrate`` restores Redis from them, all with
the one ``object_store`` block and its keys from the environment.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from deltalake.exceptions import TableNotFoundError

from materializer.clients.object_store import delta_rs_location
from materializer.config import AppConfig, parse_config
from materializer.contract.redis_layout import entity_key
from materializer.runtime.crash import CRASH_ENV
from materializer.testing import produce
from materializer.testing.object_store import ACCESS_KEY_ID, SECRET_ACCESS_KEY, S3Server
from materializer.testing.process import ManagedProcess
from materializer.testing.reference import fold_aggregate, fold_latest
from materializer.testing.waiting import wait_until
from materializer.v1 import map_service_pb2 as pb
from materializer.v1 import map_service_pb2_grpc as pb_grpc
from tests.helpers.query_redis import run as serve_and_run
from tests.helpers.slices import FIELDS, delta_map_rs, redis_map, slice_config

AGGREGATES = {"events": {"fn": "count"}, "age_total": {"fn": "sum", "field": "age"}}
KEYS = {"TEST_S3_KEY": ACCESS_KEY_ID, "TEST_S3_SECRET": SECRET_ACCESS_KEY}


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with S3Server(buckets=["lake"]) as server:
        yield server


def _events(start: int, count: int, rng: random.Random) -> list[tuple[bytes, bytes | None]]:
    out: list[tuple[bytes, bytes | None]] = []
    for i in range(start, start + count):
        uid = f"s{rng.randrange(40)}"
        value = (
            None
            if rng.random() < 0.08
            else orjson.dumps({"id": uid, "name": f"n{i}", "age": i % 70})
        )
        out.append((uid.encode(), value))
    return out


def _table(cfg: AppConfig, name: str) -> dict[str, Any]:
    try:
        return delta_map_rs(*delta_rs_location(cfg, f"{cfg.delta.root}/{name}"))
    except TableNotFoundError:
        return {}


@pytest.mark.timeout(1200)
def test_maps_on_s3_fold_once_across_a_crash_then_serve_reads_and_rehydrate(
    kafka_bootstrap, redis_url, redis_client, new_topic, s3: S3Server, tmp_path: Path, monkeypatch
):
    topic = new_topic(2)
    doc = slice_config(tmp_path, kafka_bootstrap, redis_url, topic, map_name="lake")
    doc["maps"]["lake_agg"] = {
        **doc["maps"]["lake"],
        "fold": {"mode": "aggregate", "aggregates": AGGREGATES},
        "changelog": {"topic": f"{doc['maps']['lake']['changelog']['topic']}.agg"},
    }
    doc["delta"]["root"] = "s3a://lake/warehouse"
    doc["spark"]["checkpoint_root"] = "s3a://lake/checkpoints"
    doc["object_store"] = {
        **s3.config(),
        "access_key_id": {"env": "TEST_S3_KEY"},
        "secret_access_key": {"env": "TEST_S3_SECRET"},
    }
    config_file = tmp_path / "maps.yaml"
    config_file.write_text(yaml.safe_dump(doc))
    for var, value in KEYS.items():
        monkeypatch.setenv(var, value)
    cfg = parse_config(doc)
    rng = random.Random(17)
    records = _events(0, 600, rng)
    positions = produce(kafka_bootstrap, topic, records)

    def run(crash_after: str | None = None) -> ManagedProcess:
        env = dict(os.environ)
        if crash_after:
            env[CRASH_ENV] = crash_after
        args = [sys.executable, "-m", "materializer", "run", "-c", str(config_file)]
        return ManagedProcess(args, tmp_path / "run.log", env=env)

    # A crash between a batch's Redis writes and its Delta commit: the checkpoints in the
    # bucket decide what the next run replays.
    crashed = run(crash_after="redis:1")
    assert crashed.proc.wait(600) == -signal.SIGKILL, crashed.tail()
    crashed.stop()
    more = _events(600, 400, rng)
    positions += produce(kafka_bootstrap, topic, more)
    records += more
    events = [(p, o, k, v) for (p, o), (k, v) in zip(positions, records, strict=True)]
    reference = fold_latest(events, "id", FIELDS)
    counts = fold_aggregate(
        events, "id", {name: (a["fn"], a.get("field")) for name, a in AGGREGATES.items()}
    )

    proc = run()
    try:
        wait_until(
            "Redis to hold both maps",
            lambda: (
                redis_map(redis_client, "lake") == reference
                and redis_map(redis_client, "lake_agg") == counts
            ),
            timeout=600,
        )
        wait_until(
            "the tables in the bucket to catch up",
            lambda: _table(cfg, "lake") == reference and _table(cfg, "lake_agg") == counts,
            timeout=600,
        )
        proc.proc.send_signal(signal.SIGTERM)
        assert proc.proc.wait(150) == 0, proc.tail()
    finally:
        proc.stop()
    assert (s3.root / "lake" / "warehouse" / "lake" / "_delta_log").is_dir()
    assert (s3.root / "lake" / "checkpoints" / "lake").is_dir()
    log = proc.log_path.read_text()
    assert SECRET_ACCESS_KEY not in log

    # The query service reads the same tables through delta-rs.
    async def reads(channel: Any) -> tuple[list[pb.QueryResponse], pb.GetAsOfResponse]:
        stub = pb_grpc.MapServiceStub(channel)
        pages = [p async for p in stub.Query(pb.QueryRequest(map="lake"), timeout=60)]
        key = sorted(reference)[0]
        latest = pages[0].table_version
        return pages, await stub.GetAsOf(
            pb.GetAsOfRequest(map="lake", key=key, version=latest), timeout=60
        )

    pages, as_of = serve_and_run(cfg, reads)
    rows = {row.key: orjson.loads(row.entity) for page in pages for row in page.rows}
    assert rows == reference
    assert as_of.found and orjson.loads(as_of.entity) == reference[sorted(reference)[0]]

    # Redis loses the map; rehydrate brings it back from the bucket.
    redis_client.delete(*[entity_key("lake", key) for key in reference])
    assert redis_map(redis_client, "lake") == {}
    for command in ("rehydrate", "verify"):
        done = subprocess.run(
            [sys.executable, "-m", "materializer", command, "lake", "-c", str(config_file)],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert redis_map(redis_client, "lake") == reference
