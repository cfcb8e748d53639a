"""The enrichment join in plain Python, one lookup at a time: the answer tests compare against.

It shares no code with the service's join (no rounds, no batching, no
shortcuts), so a test comparing the two checks the rounds and the batching
as well as the per-lookup rules. Useful to anyone testing their own joins.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from materializer.v1 import enrich_service_pb2 as pb


@dataclass(frozen=True)
class Outcome:
    """What Enrich answers for one event (its error text aside: only whether there is one)."""

    event: dict[str, Any] | None
    dropped: bool = False
    failed: bool = False
    missed: tuple[str, ...] = ()


def reference_join(
    event: Mapping[str, Any],
    lookups: Sequence[pb.Lookup],
    maps: Mapping[str, Mapping[str, Mapping[str, Any]]],
) -> Outcome:
    """Apply ``lookups`` in order to ``event``; ``maps`` holds each map's decoded entities."""
    doc = copy.deepcopy(dict(event))
    missed: list[str] = []
    for lookup in lookups:
        value: Any = doc
        for name in lookup.key_field.split("."):
            value = value.get(name) if isinstance(value, dict) else None
        if isinstance(value, dict | list):
            return Outcome(None, failed=True, missed=tuple(missed))
        key = value if isinstance(value, str) or value is None else json.dumps(value)
        entity = maps[lookup.map].get(key) if key is not None else None
        alias = lookup.alias or lookup.map
        if entity is not None:
            fields = list(lookup.fields)
            doc[alias] = {f: entity[f] for f in fields if f in entity} if fields else dict(entity)
            continue
        missed.append(alias)
        if lookup.join == pb.Lookup.INNER:
            return Outcome(None, dropped=True, missed=tuple(missed))
        if lookup.on_miss == pb.Lookup.ERROR:
            return Outcome(None, failed=True, missed=tuple(missed))
        if lookup.on_miss == pb.Lookup.OMIT:
            doc.pop(alias, None)
        else:
            doc[alias] = None
    return Outcome(doc, missed=tuple(missed))
