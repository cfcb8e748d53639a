"""A map's page: its summary, charts, dead letters, definition, Delta table, and buttons.

The summary is also a fragment htmx fetches again every few seconds, and the charts
read ``history.json``. The buttons post to ``actions/{action}``: the control calls
(pause, resume, restart), the operations the run carries out and reports on (verify,
rehydrate, rebuild), and deletion; those that replace or remove data need the map's
name typed to confirm.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

import orjson
import pyarrow as pa
from aiohttp import web
from jinja2 import Environment

from materializer.catalog.live import LiveMaps
from materializer.contract.table_layout import AddedColumn
from materializer.v1 import admin_service_pb2 as admin_pb
from query_service.console.calls import ConsoleCalls
from query_service.console.dead_letters import DeadLetter, last_dead_letters
from query_service.console.history import HistoryReader, hour_ago_ms
from query_service.console.map_form import SAVED, section_yaml
from query_service.console.page import Page, invalid, records_left, state_name
from query_service.console.sessions import SESSION, Session
from query_service.http import shapes
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
DONE = frozenset({*ACTIONS, *OPERATIONS, SAVED})
"""What a page may say was just done (``?done=``): nothing else is echoed."""
DEAD_LETTERS_WAIT_S = 3.0
"""The longest a map's page waits for its dead letters before it shows without them."""
DEAD_LETTERS_KEPT_S = 5.0
"""How long a map's dead letters, once read, serve its page again."""
VERSIONS_SHOWN = 15
"""Delta versions listed on a map's page."""
Column = tuple[str, str, AddedColumn | None]
"""A column of the map's table: its name, Arrow type and, if it came later, when."""


class MapPage(Page):
    """A map's page, its summary and chart data, and its buttons."""

    def __init__(
        self,
        calls: ConsoleCalls,
        live: LiveMaps,
        templates: Environment,
        base: str,
        history: HistoryReader,
    ) -> None:
        super().__init__(calls, live, templates, base, history)
        self._tables = DeltaTables(live)
        self._kafka = ThreadPoolExecutor(2, thread_name_prefix="console-kafka")
        self._dead: dict[str, tuple[float, list[DeadLetter] | str]] = {}

    async def map_page(self, request: web.Request) -> web.Response:
        """A map: summary, charts, dead letters, config, schema, Delta versions, actions."""
        name = request.match_info["map"]
        summary = await self._map_summary(request, name)
        call = self._call(request)
        definition = await call("GetMapConfig", admin_pb.GetMapConfigRequest(map=name))
        versions, schema = await asyncio.to_thread(self._table_facts, name)
        session: Session = request[SESSION]
        # Dead letters hold records' keys and errors: user data, for tokens that may read it.
        dead = await self._dead_letters(name) if session.may("get") else None
        return self.render(
            request,
            "map.html",
            **summary,
            definition=definition,
            config_yaml=section_yaml(definition),
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
            "state": state_name(status),
            "summary": {
                "watermark": shapes.watermark(status.watermark)
                if status.HasField("watermark")
                else None,
                "partitions": list(status.partitions),
                "records_left": records_left(status),
            },
            "operation": await self._history.operation(name),
        }

    def _table_facts(self, name: str) -> tuple[list[dict[str, Any]], list[Column]]:
        """The Delta table's last versions and its columns, each with the commit that added
        it after the table's creation (blocking: delta-rs)."""
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
        schema = [
            (f.name, str(f.type), AddedColumn.of_field(f.metadata))
            for f in pa.schema(table.schema().to_arrow())
        ]
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

    async def action(self, request: web.Request) -> web.Response:
        """One of the map page's buttons; typed confirmation for the destructive ones."""
        name, action = request.match_info["map"], request.match_info["action"]
        form = await request.post()
        if action in TYPED and form.get("confirm") != name:
            raise invalid(f"{action}: type the map's name {name!r} to confirm")
        call = self._call(request)
        if action in ACTIONS:
            method, _ = ACTIONS[action]
            await call(method, admin_pb.ControlRequest(map=name))
        elif action in OPERATIONS:
            await call("StartOperation", admin_pb.OperationRequest(map=name, kind=action))
        elif action == "delete":
            await call(
                "DeleteMap", admin_pb.DeleteMapRequest(map=name, purge=bool(form.get("purge")))
            )
            raise web.HTTPSeeOther(f"{self._base}/")
        else:
            raise web.HTTPNotFound()
        raise web.HTTPSeeOther(f"{self._base}/maps/{quote(name)}?done={quote(action)}")
