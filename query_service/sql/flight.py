"""Arrow Flight SQL over the maps' tables: the SQL port for clients with a Flight SQL
driver (ADBC, the Flight SQL JDBC driver, DBeaver). ``docs/sql-flight.md`` says how to
connect; decision 0028 why Flight SQL.

It listens on ``query.sql.flight_port`` with the gRPC port's tokens and TLS. A statement
needs every map it reads granted, and the metadata calls list only the maps granted.

pyarrow.flight runs each call on a gRPC thread, while statements run on the service's
event loop (``SqlExecutor``): a handler hands its work to the loop and waits, watching
the call's cancellation. That is also how a client's deadline stops a statement:
pyarrow does not show a server the deadline itself, so a statement's own bound is
``query.sql.timeout``.

A statement runs at ``GetFlightInfo``, so a refusal reaches the client's ``execute``
and the FlightInfo carries the answer's schema; the answer waits for the ``DoGet`` of
its ticket, read once, by the token that ran it (``flight_answers``). Prepared
statements, which ADBC's driver makes of every statement, take one row of parameters
(``$1``, ``$2``…) by ``DoPut``.

This module starts and stops the port; the calls are ``flight_server``'s, the protocol's
messages ``flight_commands``', tokens and errors ``flight_calls``', metadata answers
``flight_metadata``'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pyarrow as pa

from materializer.catalog.live import LiveMaps
from materializer.config import TlsConfig
from materializer.errors import SetupError
from query_service.auth import Authorizer
from query_service.sql.executor import SqlExecutor
from query_service.sql.flight_answers import POLL_SECONDS, UNREAD_SECONDS
from query_service.sql.flight_calls import Calls
from query_service.sql.flight_server import FlightSqlServer
from query_service.tables.snapshots import TableSnapshots
from query_service.transport import read_pem


def tls_options(tls: TlsConfig | None) -> dict[str, Any]:
    """``FlightServerBase``'s TLS arguments from the gRPC port's PEM files; a client CA
    turns on mutual TLS."""
    if tls is None:
        return {}
    read = read_pem
    options: dict[str, Any] = {
        "tls_certificates": [(read("cert_file", tls.cert_file), read("key_file", tls.key_file))]
    }
    if tls.client_ca_file:
        options["verify_client"] = True
        options["root_certificates"] = read("client_ca_file", tls.client_ca_file)
    return options


class FlightSqlPort:
    """A running Flight SQL port: its ``port``, and ``close``."""

    def __init__(self, server: FlightSqlServer, calls: Calls) -> None:
        self._server = server
        self._calls = calls
        self._closed = False
        self.port: int = server.port

    async def close(self, grace: float = 0.0) -> None:
        """Refuse new calls, let running ones finish for up to ``grace`` seconds, then stop
        the rest (their statements end, their clients get UNAVAILABLE) and the server.
        Closing again does nothing."""
        if self._closed:
            return
        self._closed = True
        self._calls.stopping = True
        loop = asyncio.get_running_loop()
        until = loop.time() + grace
        while self._calls.running and loop.time() < until:
            await asyncio.sleep(POLL_SECONDS)
        self._server.cancel_waiting()
        await self._server.answers.close()
        await asyncio.to_thread(self._server.shutdown)


async def start_flight(
    executor: SqlExecutor,
    live: LiveMaps,
    snapshots: TableSnapshots,
    generation: Callable[[str], Awaitable[int]],
    authorizer: Authorizer | None,
    address: str,
    *,
    unread_seconds: float = UNREAD_SECONDS,
) -> FlightSqlPort:
    """Serve Arrow Flight SQL on ``address`` (``host:port``; port 0 picks a free one) over
    ``executor``, with ``query.tls`` and ``authorizer`` (``None``: open), from now on.

    ``snapshots`` and ``generation`` are the executor's, for the tables' schemas that
    ``GetTables`` lists. Call from the event loop the executor runs on; ``close`` stops it.
    """
    host, _, port = address.rpartition(":")
    tls = tls_options(live.config.query.tls)
    scheme = "grpc+tls" if tls else "grpc"
    calls = Calls(authorizer)
    try:
        server = await asyncio.to_thread(
            FlightSqlServer,
            f"{scheme}://{host}:{port}",
            executor=executor,
            live=live,
            snapshots=snapshots,
            generation=generation,
            calls=calls,
            loop=asyncio.get_running_loop(),
            tls=tls,
            unread_seconds=unread_seconds,
        )
    except (pa.ArrowException, OSError) as exc:
        raise SetupError(f"cannot serve Arrow Flight SQL on {address}: {exc}") from None
    return FlightSqlPort(server, calls)
