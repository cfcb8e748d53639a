"""A join spec as rounds of lookups, each round one store round trip.

Lookups apply in order, and a later lookup may key on a member an earlier one
added (``user.company_id`` after a lookup aliased ``user``). Lookups whose keys
do not read a member written earlier in the same round can have all their
keys read at once, so a spec becomes the fewest consecutive rounds with that
property: applying a round's lookups in order, with keys taken before the
round, gives exactly what applying every lookup one by one would.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

OnMiss = Literal["null", "omit", "error"]


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


def lookup_step(
    *,
    map_name: str,
    key_field: str,
    alias: str,
    fields: Iterable[str],
    inner: bool,
    on_miss: OnMiss,
) -> LookupStep:
    """One lookup as the join takes it, from its spec (a configured profile, an enrichment
    job or a request) once checked: the key's path split on dots, the entity under the
    map's name when no alias is given."""
    return LookupStep(
        map=map_name,
        key_field=key_field,
        key_path=tuple(key_field.split(".")),
        alias=alias or map_name,
        fields=tuple(fields),
        inner=inner,
        on_miss=on_miss,
    )


def plan_rounds(steps: Sequence[LookupStep]) -> JoinPlan:
    """Cut the steps (at least one) into rounds; decode an entity only where it will be
    looked into."""
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
