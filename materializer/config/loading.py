"""Reading a config: YAML in, environment overrides applied, every problem named by its key
path; and the checks that need several keys at once."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    ValidationError,
)

from materializer.config.app import AppConfig
from materializer.config.maps import MapConfig, inferred_problems, is_inferred
from materializer.config.transforms import TRANSFORM_TYPES
from materializer.errors import ConfigError

# Environment variables that override connection settings, so one file serves
# every environment (a container sets them; tests point them at their services).
ENV_OVERRIDES: dict[str, tuple[str, str]] = {
    "MATERIALIZER_KAFKA_BOOTSTRAP_SERVERS": ("kafka", "bootstrap_servers"),
    "MATERIALIZER_REDIS_URL": ("redis", "url"),
    "MATERIALIZER_DELTA_ROOT": ("delta", "root"),
    "MATERIALIZER_SPARK_MASTER": ("spark", "master"),
    "MATERIALIZER_CHECKPOINT_ROOT": ("spark", "checkpoint_root"),
    "MATERIALIZER_QUERY_PORT": ("query", "port"),
    "MATERIALIZER_CATALOG_TOPIC": ("catalog", "topic"),
    "MATERIALIZER_WORKER_GROUP": ("worker", "group"),
    "MATERIALIZER_WORKER_ID": ("worker", "id"),
}


def _key_path(loc: tuple[int | str, ...]) -> str:
    """``maps.users.transforms.0.fields``: the union tag pydantic inserts is left out."""
    parts: list[str] = []
    for i, part in enumerate(loc):
        if i and isinstance(loc[i - 1], int) and part in TRANSFORM_TYPES:
            continue
        parts.append("schema" if part == "schema_" else str(part))
    return ".".join(parts)


def _message(error: Any) -> str:
    """Pydantic's message in the words of a config file's reader."""
    kind = error["type"]
    if kind == "literal_error":
        choices = error["ctx"]["expected"].replace("'", "").replace(" or ", ", ")
        return f"must be one of {choices}"
    if kind == "union_tag_invalid":
        choices = error["ctx"]["expected_tags"].replace("'", "")
        return f"unknown type {error['ctx']['tag']!r}: must be one of {choices}"
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required"
    message = str(error["msg"])
    return message.removeprefix("Value error, ")


def with_env_overrides(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with the ``ENV_OVERRIDES`` set in the environment applied, as a new document:
    the caller's (a test's template, a parsed file kept for its text) is never changed."""
    out = dict(data)
    for var, (section, key) in ENV_OVERRIDES.items():
        value = os.environ.get(var)
        if not value:  # unset or empty: the file's setting stands
            continue
        current = out.get(section) or {}  # an empty section (``redis:``) is still one
        if isinstance(current, dict):
            out[section] = {**current, key: value}
    return out


def parse_config(data: Any, source: str = "<config>") -> AppConfig:
    """Validate a decoded document; every problem is reported with its key path."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(source, ["<root>: must be a mapping"])
    data = with_env_overrides(data)
    try:
        return AppConfig.model_validate(data)
    except ValidationError as exc:
        problems = [problem for e in exc.errors() for problem in _problems(e)]
        raise ConfigError(source, problems) from None


_RELATIVE_PATH = re.compile(r"^([A-Za-z_][\w.-]*): ")


def _problems(error: Any) -> list[str]:
    """``key.path: message`` lines. A validator that checks several keys at once words each
    line as ``relative.path: message``, which is joined to where the validator sits."""
    path = _key_path(error["loc"])
    out = []
    for line in _message(error).splitlines():
        relative = _RELATIVE_PATH.match(line) if error["type"] == "value_error" else None
        if relative:
            line = (
                f"{'.'.join(p for p in (path, relative.group(1)) if p)}: {line[relative.end() :]}"
            )
        else:
            line = f"{path or '<root>'}: {line}"
        out.append(line)
    return out


def with_maps(
    config: AppConfig, maps: Mapping[str, MapConfig | dict[str, Any]], source: str = "<maps>"
) -> AppConfig:
    """``config`` with ``maps`` instead of its own, checked as a whole file is (names, topics
    no two maps may share, what its enrichments and lookups name); raw sections are
    validated, with each problem's key path under ``maps.<name>``."""
    data: dict[str, Any] = {name: getattr(config, name) for name in type(config).model_fields}
    data["maps"] = dict(maps)
    try:
        return AppConfig.model_validate(data)
    except ValidationError as exc:
        problems = [problem for e in exc.errors() for problem in _problems(e)]
        raise ConfigError(source, problems) from None


def load_config(path: str | Path) -> AppConfig:
    """Read and validate a YAML file."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(str(p), [f"<file>: cannot read: {exc.strerror}"]) from None
    return parse_config_text(text, str(p))


def parse_config_text(text: str, source: str = "<config>") -> AppConfig:
    """Validate a YAML (or JSON) document given as text."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(source, [f"<file>: not valid YAML: {exc}"]) from None
    return parse_config(data, source)


def config_problems(config: AppConfig) -> list[str]:
    """Checks that need more than one key at a time, made before any map starts.

    ``materializer validate`` and the admin API report these along with the
    model's own, so both give the same answer for the same file.
    """
    return [
        f"maps.{name}.{problem}"
        for name, map_config in config.maps.items()
        if is_inferred(map_config)
        for problem in inferred_problems(map_config)
    ]


def validate_text(text: str, source: str = "<config>") -> list[str]:
    """Every problem of a configuration document, each with its key path; empty when valid."""
    try:
        config = parse_config_text(text, source)
    except ConfigError as exc:
        return exc.problems
    return config_problems(config)
