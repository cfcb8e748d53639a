"""``query-service``: run the gRPC query service over the maps of a config file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from materializer.clients.logs import LogFormat, LogLevel, configure_logging
from materializer.config import load_config
from materializer.errors import ConfigError, MaterializerError
from query_service.event_loop import EventLoop, run
from query_service.server import serve as serve_forever

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
    host: Annotated[
        str | None, typer.Option(help="interface to listen on [default: query.host]")
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(min=0, max=65535, help="TCP port, 0 for any [default: query.port]"),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(min=0, max=65535, help="Prometheus port [default: query.metrics_port]"),
    ] = None,
    http_port: Annotated[
        int | None,
        typer.Option(
            min=0, max=65535, help="HTTP/JSON port, 0 turns it off [default: query.http_port]"
        ),
    ] = None,
    log_level: Annotated[LogLevel, typer.Option(case_sensitive=False)] = LogLevel.INFO,
    log_format: Annotated[
        LogFormat, typer.Option(case_sensitive=False, envvar="MATERIALIZER_LOG_FORMAT")
    ] = LogFormat.JSON,
    event_loop: Annotated[
        EventLoop, typer.Option(case_sensitive=False, help="the asyncio event loop to serve on")
    ] = EventLoop.UVLOOP,
) -> None:
    """Serve until SIGTERM or SIGINT, then stop gracefully."""
    try:
        app_config = load_config(config)
    except ConfigError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    query = app_config.query
    updates: dict[str, object] = {}
    if metrics_port is not None:
        updates["metrics_port"] = metrics_port
    if updates:
        app_config = app_config.model_copy(update={"query": query.model_copy(update=updates)})
    configure_logging(log_level.value, log_format, own_stderr=True)
    listen_host = host if host is not None else query.host
    listen_port = port if port is not None else query.port
    address = (
        f"[{listen_host}]:{listen_port}" if ":" in listen_host else f"{listen_host}:{listen_port}"
    )
    try:
        web_port = http_port if http_port is not None else query.http_port
        http = (listen_host, web_port) if web_port else None
        run(serve_forever(app_config, address, http=http), event_loop)
    except MaterializerError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
