"""The HTTP/JSON front on a real redis-server: every endpoint, its errors, auth, streams, and
the same answers as the gRPC API for the same requests."""

from __future__ import annotations

import asyncio
import random
import re
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import redis
import yaml

from materializer.config import parse_config
from materializer.contract.redis_layout import status_key
from materializer.contract.status import MapReport
from materializer.v1 import admin_service_pb2 as admin_pb
from materializer.v1 import admin_service_pb2_grpc as admin_grpc
from materializer.v1 import enrich_service_pb2 as enrich_pb
from materializer.v1 import enrich_service_pb2_grpc as enrich_grpc
from materializer.v1 import map_service_pb2 as pb
from materializer.v1 import map_service_pb2_grpc as pb_grpc
from query_service.http import shapes
from query_service.http.endpoints import ENDPOINTS
from query_service.http.enrichment import MAX_LINE_BYTES
from tests.helpers.query_redis import Front, fresh_map, make_config, serve_http, write_batch

READER = "reader-token-0123456789"
ADMIN = "admin-token-0123456789"


@pytest.fixture()
def map_name(redis_client: redis.Redis) -> Any:
    yield from fresh_map(redis_client)


def entity(key: str, name: str) -> bytes:
    return orjson.dumps({"id": key, "name": name})


def test_get_and_batch_get_answer_as_grpc_does(redis_url: str, map_name: str) -> None:
    write_batch(redis_url, map_name, 3, {"a": entity("a", "A"), "b": entity("b", "B")},
                {f"{map_name}-events": {0: 10, 1: 7}})  # fmt: skip
    cfg = make_config(redis_url, map_name)

    async def body(f: Front) -> None:
        maps = pb_grpc.MapServiceStub(f.channel)
        got = await f.json("GET", f"/v1/maps/{map_name}/entities/a")
        grpc_got = await maps.Get(pb.GetRequest(map=map_name, key="a"))
        assert got["found"] is grpc_got.found is True
        assert got["entity"] == orjson.loads(grpc_got.entity) == {"id": "a", "name": "A"}
        assert got["watermark"]["batch_id"] == grpc_got.watermark.batch_id == 3
        assert got["watermark"]["offsets"] == {f"{map_name}-events": {"0": 10, "1": 7}}
        shapes.Entity.model_validate(got)  # the answer is what the OpenAPI document says

        missing = await f.json("GET", f"/v1/maps/{map_name}/entities/zz")
        assert (missing["found"], missing["entity"], missing["key"]) == (False, None, "zz")

        keys = ["b", "zz", "a"]
        batch = await f.json("POST", f"/v1/maps/{map_name}/entities:batchGet", json={"keys": keys})
        grpc_batch = await maps.BatchGet(pb.BatchGetRequest(map=map_name, keys=keys))
        shapes.BatchGetAnswer.model_validate(batch)
        assert [(e["key"], e["found"]) for e in batch["entries"]] == [
            (e.key, e.found) for e in grpc_batch.entries
        ]
        assert batch["entries"][0]["entity"] == {"id": "b", "name": "B"}
        assert batch["entries"][1]["entity"] is None

        # Read-your-writes: a position the map has reached answers at once, one it has not
        # answers 504 once timeout_ms is up.
        topic = f"{map_name}-events"
        reached = await f.json("GET", f"/v1/maps/{map_name}/entities/a?min_offsets={topic}:0:10")
        assert reached["found"]
        late = await f.json(
            "GET",
            f"/v1/maps/{map_name}/entities/a?min_offsets={topic}:0:11&timeout_ms=300",
            status=504,
        )
        assert late["error"]["code"] == "DEADLINE_EXCEEDED"

    serve_http(cfg, body)


