"""Enrich requests' join specs and configured profiles, validated into join plans.

The plan itself and its rounds are ``materializer.enrichment.plan``'s, shared with
the streaming enrichment jobs.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from materializer.config import EnrichProfileConfig
from materializer.enrichment.plan import JoinPlan, LookupStep, OnMiss, lookup_step, plan_rounds
from materializer.v1 import enrich_service_pb2 as pb
from query_service.enrich.errors import LookupMapNotFound
from query_service.errors import InvalidArgument

_INNER = {pb.Lookup.JOIN_UNSPECIFIED: False, pb.Lookup.LEFT: False, pb.Lookup.INNER: True}
_ON_MISS: dict[int, OnMiss] = {
    pb.Lookup.ON_MISS_UNSPECIFIED: "null",
    pb.Lookup.NULL: "null",
    pb.Lookup.OMIT: "omit",
    pb.Lookup.ERROR: "error",
}


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
    return lookup_step(
        map_name=map_name,
        key_field=key_field,
        alias=alias,
        fields=fields,
        inner=inner,
        on_miss=on_miss,
    )


def _plan(steps: Sequence[LookupStep], where: str) -> JoinPlan:
    if not steps:
        raise InvalidArgument(f"{where}.lookups: must not be empty")
    return plan_rounds(steps)
