"""``reset-offsets``: where a still map's fold reads next (``materializer.ops.reset_offsets``)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from materializer.commands.cli_support import (
    ConfigOption,
    MapArgument,
    exits_on_errors,
    load_in_force,
    map_control,
    out,
)
from materializer.ops.reset_offsets import apply_reset, parse_position, plan_reset


def reset_offsets(
    config: ConfigOption,
    map_name: MapArgument,
    to: Annotated[
        str,
        typer.Option(
            "--to",
            help="earliest, latest, epoch milliseconds, or an ISO-8601 time: the first "
            "offset at or after it.",
        ),
    ],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show the new offsets, change nothing.")
    ] = False,
) -> None:
    """Move a paused, stopped or failed map's read position; its state and stores stay.

    Events skipped are never folded; events replayed change nothing (the
    fold's state knows them): rebuild the map to start from nothing. A map
    whose next records Kafka no longer holds goes on from where records are.
    """
    cfg = load_in_force(config)
    control = map_control(cfg, map_name)
    with exits_on_errors():
        reset = plan_reset(cfg, control, parse_position(to))
        table = Table(title=f"{map_name}: next batch starts at", title_justify="left")
        for column in ("topic", "partition", "now", "after reset"):
            table.add_column(column, justify="left" if column == "topic" else "right")
        for topic in sorted(set(reset.before) | set(reset.after)):
            parts = set(reset.before.get(topic, {})) | set(reset.after.get(topic, {}))
            for partition in sorted(parts):
                table.add_row(
                    topic,
                    str(partition),
                    str(reset.before.get(topic, {}).get(partition, "-")),
                    str(reset.after.get(topic, {}).get(partition, "-")),
                )
        out.print(table)
        if reset.dropped is not None:
            out.print(
                f"batch {reset.dropped} was planned over records that are gone: the reset drops it",
                highlight=False,
            )
        if dry_run:
            out.print("dry run: nothing changed")
            return
        apply_reset(cfg, control, reset)
        out.print(f"{map_name}: offsets reset; the next run or resume starts there")
