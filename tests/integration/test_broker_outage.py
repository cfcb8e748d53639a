"""The broker goes down and comes back (same port, same data) under a live
``materializer run``.

Nobody steps in: the run must keep going (or start its queries again by
itself), catch up, and have folded every event exactly once into Redis and
Delta, as an aggregate's counts and sums against a plain-Python fold show.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import orjson
import pytest
import yaml
from slice_helpers import delta_map_rs, redis_map, slice_config, wait_for

from materializer.layout import MapReport, status_key
from materializer.testing import KafkaBroker, create_topic, produce
from materializer.testing.process import ManagedProcess
from materializer.testing.reference import fold_aggregate

pytestmark = pytest.mark.integration

AGGREGATES = {"events": {"fn": "count"}, "age_total": {"fn": "sum", "field": "age"}}
REFERENCE = {name: (a["fn"], a.get("field")) for name, a in AGGREGATES.items()}


@pytest.mark.timeout(900)
def test_a_broker_restarted_under_a_live_run_loses_and_repeats_nothing(
    redis_url, redis_client, tmp_path: Path
):
    with KafkaBroker(workdir=tmp_path / "kafka") as broker:
        bootstrap = broker.bootstrap_servers
        topic = create_topic(bootstrap, 2)
        name = "outage"
        doc = slice_config(
            tmp_path,
            bootstrap,
            redis_url,
            topic,
            map_name=name,
            fold={"mode": "aggregate", "aggregates": AGGREGATES},
        )
        config_file = tmp_path / "maps.yaml"
        config_file.write_text(yaml.safe_dump(doc))
        rng = random.Random(3)
        produced: list[tuple[int, int, bytes, bytes]] = []

        def send(n: int) -> None:
            records = []
            for _ in range(n):
                key = f"k{rng.randrange(50)}"
                records.append((key.encode(), orjson.dumps({"id": key, "age": rng.randrange(90)})))
            positions = produce(bootstrap, topic, records)
            produced.extend((p, o, k, v) for (p, o), (k, v) in zip(positions, records, strict=True))

        def folded() -> bool:
            return redis_map(redis_client, name) == fold_aggregate(produced, "id", REFERENCE)

        args = [sys.executable, "-m", "materializer", "run", "-c", str(config_file)]
        proc = ManagedProcess(args, tmp_path / "run.log")
        try:
            send(200)
            wait_for("the first events in Redis", folded)
            broker.restart()
            send(200)
            wait_for("every event in Redis, once", folded, timeout=300)
            reference = fold_aggregate(produced, "id", REFERENCE)
            table = tmp_path / "warehouse" / name
            wait_for("every event in Delta, once", lambda: delta_map_rs(table) == reference)
            assert proc.alive(), proc.tail()
            report = MapReport.from_hash(redis_client.hgetall(status_key(name)))
            assert report is not None and report.state == "running", proc.tail()
        finally:
            proc.stop()
