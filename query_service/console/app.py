"""The console's aiohttp application, mounted under ``query.console.base_path``.

One middleware stands between every request and the pages: it finds the login
session (or sends the browser to log in), checks the CSRF token and origin of
everything that changes something, turns a refused call into an error page with
its status, and sets the headers that keep the pages to themselves (a content
security policy allowing only the service's own scripts and styles, no framing).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

import redis
from aiohttp import web
from jinja2 import Environment, PackageLoader, select_autoescape

from materializer.catalog.live import LiveMaps
from materializer.clients.redis import AsyncClient
from materializer.config import ConsoleConfig
from query_service.console.calls import ConsoleCalls
from query_service.console.changes import Changes
from query_service.console.entities import EntityBrowser
from query_service.console.history import HistoryReader
from query_service.console.map_form import MapForm
from query_service.console.map_page import MapPage
from query_service.console.overview import Overview
from query_service.console.sessions import COOKIE, SESSION, Session, Sessions
from query_service.console.sql_page import SqlPage
from query_service.errors import Unauthenticated
from query_service.http.calls import HTTP_STATUS, HttpAbort
from query_service.interceptors import INTERNAL_DETAILS

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
CSRF_FIELD = "csrf"
CSRF_HEADER = "X-CSRF-Token"
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def templates() -> Environment:
    """The pages' templates; every value is HTML-escaped unless a template says otherwise."""
    return Environment(
        loader=PackageLoader("query_service.console", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )


class Console:
    """The pages' application and the session handling around them."""

    def __init__(
        self,
        config: ConsoleConfig,
        calls: ConsoleCalls,
        sessions: Sessions,
        live: LiveMaps,
        client: AsyncClient,
        secure_cookie: bool,
    ) -> None:
        self.base = config.base_path
        self._sessions = sessions
        self._secure = secure_cookie
        self._origins = frozenset(o.rstrip("/") for o in config.allowed_origins)
        self._env = templates()
        self._env.globals["sql_on"] = calls.sql_on  # the SQL link in every page's header
        parts = (calls, live, self._env, self.base, HistoryReader(client))
        self.overview = Overview(*parts)
        self.map_page = MapPage(*parts)
        self.map_form = MapForm(*parts)
        self.entities = EntityBrowser(*parts)
        self.changes = Changes(*parts)
        self.sql = SqlPage(*parts)

    def application(self) -> web.Application:
        """The sub-application to mount at ``base``."""
        app = web.Application(middlewares=[self._middleware])
        app.router.add_get("/", self.overview.overview)
        app.router.add_get("/fragments/overview", self.overview.overview_rows)
        app.router.add_get("/login", self.login_form)
        app.router.add_post("/login", self.login)
        app.router.add_post("/logout", self.logout)
        app.router.add_get("/new-map", self.map_form.map_form)
        app.router.add_post("/new-map", self.map_form.map_form_post)
        app.router.add_get("/maps/{map}", self.map_page.map_page)
        app.router.add_get("/maps/{map}/summary", self.map_page.map_summary)
        app.router.add_get("/maps/{map}/history.json", self.map_page.history_json)
        app.router.add_get("/maps/{map}/entities", self.entities.entities)
        app.router.add_get("/maps/{map}/changes", self.changes.changes)
        app.router.add_get("/maps/{map}/changes/stream", self.changes.changes_stream)
        app.router.add_get("/maps/{map}/edit", self.map_form.map_form)
        app.router.add_post("/maps/{map}/edit", self.map_form.map_form_post)
        app.router.add_post("/maps/{map}/actions/{action}", self.map_page.action)
        app.router.add_get("/sql", self.sql.form)
        app.router.add_post("/sql", self.sql.run)
        app.router.add_static("/static/", STATIC, append_version=False)
        return app

    # -- login -------------------------------------------------------------------------

    def _page(self, template: str, status: int = 200, **values: object) -> web.Response:
        text = self._env.get_template(template).render(base=self.base, session=None, **values)
        return web.Response(text=text, status=status, content_type="text/html")

    async def login_form(self, request: web.Request) -> web.Response:
        """The form a token is typed into (an open console needs none: straight in)."""
        if self._sessions.open:
            raise web.HTTPSeeOther(f"{self.base}/")
        return self._page("login.html", next=_local(request.query.get("next"), self.base))

    async def login(self, request: web.Request) -> web.Response:
        """Check the token, start a session, and go where the browser was going."""
        form = await request.post()
        target = _local(str(form.get("next", "")), self.base)
        try:
            cookie, session = await self._sessions.login(str(form.get("token", "")))
        except Unauthenticated:
            log.warning("console: a login with an unknown token from %s", request.remote)
            return self._page("login.html", status=401, next=target, error="unknown token")
        await self._sessions.end(request.cookies.get(COOKIE))  # the browser's earlier one
        log.info("console: %s logged in from %s", session.name, request.remote)
        response = web.HTTPSeeOther(target)
        self._set_cookie(response, cookie)
        raise response

    async def logout(self, request: web.Request) -> web.Response:
        """End the session everywhere and forget the cookie."""
        await self._sessions.end(request.cookies.get(COOKIE))
        response = web.HTTPSeeOther(f"{self.base}/login")
        response.del_cookie(COOKIE, path=self.base)
        raise response

    def _set_cookie(self, response: web.StreamResponse, cookie: str) -> None:
        response.set_cookie(
            COOKIE,
            cookie,
            path=self.base,
            httponly=True,
            samesite="Strict",
            secure=self._secure,
            max_age=int(self._sessions.lifetime.total_seconds()),
        )

    # -- every request -----------------------------------------------------------------

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            response = await self._guarded(request, handler)
        except web.HTTPException as exc:
            if exc.status >= 400 and exc.status != 401:
                response = self._error(request, exc.status, exc.reason)
            else:
                response = exc
                _secure_headers(response)
                raise
        except HttpAbort as exc:
            response = self._error(
                request, HTTP_STATUS.get(exc.code, 500), exc.message, exc.code.name
            )
        except redis.RedisError as exc:
            log.warning("console %s %s: Redis unavailable: %s", request.method, request.path, exc)
            response = self._error(request, 503, "Redis is unavailable; try again shortly")
        except Exception:
            log.exception("console %s %s: unhandled error", request.method, request.path)
            response = self._error(request, 500, INTERNAL_DETAILS)
        _secure_headers(response)
        return response

    async def _guarded(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        relative = request.path[len(self.base) :] or "/"
        if isinstance(request.match_info.route.resource, web.StaticResource):
            return await handler(request)
        if request.method == "POST" and not _same_origin(request, self._origins):
            raise web.HTTPForbidden(reason="cross-origin request refused")
        if relative == "/login":
            return await handler(request)
        cookie = request.cookies.get(COOKIE)
        session = await self._sessions.find(cookie)
        fresh: str | None = None
        if session is None:
            if not self._sessions.open:
                return self._to_login(request)
            if _is_page(request):
                fresh, session = await self._sessions.anonymous()
            else:
                session = self._sessions.passing()
        if request.method == "POST":
            sent = request.headers.get(CSRF_HEADER)
            if sent is None:
                form = await request.post()
                value = form.get(CSRF_FIELD)
                sent = value if isinstance(value, str) else None
            if fresh is not None or not session.csrf_matches(sent):
                raise web.HTTPForbidden(reason="the form's CSRF token does not match the session")
        request[SESSION] = session
        response = await handler(request)
        if fresh is not None:
            self._set_cookie(response, fresh)
        return response

    def _to_login(self, request: web.Request) -> web.StreamResponse:
        """To the login form; a fragment or a POST gets a 401 instead (htmx reloads)."""
        if request.method != "GET" or request.headers.get("HX-Request"):
            response = web.Response(status=401, text="log in again")
            response.headers["HX-Redirect"] = f"{self.base}/login"
            return response
        raise web.HTTPSeeOther(f"{self.base}/login?next={quote(request.path_qs)}")

    def _error(
        self, request: web.Request, status: int, message: str, code: str = ""
    ) -> web.Response:
        session: Session | None = request.get(SESSION)
        text = self._env.get_template("error.html").render(
            base=self.base, session=session, status=status, message=message, code=code
        )
        return web.Response(text=text, status=status, content_type="text/html")


def _secure_headers(response: web.StreamResponse) -> None:
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)


def _same_origin(request: web.Request, allowed: frozenset[str]) -> bool:
    """A browser's POST names where its page came from; another site's is refused."""
    origin = request.headers.get("Origin")
    if origin is None or origin == "null":
        return origin is None
    return urlsplit(origin).netloc == request.host or origin.rstrip("/") in allowed


def _is_page(request: web.Request) -> bool:
    """A browser asking for a whole page (not a fragment, data or a stream)."""
    return (
        request.method == "GET"
        and not request.headers.get("HX-Request")
        and "text/html" in request.headers.get("Accept", "")
    )


def _local(target: str | None, base: str) -> str:
    """Where to go after login: a path of the console only, never another site nor another
    path of the host. It is checked as a browser reads it (a backslash is a slash, ``%2e``
    a dot), and a ``.`` or ``..`` segment, which would climb out of the console, is refused.
    """
    if not target or not target.isprintable() or not target.isascii():
        return f"{base}/"
    read = target.replace("\\", "/")
    segments = unquote(urlsplit(read).path).split("/")
    if read.startswith(base + "/") and not read.startswith("//") and not {".", ".."} & {*segments}:
        return target
    return f"{base}/"
