"""How the configuration file's maps and the catalog's combine: the file owns the maps it
declares, the API owns the rest.

- The maps a process runs and serves are the file's ``maps:`` plus every map in the
  catalog whose name the file does not declare.
- The API shows the file's maps (``origin: file``) and refuses to change or delete one:
  a declarative set-up (Helm values, GitOps) stays the one place that says what such a
  map is, and no API call is undone by the next deploy.
- A map in the catalog that the file comes to declare is shadowed: the file's definition
  runs, and a warning says that the catalog's is ignored (deleting it there ends that).
- A map in the catalog that no longer fits with the file (say, it now shares a topic
  with a map the file declares) is left out with an error naming it; the others run.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from materializer.config import AppConfig, MapConfig, config_problems, with_maps
from materializer.contract.map_catalog import StoredMap
from materializer.errors import ConfigError

log = logging.getLogger(__name__)

Origin = Literal["file", "api"]


@dataclass(frozen=True)
class Maps:
    """The maps in force: the config a process runs and serves, and where each map came from."""

    config: AppConfig
    origin: dict[str, Origin]
    stored: dict[str, StoredMap] = field(default_factory=dict)
    """The catalog's record of each map it holds in force (not the file's)."""
    left_out: dict[str, list[str]] = field(default_factory=dict)
    """Catalog maps not in force, with why (shadowed by the file, or not fitting with it)."""
    records: dict[str, StoredMap] = field(default_factory=dict)
    """The catalog's last record of every map, deletions included."""

    def version(self, name: str) -> int:
        """The map's last version in the catalog (a deleted one's too, so a map created
        again goes on counting); 0 for a map the catalog never held."""
        record = self.records.get(name)
        return 0 if record is None else record.version


def combine(file_config: AppConfig, records: Mapping[str, StoredMap]) -> Maps:
    """The maps in force for the file's config and the catalog's last records."""
    maps: dict[str, MapConfig | dict[str, Any]] = dict(file_config.maps)
    origin: dict[str, Origin] = dict.fromkeys(file_config.maps, "file")
    stored: dict[str, StoredMap] = {}
    left_out: dict[str, list[str]] = {}
    config = file_config
    for name in sorted(records):
        record = records[name]
        if record.config is None:
            continue
        if name in file_config.maps:
            left_out[name] = [f"maps.{name}: the configuration file declares this map"]
            continue
        try:
            candidate = with_maps(config, {**maps, name: record.config}, "catalog")
            problems = [p for p in config_problems(candidate) if p.startswith(f"maps.{name}.")]
        except ConfigError as exc:
            problems = exc.problems
        if problems:
            left_out[name] = problems
            continue
        config = candidate
        maps[name] = config.maps[name]
        origin[name] = "api"
        stored[name] = record
    return Maps(config, origin, stored, left_out, dict(records))


def log_left_out(before: Maps | None, now: Maps) -> None:
    """Say once why a catalog map is not in force."""
    for name, problems in now.left_out.items():
        if before is not None and before.left_out.get(name) == problems:
            continue
        if problems[0].endswith("declares this map"):
            log.warning(
                "map %s: the configuration file declares it, so its definition in the "
                "catalog is ignored (delete it there to silence this)",
                name,
            )
        else:
            log.error("map %s in the catalog is left out: %s", name, "; ".join(problems))
