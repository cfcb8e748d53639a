"""``query-service``: run the gRPC query service over the maps of a config file."""

from __future__ import annotations

import asyncio
import logging
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import orjson
import typer

from materializer.config import load_config
from materializer.errors import ConfigError, MaterializerError
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


class LogFormat(StrEnum):
    """JSON for log collectors, text for a terminal."""

    JSON = "json"
    TEXT = "text"


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
    log_format: Annotated[LogFormat, typer.Option(case_sensitive=False)] = LogFormat.JSON,
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
    configure_logging(log_level.value, log_format)
    listen_host = host if host is not None else query.host
    listen_port = port if port is not None else query.port
    address = (
        f"[{listen_host}]:{listen_port}" if ":" in listen_host else f"{listen_host}:{listen_port}"
    )
    try:
        web_port = http_port if http_port is not None else query.http_port
        http = (listen_host, web_port) if web_port else None
        asyncio.run(serve_forever(app_config, address, http=http))
    except MaterializerError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None


class JsonFormatter(logging.Formatter):
    """One JSON object per line: what log collectors parse without rules."""

    def format(self, record: logging.LogRecord) -> str:
        """Time, level, logger, message and the exception, if any."""
        entry = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry).decode()


def configure_logging(level: str, log_format: LogFormat) -> None:
    """Root logging for the process, in UTC."""
    handler = logging.StreamHandler()
    if log_format is LogFormat.JSON:
        formatter: logging.Formatter = JsonFormatter()
    else:
        formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    formatter.converter = time.gmtime
    handler.setFormatter(formatter)
    logging.basicConfig(level=level, handlers=[handler], force=True)
