"""``materializer maps apply|get|delete``: maps managed at runtime, from the command line.

The same catalog as the query service's ``/v1/maps`` (``materializer.catalog``), written
with the configuration file's Kafka settings; every running materializer follows it.
``apply`` is ``kubectl apply``: it creates the maps a document declares, or changes them.
"""

from __future__ import annotations

import getpass
import socket
import time
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
import yaml
from rich.table import Table

from materializer.catalog.changes import Change, check_delete, check_put
from materializer.catalog.live import LiveMaps
from materializer.catalog.purge import purge
from materializer.catalog.rule import combine
from materializer.commands.cli_support import (
    ConfigOption,
    err,
    exits_on_errors,
    fail,
    load,
    map_control,
    out,
)
from materializer.config import AppConfig
from materializer.contract.status import IN_HAND

app = typer.Typer(
    help="Maps managed at runtime: create, change, read and delete them; the running "
    "materializers and query services follow.",
    no_args_is_help=True,
)

PURGE_WAIT_SECONDS = 180.0


def _caller() -> str:
    return f"cli:{getpass.getuser()}@{socket.gethostname()}"


def _live(config: AppConfig) -> LiveMaps:
    if not config.catalog.enabled:
        raise fail("catalog.enabled is off in this configuration: maps come from the file only")
    live = LiveMaps(config)
    with exits_on_errors():
        live.catch_up()
    return live


def _sections(path: Path) -> dict[str, Any]:
    """The maps a document declares: ``{name, config}`` (the API's shape), or a ``maps:``
    section of one or more (the file's)."""
    try:
        text = typer.get_text_stream("stdin").read() if str(path) == "-" else path.read_text()
        doc = yaml.safe_load(text)
    except OSError as exc:
        raise fail(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise fail(f"{path}: not valid YAML: {exc}") from None
    if isinstance(doc, dict) and set(doc) == {"name", "config"}:
        return {str(doc["name"]): doc["config"]}
    if isinstance(doc, dict) and set(doc) == {"maps"} and isinstance(doc["maps"], dict):
        return {str(name): section for name, section in doc["maps"].items()}
    raise fail(
        f"{path}: declare the maps as `name:` and `config:` (one map), or under `maps:` "
        "as the configuration file does"
    )


@app.command()
def apply(
    config: ConfigOption,
    file: Annotated[
        Path,
        typer.Option("--file", "-f", help="The maps to create or change (YAML or JSON; -: stdin)."),
    ],
    rebuild: Annotated[
        bool,
        typer.Option(
            "--rebuild",
            help="Let a change the map's state cannot follow through: rebuilt into a new "
            "copy while the old one serves.",
        ),
    ] = False,
) -> None:
    """Create the maps a document declares, or change them (only their queries restart)."""
    cfg = load(config)
    sections = _sections(file)
    live = _live(cfg)
    try:
        checked: list[Change] = []
        with exits_on_errors():
            maps = live.maps
            for name, section in sections.items():
                change = check_put(maps, name, section, by=_caller(), rebuild=rebuild)
                checked.append(change)
                # The next map is checked with this one in force: two that clash are refused.
                maps = combine(cfg, {**maps.records, name: change.record})
            assert live.topic is not None
            for change in checked:
                record = live.topic.write(change.record)
                verb = "created" if change.created else "changed"
                extra = ", rebuilding into a new copy" if change.rebuilt else ""
                out.print(f"map {record.name} {verb} (version {record.version}{extra})")
    finally:
        live.close()


@app.command()
def get(
    config: ConfigOption,
    name: Annotated[str | None, typer.Argument(help="One map: print its definition.")] = None,
) -> None:
    """The maps in force and where each comes from; with a name, its definition as YAML."""
    cfg = load(config)
    live = _live(cfg)
    live.close()
    maps = live.maps
    if name is None:
        table = Table(title="maps", title_justify="left")
        for column in ("map", "origin", "version", "changed by", "changed at"):
            table.add_column(column)
        for map_name in sorted(maps.config.maps):
            record = maps.stored.get(map_name)
            table.add_row(
                map_name,
                maps.origin[map_name],
                str(record.version) if record else "-",
                record.by if record else "-",
                time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(record.at_ms / 1000))
                if record and record.at_ms
                else "-",
            )
        out.print(table)
        for left, problems in sorted(maps.left_out.items()):
            err.print(f"[yellow]{left}: not in force: {'; '.join(problems)}[/yellow]")
        return
    if name not in maps.config.maps:
        known = ", ".join(sorted(maps.config.maps)) or "none"
        raise fail(f"no such map {name!r} (known maps: {known})")
    record = maps.stored.get(name)
    if record is not None:
        section = record.config
    else:
        declared = maps.config.maps[name]
        section = orjson.loads(declared.model_dump_json(by_alias=True, exclude_defaults=True))
    typer.echo(yaml.safe_dump({"name": name, "config": section}, sort_keys=False), nl=False)


@app.command()
def delete(
    config: ConfigOption,
    name: Annotated[str, typer.Argument(help="The map to delete.")],
    purge_data: Annotated[
        bool,
        typer.Option(
            "--purge",
            help="Also remove its Redis keys, Delta tables, checkpoints, consumer group and "
            "changelog topics, once the materializers stopped it.",
        ),
    ] = False,
) -> None:
    """Stop a map managed at runtime and forget it."""
    cfg = load(config)
    live = _live(cfg)
    if purge_data and live.maps.origin.get(name) == "file":
        live.close()
        raise fail(
            f"map {name!r} is declared in the configuration file (maps.{name}): its data is "
            "the file's map's, and is never purged from here"
        )
    try:
        with exits_on_errors():
            in_force = live.config
            tombstone = check_delete(live.maps, name, by=_caller())
            assert live.topic is not None
            record = live.topic.write(tombstone)
        out.print(f"map {name} deleted (version {record.version})")
    finally:
        live.close()
    if purge_data:
        control = map_control(in_force, name)
        with exits_on_errors():
            control.wait_for(
                lambda state: state not in IN_HAND,
                "stopped",
                PURGE_WAIT_SECONDS,
            )
            for line in purge(in_force, name) or ["nothing was left"]:
                out.print(f"purged: {line}")
