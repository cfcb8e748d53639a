"""``query-service``: run the gRPC query service over the maps of a config file."""

from __future__ import annotations

import asyncio
import logging
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from materializer.config import load_config
from materializer.errors import ConfigError
from query_service.server import serve as serve_forever


class LogLevel(StrEnum):
    """Levels offered on the command line."""

    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"


app = typer.Typer(no_args_is_help=True, add_completion=False)


@app.callback()
def main() -> None:
    """Serve lookups in materialized maps over gRPC."""
    # With a single command typer would make it the whole app; the callback
    # keeps `serve` a subcommand, so later commands do not change the CLI.


@app.command()
def serve(
    config: Annotated[
        Path, typer.Option("-c", "--config", help="the maps YAML file", show_default=False)
    ],
    host: Annotated[str, typer.Option(help="interface to listen on")] = "0.0.0.0",  # noqa: S104
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port, 0 for any")] = 50051,
    log_level: Annotated[LogLevel, typer.Option(case_sensitive=False)] = LogLevel.INFO,
) -> None:
    """Serve until SIGTERM or SIGINT, then stop gracefully."""
    try:
        app_config = load_config(config)
    except ConfigError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    logging.basicConfig(
        level=log_level.value, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    asyncio.run(serve_forever(app_config, address))
