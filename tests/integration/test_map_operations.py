"""Operations asked through the AdminService and carried out by the run that folds the map:
verify, rehydrate and rebuild of a real ``materializer run``, one at a time, over gRPC and
HTTP, interrupted by the run stopping; and the refusals that need no run."""

from __future__ import annotations

import asyncio
import signal
import sys
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis
import yaml

from materializer.config import parse_config
from materializer.contract.control import MapControl
from materializer.contract.operations import INTERRUPTED
from materializer.contract.redis_layout import (
    entity_key,
    generation_key,
    operation_key,
)
from materializer.testing.process import ManagedProcess
from materializer.testing.waiting import eventually, wait_until
from materializer.v1 import admin_service_pb2 as admin_pb
from materializer.v1 import admin_service_pb2_grpc as admin_grpc
from query_service.client import MaterializerClient
from query_service.server import create_server
from query_service.stores.redis import RedisMapStore
from tests.helpers.query_redis import front
from tests.helpers.slices import Produced, redis_map, slice_config

KEYS = 40
State = admin_pb.Operation.State
OPS_TOKEN = "ops-token-0123456789abcdef"
WATCH_TOKEN = "watch-token-0123456789abcd"


async def _ended(stub: admin_grpc.AdminServiceStub, name: str, op_id: str) -> admin_pb.Operation:
    """The operation once its run reported it done or failed."""
    last: list[admin_pb.Operation] = []

    async def ended() -> bool:
        last[:] = [await stub.GetOperation(admin_pb.GetOperationRequest(map=name), timeout=10)]
        return last[0].id == op_id and last[0].state in (State.DONE, State.FAILED)

    await eventually(f"{op_id} to end", ended, timeout=300, interval=0.2)
    return last[0]


def test_verify_rehydrate_and_rebuild_asked_of_a_running_map(
    kafka_bootstrap, redis_url, redis_client: redis.Redis, new_topic, tmp_path: Path
):
    name = f"asked{uuid.uuid4().hex[:6]}"
    stream = Produced(kafka_bootstrap, new_topic(2), redis_client, KEYS)
    stream.produce(200)
    folded, expected = stream.folded, stream.expected
    doc = slice_config(tmp_path, kafka_bootstrap, redis_url, stream.topic, map_name=name)
    cfg = parse_config(doc)
    config_file = tmp_path / "maps.yaml"
    config_file.write_text(yaml.safe_dump(doc))
    args = [sys.executable, "-m", "materializer", "run", "-c", str(config_file)]
    proc = ManagedProcess(args, tmp_path / "run.log")
    try:
        wait_until("the first events folded", lambda: folded(name), alive=proc.alive)

        async def body() -> None:
            async with front(cfg) as f:
                stub = admin_grpc.AdminServiceStub(f.channel)

                async def start(kind: str) -> admin_pb.Operation:
                    asked = admin_pb.OperationRequest(map=name, kind=kind)
                    return await stub.StartOperation(asked, timeout=10)

                async def status_reported() -> bool:
                    got = await stub.GetStatus(admin_pb.GetStatusRequest(map=name), timeout=10)
                    return got.maps[0].state == admin_pb.MapStatus.State.RUNNING

                await eventually("running reported", status_reported, timeout=60)

                # Verify: identical, and the map resumed after its hold.
                asked = await start("verify")
                assert (asked.kind, asked.state, asked.requested_by) == (
                    "verify", State.REQUESTED, "anonymous",
                )  # fmt: skip
                verified = await _ended(stub, name, asked.id)
                assert verified.state == State.DONE, verified.error
                assert verified.WhichOneof("result") == "verify"
                assert verified.verify.identical and verified.verify.watermark_matches
                assert verified.verify.expected == verified.verify.actual == KEYS
                assert verified.worker_id and verified.progress_done == verified.progress_total
                assert verified.started_at.ToMilliseconds() >= asked.requested_at.ToMilliseconds()
                assert verified.finished_at.ToMilliseconds() >= verified.started_at.ToMilliseconds()
                assert MapControl(redis_client, name).request().desired == "running"

                # Keys lost and one too many: verify names them, rehydrate mends them.
                redis_client.delete(entity_key(name, "u1"), entity_key(name, "u2"))
                redis_client.set(entity_key(name, "zzz"), b"{}")
                differs = await _ended(stub, name, (await start("verify")).id)
                assert differs.state == State.DONE and not differs.verify.identical
                assert differs.verify.missing == admin_pb.KeyDifferences(
                    count=2, first=["u1", "u2"]
                )
                assert differs.verify.extra == admin_pb.KeyDifferences(count=1, first=["zzz"])
                assert differs.verify.different.count == 0
                rehydrated = await _ended(stub, name, (await start("rehydrate")).id)
                assert rehydrated.state == State.DONE, rehydrated.error
                assert rehydrated.rehydrate.loaded == KEYS
                assert rehydrated.rehydrate.removed == 1
                assert redis_map(redis_client, name) == expected()
                assert MapControl(redis_client, name).request().desired == "running"

                # Rebuild over HTTP; while it runs, another request is refused on both APIs.
                path = f"/v1/maps/{name}/operations"
                accepted = await f.json("POST", path, status=202, json={"kind": "rebuild"})
                assert (accepted["kind"], accepted["state"]) == ("rebuild", "REQUESTED")

                async def switched() -> bool:
                    last = await f.json("GET", path + "/last")
                    assert last["state"] in ("REQUESTED", "RUNNING"), last
                    return "rebuild" in last

                await eventually("readers switched", switched, timeout=300, interval=0.2)
                last = await f.json("GET", path + "/last")
                assert last["rebuild"] == {"generation": "1"}
                assert last["state"] == "RUNNING"
                refused = await f.json("POST", path, status=409, json={"kind": "verify"})
                assert refused["error"]["code"] == "FAILED_PRECONDITION"
                assert f"rebuild {accepted['id']}" in refused["error"]["message"]
                with pytest.raises(grpc.aio.AioRpcError) as busy:
                    await start("rehydrate")
                assert busy.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert f"rebuild {accepted['id']} asked by anonymous is running" in str(
                    busy.value.details()
                )
                unknown = await f.json("POST", path, status=400, json={"kind": "bogus"})
                assert "'bogus'" in unknown["error"]["message"]
                assert redis_client.get(generation_key(name)) == b"1"
                await asyncio.to_thread(
                    wait_until,
                    "the map resumed on the new copy",
                    lambda: (
                        folded(f"{name}~1") and redis_map(redis_client, f"{name}~1") == expected()
                    ),
                )
                rebuilt = await _ended(stub, name, accepted["id"])
                assert rebuilt.state == State.DONE, rebuilt.error
                assert rebuilt.rebuild.generation == 1
                assert redis_map(redis_client, name) == {}  # the old copy is dropped

                # A run that stops while an operation runs reports it interrupted, and ends.
                stream.produce(30)
                cut = await start("rebuild")

                async def running() -> bool:
                    got = await stub.GetOperation(admin_pb.GetOperationRequest(map=name))
                    return got.state == State.RUNNING

                await eventually("the second rebuild running", running, timeout=60)
                proc.proc.send_signal(signal.SIGTERM)
                await asyncio.to_thread(proc.proc.wait, 150)
                stopped = await stub.GetOperation(admin_pb.GetOperationRequest(map=name))
                assert (stopped.id, stopped.state) == (cut.id, State.FAILED)
                assert stopped.error == INTERRUPTED

        asyncio.run(body())
    finally:
        proc.stop()
    log = proc.log_path.read_text()
    assert proc.proc.returncode == 0, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    # The record stays for a page to show, until the next request replaces it.
    assert redis_client.hget(operation_key(name), "state") == b"failed"


