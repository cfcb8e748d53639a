"""The lookups of many requests at once: one store round trip per round for all of them.

Requests of one batch may carry different joins; round ``r`` of every join is
read in the same ``get_across`` call, so a batch costs as many round trips as
its deepest join has rounds, however many requests and events it holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from materializer.contract.watermark import Watermark
from materializer.enrichment.plan import JoinPlan
from materializer.enrichment.rounds import EventState, apply_round, round_keys, wanted_keys
from query_service.stores.base import MapStore


@dataclass(frozen=True)
class Job:
    """One request's parsed events and the join they go through."""

    plan: JoinPlan
    events: list[EventState]


async def run_jobs(store: MapStore, jobs: Sequence[Job]) -> list[dict[str, Watermark | None]]:
    """Enrich every job's events in place; per job, the watermark of each map it looked up.

    A map read in several rounds reports the watermark read first: it is the
    lower bound of every entity the job got from that map. Every map of a
    round is read even when no event has a key for it, so each response
    carries the watermark of every map its join names.
    """
    marks: list[dict[str, Watermark | None]] = [{} for _ in jobs]
    depth = max((len(job.plan.rounds) for job in jobs), default=0)
    for r in range(depth):
        active = [
            (i, job, job.plan.rounds[r]) for i, job in enumerate(jobs) if r < len(job.plan.rounds)
        ]
        keys = [round_keys(job.events, steps) for _, job, steps in active]
        wanted: dict[str, dict[str, None]] = {}  # an ordered set of keys per map
        for (_, _, steps), job_keys in zip(active, keys, strict=True):
            for step in steps:
                wanted.setdefault(step.map, {})
            for map_name, key in wanted_keys(steps, job_keys):
                wanted[map_name][key] = None
        read = await store.get_across({name: list(ks) for name, ks in wanted.items()})
        found = {
            name: dict(zip(ks, read[name].entities, strict=True)) for name, ks in wanted.items()
        }
        for (i, job, steps), job_keys in zip(active, keys, strict=True):
            apply_round(job.events, steps, job_keys, found)
            for step in steps:
                marks[i].setdefault(step.map, read[step.map].watermark)
    return marks
