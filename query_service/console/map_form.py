"""The form that creates a map or edits one: its section in YAML, its problems by field.

The YAML is read here, bounded in size and without aliases, and sent as the JSON
``CreateMap`` and ``PutMapConfig`` take; the checks of the definition are the
servicer's, and their refusals are shown next to the field they name, with what was
typed kept in the form.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote

import orjson
import yaml
from aiohttp import web

from materializer.v1 import admin_service_pb2 as admin_pb
from query_service.console.page import Page
from query_service.http.calls import HttpAbort

FORM_PROBLEMS = ("INVALID_ARGUMENT", "ALREADY_EXISTS", "FAILED_PRECONDITION")
"""Refusals of a map's definition that the form shows next to its fields."""
MAX_SECTION_BYTES = 64 * 1024
"""The longest map section the form takes; real ones are a few hundred bytes."""
SAVED = "saved"
"""What the map's page says was done when the form sends the browser there."""


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


def section_yaml(definition: admin_pb.MapDefinition) -> str:
    """A stored definition's section as YAML, as the map's page shows it and the form edits
    it (in the order it was written)."""
    return yaml.safe_dump(orjson.loads(definition.config_json or "{}"), sort_keys=False)


def _problems(message: str) -> list[str]:
    """A refusal's message as the list of problems it names (one per key path)."""
    return [p.strip() for p in message.replace("\n", "; ").split("; ") if p.strip()]


class MapForm(Page):
    """The new-map form and a map's edit form."""

    async def map_form(self, request: web.Request) -> web.Response:
        """The form that creates a map, or edits one (``/maps/{map}/edit``)."""
        name = request.match_info.get("map")
        text = ""
        if name is not None:
            definition = await self._call(request)(
                "GetMapConfig", admin_pb.GetMapConfigRequest(map=name)
            )
            text = section_yaml(definition)
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
                raise web.HTTPSeeOther(f"{self._base}/maps/{quote(name)}?done={SAVED}")
        return self.render(
            request, "map_form.html", http_status=400, name=name, editing=editing is not None,
            config_yaml=text, errors=errors, rebuild=rebuild,
        )  # fmt: skip
