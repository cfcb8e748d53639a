"""How the demo looks: a live rich view on a terminal, plain progress lines otherwise.

Plain lines are for logs and CI, where a redrawn screen would be noise: they
come every few seconds and say the same as the live view, one map per line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from materializer.demo.monitor import Lookups, MapProgress, Snapshot


@dataclass(frozen=True)
class Header:
    """What stays the same while the demo runs."""

    address: str
    config: str
    seed: int
    rate: float


def client_snippet(address: str, user: str) -> str:
    """A lookup to paste into ``python -m asyncio`` (a REPL where ``await`` works)."""
    return (
        "python -m asyncio\n"
        ">>> from query_service.client import MaterializerClient\n"
        f'>>> async with MaterializerClient("{address}") as c: '
        f'print(await c.get("users", "{user}"))'
    )


def _count(n: int) -> str:
    return f"{n:,}"


def _seconds(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f} s"


def _state_style(state: str) -> str:
    return {
        "running": "green",
        "catching_up": "cyan",
        "paused": "yellow",
        "failed": "bold red",
        "silent": "red",
    }.get(state, "dim")


def _entity(entity: dict[str, Any] | None) -> str:
    return "deleted" if entity is None else orjson.dumps(entity).decode()


def _money(value: Any) -> str:
    return "" if value is None else f"{value:,.2f}"


def _maps_table(maps: list[MapProgress]) -> Table:
    table = Table(
        title="maps",
        title_justify="left",
        caption="folded: to the map's watermark · lag: log end − watermark · "
        "freshness: produced → in Redis",
        caption_justify="left",
    )
    table.add_column("map")
    table.add_column("topic")
    for column in ("produced", "folded", "lag", "freshness"):
        table.add_column(column, justify="right")
    table.add_column("state")
    table.add_column("batch", justify="right")
    table.add_column("rows/s", justify="right")
    for m in maps:
        table.add_row(
            m.name,
            m.topic,
            _count(m.produced),
            _count(m.folded),
            _count(m.lag),
            _seconds(m.freshness),
            Text(m.state, style=_state_style(m.state)),
            "–" if m.batch_id is None else str(m.batch_id),
            f"{m.rows_per_second:,.0f}",
        )
    return table


def _lookups_table(lookups: Lookups) -> Table:
    title = (
        f"lookups: BatchGet of {len(lookups.users)} recent users from users and user_orders, "
        f"{lookups.batch_ms:.1f} ms each"
    )
    table = Table(title=title, title_justify="left")
    table.add_column("user", no_wrap=True)
    for column in ("name", "country", "plan"):
        table.add_column(column)
    for column in ("orders", "spent", "largest"):
        table.add_column(column, justify="right")
    table.add_column("last order", no_wrap=True)
    table.add_column("statuses")
    for key, user in lookups.users.items():
        orders = lookups.orders.get(key) or {}
        if user is None:
            table.add_row(key, Text("deleted", style="dim"))
            continue
        statuses = ""
        if orders:
            statuses = f"{orders.get('first_status', '')} → {orders.get('last_status', '')}"
        table.add_row(
            key,
            user.get("name", ""),
            user.get("country", ""),
            user.get("plan", ""),
            str(orders.get("orders", 0)),
            _money(orders.get("total_amount")),
            _money(orders.get("max_amount")),
            str(orders.get("last_order_at", ""))[11:19],  # the time of day, UTC
            statuses,
        )
    return table


def render(snapshot: Snapshot, header: Header, producer: str) -> RenderableType:
    """The live view: the producer, the maps, the lookups and how to query the service."""
    parts: list[RenderableType] = [
        Text.assemble(
            ("Materializer demo", "bold"),
            f"  seed {header.seed} · {header.rate:g} events/s · {producer}",
        ),
        Text(
            f"query service {header.address} · config {header.config} · Ctrl-C stops",
            style="dim",
        ),
    ]
    if snapshot.error:
        parts.append(Text(snapshot.error, style="red"))
    if snapshot.maps:
        parts.append(_maps_table(snapshot.maps))
    lookups = snapshot.lookups
    if lookups.error:
        parts.append(Text(f"lookups: {lookups.error}", style="red"))
    elif lookups.get_key:
        parts.append(_lookups_table(lookups))
        parts.append(
            Text(
                f"Get users/{lookups.get_key} ({lookups.get_ms:.1f} ms): "
                f"{_entity(lookups.get_entity)}",
                overflow="ellipsis",
                no_wrap=True,
            )
        )
        parts.append(Text("query it yourself:", style="bold"))
        parts.append(Text(client_snippet(header.address, lookups.get_key), style="cyan"))
    else:
        parts.append(Text("lookups: waiting for the first folded batch…", style="dim"))
    return Group(*parts)


def plain_lines(snapshot: Snapshot, elapsed: float) -> list[str]:
    """Progress as a few log lines: one per map, one for a lookup."""
    stamp = f"[{elapsed:5.0f} s]"
    if snapshot.error:
        return [f"{stamp} {snapshot.error}"]
    lines = [
        f"{stamp} {m.name}: produced {m.produced}, folded {m.folded}, lag {m.lag}, "
        f"freshness {_seconds(m.freshness)}, {m.state}"
        + ("" if m.batch_id is None else f", batch {m.batch_id}")
        for m in snapshot.maps
    ]
    lookups = snapshot.lookups
    if lookups.error:
        lines.append(f"{stamp} lookups: {lookups.error}")
    elif lookups.get_key:
        lines.append(
            f"{stamp} Get users/{lookups.get_key} ({lookups.get_ms:.1f} ms): "
            f"{_entity(lookups.get_entity)}"
        )
    return lines