def test_errors_are_json_with_the_matching_status(redis_url: str, map_name: str) -> None:
    cfg = make_config(redis_url, map_name, max_batch_keys=3)

    async def body(f: Front) -> None:
        async def error(method: str, path: str, status: int, **kwargs: Any) -> dict[str, Any]:
            got = await f.json(method, path, status=status, **kwargs)
            assert set(got) == {"error"} and set(got["error"]) == {"code", "message"}
            return got["error"]  # type: ignore[no-any-return]

        unknown = await error("GET", "/v1/maps/nope/entities/a", 404)
        assert unknown["code"] == "NOT_FOUND" and "nope" in unknown["message"]
        assert (await error("GET", "/v1/nothing/here", 404))["code"] == "NOT_FOUND"
        assert (await error("DELETE", f"/v1/maps/{map_name}/entities/a", 405))["message"]
        batch = f"/v1/maps/{map_name}/entities:batchGet"
        too_many = await error("POST", batch, 413, json={"keys": ["a", "b", "c", "d"]})
        assert too_many["code"] == "RESOURCE_EXHAUSTED" and "max_batch_keys" in too_many["message"]
        typo = await error("POST", batch, 400, json={"kyes": ["a"]})
        assert "kyes" in typo["message"] or "keys" in typo["message"]
        assert (await error("POST", batch, 400, data=b"{not json"))["code"] == "INVALID_ARGUMENT"
        bad = await error("GET", f"/v1/maps/{map_name}/entities/a?min_offsets=t:x:1", 400)
        assert "min_offsets" in bad["message"]
        bad = await error("GET", f"/v1/maps/{map_name}/entities/a?timeout_ms=soon", 400)
        assert "timeout_ms" in bad["message"]
        empty = await error("POST", "/v1/enrich?profile=", 400, data=b"")
        assert "profile" in empty["message"]
        huge = await error("POST", batch, 413, data=b"x" * (17 * 1024 * 1024))
        assert huge["code"] == "RESOURCE_EXHAUSTED"

    serve_http(cfg, body)


def test_changes_are_server_sent_events_resumable_with_last_event_id(
    redis_url: str, map_name: str
) -> None:
    write_batch(redis_url, map_name, 0, {"a": entity("a", "1"), "b": entity("b", "1")})
    write_batch(redis_url, map_name, 1, {"a": None})
    cfg = make_config(redis_url, map_name)

    async def events(f: Front, count: int, **headers: str) -> list[dict[str, Any]]:
        url = f"{f.base}/v1/maps/{map_name}/changes?after=0&include_entities=true"
        out: list[dict[str, Any]] = []
        async with f.http.get(url, headers=headers) as r:
            assert r.status == 200 and r.content_type == "text/event-stream"
            event: dict[str, Any] = {}
            async for raw in r.content:
                line = raw.decode().rstrip("\n")
                if not line:
                    if event:
                        out.append(event)
                        event = {}
                    if len(out) == count:
                        return out
                    continue
                field, _, value = line.partition(": ")
                event[field] = orjson.loads(value) if field == "data" else value
        return out

    async def body(f: Front) -> None:
        every = await asyncio.wait_for(events(f, 3), 10)
        assert [(e["event"], e["data"]["key"], e["data"]["op"]) for e in every] == [
            ("change", "a", "upsert"),
            ("change", "b", "upsert"),
            ("change", "a", "delete"),
        ]
        assert all(e["id"] == e["data"]["change_id"] for e in every)
        assert every[1]["data"]["entity"] == {"id": "b", "name": "1"}
        shapes.ChangeEvent.model_validate(every[1]["data"])
        # Resumed after the first: the same two later changes, nothing else.
        resumed = await asyncio.wait_for(events(f, 2, **{"Last-Event-ID": every[0]["id"]}), 10)
        assert [e["id"] for e in resumed] == [every[1]["id"], every[2]["id"]]
        # Gone from the stream's retention: an error answer, before any event.
        gone = await f.json(
            "GET", f"/v1/maps/{map_name}/changes", status=400, headers={"Last-Event-ID": "1-0"}
        )
        assert gone["error"]["code"] == "OUT_OF_RANGE"

    serve_http(cfg, body)


