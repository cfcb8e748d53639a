"""AdminService: list, status with lag from the real broker, control keys, validation — and a
real ``materializer run`` that obeys pause, resume and restart."""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest
import redis
import yaml
from typer.testing import CliRunner

from materializer.cli import app
from materializer.commands.cli_support import out
from materializer.config import AppConfig, parse_config
from materializer.contract.control import Control
from materializer.contract.redis_layout import control_key, meta_key, status_key
from materializer.contract.status import MapReport
from materializer.contract.watermark import Watermark
from materializer.testing import closed_port, produce
from materializer.testing.process import ManagedProcess
from materializer.v1 import admin_service_pb2 as pb
from tests.helpers.admin import call
from tests.helpers.slices import SCHEMA

State = pb.MapStatus.State


def two_maps_doc(kafka: str, redis_url: str, topic_a: str, topic_b: str) -> dict[str, Any]:
    name = uuid.uuid4().hex[:8]
    return {
        "kafka": {"bootstrap_servers": kafka},
        "redis": {"url": redis_url},
        "maps": {
            f"a{name}": {"source": {"topics": [topic_a], "schema": SCHEMA}, "key": "id"},
            f"b{name}": {
                "source": {"topics": [topic_b], "schema": SCHEMA},
                "key": "id",
                "fold": {"mode": "merge"},
            },
        },
    }


def two_maps(kafka: str, redis_url: str, topic_a: str, topic_b: str) -> AppConfig:
    return parse_config(two_maps_doc(kafka, redis_url, topic_a, topic_b))


def test_list_maps_describes_the_configuration(kafka_bootstrap, redis_url):
    cfg = two_maps(kafka_bootstrap, redis_url, "ta", "tb")
    listed = call(cfg, "ListMaps", pb.ListMapsRequest())
    a, b = sorted(cfg.maps)
    assert [(m.name, list(m.topics), m.key, m.fold_mode, m.format) for m in listed.maps] == [
        (a, ["ta"], "id", "latest", "json"),
        (b, ["tb"], "id", "merge", "json"),
    ]
    assert listed.maps[0].table_path.endswith(f"/{a}")


