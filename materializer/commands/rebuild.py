"""``rebuild``: a new copy of a map from the first event, readers switched when it caught up."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

from materializer.commands.cli_support import (
    ConfigOption,
    MapArgument,
    exits_on_errors,
    load_in_force,
    map_control,
    out,
)
from materializer.ops import rebuild as ops


def rebuild(
    config: ConfigOption,
    map_name: MapArgument,
    grace: Annotated[
        float,
        typer.Option(
            "--grace", min=0, help="Seconds the old copy stays after the switch, for readers."
        ),
    ] = 60.0,
) -> None:
    """Fold the map again from the earliest offsets into a new copy while the live one serves;
    switch readers atomically once it caught up; drop the old copy after a grace period."""
    from materializer.spark.session import build_spark_session

    cfg = load_in_force(config)
    control = map_control(cfg, map_name)
    with exits_on_errors():
        before = control.generation()
        out.print(f"{map_name}: generation {before} serves; starting Spark…", highlight=False)
        spark = build_spark_session(
            cfg.spark,
            app_name=f"materializer-rebuild-{map_name}",
            object_store=cfg.object_store,
        )
        try:
            with Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TaskProgressColumn(),
                TimeElapsedColumn(),
                console=out,
            ) as bar:
                task = bar.add_task(ops.PHASES["cleaning"], total=None)

                def show(progress: ops.Progress) -> None:
                    total = progress.target or None
                    bar.update(
                        task,
                        description=ops.PHASES.get(progress.phase, progress.phase),
                        completed=progress.folded,
                        total=total,
                    )

                new = ops.rebuild(spark, cfg, map_name, grace_seconds=grace, report=show)
        finally:
            spark.stop()
    out.print(f"{map_name}: generation {new} serves; generation {before} dropped", highlight=False)
