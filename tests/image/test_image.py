"""The container image as users and the Helm chart run it (``make image-test``).

Containers of the built image (``IMAGE``) run on the host network against the tests'
broker and Redis, with their files on a folder of the host mounted into them: the demo's
config validated, a topic folded into Redis and a Delta table, the query service answering
Get over gRPC and HTTP, SIGTERM to each container as Kubernetes sends it, and a worker group
of two containers handing a map over when one of them is stopped. Each map ends equal to
its plain-Python reference fold.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from materializer.contract.redis_layout import meta_key
from materializer.contract.watermark import Watermark
from materializer.demo.domain import demo_config, write_config
from materializer.testing import free_port
from materializer.testing.group import running_workers
from materializer.testing.reference import fold_latest
from materializer.testing.waiting import wait_until
from query_service.client import MaterializerClient
from tests.helpers.containers import Container, Podman
from tests.helpers.query_redis import grpc_serving
from tests.helpers.slices import (
    FIELDS,
    Produced,
    delta_map_rs,
    group_config,
    redis_map,
    slice_config,
)

pytestmark = pytest.mark.integration

START_SECONDS = 300.0
"""How long a container's run may take to fold its first batches: a JVM starting cold."""
STOP_SECONDS = 120.0
"""How long a container may take to drain and exit after SIGTERM."""


@pytest.fixture
def podman() -> Iterator[Podman]:
    image = os.environ.get("IMAGE")
    if not image:
        pytest.fail("IMAGE names the image to test: `make image-test` builds it and sets it")
    containers = Podman(image)
    yield containers
    containers.close()


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """The host folder the containers mount: configs, Delta tables and checkpoints. The
    image's user (uid 10001) writes in it."""
    tmp_path.chmod(0o777)
    return tmp_path


def write_doc(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(doc))
    return path


def stopped(container: Container, sig: signal.Signals = signal.SIGTERM) -> int:
    """``sig`` to the container; its exit code once it has drained and ended."""
    container.signal(sig)
    return container.wait(STOP_SECONDS)


def up_to_watermark(produced: Produced, mark: Watermark) -> dict[str, Any]:
    """The reference fold of the records below the watermark's offsets."""
    ends = mark.offsets[produced.topic]
    pairs = zip(produced.positions, produced.records, strict=True)
    events = [(p, o, k, v) for (p, o), (k, v) in pairs if o < ends.get(p, 0)]
    return fold_latest(events, "id", FIELDS)


async def grpc_get(grpc_port: int, map_name: str, keys: list[str]) -> dict[str, Any]:
    async with MaterializerClient(f"127.0.0.1:{grpc_port}") as client:
        return {key: (await client.get(map_name, key)).entity for key in keys}


def http_get(http_port: int, map_name: str, key: str) -> dict[str, Any]:
    url = f"http://127.0.0.1:{http_port}/v1/maps/{map_name}/entities/{key}"
    with urllib.request.urlopen(url, timeout=10) as answer:  # noqa: S310 (a loopback URL)
        body: dict[str, Any] = json.loads(answer.read())
    return body


def test_validate_passes_the_demo_config_and_names_the_key_of_a_bad_one(
    podman: Podman, work: Path, kafka_bootstrap: str, redis_url: str
) -> None:
    doc = demo_config(
        workdir=work, bootstrap_servers=kafka_bootstrap, redis_url=redis_url, port=free_port()
    )
    good = write_config(work / "demo.yaml", doc)
    done = podman.run_once(["materializer", "validate", "-c", str(good)], [work])
    assert (done.returncode, done.stdout.strip()) == (0, f"{good}: ok (2 maps)"), done.stderr

    doc["maps"]["users"]["fold"]["mode"] = "newest"
    bad = write_config(work / "bad.yaml", doc)
    done = podman.run_once(["materializer", "validate", "-c", str(bad)], [work])
    assert done.returncode == 2, done.stdout + done.stderr
    assert "maps.users.fold.mode: must be one of latest, merge, aggregate" in done.stderr


