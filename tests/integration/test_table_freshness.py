"""Read-your-writes on the Delta table: Query and GetAsOf wait for min_offsets, answer with the
source offsets the version read reflects, and give up cleanly at the deadline; over gRPC
and the HTTP front, against a pipeline that keeps running."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from materializer.job import start_map
from materializer.testing import produce
from materializer.v1 import common_pb2 as common
from materializer.v1 import map_service_pb2 as pb
from materializer.v1 import map_service_pb2_grpc as pb_grpc
from tests.helpers.query_redis import Front, serve_http
from tests.helpers.slices import config, slice_config

MAP = "fresh_table"


def _user(i: int) -> tuple[bytes, bytes]:
    return f"u{i}".encode(), orjson.dumps({"id": f"u{i}", "name": f"n{i}", "age": i})


def _wanted(topic: str, position: tuple[int, int]) -> list[common.PartitionOffset]:
    partition, offset = position
    return [common.PartitionOffset(topic=topic, partition=partition, offset=offset + 1)]


def _offsets(mark: common.Watermark) -> dict[tuple[str, int], int]:
    return {(o.topic, o.partition): o.offset for o in mark.offsets}


@pytest.fixture
def running(spark, kafka_bootstrap, redis_url, new_topic, tmp_path: Path):
    """A map whose pipeline runs through the test, with a first wave already in its table."""
    topic = new_topic(2)
    cfg = config(slice_config(tmp_path, kafka_bootstrap, redis_url, topic, map_name=MAP))
    produce(kafka_bootstrap, topic, [_user(i) for i in range(20)])
    queries = start_map(spark, cfg, MAP)
    try:
        queries.process_all_available()
        yield cfg, topic
    finally:
        queries.stop()


def test_table_reads_wait_for_min_offsets_and_say_what_they_reflect(
    running: tuple[Any, str], kafka_bootstrap: str
):
    cfg, topic = running

    async def body(front: Front) -> None:
        stub = pb_grpc.MapServiceStub(front.channel)
        # Produced just now: Redis has it within a fold batch, the table a trigger later.
        (position,) = produce(kafka_bootstrap, topic, [_user(100)])
        wanted = _wanted(topic, position)
        request = pb.QueryRequest(
            map=MAP, where="age = 100", freshness=common.Freshness(min_offsets=wanted)
        )
        pages = [page async for page in stub.Query(request, timeout=60)]
        assert [(r.key, orjson.loads(r.entity)["name"]) for r in pages[0].rows] == [
            ("u100", "n100")
        ]
        covered = _offsets(pages[0].watermark)
        assert covered[(topic, position[0])] >= position[1] + 1
        assert pages[0].watermark.batch_id >= 0 and pages[0].watermark.HasField("updated_at")

        # GetAsOf waits the same way, then answers the version asked.
        (later,) = produce(kafka_bootstrap, topic, [_user(101)])
        as_of = pb.GetAsOfRequest(
            map=MAP,
            key="u101",
            timestamp=Timestamp(seconds=4_102_444_800),  # 2100: the newest version
            freshness=common.Freshness(min_offsets=_wanted(topic, later)),
        )
        answer = await stub.GetAsOf(as_of, timeout=60)
        assert answer.found and orjson.loads(answer.entity)["name"] == "n101"
        assert _offsets(answer.watermark)[(topic, later[0])] >= later[1] + 1
        # An older version answers with the offsets it reflected, which did not hold u101.
        older = await stub.GetAsOf(pb.GetAsOfRequest(map=MAP, key="u101", version=1), timeout=10)
        assert not older.found
        assert older.watermark.offsets
        assert _offsets(older.watermark).get((topic, later[0]), 0) <= later[1]

        # The HTTP front passes min_offsets the way Get does, and shows the watermark.
        (third,) = produce(kafka_bootstrap, topic, [_user(102)])
        partition, offset = third
        page = await front.json(
            "GET",
            f"/v1/maps/{MAP}/query",
            params={
                "where": "age = 102",
                "min_offsets": f"{topic}:{partition}:{offset + 1}",
                "timeout_ms": "60000",
            },
        )
        assert [row["key"] for row in page["rows"]] == ["u102"]
        assert page["watermark"]["offsets"][topic][str(partition)] >= offset + 1
        entity = await front.json(
            "GET",
            f"/v1/maps/{MAP}/entities/u102",
            params={
                "as_of_version": str(page["table_version"]),
                "min_offsets": f"{topic}:{partition}:{offset + 1}",
            },
        )
        assert entity["found"] and entity["watermark"] == page["watermark"]

    serve_http(cfg, body)


def test_min_offsets_never_reached_ends_at_the_deadline_and_the_server_goes_on(
    running: tuple[Any, str],
):
    cfg, topic = running

    async def body(front: Front) -> None:
        stub = pb_grpc.MapServiceStub(front.channel)
        never = [common.PartitionOffset(topic=topic, partition=0, offset=10**12)]
        started = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            request = pb.QueryRequest(map=MAP, freshness=common.Freshness(min_offsets=never))
            await anext(aiter(stub.Query(request, timeout=1.5)))
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert MAP in (info.value.details() or "")
        assert f"{topic}[0] >= {10**12}" in (info.value.details() or "")
        assert time.monotonic() - started < 5
        with pytest.raises(grpc.aio.AioRpcError) as info:
            as_of = pb.GetAsOfRequest(
                map=MAP, key="u1", version=1, freshness=common.Freshness(min_offsets=never)
            )
            await stub.GetAsOf(as_of, timeout=1.5)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED

        # A topic the map does not read could never be reached: refused at once.
        elsewhere = [common.PartitionOffset(topic="not-" + topic, partition=0, offset=1)]
        with pytest.raises(grpc.aio.AioRpcError) as info:
            request = pb.QueryRequest(map=MAP, freshness=common.Freshness(min_offsets=elsewhere))
            await anext(aiter(stub.Query(request, timeout=10)))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT

        # The server answers the next calls as before.
        pages = [page async for page in stub.Query(pb.QueryRequest(map=MAP), timeout=30)]
        assert len(pages[0].rows) == 20
        assert pages[0].watermark.offsets
        missing = await front.json(
            "GET",
            f"/v1/maps/{MAP}/query",
            status=504,
            params={"min_offsets": f"{topic}:0:{10**12}", "timeout_ms": "1000"},
        )
        assert MAP in str(missing)

    serve_http(cfg, body)
