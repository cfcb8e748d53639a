"""A change to a map, checked before it is stored: nothing half-valid reaches the catalog.

A change passes the checks ``materializer validate`` makes (every problem named by its
key path), those that need the running system (its source topics exist, its schema
registry answers), and one more for a map that already holds state: a change of what
that state means (the key, the fold, how values decode) would leave Redis and Delta
holding entities of the old definition beside the new, so it is refused unless asked
to rebuild the map into a new copy (``rebuild``).
"""

from __future__ import annotations

import logging
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from materializer.catalog.rule import Maps
from materializer.clients.kafka import librdkafka
from materializer.config import MapConfig, config_problems, with_maps
from materializer.contract.map_catalog import StoredMap
from materializer.errors import ConfigError, MaterializerError

log = logging.getLogger(__name__)

CHECK_TIMEOUT_SECONDS = 5.0
MAX_CONFIG_BYTES = 1024 * 1024

STATE_BOUND = (
    "key",
    "transforms",
    "fold.mode",
    "fold.event_time",
    "fold.aggregates",
    "source.format",
    "source.envelope",
    "source.schema",
    "source.schema_file",
    "source.descriptor_file",
    "source.message",
    "source.subject_name_strategy",
    "source.record_types",
    "changelog",
)
"""What a map's existing state depends on: its entities' keys and fields, the fold's
state beside them, the Delta table's schema and the changelog its Delta query reads."""


class ChangeInvalid(MaterializerError):
    """The definition has problems; each names its key path. Nothing was stored."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("invalid map definition:\n  " + "\n  ".join(problems))


class ChangeRefused(MaterializerError):
    """The change cannot apply to this map as it stands (the file owns it, or its state
    cannot follow); the message names the way out. Nothing was stored."""


class MapExists(MaterializerError):
    """A create of a map that exists already."""


class NoSuchMap(MaterializerError):
    """A change or deletion of a map that does not exist."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        self.known = known
        super().__init__(f"no such map {name!r} (known maps: {', '.join(known) or 'none'})")


@dataclass(frozen=True)
class Change:
    """A checked change, ready to be stored."""

    record: StoredMap
    created: bool
    rebuilt: bool


def _dotted(config: MapConfig, path: str) -> Any:
    data: Any = config.model_dump(mode="json", by_alias=True)
    for part in path.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


def state_bound_changes(old: MapConfig, new: MapConfig) -> list[str]:
    """The state-bound settings (``STATE_BOUND``) ``new`` changes. A JSON ``schema`` that
    only adds nullable fields is not one: the entities folded before read them as null,
    the table gains the columns with the first batch that has them, and the map's queries
    start again on the new definition, folding nothing again."""
    bound = [path for path in STATE_BOUND if _dotted(old, path) != _dotted(new, path)]
    if "source.schema" in bound and adds_nullable_fields(old.source.schema_, new.source.schema_):
        bound.remove("source.schema")
    return bound


def adds_nullable_fields(old: str | None, new: str | None) -> bool:
    """Whether DDL ``new`` has every field of ``old`` with the same type, and more fields,
    none ``NOT NULL``. Read without Spark (the query service checks changes too): a field
    is its name and its type's text up to the next comma outside brackets."""
    if old is None or new is None:
        return False
    before, after = _ddl_fields(old), _ddl_fields(new)
    if before is None or after is None or not set(before) < set(after):
        return False
    if any(before[name] != after[name] for name in before):
        return False
    return not any("NOT NULL" in after[name] for name in set(after) - set(before))


