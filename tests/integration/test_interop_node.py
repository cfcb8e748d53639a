"""The API from another gRPC stack: Node's @grpc/grpc-js loading proto/ at run time."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import uuid
from pathlib import Path

import orjson
import redis

from materializer.config import parse_config
from materializer.contract.redis_layout import entity_key, meta_key
from materializer.contract.watermark import Watermark
from query_service.server import create_server
from query_service.stores.redis import RedisMapStore

ROOT = Path(__file__).resolve().parents[2]
INTEROP = ROOT / "tests" / "interop"


def test_a_node_client_generated_from_the_protos_gets_entities(
    redis_url: str, redis_client: redis.Redis
):
    node = shutil.which("node")
    assert node, "Node.js is needed for the interop test"
    assert (INTEROP / "node_modules" / "@grpc" / "grpc-js").is_dir(), (
        "run `make setup` (it installs the Node client's packages with npm)"
    )
    name = f"node{uuid.uuid4().hex[:8]}"
    entity = orjson.dumps({"id": "u1", "name": "Åsa", "age": 41})
    redis_client.set(entity_key(name, "u1"), entity)
    redis_client.hset(meta_key(name), mapping=Watermark(9, {"t": {0: 3}}).to_hash())
    config = parse_config(
        {
            "redis": {"url": redis_url},
            "maps": {name: {"source": {"topics": ["t"], "schema": "id STRING"}, "key": "id"}},
        }
    )

    async def main() -> bytes:
        store = RedisMapStore.from_url(redis_url)
        server, port = await create_server(config, store=store)
        await server.start()
        try:
            proc = await asyncio.create_subprocess_exec(
                node,
                str(INTEROP / "client.js"),
                str(ROOT / "proto"),
                f"127.0.0.1:{port}",
                name,
                "u1",
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
            assert proc.returncode == 0, err.decode()
            return out
        finally:
            await server.stop(None)
            await store.close()

    result = orjson.loads(asyncio.run(main()))
    assert result == {
        "get": {"found": True, "entity": entity.decode(), "batch_id": "9"},
        "batch": [["u1", True], ["absent-key", False]],
        "unknown_code": 5,  # NOT_FOUND
        "maps": [name],
    }
