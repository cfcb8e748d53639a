"""A join spec as rounds of lookups, each round one store round trip.

Lookups apply in order, and a later lookup may key on a member an earlier one
added (``user.company_id`` after a lookup aliased ``user``). Lookups whose keys
do not read a member written earlier in the same round can have all their
keys read at once, so a spec becomes the fewest consecutive rounds with that
property: applying a round's lookups in order, with keys taken before the
round, gives exactly what applying every lookup one by one would.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from materializer.config import EnrichProfileConfig
from materializer.v1 import enrich_service_pb2 as pb
from query_service.enrich.errors import LookupMapNotFound
from query_service.errors import InvalidArgument

OnMiss = Literal["null", "omit", "error"]

_INNER = {pb.Lookup.JOIN_UNSPECIFIED: False, pb.Lookup.LEFT: False, pb.Lookup.INNER: True}
_ON_MISS: dict[int, OnMiss] = {
    pb.Lookup.ON_MISS_UNSPECIFIED: "null",
    pb.Lookup.NULL: "null",
    pb.Lookup.OMIT: "omit",
    pb.Lookup.ERROR: "error",
}


@dataclass(frozen=True)
class LookupStep:
    """One validated lookup: where its key is, where the entity goes, what a miss does."""

    map: str
    key_field: str
    """As the caller spelled it, for messages."""
    key_path: tuple[str, ...]
    """``key_field`` split on dots: member names from the top of the event down."""
    alias: str
    """The top-level member the entity is set under (a name, never a path)."""
    fields: tuple[str, ...]
    inner: bool
    """A miss drops the event; ``on_miss`` applies to left joins only."""
    on_miss: OnMiss
    parse: bool = True
    """Whether the entity must be decoded: for a projection, or because a later lookup
    keys on a member of it. Otherwise the stored JSON is embedded as it is."""


@dataclass(frozen=True)
class JoinPlan:
    """A join's lookups grouped into rounds, in their original order."""

    rounds: tuple[tuple[LookupStep, ...], ...]

    @property
    def maps(self) -> tuple[str, ...]:
        """The maps looked up, each once, in order of first use."""
        return tuple(dict.fromkeys(step.map for r in self.rounds for step in r))


def plan_from_spec(spec: pb.JoinSpec, maps: Collection[str], where: str) -> JoinPlan:
    """Validate a request's spec; errors name ``<where>.lookups[i].<field>``."""
    steps = []
    for i, lookup in enumerate(spec.lookups):
        at = f"{where}.lookups[{i}]"
        if lookup.join not in _INNER:
            raise InvalidArgument(f"{at}.join: unknown value {lookup.join}")
        if lookup.on_miss not in _ON_MISS:
            raise InvalidArgument(f"{at}.on_miss: unknown value {lookup.on_miss}")
        steps.append(
            _step(
                at,
                maps,
                map_name=lookup.map,
                key_field=lookup.key_field,
                alias=lookup.alias,
                fields=lookup.fields,
                inner=_INNER[lookup.join],
                on_miss=_ON_MISS[lookup.on_miss],
            )
        )
    return _plan(steps, where)


def plan_from_profile(profile: EnrichProfileConfig, maps: Collection[str], where: str) -> JoinPlan:
    """A configured profile's plan; errors name ``<where>.lookups[i].<field>``."""
    return _plan(
        [
            _step(
                f"{where}.lookups[{i}]",
                maps,
                map_name=lookup.map,
                key_field=lookup.key_field,
                alias=lookup.alias or "",
                fields=lookup.fields,
                inner=lookup.join == "inner",
                on_miss=lookup.on_miss,
            )
            for i, lookup in enumerate(profile.lookups)
        ],
        where,
    )


def _step(
    at: str,
    maps: Collection[str],
    *,
    map_name: str,
    key_field: str,
    alias: str,
    fields: Iterable[str],
    inner: bool,
    on_miss: OnMiss,
) -> LookupStep:
    if not map_name:
        raise InvalidArgument(f"{at}.map: must not be empty")
    if map_name not in maps:
        raise LookupMapNotFound(f"{at}.map", map_name, maps)
    if not key_field:
        raise InvalidArgument(f"{at}.key_field: must not be empty")
    path = tuple(key_field.split("."))
    if not all(path):
        raise InvalidArgument(
            f"{at}.key_field: {key_field!r} is not a member name or a dotted path like a.b.c"
        )
    return LookupStep(
        map=map_name,
        key_field=key_field,
        key_path=path,
        alias=alias or map_name,
        fields=tuple(fields),
        inner=inner,
        on_miss=on_miss,
    )


def _plan(steps: Sequence[LookupStep], where: str) -> JoinPlan:
    """Cut the steps into rounds; decode an entity only where it will be looked into."""
    if not steps:
        raise InvalidArgument(f"{where}.lookups: must not be empty")
    keyed_on = [{later.key_path[0] for later in steps[i + 1 :]} for i in range(len(steps))]
    steps = [
        replace(step, parse=bool(step.fields) or step.alias in keyed_on[i])
        for i, step in enumerate(steps)
    ]
    rounds: list[tuple[LookupStep, ...]] = []
    current: list[LookupStep] = []
    for step in steps:
        if any(earlier.alias == step.key_path[0] for earlier in current):
            rounds.append(tuple(current))
            current = []
        current.append(step)
    rounds.append(tuple(current))
    return JoinPlan(rounds=tuple(rounds))