def _ddl_fields(ddl: str) -> dict[str, str] | None:
    """Field name (unquoted, lower case as Spark resolves it) to its type's text (upper
    case, spaces collapsed); None for DDL this reading does not follow."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(ddl):
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(ddl[start:i])
            start = i + 1
    parts.append(ddl[start:])
    fields: dict[str, str] = {}
    for part in parts:
        words = part.strip().split(None, 1)
        if len(words) != 2 or depth != 0:
            return None
        name = words[0].strip("`").rstrip(":").lower()
        kind = " ".join(words[1].lstrip(":").upper().split())
        if name in fields:
            return None
        fields[name] = kind
    return fields


def check_definition(maps: Maps, name: str, config: Any) -> MapConfig:
    """``config`` as map ``name`` among the maps in force, or ``ChangeInvalid``."""
    if not isinstance(config, dict):
        raise ChangeInvalid([f"maps.{name}: must be a mapping (the map's section as JSON)"])
    current: dict[str, Any] = dict(maps.config.maps)
    current[name] = config
    try:
        candidate = with_maps(maps.config, current, "<request>")
    except ConfigError as exc:
        raise ChangeInvalid(exc.problems) from None
    problems = [p for p in config_problems(candidate) if p.startswith(f"maps.{name}.")]
    if problems:
        raise ChangeInvalid(problems)
    return candidate.maps[name]


def check_reachable(maps: Maps, name: str, new: MapConfig) -> None:
    """What only the running system can say: the source topics exist, the registry answers."""
    problems = []
    admin = AdminClient(librdkafka(maps.config.kafka, logger=log))
    try:
        existing = admin.list_topics(timeout=CHECK_TIMEOUT_SECONDS).topics
    except KafkaException as exc:
        problems.append(f"maps.{name}.source.topics: cannot ask Kafka: {exc.args[0].str()}")
        existing = None
    if existing is not None:
        problems += [
            f"maps.{name}.source.topics.{i}: no topic {topic!r} in Kafka"
            for i, topic in enumerate(new.source.topics)
            if topic not in existing or existing[topic].error is not None
        ]
    url = new.source.schema_registry_url
    if url is not None:
        try:
            with urllib.request.urlopen(  # noqa: S310 - the URL's scheme is checked (http/https)
                f"{url.rstrip('/')}/subjects", timeout=CHECK_TIMEOUT_SECONDS
            ):
                pass
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            problems.append(f"maps.{name}.source.schema_registry_url: does not answer: {reason}")
    if problems:
        raise ChangeInvalid(problems)


def check_put(
    maps: Maps,
    name: str,
    config: Any,
    *,
    by: str,
    rebuild: bool = False,
    create_only: bool = False,
    reachable: bool = True,
) -> Change:
    """Check a create or update of map ``name``: the record to store, or why not.

    ``create_only`` (``POST``) refuses a map that exists; ``rebuild`` lets a
    state-bound change through, to be folded into a new copy.
    """
    if name in maps.origin and maps.origin[name] == "file":
        raise ChangeRefused(
            f"map {name!r} is declared in the configuration file (maps.{name}): change it "
            "there, or pick another name for a map managed through the API"
        )
    exists = name in maps.config.maps
    if exists and create_only:
        raise MapExists(f"map {name!r} exists already: PUT /v1/maps/{name}/config changes it")
    new = check_definition(maps, name, config)
    bound = state_bound_changes(maps.config.maps[name], new) if exists else []
    if bound and not rebuild:
        raise ChangeRefused(
            f"map {name!r}: its state cannot follow a change of "
            f"{', '.join(bound)}; ask for a rebuild (?rebuild=true, or --rebuild) to fold "
            "the new definition into a new copy while the old one keeps serving, or create "
            "the new definition under another name"
        )
    if reachable:
        check_reachable(maps, name, new)
    record = StoredMap(
        name,
        maps.version(name) + 1,
        config,  # as given: what GET answers is what was put
        by,
        int(time.time() * 1000),
        rebuilt_at=maps.version(name) + 1 if bound else _rebuilt_at(maps, name),
    )
    return Change(record, created=not exists, rebuilt=bool(bound))


def check_delete(maps: Maps, name: str, *, by: str) -> StoredMap:
    """The tombstone that deletes map ``name``, or why not.

    A definition the catalog holds but does not put in force (shadowed by the file's, or
    not fitting with it) can be deleted too: that is how its warning is silenced.
    """
    record = maps.records.get(name)
    in_catalog = record is not None and not record.deleted
    if maps.origin.get(name) == "file" and not in_catalog:
        raise ChangeRefused(
            f"map {name!r} is declared in the configuration file (maps.{name}): remove it "
            "there to delete it"
        )
    if name not in maps.config.maps and not in_catalog:
        raise NoSuchMap(name, sorted(maps.config.maps))
    return StoredMap(name, maps.version(name) + 1, None, by, int(time.time() * 1000))


def _rebuilt_at(maps: Maps, name: str) -> int:
    """The version of the map's last change its state could not follow, carried on by a
    change it can: a materializer that missed that one still knows to rebuild."""
    record = maps.stored.get(name)
    return 0 if record is None else record.rebuilt_at
