"""What every subcommand shares: the config option, consoles, and errors as exit codes.

Exit codes: 0 done, 1 the operation found a problem (a failed map, a
mismatch), 2 the command could not run as asked (bad config, unknown map,
a map in the wrong state).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import redis
import typer
from redis.exceptions import RedisClusterException
from rich.console import Console

from materializer.catalog.live import LiveMaps
from materializer.clients.redis import Client, connect
from materializer.config import AppConfig, load_config
from materializer.contract.control import MapControl
from materializer.errors import MaterializerError

err = Console(stderr=True)
out = Console()

CATALOG_READ_SECONDS = 10.0

ConfigOption = Annotated[
    Path, typer.Option("--config", "-c", help="The YAML file that declares the maps.")
]
MapArgument = Annotated[str, typer.Argument(help="A map declared in the config.")]


def fail(message: object, code: int = 2) -> typer.Exit:
    """Print ``message`` in red on stderr; raise the returned ``typer.Exit``.

    Printed as plain text: a message quotes names, statements and errors of others,
    whose brackets and ``:name:`` are no markup or emoji of rich's."""
    err.print(str(message), style="red", markup=False, emoji=False, highlight=False, soft_wrap=True)
    return typer.Exit(code)


@contextmanager
def exits_on_errors() -> Iterator[None]:
    """The product's own errors (config, state, Kafka, checkpoints) as a message and exit 2."""
    try:
        yield
    except MaterializerError as exc:
        raise fail(exc) from None
    except (redis.RedisError, RedisClusterException) as exc:
        raise fail(f"redis: {exc}") from None


def load(path: Path) -> AppConfig:
    """The config, or exit 2 with every problem and its key path."""
    with exits_on_errors():
        return load_config(path)


def load_in_force(path: Path) -> AppConfig:
    """The config with every map in force: the file's and the catalog's (``materializer
    maps``), so a command reaches a map created through the API as it does the file's.
    With Kafka out of reach, the file's maps, and a warning."""
    config = load(path)
    live = LiveMaps(config)
    try:
        with exits_on_errors():
            live.catch_up(CATALOG_READ_SECONDS)
    except typer.Exit:
        err.print("[yellow]going on with the configuration file's maps only[/yellow]")
    finally:
        live.close()
    return live.config


def redis_client(config: AppConfig) -> Client:
    """A client for one command: short timeouts, so a Redis that is down fails fast."""
    with exits_on_errors():
        return connect(config.redis, socket_timeout=10.0, socket_connect_timeout=5.0)


def map_control(config: AppConfig, name: str) -> MapControl:
    """The map's control, once the map is known to be declared."""
    with exits_on_errors():
        config.map(name)
    return MapControl(redis_client(config), name)