def test_status_reports_state_and_lag_against_the_log_end(
    kafka_bootstrap, redis_url, redis_client: redis.Redis, new_topic
):
    topic_a, topic_b = new_topic(2), new_topic(1)
    positions = produce(kafka_bootstrap, topic_a, [(f"k{i}".encode(), b"{}") for i in range(9)])
    cfg = two_maps(kafka_bootstrap, redis_url, topic_a, topic_b)
    a, b = sorted(cfg.maps)
    ends: dict[int, int] = {0: 0, 1: 0}
    for partition, offset in positions:
        ends[partition] = max(ends.get(partition, 0), offset + 1)
    done = {p: e // 2 for p, e in ends.items()}  # the map is halfway through each partition
    now = int(time.time() * 1000)
    redis_client.hset(
        meta_key(a),
        mapping=Watermark(batch_id=4, offsets={topic_a: done}, updated_at_ms=now).to_hash(),
    )
    report = MapReport("running", reported_at_ms=now, input_rows_per_second=12.5, worker="worker-a")
    redis_client.hset(status_key(a), mapping=report.to_hash())
    redis_client.hset(
        status_key(b), mapping=MapReport("failed", error="boom", reported_at_ms=now).to_hash()
    )

    statuses = {s.map: s for s in call(cfg, "GetStatus", pb.GetStatusRequest()).maps}

    sa = statuses[a]
    assert sa.state == State.RUNNING
    assert sa.last_batch_id == 4
    assert sa.last_batch_at.ToMilliseconds() == now
    assert sa.input_rows_per_second == 12.5
    assert sa.worker_id == "worker-a"
    assert [
        (p.topic, p.partition, p.materialized_offset, p.log_end_offset, p.lag)
        for p in sa.partitions
    ] == [(topic_a, p, done[p], ends[p], ends[p] - done[p]) for p in sorted(ends)]
    assert sa.total_lag == sum(ends[p] - done[p] for p in ends)
    sb = statuses[b]
    assert (sb.state, sb.error, sb.worker_id) == (State.FAILED, "boom", "")
    assert not sb.HasField("watermark")

    one = call(cfg, "GetStatus", pb.GetStatusRequest(map=a)).maps
    assert [s.map for s in one] == [a]


def test_status_of_silent_and_unstarted_maps_and_unreachable_kafka(
    redis_url, redis_client: redis.Redis
):
    with closed_port() as kafka_port:
        cfg = two_maps(f"127.0.0.1:{kafka_port}", redis_url, "ta", "tb")
        a, b = sorted(cfg.maps)
        long_ago = int(time.time() * 1000) - 3_600_000
        report = MapReport("running", reported_at_ms=long_ago)
        redis_client.hset(status_key(a), mapping=report.to_hash())
        mark = Watermark(batch_id=1, offsets={"ta": {0: 5}})
        redis_client.hset(meta_key(a), mapping=mark.to_hash())

        statuses = {s.map: s for s in call(cfg, "GetStatus", pb.GetStatusRequest()).maps}

    # A materializer that went silent (killed) is not reported as running.
    assert statuses[a].state == State.STOPPED
    assert statuses[b].state == State.NOT_STARTED
    # Kafka cannot be asked: lag is unknown, never a made-up zero.
    assert [(p.materialized_offset, p.log_end_offset, p.lag) for p in statuses[a].partitions] == [
        (5, -1, -1)
    ]
    assert statuses[a].total_lag == -1


def test_status_command_names_the_worker_of_each_map(
    kafka_bootstrap, redis_url, redis_client: redis.Redis, new_topic, tmp_path: Path, monkeypatch
):
    # The command's console took its width when it was made: wide enough for every column.
    monkeypatch.setattr(out, "width", 200)
    doc = two_maps_doc(kafka_bootstrap, redis_url, new_topic(1), new_topic(1))
    config_file = tmp_path / "maps.yaml"
    config_file.write_text(yaml.safe_dump(doc))
    a, b = sorted(doc["maps"])

    def status(*args: str) -> str:
        result = CliRunner().invoke(app, ["status", *args, "-c", str(config_file)])
        assert result.exit_code == 0, result.output
        return result.output

    def documents() -> dict[str, dict[str, Any]]:
        lines = status("--json").splitlines()
        return {d["map"]: d for d in (orjson.loads(x) for x in lines if x.startswith("{"))}

    def table_rows() -> dict[str, list[str]]:
        """The cells of each map's row in the maps table (the partitions table follows it)."""
        lines = status().split("partitions")[0].splitlines()
        return {
            cells[0]: cells
            for line in lines
            if len(cells := [c.strip() for c in line.strip("│┃").split("│")]) > 1
        }

    def report(worker: str) -> None:
        now = int(time.time() * 1000)
        lone = MapReport("running", reported_at_ms=now, worker=worker)
        redis_client.hset(status_key(a), mapping=lone.to_hash())

    # A run outside a worker group: the table is as it always was, the JSON says "".
    report("")
    header = next(line for line in status().splitlines() if "last batch" in line)
    assert "worker" not in header
    assert [d["worker_id"] for d in documents().values()] == ["", ""]

    report("worker-a")
    rows = table_rows()
    assert rows[a][:3] == [a, "running", "worker-a"]
    assert rows[b][:3] == [b, "not_started", "-"]  # no report yet: no worker either
    assert {m: d["worker_id"] for m, d in documents().items()} == {a: "worker-a", b: ""}
    # And each worker's maps.
    section = status().split("workers")[-1].split("partitions")[0]
    lines = [[c.strip() for c in line.strip("│┃").split("│")] for line in section.splitlines()]
    assert ["worker-a", "1", a] in lines
    assert ["-", "1", b] in lines
    # A map whose Redis copy is being restored serves lookups from its table meanwhile.
    assert "answer from the Delta table" not in status()
    now = int(time.time() * 1000)
    restoring = MapReport("restoring", reported_at_ms=now, worker="worker-a")
    redis_client.hset(status_key(a), mapping=restoring.to_hash())
    assert {m: d["serves_from_table"] for m, d in documents().items()} == {a: True, b: False}
    assert "lookups of keys not written back yet answer from the Delta table" in status()


def test_pause_resume_restart_write_the_control_hash(redis_url, redis_client: redis.Redis):
    cfg = two_maps("127.0.0.1:9", redis_url, "ta", "tb")
    a, _ = sorted(cfg.maps)

    def control() -> Control:
        return Control.from_hash(redis_client.hgetall(control_key(a)))

    assert call(cfg, "Pause", pb.ControlRequest(map=a)).requested_state == State.PAUSED
    assert control().desired == "paused"
    assert call(cfg, "Resume", pb.ControlRequest(map=a)).requested_state == State.RUNNING
    assert control() == Control("running", "")
    call(cfg, "Restart", pb.ControlRequest(map=a))
    first = control().restart_id
    call(cfg, "Restart", pb.ControlRequest(map=a))
    assert first and control().restart_id not in ("", first)


@pytest.mark.parametrize(
    ("method", "request_", "code"),
    [
        ("Pause", pb.ControlRequest(map="nope"), grpc.StatusCode.NOT_FOUND),
        ("Resume", pb.ControlRequest(map=""), grpc.StatusCode.INVALID_ARGUMENT),
        ("GetStatus", pb.GetStatusRequest(map="nope"), grpc.StatusCode.NOT_FOUND),
        (
            "ValidateConfig",
            pb.ValidateConfigRequest(config="x" * (1024 * 1024 + 1)),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
    ],
)
def test_bad_admin_requests_get_their_status_codes(redis_url, method, request_, code):
    cfg = two_maps("127.0.0.1:9", redis_url, "ta", "tb")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        call(cfg, method, request_)
    assert info.value.code() == code


def test_validate_config_gives_the_same_problems_as_the_cli(redis_url, tmp_path: Path):
    cfg = two_maps("127.0.0.1:9", redis_url, "ta", "tb")
    bad = {
        "kafka": {"bootstrap_server": "x"},
        "maps": {
            "users": {"source": {"topics": ["t"]}, "key": "id", "fold": {"mode": "sum"}},
            "raw": {"source": {"topics": ["t"]}, "key": "id", "fold": {"mode": "merge"}},
        },
    }
    text = yaml.safe_dump(bad)
    answer = call(cfg, "ValidateConfig", pb.ValidateConfigRequest(config=text))
    assert not answer.valid
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    cli = ManagedProcess(
        [sys.executable, "-m", "materializer", "validate", "-c", str(path)], tmp_path / "v.log"
    )
    assert cli.proc.wait(60) == 2
    printed = cli.log()
    assert "kafka.bootstrap_server: unknown key" in answer.problems
    assert "maps.users.fold.mode: must be one of latest, merge, aggregate" in answer.problems
    for problem in answer.problems:
        assert problem in printed
    good = call(cfg, "ValidateConfig", pb.ValidateConfigRequest(config=yaml.safe_dump({})))
    assert good.valid and not good.problems
    broken = call(cfg, "ValidateConfig", pb.ValidateConfigRequest(config="a: [1"))
    assert not broken.valid and broken.problems[0].startswith("<file>: not valid YAML")
