"""Bearer tokens per map and verb, TLS and mutual TLS, health that follows Redis, and the
typed client's deadlines and retries — all through real channels to a real server."""

from __future__ import annotations

import asyncio
import ssl
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import grpc
import orjson
import pytest
import redis
import trustme
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from materializer.config import AppConfig, parse_config
from materializer.contract.redis_layout import entity_key, meta_key
from materializer.contract.watermark import Watermark
from materializer.errors import ConfigError
from materializer.testing import RedisServer, free_port
from materializer.v1 import admin_service_pb2 as admin_pb
from materializer.v1 import admin_service_pb2_grpc as admin_grpc
from materializer.v1 import enrich_service_pb2 as enrich_pb
from materializer.v1 import enrich_service_pb2_grpc as enrich_grpc
from materializer.v1 import map_service_pb2 as pb
from materializer.v1 import map_service_pb2_grpc as pb_grpc
from query_service.client import MaterializerClient
from query_service.server import create_server, create_servers
from query_service.stores.redis import RedisMapStore

T = TypeVar("T")
READER = "reader-token-0123456789"
ADMIN = "admin-token-0123456789ab"
ENRICHER = "enrich-token-0123456789"


def names() -> tuple[str, str]:
    tag = uuid.uuid4().hex[:8]
    return f"users{tag}", f"orders{tag}"


def config_doc(redis_url: str, public: str, private: str, **query: Any) -> dict[str, Any]:
    def map_doc(name: str) -> dict[str, Any]:
        return {"source": {"topics": [f"{name}-events"], "schema": "id STRING"}, "key": "id"}

    return {
        "redis": {"url": redis_url},
        "query": query,
        "maps": {public: map_doc(public), private: map_doc(private)},
    }


def tokens_doc(public: str) -> dict[str, Any]:
    return {
        "tokens": [
            {"name": "reader", "token": READER, "maps": [public], "verbs": ["get"]},
            {"name": "enricher", "token": ENRICHER, "maps": [public], "verbs": ["enrich"]},
            {"name": "ops", "token": ADMIN, "maps": ["*"], "verbs": ["*"]},
        ]
    }


@asynccontextmanager
async def served(
    config: AppConfig, credentials: grpc.ChannelCredentials | None = None
) -> AsyncIterator[grpc.aio.Channel]:
    store = RedisMapStore.from_url(config.redis.url)
    server, port = await create_server(config, store=store)
    await server.start()
    target = f"localhost:{port}"
    try:
        if credentials is None:
            channel = grpc.aio.insecure_channel(target)
        else:
            channel = grpc.aio.secure_channel(target, credentials)
        async with channel:
            yield channel
    finally:
        await server.stop(None)
        await store.close()


def run(config: AppConfig, body: Callable[[grpc.aio.Channel], Awaitable[T]], **kw: Any) -> T:
    async def main() -> T:
        async with served(config, **kw) as channel:
            return await body(channel)

    return asyncio.run(main())


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


async def code_of(call: Awaitable[Any]) -> grpc.StatusCode:
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def test_tokens_grant_maps_and_verbs(redis_url: str, redis_client: redis.Redis, tmp_path: Path):
    public, private = names()
    redis_client.set(entity_key(public, "u1"), b'{"id":"u1"}')
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(yaml.safe_dump(tokens_doc(public)))
    cfg = parse_config(config_doc(redis_url, public, private, auth={"tokens_file": str(tokens)}))

    async def body(channel: grpc.aio.Channel) -> dict[str, grpc.StatusCode]:
        maps = pb_grpc.MapServiceStub(channel)
        admin = admin_grpc.AdminServiceStub(channel)
        health = health_pb2_grpc.HealthStub(channel)
        get = pb.GetRequest(map=public, key="u1")
        return {
            "no token": await code_of(maps.Get(get, timeout=10)),
            "unknown token": await code_of(maps.Get(get, timeout=10, metadata=bearer("x" * 20))),
            "not bearer": await code_of(
                maps.Get(get, timeout=10, metadata=(("authorization", f"Basic {READER}"),))
            ),
            "reader get": await code_of(maps.Get(get, timeout=10, metadata=bearer(READER))),
            "reader batch": await code_of(
                maps.BatchGet(
                    pb.BatchGetRequest(map=public, keys=["u1"]), timeout=10, metadata=bearer(READER)
                )
            ),
            "reader other map": await code_of(
                maps.Get(pb.GetRequest(map=private, key="u1"), timeout=10, metadata=bearer(READER))
            ),
            "reader pause": await code_of(
                admin.Pause(
                    admin_pb.ControlRequest(map=public), timeout=10, metadata=bearer(READER)
                )
            ),
            "reader all statuses": await code_of(
                admin.GetStatus(admin_pb.GetStatusRequest(), timeout=10, metadata=bearer(READER))
            ),
            "ops pause": await code_of(
                admin.Pause(
                    admin_pb.ControlRequest(map=private), timeout=10, metadata=bearer(ADMIN)
                )
            ),
            "ops other map": await code_of(
                maps.Get(pb.GetRequest(map=private, key="u1"), timeout=10, metadata=bearer(ADMIN))
            ),
            "health without token": await code_of(
                health.Check(health_pb2.HealthCheckRequest(), timeout=10)
            ),
        }

    codes = run(cfg, body)
    S = grpc.StatusCode
    assert codes == {
        "no token": S.UNAUTHENTICATED,
        "unknown token": S.UNAUTHENTICATED,
        "not bearer": S.UNAUTHENTICATED,
        "reader get": S.OK,
        "reader batch": S.OK,
        "reader other map": S.PERMISSION_DENIED,
        "reader pause": S.PERMISSION_DENIED,
        "reader all statuses": S.PERMISSION_DENIED,
        "ops pause": S.OK,
        "ops other map": S.OK,
        "health without token": S.OK,
    }


