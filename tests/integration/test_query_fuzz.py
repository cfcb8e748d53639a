"""Fuzzed requests for every RPC: the answer is always a deliberate status, never UNKNOWN or
INTERNAL, and the server keeps answering. Random messages and raw wire bytes alike."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import orjson
import pyarrow as pa
import pytest
import redis
from deltalake import write_deltalake
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from materializer.config import parse_config
from materializer.contract.redis_layout import changes_key, entity_key, meta_key
from materializer.contract.watermark import Watermark
from materializer.v1 import admin_service_pb2 as admin_pb
from materializer.v1 import common_pb2 as common
from materializer.v1 import enrich_service_pb2 as enrich_pb
from materializer.v1 import map_service_pb2 as pb
from query_service.server import create_server
from query_service.stores.redis import RedisMapStore

MAP = f"fz{uuid.uuid4().hex[:8]}"
DELIBERATE = set(grpc.StatusCode) - {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL}
FUZZ = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def server(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One server on its own loop and thread for the whole module; its target."""
    root = tmp_path_factory.mktemp("fuzz")
    client = redis.Redis.from_url(redis_url)
    client.set(entity_key(MAP, "u1"), b'{"id":"u1","age":3}')
    client.hset(meta_key(MAP), mapping=Watermark(1, {f"{MAP}-events": {0: 2}}).to_hash())
    client.xadd(changes_key(MAP), {"key": "u1", "op": "upsert", "batch_id": "1"})
    client.close()
    write_deltalake(
        str(root / MAP), pa.table({"_key": ["u1", "u2"], "id": ["u1", "u2"], "age": [3, None]})
    )
    config = parse_config(
        {
            "kafka": {"bootstrap_servers": "127.0.0.1:9"},
            "redis": {"url": redis_url},
            "delta": {"root": str(root)},
            "maps": {
                MAP: {"source": {"topics": [f"{MAP}-events"], "schema": "id STRING"}, "key": "id"}
            },
        }
    )
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    holder: dict[str, Any] = {}

    async def start() -> None:
        store = RedisMapStore.from_url(redis_url)
        srv, port = await create_server(config, store=store)
        await srv.start()
        holder.update(server=srv, store=store, port=port)
        ready.set()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop)
    assert ready.wait(30)
    try:
        yield f"127.0.0.1:{holder['port']}"
    finally:

        async def stop() -> None:
            await holder["server"].stop(None)
            await holder["store"].close()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


@pytest.fixture(scope="module")
def channel(server: str) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server) as ch:
        yield ch


def call(channel: grpc.Channel, method: str, body: bytes, stream: str = "unary") -> grpc.StatusCode:
    """Send raw bytes to a method; the status it ends with."""
    identity = {"request_serializer": None, "response_deserializer": None}
    try:
        if stream == "unary":
            channel.unary_unary(method, **identity)(body, timeout=5)
        elif stream == "server":
            for _ in channel.unary_stream(method, **identity)(body, timeout=1):
                pass
        else:
            for _ in channel.stream_stream(method, **identity)(iter([body]), timeout=5):
                pass
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


maps = st.sampled_from([MAP, "", "nope", "a:b", "__meta__"]) | st.text(max_size=40)
keys = st.sampled_from(["u1", "", "__changes__", "k" * 5000]) | st.text(max_size=60)
offsets = st.lists(
    st.builds(
        common.PartitionOffset,
        topic=st.sampled_from([f"{MAP}-events", "other"]) | st.text(max_size=10),
        partition=st.integers(-(2**31), 2**31 - 1),
        offset=st.integers(-(2**63), 2**63 - 1),
    ),
    max_size=3,
)
freshness = st.builds(common.Freshness, min_offsets=offsets)
wheres = st.sampled_from(
    ["age > 1", "age > 1; DROP TABLE t", "id IN (SELECT 1)", "", "x = 'a''", "/*", "age/0 = 1"]
) | st.text(max_size=80)
json_events = st.lists(
    st.one_of(
        st.binary(max_size=30),
        st.dictionaries(st.sampled_from(["user", "x", "u"]), st.text(max_size=5)).map(orjson.dumps),
    ),
    max_size=5,
)
lookups = st.lists(
    st.builds(
        enrich_pb.Lookup,
        map=maps,
        key_field=st.sampled_from(["user", "", "a.b", ".", "u..x"]) | st.text(max_size=10),
        alias=st.text(max_size=10),
        fields=st.lists(st.text(max_size=5), max_size=3),
        join=st.integers(0, 3),
        on_miss=st.integers(0, 4),
    ),
    max_size=3,
)

