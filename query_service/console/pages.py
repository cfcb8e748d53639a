"""The console's pages and fragments: what each shows and which calls it makes.

Every handler reads through ``ConsoleCalls`` as the session's token, so a page
shows only what the token may see and an action the token may not take is
refused by the same check as on gRPC. Pages are rendered whole on the server;
the parts that change (the overview's table, a map's summary) are fragments
htmx fetches again every few seconds, and the charts are drawn by uPlot from
``history.json``.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote, urlencode

import grpc
import orjson
import pyarrow as pa
import yaml
from aiohttp import web
from jinja2 import Environment

from materializer.catalog.live import LiveMaps
from materializer.clients.redis import AsyncClient
from materializer.v1 import admin_service_pb2 as admin_pb
from materializer.v1 import map_service_pb2 as map_pb
from query_service.console import figures
from query_service.console.calls import ConsoleCalls
from query_service.console.dead_letters import DeadLetter, last_dead_letters
from query_service.console.history import HistoryReader, hour_ago_ms
from query_service.console.sessions import SESSION, Session
from query_service.http import shapes
from query_service.http.calls import HttpAbort
from query_service.http.routes import sse_changes
from query_service.stores.delta import DeltaTables

log = logging.getLogger(__name__)

ACTIONS = {
    "pause": ("Pause", "control"),
    "resume": ("Resume", "control"),
    "restart": ("Restart", "control"),
}
"""Actions of the map's page that are one control call: the method and its verb."""
OPERATIONS = ("verify", "rehydrate", "rebuild")
"""Actions the run carries out and reports on (``StartOperation``)."""
TYPED = frozenset({"rehydrate", "rebuild", "delete"})
"""Actions that replace or remove data: the map's name must be typed to confirm them."""
QUERY_PAGE = 50
"""Rows per page of the entity browser's query, unless ``page_size`` says."""
QUERY_PAGE_MAX = 500
"""The largest ``page_size`` the entity browser asks for."""
FORM_PROBLEMS = ("INVALID_ARGUMENT", "ALREADY_EXISTS", "FAILED_PRECONDITION")
"""Refusals of a map's definition that the form shows next to its fields."""
MAX_SECTION_BYTES = 64 * 1024
"""The longest map section the form takes; real ones are a few hundred bytes."""
DONE = frozenset({*ACTIONS, *OPERATIONS, "saved"})
"""What a page may say was just done (``?done=``): nothing else is echoed."""
DEAD_LETTERS_WAIT_S = 3.0
"""The longest a map's page waits for its dead letters before it shows without them."""
DEAD_LETTERS_KEPT_S = 5.0
"""How long a map's dead letters, once read, serve its page again."""
VERSIONS_SHOWN = 15
"""Delta versions listed on a map's page."""


def _state(status: Any) -> str:
    return str(admin_pb.MapStatus.State.Name(status.state)).lower()


def _pretty(raw: bytes) -> str:
    """An entity's JSON, indented for reading (rendered escaped: it is user data)."""
    try:
        return orjson.dumps(orjson.loads(raw), option=orjson.OPT_INDENT_2).decode()
    except orjson.JSONDecodeError:
        return raw.decode(errors="replace")


def _watermark(message: Any) -> dict[str, Any] | None:
    return shapes.watermark(message.watermark) if message.HasField("watermark") else None


class _NoAliases(yaml.SafeLoader):
    """YAML without anchors and aliases: a map's section needs none, and aliases nested in
    aliases expand a few lines into more than the service can hold."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yaml.composer.ComposerError(
                None, None, "aliases (*name) are not accepted here", event.start_mark
            )
        return super().compose_node(parent, index)


def _section(text: str) -> tuple[str, str]:
    """The form's YAML as the JSON the call takes, or the problem with it (blocking: on a
    thread, as a large text takes a while)."""
    if len(text.encode()) > MAX_SECTION_BYTES:
        return "", f"config: longer than {MAX_SECTION_BYTES // 1024} KiB"
    try:
        section = yaml.load(text, Loader=_NoAliases) if text.strip() else None  # noqa: S506
    except yaml.YAMLError as exc:
        return "", f"config: not valid YAML: {exc}"
    if not isinstance(section, dict):
        return "", "config: must be a mapping (the map's section, in YAML)"
    try:
        return orjson.dumps(section).decode(), ""
    except TypeError as exc:  # a date or a number beyond 64 bits
        return "", f"config: {exc}"


def _seconds(ms: int) -> float | None:
    """A sample's milliseconds as seconds; None for its -1 (unknown)."""
    return None if ms < 0 else ms / 1000