def test_enrich_streams_are_checked_per_request_and_tokens_come_from_the_environment(
    redis_url: str, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
):
    public, private = names()
    redis_client.set(entity_key(public, "u1"), b'{"id":"u1","name":"Ann"}')
    monkeypatch.setenv("MATERIALIZER_TEST_TOKENS", orjson.dumps(tokens_doc(public)).decode())
    cfg = parse_config(
        config_doc(redis_url, public, private, auth={"tokens_env": "MATERIALIZER_TEST_TOKENS"})
    )

    def lookup(map_name: str) -> enrich_pb.JoinSpec:
        return enrich_pb.JoinSpec(lookups=[enrich_pb.Lookup(map=map_name, key_field="user")])

    async def body(channel: grpc.aio.Channel) -> tuple[list[bytes], grpc.StatusCode]:
        stub = enrich_grpc.EnrichServiceStub(channel)
        event = orjson.dumps({"user": "u1"})
        good = stub.Enrich(
            iter([enrich_pb.EnrichRequest(spec=lookup(public), events=[event])]),
            timeout=10,
            metadata=bearer(ENRICHER),
        )
        answers = [e.event async for r in good for e in r.events]

        async def then_private() -> AsyncIterator[enrich_pb.EnrichRequest]:
            yield enrich_pb.EnrichRequest(spec=lookup(public), events=[event])
            yield enrich_pb.EnrichRequest(spec=lookup(private), events=[event])

        bad = stub.Enrich(then_private(), timeout=10, metadata=bearer(ENRICHER))
        return answers, await code_of(_drain(bad))

    answers, code = run(cfg, body)
    assert [orjson.loads(a) for a in answers] == [
        {"user": "u1", public: {"id": "u1", "name": "Ann"}}
    ]
    assert code == grpc.StatusCode.PERMISSION_DENIED


async def _drain(call: Any) -> None:
    async for _ in call:
        pass