def test_a_run_folds_a_topic_the_query_service_serves_it_and_sigterm_drains_both(
    podman: Podman,
    work: Path,
    kafka_bootstrap: str,
    redis_url: str,
    redis_client: redis.Redis,
    new_topic: Any,
) -> None:
    name = f"img{uuid.uuid4().hex[:8]}"
    topic = new_topic(2)
    grpc_port, http_port = free_port(), free_port()
    doc = slice_config(work, kafka_bootstrap, redis_url, topic, map_name=name)
    doc["query"] = {"host": "127.0.0.1", "port": grpc_port, "http_port": http_port}
    config_file = write_doc(work / "maps.yaml", doc)
    produced = Produced(kafka_bootstrap, topic, redis_client, keys=40)
    produced.produce(400)

    run = podman.start(["materializer", "run", "-c", str(config_file)], [work])
    query = podman.start(["query-service", "serve", "-c", str(config_file)], [work])
    try:
        wait_until(
            "the run to fold the topic into Redis",
            lambda: produced.folded(name),
            START_SECONDS,
            run.running,
        )
        expected = produced.expected()
        assert redis_map(redis_client, name) == expected
        wait_until(
            "the Delta table on the mounted folder to equal the reference",
            lambda: delta_map_rs(work / "warehouse" / name) == expected,
            START_SECONDS,
            run.running,
            retry_errors=True,
        )

        wait_until(
            "the query service to serve gRPC",
            lambda: grpc_serving(grpc_port),
            START_SECONDS,
            query.running,
            retry_errors=True,
        )
        keys = sorted(expected)[:5] + ["absent"]
        assert asyncio.run(grpc_get(grpc_port, name, keys)) == {k: expected.get(k) for k in keys}
        for key in keys:
            answer = http_get(http_port, name, key)
            assert (answer["found"], answer["entity"]) == (key in expected, expected.get(key))

        # Records still arriving when SIGTERM comes: the run ends at a committed batch,
        # Redis holding exactly the fold of what its watermark says it read.
        produced.produce(400)
        wait_until(
            "the run to fold some of the later records",
            lambda: redis_map(redis_client, name) != expected,
            START_SECONDS,
            run.running,
        )
        assert stopped(run) == 0, run.tail()
        mark = Watermark.from_hash(redis_client.hgetall(meta_key(name)))
        assert mark is not None
        assert redis_map(redis_client, name) == up_to_watermark(produced, mark)
        assert stopped(query) == 0, query.tail()
    except BaseException:
        print(f"--- run\n{run.tail(60)}\n--- query service\n{query.tail(30)}")
        raise


def test_a_worker_group_of_two_containers_hands_a_map_over_when_one_is_stopped(
    podman: Podman,
    work: Path,
    kafka_bootstrap: str,
    redis_url: str,
    redis_client: redis.Redis,
    new_topic: Any,
) -> None:
    suffix = uuid.uuid4().hex[:8]
    names = [f"imga{suffix}", f"imgb{suffix}"]
    topics = {name: new_topic(1) for name in names}
    doc = group_config(work, kafka_bootstrap, redis_url, topics, f"img-{suffix}")
    config_file = write_doc(work / "maps.yaml", doc)
    produced = {n: Produced(kafka_bootstrap, t, redis_client, keys=20) for n, t in topics.items()}

    def folded() -> bool:
        return all(p.folded(n) for n, p in produced.items())

    workers = {
        worker: podman.start(
            ["materializer", "run", "-c", str(config_file)],
            [work],
            {"MATERIALIZER_WORKER_ID": worker},
        )
        for worker in ("w1", "w2")
    }
    try:
        for p in produced.values():
            p.produce(100)
        wait_until(
            "each worker to run one map",
            lambda: sorted(running_workers(redis_client, names).values()) == ["w1", "w2"],
            START_SECONDS,
            lambda: all(w.running() for w in workers.values()),
        )
        wait_until("both maps to fold", folded, START_SECONDS)
        handed = next(n for n, w in running_workers(redis_client, names).items() if w == "w1")

        assert stopped(workers["w1"]) == 0, workers["w1"].tail()
        wait_until(
            f"w2 to take over {handed}",
            lambda: running_workers(redis_client, names) == dict.fromkeys(names, "w2"),
            START_SECONDS,
            workers["w2"].running,
        )
        for p in produced.values():
            p.produce(100)
        wait_until("both maps to fold the later records", folded, START_SECONDS)
        for name, p in produced.items():
            assert redis_map(redis_client, name) == p.expected(), name
        assert "assigned to this worker" in workers["w2"].logs()
        assert stopped(workers["w2"]) == 0, workers["w2"].tail()
    except BaseException:
        for worker, container in workers.items():
            print(f"--- {worker}\n{container.tail(60)}")
        raise