def test_enrich_ndjson_matches_grpc_enrich(redis_url: str, map_name: str) -> None:
    write_batch(redis_url, map_name, 0, {f"u{i}": entity(f"u{i}", f"n{i}") for i in range(5)})
    cfg = make_config(redis_url, map_name)
    events = [orjson.dumps({"order": i, "user": f"u{i % 7}"}) for i in range(12)]
    spec = enrich_pb.JoinSpec(lookups=[enrich_pb.Lookup(map=map_name, key_field="user", alias="u")])

    async def body(f: Front) -> None:
        lookup = {"map": map_name, "key_field": "user", "alias": "u"}
        url = f"{f.base}/v1/enrich?batch=5&spec={orjson.dumps({'lookups': [lookup]}).decode()}"

        async def enrich(payload: bytes) -> list[dict[str, Any]]:
            async with f.http.post(url, data=payload) as r:
                assert r.status == 200 and r.content_type == "application/x-ndjson"
                return [orjson.loads(line) for line in (await r.read()).splitlines()]

        lines = await enrich(b"\n".join(events) + b"\n")
        for line in lines:
            shapes.EnrichedEvent.model_validate(line)
        assert [line["index"] for line in lines] == list(range(12))

        async def requests() -> AsyncIterator[enrich_pb.EnrichRequest]:
            yield enrich_pb.EnrichRequest(spec=spec, events=events[:5], request_id="0")
            yield enrich_pb.EnrichRequest(events=events[5:], request_id="1")

        stream = enrich_grpc.EnrichServiceStub(f.channel).Enrich(requests())
        answer = [e async for response in stream for e in response.events]
        assert [line["event"] for line in lines] == [orjson.loads(e.event) for e in answer]
        assert lines[0]["event"]["u"] == {"id": "u0", "name": "n0"}

        # An event that is not JSON ends the stream, as on gRPC: the lines before it, then
        # the error as the last line.
        broken = await enrich(b"\n".join([*events[:6], b"not json", *events[6:]]) + b"\n")
        assert [line.get("index") for line in broken[:-1]] == list(range(5))
        assert broken[-1]["error"]["code"] == "INVALID_ARGUMENT"
        # A bad spec is a 400 before any line.
        bad = await f.json("POST", "/v1/enrich?spec={", status=400, data=b"{}\n")
        assert "spec" in bad["error"]["message"]
        # An event far longer than a read buffer is taken whole; one longer than the limit
        # is a 413 naming its line, before any answer.
        padded = orjson.dumps({"order": 0, "user": "u1", "pad": "x" * (1 << 20)})
        (long,) = await enrich(padded + b"\n")
        assert long["event"]["u"] == {"id": "u1", "name": "n1"}
        assert len(long["event"]["pad"]) == 1 << 20
        too_long = b'{"pad": "' + b"x" * MAX_LINE_BYTES + b'"}\n'
        huge = await f.json(
            "POST", url.removeprefix(f.base), status=413, data=events[0] + b"\n" + too_long
        )
        assert huge["error"]["message"] == f"line 2: longer than {MAX_LINE_BYTES} bytes"

    serve_http(cfg, body)


def test_admin_in_kafka_connect_shapes(
    redis_url: str, redis_client: redis.Redis, map_name: str
) -> None:
    cfg = make_config(redis_url, map_name)
    report = MapReport("running", reported_at_ms=int(time.time() * 1000), worker="worker-a")
    redis_client.hset(status_key(map_name), mapping=report.to_hash())

    async def body(f: Front) -> None:
        listed = await f.json("GET", "/v1/maps")
        assert [m["name"] for m in listed["maps"]] == [map_name]
        status = await f.json("GET", f"/v1/maps/{map_name}/status")
        grpc_status = await admin_grpc.AdminServiceStub(f.channel).GetStatus(
            admin_pb.GetStatusRequest(map=map_name)
        )
        assert status["map"] == map_name
        assert status["state"] == admin_pb.MapStatus.State.Name(grpc_status.maps[0].state)
        assert status["state"] == "RUNNING"
        assert status["worker_id"] == grpc_status.maps[0].worker_id == "worker-a"
        paused = await f.json("PUT", f"/v1/maps/{map_name}/pause", status=202)
        assert paused == {"map": map_name, "requested_state": "PAUSED"}
        assert (await f.json("PUT", f"/v1/maps/{map_name}/resume", status=202))[
            "requested_state"
        ] == "RUNNING"
        assert (await f.json("POST", f"/v1/maps/{map_name}/restart", status=202))["map"] == map_name
        bad = yaml.safe_dump({"maps": {"m": {"key": "id"}}})
        checked = await f.json("PUT", "/v1/config/validate", data=bad)
        assert checked["valid"] is False and any("maps.m" in p for p in checked["problems"])
        assert (await f.json("GET", "/healthz")) == {"status": "SERVING"}
        assert (await f.json("GET", "/readyz")) == {"status": "SERVING"}
        # A readiness probe naming no map, or not a map's name, is the caller's mistake.
        for bad_name in ("", "no such/map"):
            refused = await f.json("GET", "/readyz", params={"map": bad_name}, status=400)
            assert refused["error"]["message"].startswith(f"map: {bad_name!r} is not a map's name")

    serve_http(cfg, body)


