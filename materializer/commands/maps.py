"""``status``, ``pause``, ``resume``, ``restart``: a running materializer's maps, from outside.

Requests are written to ``<map>:__control__`` (as the query service's
AdminService does); the materializer obeys within one supervisor loop, and
with ``--wait`` the command returns once its report shows it did.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import orjson
import typer
from rich.markup import escape
from rich.table import Table

from materializer.clients.kafka_offsets import admin_client, partition_offsets
from materializer.commands.cli_support import (
    ConfigOption,
    MapArgument,
    exits_on_errors,
    load_in_force,
    map_control,
    out,
    redis_client,
)
from materializer.config import AppConfig
from materializer.contract.control import MapControl, now_ms
from materializer.contract.status import FOLDING, MapView, map_view

WaitOption = Annotated[
    bool, typer.Option("--wait/--no-wait", help="Return once the materializer obeyed.")
]


def _views(config: AppConfig, names: list[str]) -> list[MapView]:
    client = redis_client(config)
    try:
        topics = sorted({t for n in names for t in config.map(n).source.topics})
        try:
            ends = partition_offsets(admin_client(config.kafka), topics) if topics else {}
        except Exception as exc:  # Kafka down: show the rest, lag unknown
            out.print(f"[yellow]log end offsets unknown: {exc}[/yellow]", highlight=False)
            ends = None
        views = []
        for name in names:
            control = MapControl(client, name)
            generation = control.generation()
            views.append(
                map_view(
                    name,
                    config.map(name).source.topics,
                    generation,
                    control.report(),
                    control.watermark(generation),
                    ends,
                    now_ms(),
                )
            )
        return views
    finally:
        client.close()


_STATE_STYLE = {
    "running": "green",
    "catching_up": "cyan",
    "paused": "yellow",
    "restoring": "magenta",
    "rebuilding": "magenta",
    "failed": "red",
    "stopped": "dim",
}


def _age(ms: int | None) -> str:
    if ms is None:
        return "-"
    return f"{ms / 1000:.1f} s ago" if ms < 120_000 else f"{ms / 60_000:.0f} min ago"


def _state_size(view: MapView) -> str:
    """The fold state's keys and memory, as last measured."""
    report = view.report
    if report is None or report.state_keys < 0:
        return "-"
    return f"{report.state_keys} keys, {report.state_bytes / 1_048_576:.1f} MiB"


def _eta(seconds: float) -> str:
    """An ETA in words: "-" when unknown."""
    if seconds < 0:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def _left(lag: int) -> str:
    return "unknown" if lag < 0 else str(lag)


def _worker(view: MapView) -> str:
    """The worker running the map, as its last report says; "-" outside a worker group."""
    return view.report.worker if view.report is not None and view.report.worker else "-"


def _path(view: MapView) -> str:
    """How the map's fold runs, as its last report says; "-" when it does not run."""
    folding = view.report is not None and view.state in FOLDING and view.report.fold_path
    return view.report.fold_path if folding and view.report is not None else "-"


