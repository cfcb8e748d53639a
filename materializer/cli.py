"""The ``materializer`` command."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from materializer.config import AppConfig, config_problems, load_config
from materializer.errors import ConfigError, MaterializerError

app = typer.Typer(help="Fold Kafka topics into Delta tables and Redis maps.", no_args_is_help=True)
err = Console(stderr=True)

ConfigOption = Annotated[
    Path, typer.Option("--config", "-c", help="The YAML file that declares the maps.")
]


def _load(path: Path) -> AppConfig:
    try:
        return load_config(path)
    except MaterializerError as exc:
        err.print(f"[red]{exc}[/red]", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None


@app.command()
def validate(config: ConfigOption) -> None:
    """Check a configuration file; every problem is printed with its key path."""
    cfg = _load(config)
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
        list[str] | None, typer.Option("--map", "-m", help="Run only these maps.")
    ] = None,
) -> None:
    """Run the streaming jobs of every map (or the named ones) until SIGTERM or Ctrl-C."""
    from materializer.pipeline.runner import run_maps

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # py4j logs every callback from the JVM (each batch's foreachBatch) at INFO.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    cfg = _load(config)
    names = map_names or sorted(cfg.maps)
    try:
        for name in names:
            cfg.map(name)
    except MaterializerError as exc:
        err.print(f"[red]{exc}[/red]", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    if not names:
        err.print("no maps declared: nothing to run")
        raise typer.Exit(2)

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        failed = run_maps(cfg, names, stop)
    except MaterializerError as exc:
        err.print(f"[red]{exc}[/red]", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    if failed:
        err.print(f"[red]failed maps: {', '.join(failed)}[/red]", highlight=False, soft_wrap=True)
        raise typer.Exit(1)