def test_openapi_describes_every_endpoint(redis_url: str, map_name: str) -> None:
    cfg = make_config(redis_url, map_name)

    async def body(f: Front) -> None:
        doc = await f.json("GET", "/openapi.json")
        assert doc["openapi"].startswith("3.")
        for endpoint in ENDPOINTS:
            operation = doc["paths"][endpoint.path][endpoint.method.lower()]
            assert operation["operationId"] == endpoint.name
            assert str(endpoint.status) in operation["responses"]
        # Every reference resolves.
        text = orjson.dumps(doc).decode()
        for ref in {part.split('"')[0] for part in text.split('"$ref":"')[1:]}:
            assert ref.rsplit("/", 1)[-1] in doc["components"]["schemas"], ref

    serve_http(cfg, body)


def test_bearer_tokens_and_per_map_grants(redis_url: str, tmp_path: Path) -> None:
    public, private = "pub-" + random.randbytes(4).hex(), "priv-" + random.randbytes(4).hex()
    write_batch(redis_url, public, 0, {"a": entity("a", "A")})
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(
        yaml.safe_dump(
            {
                "tokens": [
                    {"name": "reader", "token": READER, "maps": [public], "verbs": ["get"]},
                    {"name": "admin", "token": ADMIN, "maps": ["*"], "verbs": ["*"]},
                ]
            }
        )
    )
    doc = {
        "redis": {"url": redis_url},
        "query": {"auth": {"tokens_file": str(tokens)}},
        "maps": {
            m: {"source": {"topics": [f"{m}-events"], "schema": "id STRING"}, "key": "id"}
            for m in (public, private)
        },
    }
    cfg = parse_config(doc)

    async def body(f: Front) -> None:
        path = f"/v1/maps/{public}/entities/a"
        missing = await f.json("GET", path, status=401)
        assert missing["error"]["code"] == "UNAUTHENTICATED"
        reader = {"Authorization": f"Bearer {READER}"}
        assert (await f.json("GET", path, headers=reader))["found"]
        other = await f.json("GET", f"/v1/maps/{private}/entities/a", status=403, headers=reader)
        assert other["error"]["code"] == "PERMISSION_DENIED"
        assert await f.json("PUT", f"/v1/maps/{public}/pause", status=403, headers=reader)
        admin = {"Authorization": f"Bearer {ADMIN}"}
        assert await f.json("PUT", f"/v1/maps/{public}/pause", status=202, headers=admin)
        # Probes and the document need no token.
        assert (await f.json("GET", "/readyz"))["status"] == "SERVING"
        assert (await f.json("GET", "/openapi.json"))["paths"]

    serve_http(cfg, body)


def test_curl_reads_an_entity(redis_url: str, map_name: str) -> None:
    write_batch(redis_url, map_name, 0, {"k 1": entity("k 1", "spaced")})
    cfg = make_config(redis_url, map_name)

    async def body(f: Front) -> None:
        url = f"{f.base}/v1/maps/{map_name}/entities/k%201"
        done = await asyncio.create_subprocess_exec(
            "curl", "-sS", "--fail-with-body", url, stdout=subprocess.PIPE
        )
        out, _ = await done.communicate()
        assert done.returncode == 0
        got = orjson.loads(out)
        assert (got["key"], got["entity"]) == ("k 1", {"id": "k 1", "name": "spaced"})

    serve_http(cfg, body)


