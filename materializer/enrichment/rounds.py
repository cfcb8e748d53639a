"""The join's semantics on parsed events, without a store: keys, hits, misses.

Shared by the query service's Enrich and the streaming enrichment jobs, so an
event joined either way comes out the same.

One round works in three steps: ``round_keys`` takes every lookup's key from
each live event, the caller reads the entities of all those keys at once, and
``apply_round`` applies the lookups to each event in their order. An event
dropped or failed by one lookup is skipped by the lookups after it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

from materializer.contract.redis_layout import RESERVED_KEYS
from materializer.enrichment.plan import LookupStep


class BadKey(NamedTuple):
    """A key field holding a value no key can be made of: an object or an array."""

    kind: str


KeyOutcome = str | BadKey | None
"""An entity key, a key field that cannot be a key, or a miss (missing or null field)."""

Found = Mapping[str, Mapping[str, bytes | None]]
"""Per map, per key asked for: the stored entity JSON, or ``None`` when absent."""


@dataclass(slots=True)
class EventState:
    """One event on its way through the lookups."""

    doc: dict[str, Any] | None
    """The event as parsed, lookups added so far; ``None`` once dropped or failed."""
    missed: list[str] = field(default_factory=list)
    error: str = ""
    dropped: bool = False

    def encoded(self) -> bytes:
        """The event as compact JSON, or empty when dropped or failed."""
        return b"" if self.doc is None else orjson.dumps(self.doc)


def key_of(doc: Mapping[str, Any], path: Sequence[str]) -> KeyOutcome:
    """The key at ``path``: strings as they are, numbers and booleans as their JSON text.

    A path through a member that is missing, null or not an object is a miss,
    and so is a key no entity can have (empty, or a name the layout reserves).
    """
    value: Any = doc
    for name in path:
        if not isinstance(value, dict):
            return None
        value = value.get(name)
    if value is None:
        return None
    if isinstance(value, str):
        return None if not value or value in RESERVED_KEYS else value
    if isinstance(value, dict | list):
        return BadKey(kind(value))
    return orjson.dumps(value).decode()


def round_keys(events: Sequence[EventState], steps: Sequence[LookupStep]) -> list[list[KeyOutcome]]:
    """Per event, each step's key, taken before any step of the round applies; none for an
    event already dropped or failed."""
    return [
        [] if e.doc is None else [key_of(e.doc, step.key_path) for step in steps] for e in events
    ]


def wanted_keys(
    steps: Sequence[LookupStep], keys: Sequence[Sequence[KeyOutcome]]
) -> Iterator[tuple[str, str]]:
    """(map, key) of every entity the round needs, repeats included."""
    for event_keys in keys:
        for step, key in zip(steps, event_keys, strict=False):  # a dead event has no keys
            if isinstance(key, str):
                yield step.map, key


def apply_round(
    events: Sequence[EventState],
    steps: Sequence[LookupStep],
    keys: Sequence[Sequence[KeyOutcome]],
    found: Found,
) -> None:
    """Apply the round's steps in order to each event, with the entities read for them."""
    values: dict[tuple[int, str], Any] = {}
    for event, event_keys in zip(events, keys, strict=True):
        for i, (step, key) in enumerate(zip(steps, event_keys, strict=False)):
            doc = event.doc
            if doc is None:
                break
            if isinstance(key, BadKey):
                event.doc = None
                event.error = (
                    f"lookup {step.alias!r}: key field {step.key_field!r} holds {key.kind}, "
                    "not a key"
                )
            elif key is not None and (raw := found[step.map].get(key)) is not None:
                if (i, key) not in values:
                    values[i, key] = _entity_value(step, raw)
                doc[step.alias] = values[i, key]
            else:
                _miss(event, doc, step, key)


def _miss(event: EventState, doc: dict[str, Any], step: LookupStep, key: str | None) -> None:
    event.missed.append(step.alias)
    if step.inner:
        event.doc = None
        event.dropped = True
    elif step.on_miss == "error":
        event.doc = None
        event.error = f"lookup {step.alias!r}: " + (
            f"key field {step.key_field!r} is missing or null"
            if key is None
            else f"no entity with key {key!r} in map {step.map!r}"
        )
    elif step.on_miss == "null":
        doc[step.alias] = None
    else:
        doc.pop(step.alias, None)


def _entity_value(step: LookupStep, raw: bytes) -> Any:
    """What goes under the alias. Events share it, so it is never modified afterwards."""
    if not step.parse:
        return orjson.Fragment(raw)
    entity = orjson.loads(raw)
    if not isinstance(entity, dict):
        raise ValueError(f"map {step.map!r} holds {kind(entity)} where an object belongs")
    if not step.fields:
        return entity
    return {name: entity[name] for name in step.fields if name in entity}


def kind(value: Any) -> str:
    """How a JSON value is named in messages: "an object", "a number"..."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    return "null" if value is None else "a number"
