"""``rehydrate`` and ``verify``: a map's Redis copy rebuilt from, or checked against, Delta.

Both read the Delta table with delta-rs and the changelog with a plain Kafka
consumer (no Spark, no JVM), holding the map still while they work
(``materializer.restore.rehydrate``).
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from materializer.commands.cli_support import (
    ConfigOption,
    MapArgument,
    err,
    exits_on_errors,
    load_in_force,
    out,
    redis_client,
)
from materializer.contract.watermark import Watermark
from materializer.ops.verify import Comparison
from materializer.ops.verify import verify as verify_map
from materializer.restore.changelog_tail import Tail
from materializer.restore.expected_state import ExpectedState
from materializer.restore.rehydrate import rehydrate as rehydrate_map

GenerationOption = Annotated[
    int | None,
    typer.Option(
        "--generation",
        min=0,
        help="The copy to work on [default: the one <map>:__generation__ names]. Needed when "
        "Redis lost the pointer of a rebuilt map too.",
    ),
]


def _tail_text(tail: Tail) -> str:
    return (
        f"{tail.records} changelog records after the table "
        f"({tail.upserts} upserts, {tail.deletes} deletes)"
    )


def _watermark_text(mark: Watermark | None) -> str:
    if mark is None:
        return "none"
    return f"batch {mark.batch_id} of {mark.app_id}, offsets {mark.offsets}"


def rehydrate(
    config: ConfigOption, map_name: MapArgument, generation: GenerationOption = None
) -> None:
    """Load a map's Redis copy from its Delta table and changelog tail, and its watermark.

    Redis ends up holding exactly the table with the changelog after it on top:
    keys Redis held beyond that are removed. A map a running materializer folds
    is paused meanwhile and resumed after.
    """
    cfg = load_in_force(config)
    client = redis_client(cfg)
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    ) as progress:
        task = progress.add_task(f"rehydrating {map_name}", total=None)

        def started(state: ExpectedState) -> None:
            progress.update(task, total=state.source_rows)

        def advanced(rows: int) -> None:
            progress.advance(task, rows)

        try:
            with exits_on_errors():
                report = rehydrate_map(
                    cfg,
                    map_name,
                    client,
                    generation=generation,
                    on_start=started,
                    on_progress=advanced,
                )
        finally:
            client.close()
    rate = report.written / report.seconds if report.seconds > 0 else 0.0
    out.print(
        f"rehydrated {report.physical}: {report.written} entities "
        f"(Delta version {report.table_version}, {report.table_rows} rows; "
        f"{_tail_text(report.tail)}), {report.removed} stale keys removed, "
        + (f"{report.expired} past their TTL left out, " if report.expired else "")
        + f"watermark {_watermark_text(report.watermark)}; "
        f"{report.seconds:.1f} s, {rate:,.0f} entities/s"
        + ("; the map was paused meanwhile and is resumed" if report.paused else ""),
        highlight=False,
        soft_wrap=True,
    )


def verify(
    config: ConfigOption,
    map_name: MapArgument,
    generation: GenerationOption = None,
    show: Annotated[int, typer.Option(min=0, help="Keys listed per kind of difference.")] = 10,
    replay: Annotated[
        bool,
        typer.Option(
            "--replay",
            help="Also fold the topics again from the earliest offsets, up to Redis's "
            "watermark, in a throwaway copy (Spark), and compare Redis with that.",
        ),
    ] = False,
) -> None:
    """Compare a map's Redis copy with its Delta table and changelog tail, key by key.

    Exit 0 when every entity and the watermark match, 1 on any difference, 2
    when the comparison could not run.
    """
    cfg = load_in_force(config)
    client = redis_client(cfg)
    spark = None
    try:
        with exits_on_errors(), err.status(f"comparing {map_name}"):
            replayer = None
            if replay:
                from pyspark.sql import SparkSession

                from materializer.ops.replay import replay_digests
                from materializer.spark.session import build_spark_session

                # A session the process already had (an embedding application) stays up.
                own = SparkSession.getActiveSession() is None
                session = build_spark_session(
                    cfg.spark,
                    app_name=f"materializer-verify-{map_name}",
                    object_store=cfg.object_store,
                )
                spark = session if own else None

                def replayer(until: dict[str, dict[int, int]]) -> dict[str, bytes]:
                    return replay_digests(session, cfg, map_name, until, client)

            report = verify_map(
                cfg, map_name, client, generation=generation, show=show, replay=replayer
            )
    finally:
        client.close()
        if spark is not None:
            spark.stop()
    summary = Table(title=f"verify {report.physical}", title_justify="left")
    summary.add_column("")
    summary.add_column("expected (Delta + changelog)", justify="right")
    summary.add_column("Redis", justify="right")
    summary.add_row("entities", str(report.expected), str(report.actual))
    summary.add_row(
        "watermark",
        _watermark_text(report.expected_watermark),
        _watermark_text(report.actual_watermark),
    )
    out.print(summary)
    out.print(
        f"Delta version {report.table_version} ({report.table_rows} rows), "
        f"{_tail_text(report.tail)}"
        + ("; the map was paused meanwhile and is resumed" if report.paused else ""),
        highlight=False,
        soft_wrap=True,
    )
    _print_differences(report.stores, "")
    if report.replayed is not None:
        _print_differences(report.replayed, " (against the replayed fold)")
        if report.replayed.identical:
            out.print("the fold replayed from Kafka agrees with Redis", highlight=False)
    if not report.watermark_matches:
        out.print("[red]watermark differs from the fold checkpoint's last batch[/red]")
    if not report.identical:
        raise typer.Exit(1)
    out.print(f"[green]identical[/green]: {report.expected} entities and the watermark")


def _print_differences(found: Comparison, against: str) -> None:
    for label, keys in (
        ("missing in Redis", found.missing),
        ("extra in Redis", found.extra),
        ("different value", found.different),
    ):
        if keys.count:
            more = f" (first {len(keys.first)})" if keys.count > len(keys.first) else ""
            out.print(f"[red]{label}{against}: {keys.count}[/red]{more}", highlight=False)
            for key in keys.first:
                out.print(f"  {key}", highlight=False, markup=False)