def test_fuzzed_paths_and_bodies_never_answer_500(redis_url: str, map_name: str) -> None:
    write_batch(redis_url, map_name, 0, {"a": entity("a", "A")})
    cfg = make_config(redis_url, map_name)
    rng = random.Random(11)
    pieces = ["v1", "maps", map_name, "entities", "a", ":batchGet", "query", "changes", "..",
              "%00", "%ff", "status", "pause", "\u00e9", "x" * 300, "enrich", ""]  # fmt: skip
    params = ["min_offsets=::", "timeout_ms=-1", "limit=x", "where=)))", "as_of_version=q",
              "as_of_timestamp=never", "fields=,,", "spec=[]", "batch=0",
              "page_token=%%"]  # fmt: skip
    bodies = [b"", b"{}", b"[]", b"null", b'{"keys": 5}', b'{"keys": [1, 2]}', b"\xff\xfe",
              b'{"keys": ["a"], "min_offsets": {"t": {"x": 1}}}', b"\n\n{]\n"]  # fmt: skip

    async def body(f: Front) -> None:
        for _ in range(300):
            path = "/" + "/".join(rng.choice(pieces) for _ in range(rng.randint(1, 5)))
            if rng.random() < 0.5:
                path += "?" + "&".join(rng.sample(params, rng.randint(1, 3)))
            method = rng.choice(["GET", "POST", "PUT", "DELETE"])
            try:
                async with f.http.request(
                    method, f.base + path, data=rng.choice(bodies), timeout=aiohttp.ClientTimeout(5)
                ) as r:
                    assert r.status < 500 or r.status in (503, 504), (method, path, r.status)
                    if r.status >= 400:
                        assert (await r.json(content_type=None))["error"]["code"]
            except TimeoutError:
                pass  # a change stream that opened: it waits for changes, as it should
        assert (await f.json("GET", f"/v1/maps/{map_name}/entities/a"))["found"]

    serve_http(cfg, body)


def test_numbers_and_offsets_out_of_range_are_400s_the_document_declares(
    redis_url: str, map_name: str
) -> None:
    topic = f"{map_name}-events"
    write_batch(redis_url, map_name, 0, {"a": entity("a", "A")}, {topic: {0: 5}})
    cfg = make_config(redis_url, map_name)
    entities, query = f"/v1/maps/{map_name}/entities/a", f"/v1/maps/{map_name}/query"
    refused = [
        (query, "page_size", "17179869183"),  # past int32: once an overflow and a 500
        (query, "page_size", "10001"),
        (query, "page_size", "-1"),
        (query, "limit", "-1"),
        (query, "limit", str(2**63)),
        (entities, "as_of_version", str(2**63)),
        (entities, "timeout_ms", "0"),
        (entities, "min_offsets", "t:x:1"),
        (entities, "min_offsets", "t:0:-1"),
        (entities, "min_offsets", "t:99999999999:1"),
    ]

    async def body(f: Front) -> None:
        document = await f.json("GET", "/openapi.json")
        for path, name, value in refused:
            answer = await f.json("GET", f"{path}?{name}={value}", status=400)
            assert answer["error"]["code"] == "INVALID_ARGUMENT"
            assert answer["error"]["message"].startswith(f"{name}:"), answer
            # The document says so: the value is outside the schema it declares.
            template = path.replace(map_name, "{map}").replace("/a", "/{key}")
            declared = document["paths"][template]["get"]["parameters"]
            # A form-exploded object (as_of) declares its members as its properties.
            (schema,) = [
                p["schema"] if p["name"] == name else p["schema"]["properties"][name]
                for p in declared
                if p["name"] == name or name in p["schema"].get("properties", {})
            ]
            if schema["type"] == "integer":
                assert not schema["minimum"] <= int(value) <= schema["maximum"], (name, value)
            else:
                assert not re.fullmatch(schema["pattern"], value), (name, value)
        # In range, the same parameters are taken.
        # (This map has no Delta table: a query that passed its checks gets that far.)
        page = await f.json("GET", f"{query}?page_size=10000&limit=1", status=404)
        assert "no Delta table" in page["error"]["message"]
        got = await f.json("GET", f"{entities}?min_offsets={topic}:0:4,&timeout_ms=2147483647")
        assert got["found"]
        # A validation request without a configuration is refused, not answered valid.
        empty = await f.json("PUT", "/v1/config/validate", data=b"", status=400)
        assert empty["error"]["message"].startswith("config: empty")

    serve_http(cfg, body)
