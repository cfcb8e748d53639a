"""The ``materializer`` command."""

from __future__ import annotations

import signal
import threading
from typing import Annotated

import typer
from pydantic import ValidationError

from materializer.clients.logs import LogFormat, LogLevel, configure_logging
from materializer.commands import catalog, maps, offsets, rebuild, rehydrate, sql
from materializer.commands.cli_support import ConfigOption, err, load
from materializer.config import WorkerConfig, config_problems
from materializer.errors import ConfigError, MaterializerError
from materializer.spark.signals import STOP_SIGNALS

app = typer.Typer(help="Fold Kafka topics into Delta tables and Redis maps.", no_args_is_help=True)


@app.callback()
def main(
    log_format: Annotated[
        LogFormat,
        typer.Option(
            case_sensitive=False,
            envvar="MATERIALIZER_LOG_FORMAT",
            help="json: one object per line with each batch's fields as keys, Spark's too.",
        ),
    ] = LogFormat.TEXT,
    log_level: Annotated[
        LogLevel, typer.Option(case_sensitive=False, envvar="MATERIALIZER_LOG_LEVEL")
    ] = LogLevel.INFO,
) -> None:
    """Fold Kafka topics into Delta tables and Redis maps."""
    configure_logging(log_level.value, log_format, own_stderr=True)


@app.command()
def validate(config: ConfigOption) -> None:
    """Check a configuration file; every problem is printed with its key path."""
    cfg = load(config)
    problems = config_problems(cfg)
    if problems:
        err.print(
            f"[red]{ConfigError(str(config), problems)}[/red]", highlight=False, soft_wrap=True
        )
        raise typer.Exit(2)
    typer.echo(f"{config}: ok ({len(cfg.maps)} map{'s' if len(cfg.maps) != 1 else ''})")


@app.command()
def run(
    config: ConfigOption,
    map_names: Annotated[
        list[str] | None,
        typer.Option("--map", "-m", help="Run only these maps and enrichments."),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            min=0,
            max=65535,
            help="Serve Prometheus /metrics on this port instead of metrics.port (0: off).",
        ),
    ] = None,
    group: Annotated[
        str | None,
        typer.Option(
            "--group",
            help="Share the maps with the other runs of this worker group (worker.group).",
        ),
    ] = None,
) -> None:
    """Run every map and enrichment (or the named ones) until SIGTERM, SIGHUP or Ctrl-C; with
    --group, the share of them the worker group gives this run."""
    from materializer.run import run_maps

    cfg = load(config)
    if metrics_port is not None:
        cfg = cfg.model_copy(
            update={"metrics": cfg.metrics.model_copy(update={"port": metrics_port})}
        )
    if group is not None:
        try:
            worker = WorkerConfig.model_validate({**cfg.worker.model_dump(), "group": group})
        except ValidationError as exc:
            err.print(f"[red]--group: {exc.errors()[0]['msg']}[/red]", highlight=False)
            raise typer.Exit(2) from None
        cfg = cfg.model_copy(update={"worker": worker})
    if not map_names and not cfg.catalog.enabled and not cfg.maps and not cfg.enrichments:
        err.print("no maps or enrichments declared, and catalog.enabled is off: nothing to run")
        raise typer.Exit(2)

    stop = threading.Event()
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda *_: stop.set())
    try:
        failed = run_maps(cfg, map_names or None, stop)
    except MaterializerError as exc:
        err.print(f"[red]{exc}[/red]", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    if failed:
        err.print(f"[red]failed: {', '.join(failed)}[/red]", highlight=False, soft_wrap=True)
        raise typer.Exit(1)


@app.command("jvm-archive")
def jvm_archive(
    force: Annotated[bool, typer.Option(help="Write it again even when one is there.")] = False,
) -> None:
    """Write the driver JVM's class data archive, once after installing: runs then start
    with Spark's classes already loaded and verified. It trains on a run of its own (its
    own broker and Redis, about a minute)."""
    from materializer.commands.class_archive import build_archive

    try:
        path = build_archive(typer.echo, force)
    except MaterializerError as exc:
        err.print(f"[red]{exc}[/red]", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    typer.echo(f"class data archive: {path}")


@app.command()
def demo(
    duration: Annotated[
        float,
        typer.Option(
            min=0, help="Seconds of producing, then serve until Ctrl-C; 0: produce until Ctrl-C."
        ),
    ] = 0,
    rate: Annotated[float, typer.Option(min=1, help="Events per second, both topics.")] = 200,
    seed: Annotated[int, typer.Option(help="The generator's seed: same seed, same users.")] = 1,
    port: Annotated[
        int, typer.Option(min=1, max=65535, help="Query service port; another if it is taken.")
    ] = 50051,
    redis_url: Annotated[
        str | None,
        typer.Option(
            envvar="REDIS_URL",
            help="Use this Redis (its users and user_orders maps are cleared) "
            "instead of starting redis-server.",
        ),
    ] = None,
    workdir: Annotated[
        str | None,
        typer.Option(help="Keep config, logs and Delta tables here, not in a temp dir."),
    ] = None,
    exit_after_duration: Annotated[
        bool,
        typer.Option(
            "--exit-after-duration",
            help="With --duration: exit once every event is folded, instead of serving on.",
        ),
    ] = False,
    schema_registry: Annotated[
        bool,
        typer.Option(
            "--schema-registry",
            help="Start a schema registry (Apicurio, resolved by `make jars`) and produce Avro "
            "with Confluent's AvroSerializer instead of JSON.",
        ),
    ] = False,
) -> None:
    """Start Kafka, Redis, the pipeline and the query service on a sample stream, and watch it."""
    from pathlib import Path

    from materializer.demo import DemoOptions, run_demo

    if exit_after_duration and not duration:
        err.print("--exit-after-duration needs --duration", highlight=False)
        raise typer.Exit(2)
    options = DemoOptions(
        duration=duration,
        rate=rate,
        seed=seed,
        port=port,
        redis_url=redis_url,
        workdir=Path(workdir) if workdir else None,
        exit_after_duration=exit_after_duration,
        schema_registry=schema_registry,
    )
    code = run_demo(options)
    if code:
        raise typer.Exit(code)


# Operating maps, in the order an operator meets them.
for command in (maps.status, maps.pause, maps.resume, maps.restart):
    app.command()(command)
app.command("reset-offsets")(offsets.reset_offsets)
app.command()(rehydrate.rehydrate)
app.command()(rehydrate.verify)
app.command()(rebuild.rebuild)
app.add_typer(catalog.app, name="maps")
# Reading the maps through a running query service.
app.command()(sql.sql)