def _problems(message: str) -> list[str]:
    """A refusal's message as the list of problems it names (one per key path)."""
    return [p.strip() for p in message.replace("\n", "; ").split("; ") if p.strip()]


class Pages:
    """The handlers, over the calls of the logged-in token."""

    def __init__(
        self,
        calls: ConsoleCalls,
        live: LiveMaps,
        client: AsyncClient,
        templates: Environment,
        base: str,
    ) -> None:
        self._calls = calls
        self._live = live
        self._tables = DeltaTables(live)
        self._history = HistoryReader(client)
        self._templates = templates
        self._base = base
        self._kafka = ThreadPoolExecutor(2, thread_name_prefix="console-kafka")
        self._dead: dict[str, tuple[float, list[DeadLetter] | str]] = {}

    # -- rendering ---------------------------------------------------------------------

    def render(
        self, request: web.Request, template: str, http_status: int = 200, **values: Any
    ) -> web.Response:
        """A template with what every page needs: the base path, the session, the request."""
        session: Session = request[SESSION]
        text = self._templates.get_template(template).render(
            base=self._base, session=session, figures=figures, path=request.path, **values
        )
        return web.Response(text=text, status=http_status, content_type="text/html")

    def _known(self, request: web.Request) -> str:
        """The request's map, when it exists and the token may use it (404 and 403 as the
        servicers answer them): pages that call nothing before the form is used check
        here."""
        name = request.match_info["map"]
        session: Session = request[SESSION]
        if name not in self._live.config.maps:
            raise HttpAbort(grpc.StatusCode.NOT_FOUND, f"unknown map {name!r}")
        if session.grant is not None and not session.grant.allows_map(name):
            problem = f"token {session.grant.name!r} may not use map {name!r}"
            raise HttpAbort(grpc.StatusCode.PERMISSION_DENIED, problem)
        return name

    def _call(self, request: web.Request) -> Any:
        session: Session = request[SESSION]

        async def call(name: str, message: Any) -> Any:
            return await self._calls.unary(name, message, request, session.grant)

        return call

    # -- overview ----------------------------------------------------------------------

    async def overview(self, request: web.Request) -> web.Response:
        """Every map the token may see, its state, lag, freshness and rates; the workers."""
        return self.render(request, "overview.html", **await self._overview(request))

    async def overview_rows(self, request: web.Request) -> web.Response:
        """The overview's table alone, for htmx to swap in every few seconds."""
        return self.render(request, "overview_rows.html", **await self._overview(request))

    async def _overview(self, request: web.Request) -> dict[str, Any]:
        session: Session = request[SESSION]
        statuses = await self._calls.status(request, session.grant)
        names = [s.map for s in statuses]
        enrichments = sorted(
            name
            for name in self._live.config.enrichments
            if session.grant is None or session.grant.allows_map(name)
        )
        reports = await self._history.reports(enrichments)
        trends = await self._history.recent(names)
        rows = []
        workers: dict[str, list[str]] = {}
        for status in statuses:
            trend = trends.get(status.map)
            last = trend.last if trend else None
            rows.append(
                {
                    "name": status.map,
                    "state": _state(status),
                    "error": status.error,
                    "worker": status.worker_id,
                    "lag": status.total_lag,
                    "lag_seconds": _seconds(last.lag_ms) if last else None,
                    "p50": _seconds(last.freshness_p50_ms) if last else None,
                    "p99": _seconds(last.freshness_p99_ms) if last else None,
                    "input_rate": status.input_rate or status.input_rows_per_second,
                    "fold_rate": status.output_rows_per_second,
                    "records_left": sum(max(0, p.lag) for p in status.partitions),
                    "eta": status.eta_seconds,
                    "trend": figures.sparkline(trend.p99s if trend else []),
                }
            )
            if status.worker_id:
                workers.setdefault(status.worker_id, []).append(status.map)
        return {
            "maps": rows,
            "enrichments": [(name, reports.get(name)) for name in enrichments],
            "workers": sorted(workers.items()),
        }

    # -- a map -------------------------------------------------------------------------

    async def map_page(self, request: web.Request) -> web.Response:
        """A map: summary, charts, dead letters, config, schema, Delta versions, actions."""
        name = request.match_info["map"]
        summary = await self._map_summary(request, name)
        call = self._call(request)
        definition = await call("GetMapConfig", admin_pb.GetMapConfigRequest(map=name))
        config_yaml = yaml.safe_dump(orjson.loads(definition.config_json or "{}"), sort_keys=False)
        versions, schema = await asyncio.to_thread(self._table_facts, name)
        session: Session = request[SESSION]
        # Dead letters hold records' keys and errors: user data, for tokens that may read it.
        dead = await self._dead_letters(name) if session.may("get") else None
        return self.render(
            request,
            "map.html",
            **summary,
            definition=definition,
            config_yaml=config_yaml,
            versions=versions,
            schema=schema,
            dead_letters=dead,
            done=request.query.get("done", "") if request.query.get("done") in DONE else "",
        )

    async def _dead_letters(self, name: str) -> list[DeadLetter] | str:
        """The map's last dead letters, read at most every ``DEAD_LETTERS_KEPT_S`` per map
        on threads of their own (a slow broker holds neither the page nor the other reads);
        what went wrong, in words, when Kafka did not answer in time."""
        loop = asyncio.get_running_loop()
        kept = self._dead.get(name)
        if kept is not None and kept[0] > loop.time():
            return kept[1]
        read = loop.run_in_executor(self._kafka, last_dead_letters, self._live.config, name)
        try:
            letters: list[DeadLetter] | str = await asyncio.wait_for(read, DEAD_LETTERS_WAIT_S)
        except TimeoutError:
            letters = "Kafka did not answer in time"
        except Exception as exc:  # Kafka down or the topic unreadable: the page still shows
            letters = f"Kafka could not be read: {exc}"
        self._dead[name] = (loop.time() + DEAD_LETTERS_KEPT_S, letters)
        return letters

    async def map_summary(self, request: web.Request) -> web.Response:
        """The map's state and figures alone, for htmx to swap in every few seconds."""
        summary = await self._map_summary(request, request.match_info["map"])
        return self.render(request, "map_summary.html", **summary)

    async def _map_summary(self, request: web.Request, name: str) -> dict[str, Any]:
        """What the summary part of a map's page shows: status, watermark, operation."""
        answer = await self._call(request)("GetStatus", admin_pb.GetStatusRequest(map=name))
        status = answer.maps[0]
        return {
            "name": name,
            "status": status,
            "state": _state(status),
            "summary": {
                "watermark": shapes.watermark(status.watermark)
                if status.HasField("watermark")
                else None,
                "partitions": list(status.partitions),
                "records_left": sum(max(0, p.lag) for p in status.partitions),
            },
            "operation": await self._history.operation(name),
        }

    def _table_facts(self, name: str) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
        """The Delta table's last versions and its columns (blocking: delta-rs)."""
        try:
            table = self._tables.open(name)
        except Exception as exc:  # no table yet, or storage unreachable: the page still shows
            log.debug("map %s: no Delta facts: %s", name, exc)
            return [], []
        versions = [
            {
                "version": entry.get("version"),
                "timestamp": entry.get("timestamp"),
                "operation": entry.get("operation"),
                "rows": (entry.get("operationMetrics") or {}).get("num_output_rows")
                or (entry.get("operationMetrics") or {}).get("numOutputRows"),
            }
            for entry in table.history(VERSIONS_SHOWN)
        ]
        schema = [(f.name, str(f.type)) for f in pa.schema(table.schema().to_arrow())]
        return versions, schema

    async def history_json(self, request: web.Request) -> web.Response:
        """The map's chart series since ``since`` (epoch ms; default an hour ago)."""
        name = request.match_info["map"]
        await self._call(request)("GetStatus", admin_pb.GetStatusRequest(map=name))  # the grant
        try:
            since = int(request.query.get("since", "0"))
        except ValueError:
            since = 0
        series = await self._history.series(name, since or hour_ago_ms())
        return web.Response(body=orjson.dumps(series), content_type="application/json")

    # -- actions -----------------------------------------------------------------------

    async def action(self, request: web.Request) -> web.Response:
        """One of the map page's buttons; typed confirmation for the destructive ones."""
        name, action = request.match_info["map"], request.match_info["action"]
        form = await request.post()
        if action in TYPED and form.get("confirm") != name:
            raise HttpAbort(_invalid(), f"{action}: type the map's name {name!r} to confirm")
        call = self._call(request)
        if action in ACTIONS:
            method, _ = ACTIONS[action]
            await call(method, admin_pb.ControlRequest(map=name))
        elif action in OPERATIONS:
            await call("StartOperation", _operation_request(name, action))
        elif action == "delete":
            await call(
                "DeleteMap", admin_pb.DeleteMapRequest(map=name, purge=bool(form.get("purge")))
            )
            raise web.HTTPSeeOther(f"{self._base}/")
        else:
            raise web.HTTPNotFound()
        raise web.HTTPSeeOther(f"{self._base}/maps/{quote(name)}?done={quote(action)}")

    async def map_form(self, request: web.Request) -> web.Response:
        """The form that creates a map, or edits one (``/maps/{map}/edit``)."""
        name = request.match_info.get("map")
        text = ""
        if name is not None:
            definition = await self._call(request)(
                "GetMapConfig", admin_pb.GetMapConfigRequest(map=name)
            )
            text = yaml.safe_dump(orjson.loads(definition.config_json or "{}"), sort_keys=False)
        return self.render(request, "map_form.html", name=name or "", editing=name is not None,
                           config_yaml=text, errors={})  # fmt: skip

    async def map_form_post(self, request: web.Request) -> web.Response:
        """Store the form's definition; its problems are shown next to the fields."""
        editing = request.match_info.get("map")
        form = await request.post()
        name = str(editing or form.get("name", "")).strip()
        text = str(form.get("config", ""))
        rebuild = bool(form.get("rebuild"))
        errors: dict[str, list[str]] = {}
        if not name:
            errors["name"] = ["name: a map needs a name"]
        section, problem = await asyncio.to_thread(_section, text)
        if problem:
            errors["config"] = [problem]
        if not errors:
            message = admin_pb.PutMapRequest(map=name, config_json=section, rebuild=rebuild)
            try:
                await self._call(request)("PutMapConfig" if editing else "CreateMap", message)
            except HttpAbort as exc:
                if exc.code.name not in FORM_PROBLEMS:
                    raise
                for problem in _problems(exc.message):
                    field = "name" if problem.startswith(("map ", "name")) else "config"
                    errors.setdefault(field, []).append(problem)
            else:
                raise web.HTTPSeeOther(f"{self._base}/maps/{quote(name)}?done=saved")
        return self.render(
            request, "map_form.html", http_status=400, name=name, editing=editing is not None,
            config_yaml=text, errors=errors, rebuild=rebuild,
        )  # fmt: skip

    # -- entity browser ----------------------------------------------------------------

    async def entities(self, request: web.Request) -> web.Response:
        """Get, BatchGet, a filtered Query with paging, an as-of read; the same by hand."""
        name = self._known(request)
        q = request.query
        op = q.get("op", "")
        call = self._call(request)
        result: dict[str, Any] | None = None
        error: str | None = None
        try:
            if op == "get" and q.get("key"):
                answer = await call("Get", map_pb.GetRequest(map=name, key=q["key"]))
                result = {
                    "rows": [(q["key"], answer.found, _pretty(answer.entity))],
                    "watermark": _watermark(answer),
                }
            elif op == "batch" and q.get("keys"):
                keys = [k.strip() for k in q["keys"].replace("\n", ",").split(",") if k.strip()]
                answer = await call("BatchGet", map_pb.BatchGetRequest(map=name, keys=keys))
                result = {
                    "rows": [(e.key, e.found, _pretty(e.entity)) for e in answer.entries],
                    "watermark": _watermark(answer),
                }
            elif op == "query":
                result = await self._query(request, name)
            elif op == "asof" and q.get("key"):
                result = await self._as_of(request, name)
        except HttpAbort as exc:
            error = f"{exc.code.name}: {exc.message}"
        return self.render(
            request,
            "entities.html",
            name=name,
            op=op,
            q=q,
            result=result,
            error=error,
            commands=self._commands(request, name) if op and error is None else None,
        )

    async def _query(self, request: web.Request, name: str) -> dict[str, Any]:
        q = request.query
        try:
            size = min(QUERY_PAGE_MAX, max(1, int(q.get("page_size") or QUERY_PAGE)))
        except ValueError:
            size = QUERY_PAGE
        message = map_pb.QueryRequest(map=name, page_size=size, page_token=q.get("page_token", ""))
        if q.get("where"):
            message.where = q["where"]
        session: Session = request[SESSION]
        pages = self._calls.stream("Query", message, request, session.grant)
        try:
            page = await anext(pages, None)
        finally:
            await pages.aclose()
        rows = [] if page is None else [(r.key, True, _pretty(r.entity)) for r in page.rows]
        return {
            "rows": rows,
            "table_version": page.table_version if page is not None else None,
            "next_page_token": page.page_token if page is not None else "",
        }

    async def _as_of(self, request: web.Request, name: str) -> dict[str, Any]:
        q = request.query
        message = map_pb.GetAsOfRequest(map=name, key=q["key"])
        when = q.get("as_of", "").strip()
        if when.isdigit():
            message.version = int(when)
        elif when:
            try:
                message.timestamp.FromJsonString(when)
            except ValueError:
                raise HttpAbort(
                    _invalid(), f"as_of: a version or an RFC 3339 time, not {when!r}"
                ) from None
        answer = await self._call(request)("GetAsOf", message)
        return {
            "rows": [(q["key"], answer.found, _pretty(answer.entity))],
            "table_version": answer.table_version,
            "committed_at": answer.committed_at.ToJsonString()
            if answer.HasField("committed_at")
            else None,
        }

    def _commands(self, request: web.Request, name: str) -> dict[str, str]:
        """The HTTP and grpcurl commands that ask the same; the token stays ``$TOKEN``."""
        q = request.query
        origin = f"{request.scheme}://{request.host}"
        grpc_host = f"{request.host.rsplit(':', 1)[0]}:{self._live.config.query.port}"
        auth = ' -H "Authorization: Bearer $TOKEN"' if request[SESSION].grant else ""
        gauth = ' -H "authorization: Bearer $TOKEN"' if request[SESSION].grant else ""
        plain = "" if self._live.config.query.tls else " -plaintext"
        op = q.get("op")
        path = f"/v1/maps/{quote(name, safe='')}"
        body: dict[str, Any]
        if op == "get":
            url = f"{origin}{path}/entities/{quote(q.get('key', ''), safe='')}"
            method, body = "Get", {"map": name, "key": q.get("key", "")}
            curl = f"curl{auth} {shlex.quote(url)}"
        elif op == "batch":
            keys = [k.strip() for k in q.get("keys", "").replace("\n", ",").split(",") if k.strip()]
            url = f"{origin}{path}/entities:batchGet"
            method, body = "BatchGet", {"map": name, "keys": keys}
            curl = (
                f"curl{auth} -H 'Content-Type: application/json' -d "
                f"{shlex.quote(orjson.dumps({'keys': keys}).decode())} {shlex.quote(url)}"
            )
        elif op == "query":
            params = {"where": q["where"]} if q.get("where") else {}
            url = f"{origin}{path}/query" + (f"?{urlencode(params)}" if params else "")
            method, body = "Query", {"map": name, **params}
            curl = f"curl{auth} {shlex.quote(url)}"
        else:
            when = q.get("as_of", "")
            key = "as_of_version" if when.isdigit() else "as_of_timestamp"
            url = f"{origin}{path}/entities/{quote(q.get('key', ''), safe='')}?" + urlencode(
                {key: when}
            )
            method = "GetAsOf"
            body = {"map": name, "key": q.get("key", "")}
            body["version" if when.isdigit() else "timestamp"] = (
                int(when) if when.isdigit() else when
            )
            curl = f"curl{auth} {shlex.quote(url)}"
        grpcurl = (
            f"grpcurl{plain}{gauth} -d {shlex.quote(orjson.dumps(body).decode())} "
            f"{grpc_host} materializer.v1.MapService/{method}"
        )
        return {"curl": curl, "grpcurl": grpcurl}

    # -- live changes ------------------------------------------------------------------

    async def changes(self, request: web.Request) -> web.Response:
        """The page that shows the map's changes as they happen."""
        name = self._known(request)
        return self.render(request, "changes.html", name=name, key=request.query.get("key", ""))

    async def changes_stream(self, request: web.Request) -> web.StreamResponse:
        """``Watch`` as Server-Sent Events, as the session's token, filtered by key."""
        session: Session = request[SESSION]
        keys = [k.strip() for k in request.query.get("key", "").split(",") if k.strip()]
        call = map_pb.WatchRequest(map=request.match_info["map"], include_entities=True, keys=keys)
        return await sse_changes(
            request,
            lambda opened: self._calls.stream(
                "Watch", call, request, session.grant, on_opened=opened
            ),
        )


def _invalid() -> grpc.StatusCode:
    return grpc.StatusCode.INVALID_ARGUMENT


def _operation_request(name: str, kind: str) -> Any:
    return admin_pb.OperationRequest(map=name, kind=kind)