def test_requests_refused_without_a_grant_a_run_or_a_known_kind(
    redis_url, redis_client: redis.Redis, tmp_path: Path
):
    name = f"asked{uuid.uuid4().hex[:6]}"
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(
        yaml.safe_dump(
            {
                "tokens": [
                    {"name": "ops", "token": OPS_TOKEN, "maps": ["*"], "verbs": ["*"]},
                    {"name": "watch", "token": WATCH_TOKEN, "maps": ["*"], "verbs": ["status"]},
                ]
            }
        )
    )
    doc = {
        "redis": {"url": redis_url},
        "query": {"auth": {"tokens_file": str(tokens)}},
        "maps": {
            name: {"source": {"topics": [f"{name}-events"], "schema": "id STRING"}, "key": "id"}
        },
    }
    cfg = parse_config(doc)

    def as_(token: str) -> tuple[tuple[str, str]]:
        return (("authorization", f"Bearer {token}"),)

    async def code(call: Any, request: Any, token: str) -> tuple[grpc.StatusCode, str]:
        try:
            await call(request, timeout=10, metadata=as_(token))
        except grpc.aio.AioRpcError as exc:
            return exc.code(), str(exc.details())
        return grpc.StatusCode.OK, ""

    async def body() -> None:
        store = RedisMapStore.from_url(redis_url)
        server, port = await create_server(cfg, store=store)
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = admin_grpc.AdminServiceStub(channel)
                verify = admin_pb.OperationRequest(map=name, kind="verify")
                last = admin_pb.GetOperationRequest(map=name)
                denied = await code(stub.StartOperation, verify, WATCH_TOKEN)
                assert denied == (
                    grpc.StatusCode.PERMISSION_DENIED,
                    "token 'watch' may not call StartOperation",
                )
                assert (await code(stub.GetOperation, last, WATCH_TOKEN))[0] == (
                    grpc.StatusCode.NOT_FOUND
                )
                no_run = await code(stub.StartOperation, verify, OPS_TOKEN)
                assert no_run[0] == grpc.StatusCode.FAILED_PRECONDITION
                assert "no materializer runs it" in no_run[1]
                bogus = admin_pb.OperationRequest(map=name, kind="compact")
                assert await code(stub.StartOperation, bogus, OPS_TOKEN) == (
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "kind: unknown 'compact' (one of verify, rehydrate, rebuild)",
                )
                async with MaterializerClient(f"127.0.0.1:{port}", token=WATCH_TOKEN) as client:
                    with pytest.raises(grpc.aio.AioRpcError) as never:
                        await client.last_operation(name)
                    assert never.value.code() == grpc.StatusCode.NOT_FOUND
                    assert "no operation was asked of it yet" in str(never.value.details())
                elsewhere = admin_pb.OperationRequest(map="nosuchmap", kind="verify")
                assert (await code(stub.StartOperation, elsewhere, OPS_TOKEN))[0] == (
                    grpc.StatusCode.NOT_FOUND
                )
        finally:
            await server.stop(None)
            await store.close()

    asyncio.run(body())
    assert not redis_client.exists(operation_key(name))