@pytest.mark.parametrize(
    ("doc", "problem"),
    [
        ({"tokens": []}, "must hold 'tokens:'"),
        ({"tokens": [{"token": "short", "maps": ["*"], "verbs": ["*"]}]}, "at least 16"),
        ({"tokens": [{"token": READER, "maps": ["*"], "verbs": ["read"]}]}, "unknown 'read'"),
        ({"tokens": [{"token": READER, "maps": [], "verbs": ["*"]}]}, "tokens.0.maps"),
    ],
)
def test_bad_tokens_documents_name_the_entry(redis_url: str, tmp_path: Path, doc, problem):
    public, private = names()
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(yaml.safe_dump(doc))
    cfg = parse_config(config_doc(redis_url, public, private, auth={"tokens_file": str(tokens)}))
    with pytest.raises(ConfigError) as info:
        asyncio.run(create_server(cfg))
    assert info.value.problems[0].startswith("query.auth.tokens_file: ")
    assert problem in info.value.problems[0]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A CA, a server certificate for localhost, and a client certificate."""
    ca = trustme.CA()
    root = tmp_path_factory.mktemp("pki")
    server = ca.issue_cert("localhost")
    client = ca.issue_cert("orders-service")
    files = {
        "ca": root / "ca.pem",
        "cert": root / "server.pem",
        "key": root / "server.key",
    }
    ca.cert_pem.write_to_path(str(files["ca"]))
    server.cert_chain_pems[0].write_to_path(str(files["cert"]))
    server.private_key_pem.write_to_path(str(files["key"]))
    return {
        "files": files,
        "ca_pem": ca.cert_pem.bytes(),
        "client_cert": client.cert_chain_pems[0].bytes(),
        "client_key": client.private_key_pem.bytes(),
    }


def _get_over(cfg: AppConfig, public: str, credentials: grpc.ChannelCredentials | None) -> Any:
    async def body(channel: grpc.aio.Channel) -> Any:
        stub = pb_grpc.MapServiceStub(channel)
        try:
            return await stub.Get(pb.GetRequest(map=public, key="u1"), timeout=5)
        except grpc.aio.AioRpcError as exc:
            return exc.code()

    return run(cfg, body, credentials=credentials)


def test_tls_and_mutual_tls(redis_url: str, redis_client: redis.Redis, pki: dict[str, Any]):
    public, private = names()
    redis_client.set(entity_key(public, "u1"), b'{"id":"u1"}')
    files = pki["files"]
    tls = {"cert_file": str(files["cert"]), "key_file": str(files["key"])}
    cfg = parse_config(config_doc(redis_url, public, private, tls=tls))
    trusting = grpc.ssl_channel_credentials(root_certificates=pki["ca_pem"])
    assert _get_over(cfg, public, trusting).entity == b'{"id":"u1"}'
    assert _get_over(cfg, public, None) == grpc.StatusCode.UNAVAILABLE  # plaintext refused
    untrusting = grpc.ssl_channel_credentials(root_certificates=trustme.CA().cert_pem.bytes())
    assert _get_over(cfg, public, untrusting) == grpc.StatusCode.UNAVAILABLE

    mutual = parse_config(
        config_doc(redis_url, public, private, tls={**tls, "client_ca_file": str(files["ca"])})
    )
    with_cert = grpc.ssl_channel_credentials(
        root_certificates=pki["ca_pem"],
        private_key=pki["client_key"],
        certificate_chain=pki["client_cert"],
    )
    assert _get_over(mutual, public, with_cert).entity == b'{"id":"u1"}'
    assert _get_over(mutual, public, trusting) == grpc.StatusCode.UNAVAILABLE  # no client cert


def _https_answers(cfg: AppConfig, path: str, contexts: dict[str, ssl.SSLContext | None]) -> dict:
    """Each client's answer from the HTTP front of ``cfg``: (status, body), or the class of
    the error that kept it from one."""

    async def main() -> dict[str, Any]:
        store = RedisMapStore.from_url(cfg.redis.url)
        servers = await create_servers(cfg, store=store, http=("127.0.0.1", 0))
        await servers.start()
        answers: dict[str, Any] = {}
        try:
            async with aiohttp.ClientSession() as http:
                for name, context in contexts.items():
                    scheme = "http" if context is None else "https"
                    url = f"{scheme}://127.0.0.1:{servers.http_port}{path}"
                    options: dict[str, Any] = {"timeout": aiohttp.ClientTimeout(total=10)}
                    if context is not None:
                        options |= {"ssl": context, "server_hostname": "localhost"}
                    try:
                        async with http.get(url, **options) as response:
                            answers[name] = (response.status, await response.read())
                    except (aiohttp.ClientError, ssl.SSLError, OSError) as exc:
                        answers[name] = type(exc).__name__
        finally:
            await servers.stop(None)
            await store.close()
        return answers

    return asyncio.run(main())


def test_the_http_front_speaks_the_same_tls(
    redis_url: str, redis_client: redis.Redis, pki: dict[str, Any], tmp_path: Path
):
    """``query.tls`` puts the HTTP port behind the gRPC port's certificate, and mutual TLS
    asks the same client certificate of an HTTP client."""
    public, private = names()
    redis_client.set(entity_key(public, "u1"), b'{"id":"u1"}')
    files = pki["files"]
    tls = {"cert_file": str(files["cert"]), "key_file": str(files["key"])}
    trusting = ssl.create_default_context(cadata=pki["ca_pem"].decode())
    untrusting = ssl.create_default_context(cadata=trustme.CA().cert_pem.bytes().decode())
    (tmp_path / "client.pem").write_bytes(pki["client_cert"])
    (tmp_path / "client.key").write_bytes(pki["client_key"])
    with_cert = ssl.create_default_context(cadata=pki["ca_pem"].decode())
    with_cert.load_cert_chain(tmp_path / "client.pem", tmp_path / "client.key")
    path = f"/v1/maps/{public}/entities/u1"

    one_way = parse_config(config_doc(redis_url, public, private, tls=tls))
    answers = _https_answers(
        one_way, path, {"trusting": trusting, "untrusting": untrusting, "plaintext": None}
    )
    status, body = answers["trusting"]
    assert status == 200 and orjson.loads(body)["entity"] == {"id": "u1"}, answers
    assert answers["untrusting"] == "ClientConnectorCertificateError", answers
    assert isinstance(answers["plaintext"], str), answers  # no answer in clear text

    mutual = parse_config(
        config_doc(redis_url, public, private, tls={**tls, "client_ca_file": str(files["ca"])})
    )
    answers = _https_answers(mutual, path, {"with_cert": with_cert, "without": trusting})
    status, body = answers["with_cert"]
    assert status == 200 and orjson.loads(body)["entity"] == {"id": "u1"}, answers
    assert isinstance(answers["without"], str), answers  # the handshake refused it


def test_unreadable_tls_files_name_the_key(redis_url: str, tmp_path: Path):
    public, private = names()
    tls = {"cert_file": str(tmp_path / "none.pem"), "key_file": str(tmp_path / "none.key")}
    cfg = parse_config(config_doc(redis_url, public, private, tls=tls))
    with pytest.raises(ConfigError, match=r"query.tls.key_file: cannot read"):
        asyncio.run(create_server(cfg))


def test_health_follows_redis_down_and_back(tmp_path: Path):
    server = RedisServer(tmp_path).start()
    try:
        public, private = names()
        cfg = parse_config(config_doc(server.url, public, private))

        async def body(channel: grpc.aio.Channel) -> list[int]:
            stub = health_pb2_grpc.HealthStub(channel)

            async def status(service: str = "") -> int:
                req = health_pb2.HealthCheckRequest(service=service)
                return (await stub.Check(req, timeout=5)).status

            async def until(wanted: int) -> None:
                for _ in range(300):
                    if await status() == wanted:
                        return
                    await asyncio.sleep(0.1)
                raise AssertionError(f"health never became {wanted}")

            seen = [await status(), await status("materializer.v1.MapService")]
            server.stop()
            await until(health_pb2.HealthCheckResponse.NOT_SERVING)
            seen.append(await status("materializer.v1.EnrichService"))
            maps = pb_grpc.MapServiceStub(channel)
            seen.append(
                (await code_of(maps.Get(pb.GetRequest(map=public, key="k"), timeout=5))).value[0]
            )
            server.start()
            await until(health_pb2.HealthCheckResponse.SERVING)
            seen.append(await status("materializer.v1.AdminService"))
            return seen

        S = health_pb2.HealthCheckResponse
        assert run(cfg, body) == [
            S.SERVING,
            S.SERVING,
            S.NOT_SERVING,
            grpc.StatusCode.UNAVAILABLE.value[0],
            S.SERVING,
        ]
    finally:
        server.stop()


def test_client_retries_unavailable_within_its_deadline_and_nothing_else(
    redis_url: str, redis_client: redis.Redis
):
    public, private = names()
    redis_client.set(entity_key(public, "u1"), b'{"id":"u1","n":1}')
    redis_client.hset(
        meta_key(public), mapping=Watermark(3, {f"{public}-events": {0: 8}}).to_hash()
    )
    cfg = parse_config(config_doc(redis_url, public, private))
    port = free_port()

    async def main() -> tuple[Any, Any, grpc.StatusCode, int]:
        store = RedisMapStore.from_url(redis_url)
        async with MaterializerClient(
            f"127.0.0.1:{port}", deadline=20, backoff=0.2, retries=8
        ) as client:
            # The server is not there yet: the first attempts are UNAVAILABLE.
            lookup = asyncio.create_task(client.get(public, "u1"))
            await asyncio.sleep(0.5)
            server, bound = await create_server(cfg, f"127.0.0.1:{port}", store=store)
            assert bound == port
            await server.start()
            try:
                found = await lookup
                entities, mark = await client.batch_get(public, ["u1", "nope"])
                try:
                    await client.get("no-such-map", "u1")
                    code = grpc.StatusCode.OK
                except grpc.aio.AioRpcError as exc:
                    code = exc.code()
                from prometheus_client import REGISTRY

                not_found = REGISTRY.get_sample_value(
                    "materializer_query_requests_total", {"method": "Get", "code": "NOT_FOUND"}
                )
                return found, (entities, mark), code, int(not_found or 0)
            finally:
                await server.stop(None)
                await store.close()

    before = _not_found_count()
    found, (entities, mark), code, not_found = asyncio.run(main())
    assert found.entity == {"id": "u1", "n": 1}
    assert found.watermark.batch_id == 3
    assert found.watermark.offsets == {(f"{public}-events", 0): 8}
    assert entities == {"u1": {"id": "u1", "n": 1}, "nope": None}
    assert mark is not None and mark.batch_id == 3
    assert code == grpc.StatusCode.NOT_FOUND
    assert not_found == before + 1  # NOT_FOUND is not retried


def _not_found_count() -> int:
    from prometheus_client import REGISTRY

    value = REGISTRY.get_sample_value(
        "materializer_query_requests_total", {"method": "Get", "code": "NOT_FOUND"}
    )
    return int(value or 0)