def _render(views: list[MapView]) -> None:
    maps = Table(title="maps", title_justify="left")
    columns = [
        *("map", "state", "gen", "last batch", "written", "in/s", "out/s"),
        *("left", "catch-up/s", "ETA", "state"),
    ]
    # A worker column when a worker group runs a map: a lone run's table stays as it was.
    grouped = any(_worker(v) != "-" for v in views)
    if grouped:
        columns.insert(2, "worker")
    # A path column once a map folds on the real-time path: a micro-batch run's stays as it was.
    paths = any(_path(v) == "realtime" for v in views)
    if paths:
        columns.insert(2, "path")
    for column in columns:
        left = column in ("map", "state", "worker", "path")
        maps.add_column(column, justify="left" if left else "right")
    for v in views:
        style = _STATE_STYLE.get(v.state, "")
        maps.add_row(
            v.name,
            f"[{style}]{v.state}[/{style}]" if style else v.state,
            *((_path(v),) if paths else ()),
            *((escape(_worker(v)),) if grouped else ()),  # a name of the operator's choosing
            str(v.generation),
            str(v.watermark.batch_id) if v.watermark else "-",
            _age(v.freshness_ms),
            f"{v.report.input_rows_per_second:.0f}" if v.report else "-",
            f"{v.report.processed_rows_per_second:.0f}" if v.report else "-",
            _left(v.total_lag),
            f"{v.catch_up_rate:.0f}",
            _eta(v.eta_seconds),
            _state_size(v),
        )
    out.print(maps)
    if any(v.state == "restoring" for v in views):
        out.print("restoring: lookups of keys not written back yet answer from the Delta table")
    if grouped:  # each worker's maps, as Kafka Connect lists each worker's connectors
        workers = Table(title="workers", title_justify="left")
        for column in ("worker", "maps", "running"):
            workers.add_column(column, justify="right" if column == "maps" else "left")
        by_worker: dict[str, list[str]] = {}
        for v in views:
            by_worker.setdefault(_worker(v), []).append(v.name)
        for worker, names in sorted(by_worker.items()):
            workers.add_row(escape(worker), str(len(names)), ", ".join(names))
        out.print(workers)
    parts = Table(title="partitions", title_justify="left")
    for column in (
        *("map", "topic", "partition", "materialized", "log end"),
        *("left", "catch-up/s", "ETA"),
    ):
        parts.add_column(column, justify="right" if column not in ("map", "topic") else "left")
    for v in views:
        for p in v.partitions:
            parts.add_row(
                v.name,
                p.topic,
                str(p.partition),
                str(p.materialized_offset),
                str(p.log_end_offset) if p.log_end_offset >= 0 else "?",
                str(p.lag) if p.lag >= 0 else "?",
                f"{p.catch_up_rate:.0f}",
                _eta(p.eta_seconds),
            )
    out.print(parts)
    for v in views:
        if v.report is not None and v.report.error:
            error = escape(v.report.error)  # Spark's errors hold brackets of their own
            out.print(f"[red]{v.name}: {error}[/red]", highlight=False, soft_wrap=True)


def status(
    config: ConfigOption,
    map_name: Annotated[str | None, typer.Argument(help="One map; all when left out.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document per map.")] = False,
) -> None:
    """Each map's state, the worker running it (in a worker group), last batch, rates, and
    records left per partition against Kafka's log ends, with the rate it catches up at and
    when it should be done (ETA).

    Exits 1 when a map has failed, so a health check can run it.
    """
    cfg = load_in_force(config)
    names = [map_name] if map_name else sorted(cfg.maps)
    with exits_on_errors():
        for name in names:
            cfg.map(name)
        views = _views(cfg, names)
    if as_json:
        for v in views:
            typer.echo(orjson.dumps(v.to_json()).decode())
    else:
        _render(views)
    if any(v.state == "failed" for v in views):
        raise typer.Exit(1)


def _request(config_path: Path, name: str, desired: str, restart: bool, wait: bool) -> None:
    cfg = load_in_force(config_path)
    control = map_control(cfg, name)
    with exits_on_errors():
        control.ask(desired, restart=restart)
        out.print(f"{name}: {'restart' if restart else desired} requested", highlight=False)
        if not wait:
            return
        if control.state() in ("not_started", "stopped"):
            out.print(
                f"{name}: no materializer runs it now; the request holds for the next run",
                highlight=False,
            )
            return
        # A report written after the request may come from a loop that read the
        # control hash just before it; the second new report comes from a loop
        # that started after it.
        seen: set[int] = set()
        first = control.report()
        if first is not None:
            seen.add(first.reported_at_ms)

        def obeyed(state: str) -> bool:
            report = control.report()
            if report is not None:
                seen.add(report.reported_at_ms)
            # A map that resumed far behind its logs runs, catching up.
            running = desired == "running" and state in FOLDING
            return len(seen) >= 3 and (state == desired or running)

        state = control.wait_for(obeyed, desired)
        out.print(f"{name}: {state}", highlight=False)


def pause(config: ConfigOption, map_name: MapArgument, wait: WaitOption = True) -> None:
    """Stop folding the map after its batch in flight; its offsets stay where they are."""
    _request(config, map_name, "paused", restart=False, wait=wait)


def resume(config: ConfigOption, map_name: MapArgument, wait: WaitOption = True) -> None:
    """Fold the map again from its checkpoint: nothing lost, nothing folded twice."""
    _request(config, map_name, "running", restart=False, wait=wait)


def restart(config: ConfigOption, map_name: MapArgument, wait: WaitOption = True) -> None:
    """Stop and start the map's queries (a failed map tries again)."""
    _request(config, map_name, "running", restart=True, wait=wait)
