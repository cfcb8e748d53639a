"""Where the console joins the HTTP front: under its base path, over the same servicers."""

from __future__ import annotations

from aiohttp import web

from materializer.catalog.live import LiveMaps
from materializer.clients.redis import AsyncClient
from materializer.config import AppConfig
from query_service.auth import Authorizer
from query_service.console.app import Console
from query_service.console.calls import ConsoleCalls
from query_service.console.sessions import Sessions
from query_service.interceptors import RequestMaps
from query_service.services.admin_service import AdminServicer
from query_service.services.map_service import MapServicer
from query_service.services.sql_service import SqlServicer


def mount_console(
    app: web.Application,
    config: AppConfig,
    live: LiveMaps,
    maps: MapServicer,
    admin: AdminServicer,
    authorizer: Authorizer | None,
    request_maps: RequestMaps,
    client: AsyncClient,
    sql: SqlServicer | None = None,
) -> Console:
    """Serve the console at ``query.console.base_path`` of ``app``; its bare path redirects.

    Without ``sql``, or with ``query.sql.enabled`` off, the SQL page says it is off.
    """
    settings = config.query.console
    statements = sql if config.query.sql.enabled else None
    console = Console(
        settings,
        ConsoleCalls(maps, admin, authorizer, request_maps, statements),
        Sessions(client, authorizer, settings.session),
        live,
        client,
        secure_cookie=settings.secure_cookie
        if settings.secure_cookie is not None
        else config.query.tls is not None,
    )
    base = settings.base_path

    async def to_console(_: web.Request) -> web.StreamResponse:
        raise web.HTTPPermanentRedirect(f"{base}/")

    app.router.add_get(base, to_console)
    app.add_subapp(base, console.application())
    return console
