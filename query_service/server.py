"""Assemble the gRPC server, and run it until SIGTERM/SIGINT.

``create_server`` only builds and binds, so tests (and an embedded demo) start
it on port 0 and call it through a real channel; ``serve`` is the process's
main loop.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import grpc
from aiohttp import web
from grpc_health.v1 import health, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from materializer.catalog.live import LiveMaps
from materializer.config import AppConfig, TlsConfig
from materializer.errors import SetupError
from materializer.v1 import (
    admin_service_pb2,
    enrich_service_pb2,
    map_service_pb2,
    sql_service_pb2,
)
from materializer.v1 import admin_service_pb2_grpc as admin_pb_grpc
from materializer.v1 import enrich_service_pb2_grpc as enrich_pb_grpc
from materializer.v1 import map_service_pb2_grpc as map_pb_grpc
from materializer.v1 import sql_service_pb2_grpc as sql_pb_grpc
from query_service.auth import Authorizer
from query_service.catalog import FIRST_READ_SECONDS, CatalogWatcher
from query_service.freshness import FreshnessGate
from query_service.health import RedisHealth
from query_service.indexes.queries import IndexQueries
from query_service.indexes.reads import IndexReads
from query_service.interceptors import add_wrapped
from query_service.metrics import serve_metrics
from query_service.near_cache import NearCaches
from query_service.requested_maps import request_maps
from query_service.services.admin_service import AdminServicer
from query_service.services.enrich_service import EnrichServicer
from query_service.services.map_service import MapServicer
from query_service.services.sql_service import SqlServicer
from query_service.services.table_reads import TableReads
from query_service.sql.executor import SqlExecutor
from query_service.stores.admin import ControlStore, LogEnds
from query_service.stores.delta import DeltaTables
from query_service.stores.redis import RedisMapStore
from query_service.tables.fallback import TableFallback
from query_service.tables.snapshots import TableSnapshots
from query_service.transport import MAX_MESSAGE_BYTES, read_pem

if TYPE_CHECKING:
    from query_service.sql.flight import FlightSqlPort

log = logging.getLogger(__name__)

MAP_SERVICE = map_service_pb2.DESCRIPTOR.services_by_name["MapService"].full_name
SERVICES = (
    MAP_SERVICE,
    enrich_service_pb2.DESCRIPTOR.services_by_name["EnrichService"].full_name,
    admin_service_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name,
    sql_service_pb2.DESCRIPTOR.services_by_name["SqlService"].full_name,
)
GRACE_SECONDS = 5.0
SERVER_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    # Ping idle clients so half-open connections (a vanished pod, a NAT that
    # dropped the flow) are noticed within ~80 s instead of never.
    ("grpc.keepalive_time_ms", 60_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.keepalive_permit_without_calls", 1),
    # Accept client keepalive pings down to every 10 s (the default, 5 min,
    # answers a client that pings more often with GOAWAY "too_many_pings").
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
]


class Closeable(Protocol):
    """A background part of the server (near caches, health checks) with its own tasks."""

    async def close(self) -> None:
        """Stop its tasks."""


def server_credentials(tls: TlsConfig) -> grpc.ServerCredentials:
    """TLS from PEM files; a client CA turns on mutual TLS (client certificates required)."""
    client_ca = read_pem("client_ca_file", tls.client_ca_file) if tls.client_ca_file else None
    return grpc.ssl_server_credentials(
        [(read_pem("key_file", tls.key_file), read_pem("cert_file", tls.cert_file))],
        root_certificates=client_ca,
        require_client_auth=client_ca is not None,
    )


@dataclass
class Servers:
    """What one query service process serves: the gRPC server and, if on, the HTTP front."""

    grpc: grpc.aio.Server
    port: int
    http: web.AppRunner | None = None
    http_port: int | None = None
    live: LiveMaps | None = None
    """The maps it serves, the file's and the catalog's."""
    catalog: CatalogWatcher | None = None
    """Follows the catalog until the servers stop."""
    sql: SqlExecutor | None = None
    """Runs SQL statements in processes of its own, ended when the servers stop."""
    flight: FlightSqlPort | None = None
    """Arrow Flight SQL (``query.sql.flight_port``); serves from its creation, like the HTTP
    front."""

    async def start(self) -> None:
        """Start the gRPC server (the HTTP front listens from its creation)."""
        await self.grpc.start()

    async def stop(self, grace: float | None) -> None:
        """Stop taking calls, let running ones finish for ``grace`` seconds, then end."""
        if self.http is not None:
            await self.http.shutdown()
        # Flight SQL's statements run on the executor: both ports drain before it closes.
        await asyncio.gather(
            self.grpc.stop(grace),
            self.flight.close(grace or 0.0) if self.flight is not None else asyncio.sleep(0),
        )
        if self.http is not None:
            await self.http.cleanup()
        if self.catalog is not None:
            await self.catalog.close()
        if self.sql is not None:
            await self.sql.close()


async def create_server(
    config: AppConfig,
    address: str = "127.0.0.1:0",
    store: RedisMapStore | None = None,
    near_caches: NearCaches | None = None,
    background: list[Closeable] | None = None,
) -> tuple[grpc.aio.Server, int]:
    """A gRPC server bound to ``address`` but not started, and the port it got
    (``create_servers`` without the HTTP front)."""
    servers = await create_servers(config, address, store, near_caches, background)
    return servers.grpc, servers.port


async def create_servers(
    config: AppConfig,
    address: str = "127.0.0.1:0",
    store: RedisMapStore | None = None,
    near_caches: NearCaches | None = None,
    background: list[Closeable] | None = None,
    http: tuple[str, int] | None = None,
    flight: str | None = None,
) -> Servers:
    """A gRPC server bound to ``address`` but not started, the port it got, and with
    ``http`` (host, port) the HTTP/JSON front over the same servicers, listening.

    Registers ``MapService``, ``EnrichService`` and ``AdminService`` over the
    maps of ``config``, ``grpc.health.v1`` and server reflection, behind the
    one wrapper (bearer tokens when ``query.auth`` is set, metrics, status
    mapping); the HTTP front calls the same servicer methods through the same
    wrapper. With ``flight`` (``host:port``) and ``query.sql`` on, Arrow Flight SQL over
    the same SQL executor and tokens, serving. Health follows Redis: NOT_SERVING while
    it cannot be reached. Every port is TLS when ``query.tls`` is set.

    Without ``store``, a ``RedisMapStore`` on ``config.redis`` is created
    and lives as long as the process; pass your own to close it when the
    server is done (``serve`` does). The same goes for ``near_caches`` (the
    near caches of ``query.near_cache``), started and closed by its owner.
    Background parts started here (the Redis health check) are appended to
    ``background`` for the caller to close; without it they end with the
    event loop. Port 0 picks a free port.
    """
    authorizer = Authorizer.from_config(config.query.auth) if config.query.auth else None
    credentials = server_credentials(config.query.tls) if config.query.tls else None
    if store is None:
        store = RedisMapStore.from_config(config.redis)
    if near_caches is None:
        near_caches = NearCaches(store, config.query.near_cache)
        await near_caches.start()
    live = LiveMaps(config)
    catalog = CatalogWatcher(live)
    maps_of = request_maps(live)
    server = grpc.aio.server(options=SERVER_OPTIONS)
    gate = FreshnessGate(store, live.topics())
    # One set of latest table snapshots for Query, GetAsOf and SQL: calls close together
    # share one opening of a table.
    snapshots = TableSnapshots(DeltaTables(live))
    tables = TableReads(live, store.generation, snapshots)
    reads = IndexReads(store.client, store.where)
    indexes = IndexQueries(live, store, gate, snapshots, reads)
    fallback = TableFallback(snapshots, live)
    maps = MapServicer(live, store, gate, tables, near_caches, indexes, fallback)
    enrich = EnrichServicer(live, store, gate)
    admin = AdminServicer(live, ControlStore(store.client), LogEnds(config.kafka), catalog)
    executor = SqlExecutor(live, snapshots, store.generation, store=store, gate=gate, indexes=reads)
    sql = SqlServicer(executor)
    adders: list[tuple[Callable[[Any, Any], None], object]] = [
        (map_pb_grpc.add_MapServiceServicer_to_server, maps),
        (enrich_pb_grpc.add_EnrichServiceServicer_to_server, enrich),
        (admin_pb_grpc.add_AdminServiceServicer_to_server, admin),
    ]
    if config.query.sql.enabled:
        adders.append((sql_pb_grpc.add_SqlServiceServicer_to_server, sql))
    for add, servicer in adders:
        add_wrapped(server, add, servicer, authorizer, maps_of)

    health_servicer = health.aio.HealthServicer()
    add_wrapped(server, health_pb2_grpc.add_HealthServicer_to_server, health_servicer)
    redis_health = RedisHealth(health_servicer, store.client, SERVICES, maps=list(config.maps))
    await redis_health.start()
    catalog.on_change(lambda now: redis_health.follow(now.maps))
    await catalog.start(wait=0.0)  # ``serve`` waits for the catalog before it serves
    if background is not None:
        background.append(redis_health)

    reflection.enable_server_reflection(
        [*SERVICES, health.SERVICE_NAME, reflection.SERVICE_NAME], server
    )
    if credentials is not None:
        port: int = server.add_secure_port(address, credentials)
    else:
        port = server.add_insecure_port(address)
    if port == 0:
        raise SetupError(f"cannot listen on {address}: the address is taken or not local")
    servers = Servers(server, port, live=live, catalog=catalog, sql=executor)
    if flight is not None and config.query.sql.enabled:
        from query_service.sql.flight import start_flight

        servers.flight = await start_flight(
            executor, live, snapshots, store.generation, authorizer, flight
        )
    if http is not None:
        from query_service.http.routes import HttpFront
        from query_service.http.server import create_app, openapi, start_http

        front = HttpFront(maps, enrich, admin, sql, redis_health, authorizer, maps_of, openapi())
        app = create_app(front)
        if config.query.console.enabled:
            from query_service.console.mount import mount_console

            mount_console(app, config, live, maps, admin, authorizer, maps_of, store.client, sql)
        servers.http, servers.http_port = await start_http(app, http[0], http[1], config.query.tls)
    return servers


async def serve(
    config: AppConfig,
    address: str,
    *,
    http: tuple[str, int] | None = None,
    grace: float = GRACE_SECONDS,
) -> None:
    """Serve until SIGTERM or SIGINT (or cancellation), then stop gracefully.

    On a signal the server reports NOT_SERVING (so load balancers and
    readiness probes stop sending calls), stops accepting calls, lets running
    ones finish for up to ``grace`` seconds, cancels the rest, and only then
    closes the Redis pool, so no call in flight loses its store.
    """
    store = RedisMapStore.from_config(config.redis)
    near_caches = NearCaches(store, config.query.near_cache)
    background: list[Closeable] = []
    try:
        await near_caches.start()
        host = address.rpartition(":")[0]
        port = config.query.sql.flight_port
        flight = f"{host}:{port}" if port else None
        servers = await create_servers(
            config, address, store, near_caches, background, http, flight
        )
        if servers.catalog is not None:  # a replica starts with every map created so far
            await servers.catalog.first_read(FIRST_READ_SECONDS)
        if config.query.metrics_port is not None:
            serve_metrics(config.query.metrics_port)
        await servers.start()
        log.info(
            "query service listening on %s:%d, HTTP %s, Flight SQL %s "
            "(maps: %s, tls: %s, auth: %s, metrics: %s, event loop: %s)",
            host,
            servers.port,
            "off" if servers.http_port is None else servers.http_port,
            "off" if servers.flight is None else servers.flight.port,
            ", ".join(sorted((servers.live or LiveMaps(config)).config.maps)) or "none",
            "on" if config.query.tls else "off",
            "on" if config.query.auth else "off",
            config.query.metrics_port if config.query.metrics_port is not None else "off",
            type(asyncio.get_running_loop()).__module__.partition(".")[0],
        )
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        signals = (signal.SIGTERM, signal.SIGINT)
        for sig in signals:
            loop.add_signal_handler(sig, stopping.set)
        try:
            await stopping.wait()
            log.info("stopping: up to %.1f s for calls in flight", grace)
        finally:
            for sig in signals:
                loop.remove_signal_handler(sig)
            for part in background:
                await part.close()  # health turns NOT_SERVING: balancers move away first
            background.clear()
            await servers.stop(grace)
    finally:
        for part in background:
            await part.close()
        await near_caches.close()
        await store.close()
    log.info("query service stopped")