REQUESTS: dict[str, tuple[str, st.SearchStrategy[Message]]] = {
    "/materializer.v1.MapService/Get": (
        "unary",
        st.builds(pb.GetRequest, map=maps, key=keys, freshness=freshness),
    ),
    "/materializer.v1.MapService/BatchGet": (
        "unary",
        st.builds(
            pb.BatchGetRequest, map=maps, keys=st.lists(keys, max_size=20), freshness=freshness
        ),
    ),
    "/materializer.v1.MapService/Query": (
        "server",
        st.builds(
            pb.QueryRequest,
            map=maps,
            where=wheres,
            fields=st.lists(st.sampled_from(["age", "id", "_key", "zz", ""]), max_size=3),
            limit=st.integers(-5, 10**12),
            page_size=st.integers(-5, 20_000),
            page_token=st.sampled_from(["", "x", "eyJ2IjoxfQ=="]) | st.text(max_size=20),
        ),
    ),
    "/materializer.v1.MapService/GetAsOf": (
        "unary",
        st.builds(pb.GetAsOfRequest, map=maps, key=keys, version=st.integers(-(2**63), 2**63 - 1)),
    ),
    "/materializer.v1.MapService/Watch": (
        "server",
        st.builds(
            pb.WatchRequest,
            map=maps,
            after_change_id=st.sampled_from(["", "0", "1-0", "99999999999999-0", "x-y", "-1"])
            | st.text(max_size=20),
            include_entities=st.booleans(),
            keys=st.lists(keys, max_size=3),
        ),
    ),
    "/materializer.v1.EnrichService/Enrich": (
        "bidi",
        st.builds(
            enrich_pb.EnrichRequest,
            spec=st.builds(enrich_pb.JoinSpec, lookups=lookups),
            events=json_events,
            request_id=st.text(max_size=10),
            freshness=freshness,
        ),
    ),
    "/materializer.v1.AdminService/Pause": (
        "unary",
        st.builds(admin_pb.ControlRequest, map=st.sampled_from(["", "nope"]) | st.text(max_size=9)),
    ),
    "/materializer.v1.AdminService/ValidateConfig": (
        "unary",
        st.builds(
            admin_pb.ValidateConfigRequest,
            config=st.text(max_size=200)
            | st.sampled_from(
                ["maps: {a: {key: id}}", "{", "- 1", "maps: [1]", "!!python/object:x {}"]
            ),
        ),
    ),
}


@pytest.mark.parametrize("method", sorted(REQUESTS))
def test_fuzzed_messages_get_deliberate_statuses(channel: grpc.Channel, method: str):
    stream, messages = REQUESTS[method]

    @FUZZ
    @given(message=messages)
    def check(message: Message) -> None:
        code = call(channel, method, message.SerializeToString(), stream)
        assert code in DELIBERATE, (code, message)

    check()


@pytest.mark.parametrize("method", sorted(REQUESTS))
def test_raw_bytes_and_invalid_utf8_are_invalid_argument(channel: grpc.Channel, method: str):
    stream = REQUESTS[method][0]

    @FUZZ
    @given(raw=st.binary(max_size=64))
    def check(raw: bytes) -> None:
        code = call(channel, method, raw, stream)
        assert code in DELIBERATE, (code, raw)

    check()
    # Field 1 (map, a string) holding bytes that are not UTF-8.
    invalid_utf8 = b"\x0a\x02\xff\xfe"
    assert call(channel, method, invalid_utf8, stream) == grpc.StatusCode.INVALID_ARGUMENT


def test_the_server_still_answers_after_the_fuzzing(channel: grpc.Channel, server: str):
    get = channel.unary_unary(
        "/materializer.v1.MapService/Get",
        request_serializer=pb.GetRequest.SerializeToString,
        response_deserializer=pb.GetResponse.FromString,
    )
    response = get(pb.GetRequest(map=MAP, key="u1"), timeout=5)
    assert response.found and orjson.loads(response.entity) == {"id": "u1", "age": 3}
